"""The default test suite's wall time at several commits, run alternately (each base,
then head, and again) so that all meet the same machine; medians of each.

Each commit is a fresh clone in a temporary directory, tested with this environment's
interpreter and packages and the clone first on PYTHONPATH (what `.ci/run` runs, less
the install). Each run gets a fresh `TMPDIR` and `XDG_CACHE_HOME`, so no run finds the
compile caches an earlier one left: each starts cold, as CI does. The figure is pytest's own "in N s".
`--base-site DIR` stands the packages installed in DIR (`pip install --target DIR PKG==VER
--no-deps`) in for this environment's on the bases' side, as their own pins would install them.

    python bench/suite_time.py --base 2800618 [--base 23ecf17 ...] [--head HEAD] [--runs 3] [--base-site DIR] [--out F.json]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def clone(rev: str, where: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(HERE.parent), str(where)], check=True)
    subprocess.run(["git", "-C", str(where), "checkout", "-q", rev], check=True)
    return where


def pythonpath(tree: Path, site=None) -> str:
    """The clone first, then `site` (packages standing in for this environment's), if any."""
    return os.pathsep.join(str(p) for p in (tree, site) if p)


def suite(tree: Path, site=None) -> dict:
    """One run of the default suite in `tree`: pytest's seconds, the wall, the counts line,
    the failed tests' ids."""
    with tempfile.TemporaryDirectory(prefix="r", dir=tree.parent) as tmp:
        env = dict(os.environ, PYTHONPATH=pythonpath(tree, site), TMPDIR=tmp, XDG_CACHE_HOME=os.path.join(tmp, "cache"))
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=12",
                              "-rf"], cwd=tree, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    last = [line for line in out.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    seconds = re.search(r"in ([\d.]+)s", last[-1]) if last else None
    slowest = re.findall(r"^([\d.]+)s (call|setup|teardown) +(\S+)", out.stdout, re.M)
    return {"rc": out.returncode, "wall_s": round(wall, 1), "pytest_s": float(seconds[1]) if seconds else None,
            "line": last[-1].strip("= ") if last else out.stdout[-300:],
            "failed": re.findall(r"^FAILED (\S+)", out.stdout, re.M),
            "slowest": [[float(t), phase, test] for t, phase, test in slowest]}


def site_packages(site) -> list:
    """`name-version` of each distribution installed in `site` (None: none)."""
    return sorted(p.name.removesuffix(".dist-info") for p in Path(site).glob("*.dist-info")) if site else []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, action="append", help="a commit to compare with (repeatable)")
    p.add_argument("--head", default="HEAD")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--base-site", help="packages the bases run with instead of this environment's")
    p.add_argument("--out", default="bench/results/suite_time.json")
    opts = p.parse_args()
    from common import machine_info, write_json

    sides = [*opts.base, opts.head]
    runs = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="suite_time-") as tmp:
        trees = {side: clone(side, Path(tmp) / f"tree{i}") for i, side in enumerate(sides)}
        revs = {side: subprocess.run(["git", "-C", str(t), "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True).stdout.strip() for side, t in trees.items()}
        for i in range(opts.runs):
            for side in sides:
                runs[side].append(suite(trees[side], opts.base_site if side in opts.base else None))
                print(f"[{i + 1}] {revs[side]}: {runs[side][-1]}", flush=True)
    med = {revs[side]: statistics.median(r["pytest_s"] for r in rs) for side, rs in runs.items()}
    head = med[revs[opts.head]]
    ratios = {revs[b]: round(head / med[revs[b]], 3) for b in opts.base}
    write_json(opts.out, {"meta": machine_info(), "head": revs[opts.head], "bases": [revs[b] for b in opts.base],
                          "base_site": site_packages(opts.base_site),
                          "runs": {revs[side]: rs for side, rs in runs.items()}, "median_s": med,
                          "ratio_head_to_base": ratios})
    print("median: " + ", ".join(f"{rev} {m:.1f} s" for rev, m in med.items())
          + "; head/base " + ", ".join(f"{rev} {r:.3f}" for rev, r in ratios.items()))


if __name__ == "__main__":
    main()

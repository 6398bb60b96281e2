"""One `jaxrl-dist train` command at two commits, run alternately (base, head, base, ...)
so that both meet the same machine: each run's training steps/s (the summary's `sps`,
compiles apart), its compile seconds and the process wall; medians and head/base ratios.

Each commit is a fresh clone, run with this environment's interpreter and packages and
the clone first on PYTHONPATH; every run has its own run dir and no compile cache.
`--base-site DIR`: the base runs with the packages installed in DIR in place of this
environment's (as `bench/suite_time.py`).

    python bench/cli_ab.py --base REV [--head HEAD] [--runs 3] [--base-site DIR] [--out F.json] -- OVERRIDE ...
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from suite_time import clone, pythonpath, site_packages  # noqa: E402

FIGURES = ("sps", "compile_seconds", "wall_s")


def run(tree: Path, overrides: list, run_dir: Path, site=None) -> dict:
    """One `jaxrl-dist train` in `tree`: its summary's figures and the process wall."""
    env = dict(os.environ, PYTHONPATH=pythonpath(tree, site))
    cmd = [sys.executable, "-m", "jaxrl_dist", "train", *overrides, f"run.dir={run_dir}",
           "run.progress=false", "run.compile_cache=false"]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"sps": summary["sps"], "compile_seconds": summary["compile_seconds"], "wall_s": round(wall, 2),
            "final_return": summary.get("final_return"), "params_sha256": summary.get("params_sha256")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the commit to compare with")
    p.add_argument("--head", default="HEAD")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--base-site", help="packages the base runs with instead of this environment's")
    p.add_argument("--out", default="bench/results/cli_ab.json")
    p.add_argument("overrides", nargs="*", help="the train command's overrides (after --)")
    opts = p.parse_args()
    from common import machine_info, write_json

    sides = {"base": opts.base, "head": opts.head}
    runs = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="cli_ab-") as tmp:
        trees = {side: clone(rev, Path(tmp) / side) for side, rev in sides.items()}
        revs = {side: subprocess.run(["git", "-C", str(t), "rev-parse", "--short", "HEAD"], capture_output=True,
                                     text=True).stdout.strip() for side, t in trees.items()}
        for i in range(opts.runs):
            for side in sides:
                site = opts.base_site if side == "base" else None
                runs[side].append(run(trees[side], opts.overrides, Path(tmp) / f"run-{side}-{i}", site))
                print(f"[{i + 1}] {side} {revs[side]}: {runs[side][-1]}", flush=True)
    med = {side: {f: statistics.median(r[f] for r in rs) for f in FIGURES} for side, rs in runs.items()}
    ratio = {f: round(med["head"][f] / med["base"][f], 3) for f in FIGURES}
    write_json(opts.out, {"meta": machine_info(), "revs": revs, "base_site": site_packages(opts.base_site),
                          "overrides": opts.overrides, "runs": runs,
                          "median": med, "ratio_head_to_base": ratio})
    print(f"medians: {med}\nhead/base: {ratio}")


if __name__ == "__main__":
    main()

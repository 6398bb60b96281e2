"""How well `jaxrl-dist calibrate`'s learner line fits the times it measured.

The calibration times the jitted learner update at K = 1, 2, 4, ... shards (medians
of `--repeats` warm calls) and fits `learn_s_fixed + learn_s_per_sample * samples`
(`calibrate.fit_line`). The tests check the fit's arithmetic on the recorded
numbers; how close the line comes to the measured times depends on the machine and
its load, so it is a figure here, not an assertion there. Each run is a fresh
`jaxrl-dist calibrate` process on the local backend (CartPole, the test's tiny
size by default); the table has every K of every run, and the worst relative
error per run with the 1-minute load average it ran under.

    python bench/calibrate_fit.py [--runs 3] [--repeats 5] [--learner-shards 8]
        [--out bench/results/calibrate_fit.json] [-- extra overrides]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import machine_info, print_table, write_json  # noqa: E402

TINY = ["env=cartpole", "backend=local", "backend.envs_per_shard=4", "algo.num_steps=32"]


def calibrate_once(args, overrides: list) -> dict:
    """One `jaxrl-dist calibrate` process; its profile file's learner fit and machine."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.json"
        subprocess.run([sys.executable, "-m", "jaxrl_dist", "calibrate", *TINY, *overrides,
                        "--rounds", "3", "--learner-shards", str(args.learner_shards),
                        "--repeats", str(args.repeats), "--out", str(out)],
                       check=True, stdout=subprocess.DEVNULL, env={**os.environ})
        meta = json.loads(out.read_text())["meta"]
    fit = meta["fits"]["learn"]
    errors = [(f - t) / t for f, t in zip(fit["fit_s"], fit["measured_s"])]
    return {**fit, "rel_error": errors, "worst_abs_rel_error": max(map(abs, errors)),
            "load_avg_1m": meta["machine"]["load_avg_1m"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--learner-shards", type=int, default=8)
    parser.add_argument("--out", default=str(HERE / "results" / "calibrate_fit.json"))
    args, overrides = parser.parse_known_args()
    runs = [calibrate_once(args, [o for o in overrides if o != "--"]) for _ in range(args.runs)]
    rows = [(i, k, n, f"{1e3 * t:.2f}", f"{1e3 * f:.2f}", f"{100 * e:+.0f}%")
            for i, r in enumerate(runs)
            for k, n, t, f, e in zip(r["shards"], r["samples"], r["measured_s"], r["fit_s"], r["rel_error"])]
    print_table("learner fit against the measured times", ("run", "K", "samples", "measured ms", "fit ms",
                                                          "fit - measured"), rows)
    for i, r in enumerate(runs):
        print(f"run {i}: worst |fit - measured| / measured {100 * r['worst_abs_rel_error']:.0f}% "
              f"(load {r['load_avg_1m']:.1f})")
    write_json(args.out, {"machine": machine_info(), "repeats": args.repeats, "runs": runs})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

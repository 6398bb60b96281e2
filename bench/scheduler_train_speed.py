"""Scheduler training speed: this tree against a baseline tree, side by side in one run.

Runs `jaxrl-dist scheduler train` from each source tree (`PYTHONPATH`) in
turn, `--rounds` times alternately (so the machine's load hits both alike),
each for `--updates` updates of the same recipe, and times every update line
as it arrives: start-up and compile (process start to the first update), and
the median seconds of the updates after the first. A full recipe's wall is then
start-up + its updates x that median. The baseline is a checkout of an earlier
commit, e.g.

    git worktree add /tmp/base f18418b
    python bench/scheduler_train_speed.py --baseline /tmp/base

Writes `bench/results/scheduler_train_speed.json`.
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ("env=cartpole run.target_return=475 scheduler.max_shards=16 --episodes 8 --rollout 16 "
          "--max-rounds 60 --time-weight 0.6")


def timed_training(tree: Path, args: list, updates: int) -> dict:
    """One `scheduler train` process from `tree`: seconds to its first update line and
    between the update lines after it."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "jaxrl_dist", "scheduler", "train", *args, "--updates", str(updates),
               "--out", str(Path(tmp) / "s.msgpack")]
        t0, stamps = time.perf_counter(), []
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            for line in proc.stdout:
                if line.startswith("scheduler update"):
                    stamps.append(time.perf_counter() - t0)
        finally:
            proc.wait()
    if proc.returncode != 0 or len(stamps) < 2:
        raise SystemExit(f"{tree}: scheduler train exited {proc.returncode} after {len(stamps)} updates")
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"first_update_s": stamps[0], "update_s": gaps, "update_s_median": statistics.median(gaps),
            "load_avg": os.getloadavg()[0]}


def recipe_wall(runs: list, updates: int) -> float:
    """A recipe's wall from its runs: median start-up + `updates` x median update."""
    first = statistics.median(r["first_update_s"] for r in runs)
    return first + (updates - 1) * statistics.median(r["update_s_median"] for r in runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", required=True, help="the baseline source tree (a checkout)")
    p.add_argument("--recipe", default=RECIPE, help="the common arguments of `scheduler train`")
    p.add_argument("--baseline-updates", type=int, default=90, help="the baseline recipe's updates")
    p.add_argument("--new-extra", default="--epochs 10 --lr 1e-3", help="this tree's recipe flags")
    p.add_argument("--new-updates", type=int, default=40, help="this tree's recipe's updates")
    p.add_argument("--updates", type=int, default=6, help="updates timed per process")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "scheduler_train_speed.json"))
    o = p.parse_args()
    common = shlex.split(o.recipe)
    trees = {"baseline": (Path(o.baseline), common), "new": (ROOT, common + shlex.split(o.new_extra))}
    runs = {name: [] for name in trees}
    for r in range(o.rounds):
        for name, (tree, args) in trees.items():
            runs[name].append(timed_training(tree, args, o.updates))
            last = runs[name][-1]
            print(f"round {r} {name}: first update {last['first_update_s']:.1f} s, "
                  f"update {last['update_s_median']:.2f} s (load {last['load_avg']:.1f})", flush=True)
    walls = {"baseline": recipe_wall(runs["baseline"], o.baseline_updates),
             "new": recipe_wall(runs["new"], o.new_updates)}
    per_update = {k: statistics.median(r["update_s_median"] for r in v) for k, v in runs.items()}
    result = {"per_update_ratio": per_update["new"] / per_update["baseline"], "per_update_s": per_update,
              "recipe_wall_s": walls, "recipe_wall_ratio": walls["new"] / walls["baseline"]}
    print(result)
    write_json(o.out, {"meta": machine_info(), "args": vars(o), "runs": runs, **result})


if __name__ == "__main__":
    main()

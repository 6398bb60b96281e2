"""CLI start-up: this tree against a baseline tree, side by side in one run.

Launches `jaxrl-dist train` (as `python -m jaxrl_dist`) from each source tree
(`PYTHONPATH`) in turn, `--launches` times alternately after one untimed
warm-up launch per tree and trainer (which fills the persistent compile
cache, as any earlier run of the same config does), and reads per launch:
the seconds from the launch to the first update's record (imports, config,
the trainer's build, the first update with its cache loads; the sync and async
trainers' records carry their time), to the target
(`wall_to_target_s` is counted from the trainer's own start, so the launch
time is used instead), and to the process's exit. Medians per tree and
trainer, and the ratio new / baseline. The baseline is a checkout of an
earlier commit, e.g.

    git worktree add /tmp/base HEAD~1
    python bench/startup.py --baseline /tmp/base

Writes `bench/results/startup.json`.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["env=cartpole", "run.progress=false", "run.tensorboard=false"]
TARGET = ["run.target_return=475", "run.stop_at_target=true"]
TRAINERS = {  # the fused trainer runs its whole budget (it takes no target)
    "sync": ["trainer=sync", "backend=local", "scheduler=fixed", "scheduler.num_shards=4", *TARGET],
    "async": ["trainer=async", "backend=local", "asynchronous.actors=4", "asynchronous.batch_chunks=4", *TARGET],
    "fused": ["trainer=fused"],
}


def launch(tree: Path, args: list) -> dict:
    """One CLI run from `tree`: seconds from its launch to its first record, its target and its exit."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        subprocess.run([sys.executable, "-m", "jaxrl_dist", "train", *args, f"run.dir={tmp}"], cwd=tmp, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        exit_s = time.time() - t0
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    reached = [r for r in records if (r.get("return") or -1e9) >= 475]
    clock = "time" in records[0]  # the fused trainer's records carry no clock
    return {"first_record_s": records[0]["time"] - t0 if clock else None, "exit_s": exit_s,
            "target_s": reached[0]["time"] - t0 if clock and reached else None, "load_avg": os.getloadavg()[0]}


def medians(runs: list) -> dict:
    keys = ("first_record_s", "target_s", "exit_s")
    return {k: statistics.median(r[k] for r in runs) for k in keys if all(r[k] is not None for r in runs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", required=True, help="the baseline source tree (a checkout)")
    p.add_argument("--trainers", default="sync,async,fused")
    p.add_argument("--launches", type=int, default=5, help="timed launches per tree and trainer")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "startup.json"))
    o = p.parse_args()
    trees = {"baseline": Path(o.baseline), "new": ROOT}
    runs = {t: {name: [] for name in trees} for t in o.trainers.split(",")}
    for trainer in runs:
        args = COMMON + TRAINERS[trainer]
        for tree in trees.values():
            launch(tree, args)  # warm-up: the compile cache
        for i in range(o.launches):
            for name, tree in trees.items():
                runs[trainer][name].append(launch(tree, args))
                r = runs[trainer][name][-1]
                print(f"{trainer} {i} {name}: first record {r['first_record_s']} s, exit {r['exit_s']:.2f} s "
                      f"(load {r['load_avg']:.1f})", flush=True)
        write(o, runs)  # after every trainer: an interrupted run keeps what it measured


def write(o, runs: dict) -> None:
    done = {t: by_tree for t, by_tree in runs.items() if all(by_tree.values())}
    summary = {t: {name: medians(v) for name, v in by_tree.items()} for t, by_tree in done.items()}
    for s in summary.values():
        s["ratio"] = {k: s["new"][k] / s["baseline"][k] for k in s["new"]}
    print(json.dumps(summary, indent=1))
    write_json(o.out, {"meta": machine_info(), "args": vars(o), "runs": done, "summary": summary})


if __name__ == "__main__":
    main()

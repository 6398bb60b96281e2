"""Action masks hold, on every path, and the check can fail: jumanji's Knapsack-v1.

Through the CLI a user runs (`python -m jaxrl_dist train env=knapsack ...`):

- `fused`: the preset, `--seeds` seeds x `--steps` steps each, masked; every update's
  `illegal_actions` (what the envs received, judged by their own masks) summed, and each
  seed's final return against uniform random legal play (`jumanji_env.random_legal_return`,
  `--seeds` batches of 256 episodes), with 95% t-intervals over seeds.
- `control`: the same with `algo.action_mask=false` (short): its counter must not be 0.
- `ray`, `http`: the sync trainer, 2 shards a round, `--steps` steps, on a local Ray
  runtime and on one `jaxrl-dist serve` process on a loopback port; the counter summed.

    python bench/masks.py [--parts fused,control,ray,http] [--seeds 5] [--steps 1000000]
        [--out bench/results/masks.json]
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
from common import machine_info, print_table  # noqa: E402

from jaxrl_dist.tools.files import write_json  # noqa: E402

QUIET = ["run.progress=false", "run.tensorboard=false"]
TOKEN = "bench-masks-token"


def cli(args: list, run_dir: Path, timeout: float = 3600, env: dict | None = None) -> dict:
    """One `jaxrl-dist train` process: its summary, its records' illegal actions, its wall."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "jaxrl_dist", "train", "env=knapsack", *args, *QUIET,
                          f"run.dir={run_dir}"], capture_output=True, text=True, timeout=timeout,
                         env=dict(os.environ, **(env or {})))
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"summary": summary, "illegal_actions": int(sum(r["illegal_actions"] for r in records)),
            "no_legal_actions": int(sum(r.get("no_legal_actions", 0) for r in records)),
            "env_steps": summary["env_steps"], "wall_s": time.perf_counter() - t0}


def interval(xs: list) -> tuple:
    """Mean and 95% t-interval half-width over `xs`."""
    from scipy import stats

    n = len(xs)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(xs) / n ** 0.5
    return statistics.fmean(xs), half


def random_legal(seeds: int) -> list:
    from jaxrl_dist.envs.jumanji_env import random_legal_return
    import numpy as np

    return [float(np.nanmean(random_legal_return("Knapsack-v1", 256, seed))) for seed in range(seeds)]


def fused(args, tmp: Path) -> dict:
    run = cli(["trainer=fused", f"num_seeds={args.seeds}", f"algo.total_timesteps={args.steps}"], tmp / "fused")
    trained = run["summary"]["returns_per_seed"]
    baseline = random_legal(args.seeds)
    (m, h), (bm, bh) = interval(trained), interval(baseline)
    return {"illegal_actions": run["illegal_actions"], "no_legal_actions": run["no_legal_actions"],
            "env_steps": run["env_steps"] * args.seeds, "wall_s": run["wall_s"],
            "train_s": run["summary"]["train_seconds"], "returns_per_seed": trained, "return": [m, m - h, m + h],
            "random_legal_per_seed": baseline, "random_legal": [bm, bm - bh, bm + bh],
            "gain": m / bm - 1, "intervals_apart": bool(m - h > bm + bh)}


def control(args, tmp: Path) -> dict:
    run = cli(["trainer=fused", "algo.action_mask=false", "algo.total_timesteps=102400"], tmp / "control")
    return {k: run[k] for k in ("illegal_actions", "env_steps", "wall_s")}


def ray(args, tmp: Path) -> dict:
    run = cli(["trainer=sync", "backend=ray", "scheduler=fixed", "scheduler.num_shards=2", "backend.max_shards=2",
               f"algo.total_timesteps={args.steps}"], tmp / "ray")
    return {k: run[k] for k in ("illegal_actions", "no_legal_actions", "env_steps", "wall_s")}


def http(args, tmp: Path) -> dict:
    from jaxrl_dist.serve.local import LocalServer

    server = LocalServer("serve.allowed_envs=[Knapsack-v1]", token=TOKEN)
    try:
        run = cli(["trainer=sync", "backend=http", f"backend.urls=[{server.url}]", "scheduler=fixed",
                   "scheduler.num_shards=2", "backend.max_shards=2", f"algo.total_timesteps={args.steps}"],
                  tmp / "http", env={"JAXRL_DIST_TOKEN": TOKEN})
    finally:
        server.stop()
    return {k: run[k] for k in ("illegal_actions", "no_legal_actions", "env_steps", "wall_s")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="fused,control,ray,http")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--out", default="bench/results/masks.json")
    args = p.parse_args()
    parts = {"fused": fused, "control": control, "ray": ray, "http": http}
    result = {"machine": machine_info(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    with tempfile.TemporaryDirectory(prefix="bench-masks-") as tmp:
        for part in args.parts.split(","):
            result[part] = parts[part](args, Path(tmp))
            print(json.dumps({part: result[part]}), flush=True)
            write_json(Path(args.out), result)  # each part as it ends
    rows = [[k, f"{result[k]['env_steps']:,}", str(result[k]["illegal_actions"]), f"{result[k]['wall_s']:.0f}"]
            for k in parts if k in result]
    print_table("Knapsack-v1: illegal actions the envs received", ["path", "env steps", "illegal", "wall s"], rows)
    if "fused" in result:
        f = result["fused"]
        print(f"masked return {f['return'][0]:.2f} [{f['return'][1]:.2f}, {f['return'][2]:.2f}] vs random legal "
              f"{f['random_legal'][0]:.2f} [{f['random_legal'][1]:.2f}, {f['random_legal'][2]:.2f}]: "
              f"{100 * f['gain']:+.1f}%, intervals apart: {f['intervals_apart']}")


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    main()

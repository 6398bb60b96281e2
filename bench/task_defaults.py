"""Returns of env ids that have no preset, trained on the defaults their spaces pick.

Each id runs `jaxrl-dist train trainer=fused env.id=ID algo.total_timesteps=BUDGET`
(no other override: the `auto_<family>` preset supplies the rest), then
`jaxrl-dist eval RUN_DIR eval.episodes=16`. Writes JSON and a markdown table.

    python bench/task_defaults.py [--out bench/results/task_defaults.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from jaxrl_dist.envs import resolve_suite

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# (env id, budget in env steps per seed): budgets sized for a 2-core CPU
CASES = (
    ("MountainCar-v0", 500_000),
    ("MountainCarContinuous-v0", 500_000),
    ("LunarLander-v2", 500_000),
    ("Asterix-MinAtar", 1_000_000),
    ("SpaceInvaders-MinAtar", 1_000_000),
    ("Walker2d-v3", 300_000),
)


def cli(*args: str, timeout: float = 3600) -> str:
    from common import cli_command

    out = subprocess.run([*cli_command(), *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"jaxrl-dist {' '.join(args)}: {out.stderr[-2000:]}")
    return out.stdout


def run_case(env_id: str, budget: int, root: Path) -> dict:
    run = root / env_id
    t0 = time.perf_counter()
    cli("train", "trainer=fused", f"env.id={env_id}", f"algo.total_timesteps={budget}", f"run.dir={run}",
        "run.progress=false", "run.tensorboard=false")
    wall = time.perf_counter() - t0
    summary = json.loads((run / "summary.json").read_text())
    cli("eval", str(run), "eval.episodes=16")
    ev = json.loads((run / "eval.json").read_text())
    given = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())
    suite = yaml.safe_load((run / "config.yaml").read_text())["env"]["suite"]
    return {"env_id": env_id, "budget": budget, "suite": resolve_suite(env_id, suite),
            "preset": next((o.split("=", 1)[1] for o in given if o.startswith("env=")), None),
            "final_return": summary["final_return"], "eval_mean": ev["mean_return"],
            "eval_std": ev["std_return"], "episodes_ended": ev["episodes_ended"], "wall_s": wall,
            "sps": summary["sps"]}


def table(rows: list) -> str:
    lines = ["| env id | suite | defaults | budget (steps) | final return (training) | greedy eval (16 episodes) | wall (s) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ev = "-" if r["eval_mean"] is None else f"{r['eval_mean']:.1f} +- {r['eval_std']:.1f}"
        final = "-" if r["final_return"] is None else f"{r['final_return']:.1f}"
        lines.append(f"| {r['env_id']} | {r['suite']} | {r['preset']} | {r['budget']:,} | {final} | {ev} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench/results/task_defaults.json")
    opts = p.parse_args()
    from common import machine_info, write_json

    rows = []
    with tempfile.TemporaryDirectory(prefix="task_defaults-") as tmp:
        for env_id, budget in CASES:
            rows.append(run_case(env_id, budget, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    write_json(opts.out, {"meta": machine_info(), "rows": rows})
    print(table(rows))


if __name__ == "__main__":
    main()

"""Train brax's hopper with the fused trainer through the CLI's own path (the `env=brax_hopper`
preset composed by Hydra, then `trainers.runner.train`) and record its speed and return.

    python bench/brax_hopper.py [OVERRIDE ...] [--out bench/out/brax_hopper.json]

OVERRIDEs are `jaxrl-dist train` keys (`algo.total_timesteps=5e5`, `env.kwargs.pipeline=
generalized`, `num_seeds=4`; `env=brax_ant` runs another preset). Writes the machine, the settings, compile and training
seconds, env steps/s over all seeds (compile apart), the final return per seed and the
curve (env steps vs the return of each logged update) to JSON.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, read_jsonl, write_json  # noqa: E402

from jaxrl_dist import config as config_mod  # noqa: E402
from jaxrl_dist.cli.compose import load_config  # noqa: E402
from jaxrl_dist.trainers.runner import train  # noqa: E402

BASE = ["trainer=fused", "env=brax_hopper", "run.progress=false", "run.tensorboard=false",
        "run.checkpoint_every_s=0"]


def run(overrides, run_dir: str) -> dict:
    """The summary of one fused run of the preset with `overrides`, and its curve."""
    other_env = any(o.startswith("env=") for o in overrides)  # another preset replaces hopper's
    base = [o for o in BASE if not (other_env and o.startswith("env="))]
    cfg = load_config(base + list(overrides) + [f"run.dir={run_dir}"])
    summary = train(cfg, run_dir)
    rows = read_jsonl(Path(run_dir) / "metrics.jsonl")
    curve = {"env_steps": [r["env_steps"] for r in rows], "return": [r.get("return") for r in rows]}
    return {"settings": config_mod.to_dict(cfg), "summary": summary, "curve": curve}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*")
    p.add_argument("--out", default="bench/out/brax_hopper.json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = {"meta": machine_info(), "overrides": args.overrides, **run(args.overrides, tmp + "/run")}
    s = data["summary"]
    write_json(args.out, data)
    print(f"final return {s['final_return']:.1f} (per seed: "
          f"{', '.join(f'{x:.1f}' for x in s['returns_per_seed'])}) after {s['env_steps']:,} "
          f"steps per seed; {s['sps']:,.0f} env steps/s in all (compile {s['compile_seconds']:.1f} s "
          f"apart), training {s['train_seconds']:.1f} s; wrote {args.out}")
    return data


if __name__ == "__main__":
    main()

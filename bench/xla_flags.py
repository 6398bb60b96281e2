"""Fused PPO training throughput under each combination of the CPU XLA flags that
`jaxrl_dist.platform.configure_cpu` sets (host device count, concurrency scheduler).

    python bench/xla_flags.py [--quick] [--out bench/out/xla_flags.json]

Each setting runs in its own process, since XLA reads `XLA_FLAGS` once at start.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SETTINGS = {  # label -> XLA_FLAGS (explicit values, so configure_cpu adds nothing)
    "1 device, scheduler on (XLA default)":
        "--xla_force_host_platform_device_count=1 --xla_cpu_enable_concurrency_optimized_scheduler=true",
    "1 device, scheduler off":
        "--xla_force_host_platform_device_count=1 --xla_cpu_enable_concurrency_optimized_scheduler=false",
    "1 device per core, scheduler on":
        "--xla_force_host_platform_device_count={cores} --xla_cpu_enable_concurrency_optimized_scheduler=true",
    "1 device per core, scheduler off (configure_cpu)":
        "--xla_force_host_platform_device_count={cores} --xla_cpu_enable_concurrency_optimized_scheduler=false",
}
# (envs per seed, total_timesteps per seed, seeds): CartPole-v1 training runs
FULL = [(4, 500_000, 1), (1024, 2_097_152, 1), (4, 500_000, 16)]
QUICK = [(4, 8_192, 1), (4, 8_192, 4)]


def child(quick: bool) -> None:
    """Measure the training cases in this process; print the rows as JSON."""
    import fused as fb

    opts = fb.parse_args(["--quick"] if quick else [])
    opts.revision = {}
    rows = []
    for envs, steps, seeds in QUICK if quick else FULL:
        case = fb.Case("CartPole-v1", "gymnax", envs, steps, 0, seeds, ("train",))
        rows += fb.run_case(case, opts, set())
    print(json.dumps([{k: r[k] for k in ("num_envs", "num_seeds", "steps_per_s", "median_s",
                                         "compile_s", "other_cpu")} for r in rows]))


def run_setting(flags: str, quick: bool) -> list[dict]:
    env = {**os.environ, "XLA_FLAGS": flags.format(cores=os.cpu_count() or 1)}
    cmd = [sys.executable, __file__, "--child"] + (["--quick"] if quick else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench/out/xla_flags.json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.quick)
    from common import fmt, machine_info, markdown_table, print_table, write_json

    results = {label: run_setting(flags, args.quick) for label, flags in SETTINGS.items()}
    cases = [f"{r['num_envs']} envs x {r['num_seeds']} seeds" for r in next(iter(results.values()))]
    rows = [[label] + [f"{fmt(r['steps_per_s'])} ({r['other_cpu']:.0%})" for r in rs]
            for label, rs in results.items()]
    headers = ["XLA flags"] + [f"{c}, steps/s (others' CPU)" for c in cases]
    meta = {k: v for k, v in machine_info().items() if k != "xla_flags"}
    write_json(args.out, {"meta": meta, "settings": SETTINGS, "results": results})
    print_table("CartPole-v1 PPO training throughput by XLA flags", headers, rows)
    print(markdown_table(headers, rows))


if __name__ == "__main__":
    main()

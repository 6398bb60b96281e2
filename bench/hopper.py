"""Train envpool Hopper-v3 with the fused PPO trainer and record the learning curve.

    python bench/hopper.py [--total-timesteps 1e6] [--seed 0] [--num-seeds 1]
                           [--out bench/out/hopper.json] [--plot bench/out/hopper.png]

Writes the settings, machine, timings, the curve (env steps vs mean episode
return of each update, per seed) and the final return (episodes completed in
the last 10% of updates) to JSON, and a PNG when matplotlib is importable.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, write_json  # noqa: E402

from jaxrl_dist import config as config_mod  # noqa: E402
from jaxrl_dist.trainers import fused  # noqa: E402
from jaxrl_dist.config import AlgoConfig, Config, EnvConfig  # noqa: E402
from jaxrl_dist.envs import make_env  # noqa: E402

# Continuous-control PPO settings (CleanRL's MuJoCo defaults, batch 8 x 256).
SETTINGS = {
    "env": {"id": "Hopper-v3", "suite": "envpool", "num_envs": 8, "normalize_obs": True,
            "normalize_reward": True},
    "algo": {"num_steps": 256, "update_epochs": 10, "num_minibatches": 32, "lr": 3e-4,
             "anneal_lr": True, "ent_coef": 0.0, "gamma": 0.99, "gae_lambda": 0.95,
             "clip_eps": 0.2, "clip_vloss": True, "max_grad_norm": 0.5, "vf_coef": 0.5,
             "hidden_sizes": (64, 64), "activation": "tanh"},
}


def make_config(total_timesteps: int, seed: int, num_seeds: int) -> Config:
    env = EnvConfig(**SETTINGS["env"])
    algo = AlgoConfig(total_timesteps=total_timesteps, **SETTINGS["algo"])
    return config_mod.validate(Config(env=env, algo=algo, seed=seed, num_seeds=num_seeds))


def train(cfg: Config, log_chunks: int):
    """Run training chunk by chunk; returns (metrics as numpy [U, S], timings)."""
    env = make_env(cfg.env.id, cfg.env.num_envs * cfg.num_seeds, cfg.env.suite, cfg.seed)
    setup = fused.make_setup(cfg, env.spec)
    updates = setup.derived.num_updates
    k = fused.chunk_size(updates, log_chunks)
    runner = fused.init_runner(setup, env, cfg.seed)
    start = time.perf_counter()
    chunk = fused.make_train_chunk(setup, env, k).lower(runner).compile()
    compile_s = time.perf_counter() - start
    parts, start = [], time.perf_counter()
    for i in range(updates // k):
        runner, metrics = chunk(runner)
        parts.append({name: np.asarray(v) for name, v in metrics.items()})
        report_progress(parts, (i + 1) * k, updates, setup.derived.batch_size, start)
    train_s = time.perf_counter() - start
    metrics = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    return metrics, {"compile_s": compile_s, "train_s": train_s, "chunk_updates": k,
                     "num_updates": updates, "batch_size": setup.derived.batch_size}


def report_progress(parts, done: int, total: int, batch: int, start: float) -> None:
    recent = parts[-1]
    count = recent["episodes"].sum()
    ret = recent["episode_return_sum"].sum() / count if count else float("nan")
    elapsed = time.perf_counter() - start
    print(f"update {done}/{total}  steps {done * batch:,}  return {ret:8.1f}  "
          f"{done * batch / elapsed:,.0f} steps/s/seed", flush=True)


def final_return(metrics: dict, fraction: float = 0.1) -> np.ndarray:
    """Per seed: mean return of the episodes completed in the last `fraction` of updates."""
    tail = max(1, int(np.ceil(metrics["episodes"].shape[0] * fraction)))
    ret = metrics["episode_return_sum"][-tail:].sum(0)
    count = metrics["episodes"][-tail:].sum(0)
    return np.where(count > 0, ret / np.maximum(count, 1), np.nan)


def curve(metrics: dict, batch: int) -> dict:
    """Env steps (per seed) after each update and, per seed, that update's mean episode
    return (None when no episode ended) and the sum and count it comes from."""
    ret, count = metrics["episode_return_sum"], metrics["episodes"]
    mean = np.where(count > 0, ret / np.maximum(count, 1), np.nan)
    steps = (np.arange(ret.shape[0]) + 1) * batch
    return {"env_steps": steps.tolist(),
            "return_mean": [[None if np.isnan(x) else float(x) for x in row] for row in mean.T],
            "return_sum": ret.T.tolist(), "episodes": count.T.tolist()}


def smoothed(metrics_curve: dict, window: int = 10) -> list:
    """Per seed: mean return of the episodes of the last `window` updates (pooled, not averaged)."""
    ret, count = (np.asarray(metrics_curve[k], dtype=float) for k in ("return_sum", "episodes"))
    kernel = np.ones(window)
    rows = []
    for r, c in zip(ret, count):
        r_sum, c_sum = np.convolve(r, kernel)[:len(r)], np.convolve(c, kernel)[:len(c)]
        rows.append(np.where(c_sum > 0, r_sum / np.maximum(c_sum, 1), np.nan))
    return rows


def plot(path: str, data: dict) -> bool:
    """Learning curve PNG; skipped (False) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = np.asarray(data["curve"]["env_steps"])
    for s, (row, smooth) in enumerate(zip(data["curve"]["return_mean"], smoothed(data["curve"]))):
        line, = ax.plot(steps, np.array(row, dtype=float), lw=0.6, alpha=0.35)
        ax.plot(steps, smooth, lw=1.8, color=line.get_color(), label=f"seed index {s}, 10-update mean")
    ax.axhline(1500, color="grey", ls="--", lw=0.8)
    ax.set(xlabel="env steps (per seed)", ylabel="mean episode return",
           title=f"{data['env_id']}, fused PPO, final return {np.nanmean(data['final_return']):.0f}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return True


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-timesteps", type=float, default=1e6, help="per seed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-seeds", type=int, default=1)
    p.add_argument("--log-chunks", type=int, default=50)
    p.add_argument("--out", default="bench/out/hopper.json")
    p.add_argument("--plot", default="bench/out/hopper.png", help="PNG path ('' for none)")
    p.add_argument("--replot", metavar="JSON", help="only redraw the plot of an existing JSON")
    args = p.parse_args(argv)
    if args.replot:
        return plot(args.plot, json.loads(Path(args.replot).read_text()))
    cfg = make_config(int(args.total_timesteps), args.seed, args.num_seeds)
    metrics, timing = train(cfg, args.log_chunks)
    data = {"meta": machine_info(), "env_id": cfg.env.id, "seed": cfg.seed,
            "num_seeds": cfg.num_seeds, "total_timesteps": cfg.algo.total_timesteps,
            "settings": config_mod.to_dict(cfg), **timing,
            "final_return": final_return(metrics).tolist(),
            "curve": curve(metrics, timing["batch_size"])}
    write_json(args.out, data)
    plotted = bool(args.plot) and plot(args.plot, data)
    print(f"final return (last 10% of updates) per seed: "
          f"{', '.join(f'{x:.1f}' for x in data['final_return'])}; "
          f"compile {timing['compile_s']:.1f} s, train {timing['train_s']:.1f} s")
    print(f"wrote {args.out}" + (f" and {args.plot}" if plotted else " (no matplotlib: no plot)"))
    return data


if __name__ == "__main__":
    main()

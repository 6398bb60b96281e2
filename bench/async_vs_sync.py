"""The async trainer against the sync round trainer, with and without stragglers.

Every run is on the local backend with a learner batch of 4 shards (chunks):
`sync` is the round trainer with `scheduler=fixed scheduler.num_shards=4`;
`async_sN` is `trainer=async asynchronous.max_staleness=N` starting with 4 actors,
the balancer free to run 1..8. `stragglers` sets `backend.slowdown=3
backend.slow_every=4`: every 4th slot's shards take 3 times as long (its
machine is slower; the wait is a sleep, so the CPUs it leaves idle are there
for the other actors, as they would be on other machines).

CartPole runs a fixed budget past the target (not stopping there), so that
throughput is measured over a couple of seconds of steady state, with the
balancer's search for its actor count inside it, rather than over the fraction
of a second the target takes. Per run (priced as `cost=aws_lambda`, whose
instances stay warm between chunks, so the modeled clock follows compute
rather than start-ups): env steps/s after warm-up (the env steps sampled
between the 4th and the last update, over the measured seconds between them),
the learner's median seconds per update, measured wall
time to the target (from the process's start: compiles included, the
persistent compile cache warmed by an untimed run of each mode first), the
measured training time to the target (from the end of the first update, so
without the start-up both trainers share), final
return, the same two on the modeled cloud clock (actors on their own
instances, their measured compute times), staleness (mean and max of learned chunks' lag), dropped chunks, and
the mean number of active actors; mean and std over seeds, and the ratios
async/sync of the same task and setting.

    python bench/async_vs_sync.py                          # CartPole-v1 (gymnax, envpool), Pong-v5 (short), 3 seeds
    python bench/async_vs_sync.py --tasks cartpole --seeds 1

Writes `bench/results/async_vs_sync.{json,md}` and `bench/results/async_vs_sync.png`.

`--regime remote` runs the same comparison over remote actors instead
(`async_remote.py`): `jaxrl-dist serve` instances behind loopback latency
proxies, the real CLI on `backend=http`; it writes `bench/results/async_remote.*`.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fmt, machine_info, markdown_table, print_table, read_jsonl, write_json  # noqa: E402

from jaxrl_dist.platform import configure_cpu  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
COMMON = ["backend=local", "cost=aws_lambda", "run.progress=false", "run.tensorboard=false", "scheduler=fixed",
          "scheduler.num_shards=4", "asynchronous.batch_chunks=4", "asynchronous.actors=4", "asynchronous.max_actors=8"]
MODES = {
    "sync": ["trainer=sync"],
    "async_s1": ["trainer=async", "asynchronous.max_staleness=1"],
    "async_s2": ["trainer=async", "asynchronous.max_staleness=2"],
    "async_s4": ["trainer=async", "asynchronous.max_staleness=4"],
}
SETTINGS = {"homogeneous": [], "stragglers": ["backend.slowdown=3", "backend.slow_every=4"]}
TASKS = {
    "cartpole": {"overrides": ["env=cartpole", "run.target_return=475", "algo.total_timesteps=300000"],
                 "budget": "3e5 steps (146 updates), target 475"},
    # the same task on envpool's C++ CartPole: a shard steps its envs through XLA
    # custom calls, several times the rollout cost of gymnax's, so actors matter;
    # one envpool thread a pool (envpool's own choice, 2 here, was 20% slower in both
    # trainers: the pools' threads contend for 2 cores)
    "cartpole_envpool": {"overrides": ["env=cartpole", "env.suite=envpool", "env.num_threads=1",
                                       "run.target_return=475", "algo.total_timesteps=300000"],
                         "budget": "3e5 steps (146 updates), target 475"},
    # short: 12 updates of 4 shards x 4 envs x 32 steps; throughput and staleness only
    "pong": {"overrides": ["env=pong", "backend.envs_per_shard=4", "algo.num_steps=32",
                           "algo.num_minibatches=4", "algo.total_timesteps=6144"],
             "budget": "shortened: 6144 steps (12 updates); no target"},
}
WARMUP_UPDATES = 4


def throughput(records: list, clock: str = "time") -> float | None:
    """Env steps per second between update `WARMUP_UPDATES` and the last, on the
    measured clock (`time`) or the modeled one (`cum_modeled_s`)."""
    if len(records) <= WARMUP_UPDATES:
        return None
    a, b = records[WARMUP_UPDATES - 1], records[-1]
    return (b["env_steps"] - a["env_steps"]) / max(b[clock] - a[clock], 1e-9)


def run_one(task: str, mode: str, setting: str, seed: int, root: Path, extra=()) -> dict:
    from jaxrl_dist.cli.compose import load_config
    from jaxrl_dist.trainers.runner import train

    run_dir = root / task / setting / mode / f"seed{seed}"
    cfg = load_config(COMMON + TASKS[task]["overrides"] + MODES[mode] + SETTINGS[setting]
                      + [f"seed={seed}", f"run.dir={run_dir}"] + list(extra))
    with contextlib.redirect_stdout(io.StringIO()):
        summary = train(cfg)
    records = read_jsonl(run_dir / "metrics.jsonl")
    learned = [r for r in records if "staleness_mean" in r]
    hit = next((r for r in records if (r.get("return_recent") or -1e9) >= (cfg.run.target_return or 1e9)), None)
    return {"seed": seed, "sps": throughput(records), "wall_to_target_s": summary.get("wall_to_target_s"),
            "train_to_target_s": hit and hit["time"] - records[0]["time"],
            "modeled_sps": throughput(records, "cum_modeled_s"),
            "time_to_target_s": summary.get("time_to_target_s"),
            "final_return": summary.get("final_return"), "updates": len(records),
            "env_steps": summary.get("env_steps"), "wall_seconds": summary.get("wall_seconds"),
            "staleness_mean": statistics.fmean(r["staleness_mean"] for r in learned) if learned else 0.0,
            "staleness_max": max((r["staleness_max"] for r in learned), default=0),
            "dropped": summary.get("dropped_chunks", 0),
            "actors_mean": statistics.fmean(r.get("actors_active", 4) for r in records),
            "learn_ms": 1e3 * statistics.median(r["learn_s"] for r in records[WARMUP_UPDATES:] or records),
            "staleness_histogram": summary.get("staleness_histogram")}


def stats(values: list) -> dict:
    xs = [v for v in values if v is not None]
    return {"mean": statistics.fmean(xs) if xs else None,
            "std": statistics.stdev(xs) if len(xs) > 1 else 0.0 if xs else None, "n": len(xs)}


METRICS = ("sps", "wall_to_target_s", "train_to_target_s", "modeled_sps", "time_to_target_s",
           "final_return", "staleness_mean", "staleness_max", "dropped", "actors_mean", "updates",
           "learn_ms")


def ratios(agg: dict) -> dict:
    """async/sync of each task and setting: throughput, and wall time to target."""
    out = {}
    for (task, setting, mode), a in agg.items():
        base = agg.get((task, setting, "sync"))
        if mode == "sync" or base is None:
            continue
        for k in ("sps", "wall_to_target_s", "train_to_target_s", "modeled_sps", "time_to_target_s"):
            x, y = a[k]["mean"], base[k]["mean"]
            if x is not None and y:
                out[f"{task}/{setting}/{mode}/{k}_vs_sync"] = x / y
    return out


def cell(s: dict, digits: int = 3) -> str:
    return "—" if s["mean"] is None else f"{fmt(s['mean'], digits)} ± {fmt(s['std'], 2)}"


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({k[0] for k in runs})
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        keys = [k for k in runs if k[0] == task]
        labels = [f"{k[1][:5]}\n{k[2]}" for k in keys]
        means = [statistics.fmean([r["sps"] for r in runs[k] if r["sps"]] or [0]) for k in keys]
        colors = ["tab:gray" if k[2] == "sync" else "tab:blue" for k in keys]
        ax.bar(range(len(keys)), means, color=colors)
        ax.set_xticks(range(len(keys)), labels, fontsize="x-small")
        ax.set(ylabel="env steps/s after warm-up", title=f"{task}: throughput (gray: sync)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--regime", choices=("local", "remote"), default="local")
    known, rest = pre.parse_known_args()
    if known.regime == "remote":
        import async_remote

        return async_remote.main(rest)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--regime", choices=("local", "remote"), default="local",
                   help="remote: serve instances behind latency proxies, the CLI on backend=http")
    p.add_argument("--tasks", default="cartpole,cartpole_envpool,pong")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS / "async_vs_sync"))
    args = p.parse_args()
    configure_cpu()
    write_outputs(args, run_matrix(args))


def run_matrix(args) -> dict:
    """Every task x setting x seed x mode run, modes interleaved seed by seed."""
    runs, root = {}, Path(tempfile.mkdtemp(prefix="async-vs-sync-"))
    for task in args.tasks.split(","):
        for mode in args.modes.split(","):  # untimed: fills the persistent compile cache
            run_one(task, mode, "homogeneous", 99, root / "warm", ["run.max_rounds=3", "run.stop_at_target=false"])
        for setting in args.settings.split(","):
            # modes interleaved seed by seed: a slow spell of the machine hits every mode alike
            for seed in range(args.seeds):
                for mode in args.modes.split(","):
                    t0 = time.perf_counter()
                    r = run_one(task, mode, setting, seed, root)
                    runs.setdefault((task, setting, mode), []).append(r)
                    print(f"{task} {setting} {mode} seed {seed}: {fmt(r['sps'])} steps/s, "
                          f"to target {fmt(r['wall_to_target_s'])} s, return {fmt(r['final_return'])}, "
                          f"staleness {fmt(r['staleness_mean'])}/{r['staleness_max']}, "
                          f"dropped {r['dropped']} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return runs


def write_outputs(args, runs: dict) -> None:
    """The table (printed and markdown), the JSON with every run, the ratios and the plot."""
    agg = {k: {m: stats([r[m] for r in rs]) for m in METRICS} for k, rs in runs.items()}
    rows = [[t, s, m, cell(a["sps"], 4), cell(a["wall_to_target_s"]), cell(a["train_to_target_s"]),
             cell(a["modeled_sps"], 4),
             cell(a["time_to_target_s"]), cell(a["final_return"]),
             f"{fmt(a['staleness_mean']['mean'])} / {fmt(a['staleness_max']['mean'])}",
             cell(a["dropped"]), cell(a["actors_mean"]), cell(a["learn_ms"])] for (t, s, m), a in agg.items()]
    headers = ["task", "setting", "mode", "env steps/s", "wall to target (s)", "training to target (s)",
               "modeled env steps/s",
               "modeled time to target (s)", "final return",
               "staleness mean / max", "dropped chunks", "actors", "update (ms, median)"]
    print_table("async against sync", headers, rows)
    rat = ratios(agg)
    for k, v in rat.items():
        print(f"{k}: {v:.3f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    budgets = {t: TASKS[t]["budget"] for t in args.tasks.split(",")}
    write_json(out.with_suffix(".json"), {
        "machine": machine_info(), "seeds": args.seeds, "budgets": budgets, "ratios": rat,
        "aggregate": {"/".join(k): v for k, v in agg.items()},
        "runs": {"/".join(k): v for k, v in runs.items()}})
    md = markdown_table(headers, rows) + "\n\nBudgets: " + "; ".join(f"{t}: {b}" for t, b in budgets.items())
    md += "\n\n" + "\n".join(f"- {k}: {v:.3f}" for k, v in rat.items()) + "\n"
    out.with_suffix(".md").write_text(md)
    plot(runs, out.with_suffix(".png"))

if __name__ == "__main__":
    main()

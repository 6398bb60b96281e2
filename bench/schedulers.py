"""Schedulers compared on real training runs, priced by the same cost model.

For each task and policy, `--seeds` runs of the round trainer on the local
backend (every policy's seed `s` starts from the same params and keys), each
stopping at the task's target return (`run.stop_at_target`) or its step
budget. Policies:

- `max`: always `backend.max_shards` (32) shards; `fixed8`: 8; `adapt`
  (reward ratio); `ramp`; `learned`: the scheduler preset for the task
  (`scheduler=learned`), all priced as serverless functions (`cost=azure_aci`);
- `cluster`: `max` on the server-based cluster (`cost=vm_cluster`): 32 vCPUs
  billed for their whole life, start-up included, so using them all is its
  natural schedule;
- `learned_lambda`, `learned_cloudrun` (not in the default set): `learned`
  priced as `aws_lambda` or `gcp_cloud_run`, whose instances stay warm between
  rounds (the schedule does not depend on the prices).

Per policy (mean and std over seeds): modeled time to target, measured wall
time to target, dollars to target, final return, shards per round; and the
targets' ratios: learned against max (cost and time to target), serverless
against the cluster. The modeled clock and dollars come from the cost preset
(`configs/cost/`); measured wall time is this machine's.

    python bench/schedulers.py                       # CartPole-v1, 3 seeds
    python bench/schedulers.py --tasks cartpole,hopper --seeds 3
    python bench/schedulers.py --quick               # a smoke run
    python bench/schedulers.py --tasks cartpole,hopper --policies learned_lambda,learned_cloudrun,cluster \
        --out bench/results/schedulers_serverless    # the other serverless presets against the cluster

Writes `bench/results/schedulers.{json,md}` and PNGs under
`bench/results/schedulers/`.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fmt, machine_info, markdown_table, print_table, write_json  # noqa: E402

from jaxrl_dist.platform import configure_cpu  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

POLICIES = {
    "max": ["scheduler=max"],
    "fixed8": ["scheduler=fixed", "scheduler.num_shards=8"],
    "adapt": ["scheduler=adapt"],
    "ramp": ["scheduler=ramp", "scheduler.step=2", "scheduler.every=1"],
    "learned": ["scheduler=learned"],
    "cluster": ["scheduler=max", "cost=vm_cluster"],
    # the same learned training priced on the other serverless presets (warm instances kept)
    "learned_lambda": ["scheduler=learned", "cost=aws_lambda"],
    "learned_cloudrun": ["scheduler=learned", "cost=gcp_cloud_run"],
}

# Each task's settings; `budget` says whether it is the task's full budget on this machine.
TASKS = {
    "cartpole": {"overrides": ["env=cartpole", "run.target_return=475"], "budget": "full (5e5 steps)"},
    "hopper": {"overrides": ["env=hopper", "run.target_return=1000"], "also": [300.0],
               "budget": "full (1e6 steps), target 1000"},
    "spaceinvaders": {"overrides": ["env=spaceinvaders", "algo.total_timesteps=100000",
                                    "run.target_return=250", "backend.envs_per_shard=2",
                                    "algo.minibatch_size=64"],
                      "budget": "shortened: 1e5 steps, target 250"},
}

METRICS = ("time_to_target_s", "wall_to_target_s", "cost_to_target_usd", "final_return",
           "cost_usd", "modeled_seconds", "mean_shards", "rounds")


def run_one(task: str, policy: str, seed: int, root: Path, extra: list) -> dict:
    """One training run; its summary plus the shards it ran each round."""
    from jaxrl_dist.cli import load_config
    from jaxrl_dist.trainers.runner import train

    run_dir = root / task / policy / f"seed{seed}"
    cfg = load_config(["backend=local", "run.stop_at_target=true", "run.progress=false",
                       "run.tensorboard=false", f"seed={seed}", f"run.dir={run_dir}"]
                      + TASKS[task]["overrides"] + POLICIES[policy] + extra)
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # each run's summary table; the bench prints its own
        summary = train(cfg)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    shards = [r["num_shards"] for r in records]
    out = {k: summary.get(k) for k in METRICS if k in summary}
    for t in TASKS[task].get("also", []):
        out.update(reach(records, t))
    out.update({"seed": seed, "process_s": time.perf_counter() - t0, "shards": shards,
                "mean_shards": statistics.fmean(shards), "rounds": len(shards),
                "reached": summary.get("time_to_target_s") is not None, "run_dir": str(run_dir)})
    return out


def reach(records: list, target: float) -> dict:
    """Modeled time, wall time and dollars when the recent return first reached `target`
    (a lower target than the run's, read from its records; null if never)."""
    hit = next((r for r in records if (r.get("return_recent") or -float("inf")) >= target), None)
    keys = {"cum_modeled_s": "time_to_{}_s", "cum_wall_s": "wall_to_{}_s", "cum_cost_usd": "cost_to_{}_usd"}
    return {name.format(int(target)): hit and hit[k] for k, name in keys.items()}


def stats(values: list) -> dict:
    """Mean and std of the non-null values, and how many there were."""
    xs = [v for v in values if v is not None]
    return {"mean": statistics.fmean(xs) if xs else None,
            "std": statistics.stdev(xs) if len(xs) > 1 else 0.0 if xs else None, "n": len(xs)}


def aggregate(runs: list) -> dict:
    keys = [k for k in runs[0] if k in METRICS or k.startswith(("time_to_", "wall_to_", "cost_to_"))]
    return {k: stats([r.get(k) for r in runs]) for k in keys}


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def targets(agg: dict, also=()) -> dict:
    """The issue's ratios from the per-policy means (to target: reached runs only):
    learned against max, and every serverless policy against the cluster."""
    m = lambda p, k: (agg.get(p) or {}).get(k, {}).get("mean")  # noqa: E731
    out = {}
    for sfx in ["target", *(str(int(t)) for t in also)]:
        cost, time_ = (f"cost_to_{sfx}_usd", f"time_to_{sfx}_s")
        out[f"learned_cost_vs_max_to_{sfx}"] = ratio(m("learned", cost), m("max", cost))
        out[f"learned_time_vs_max_to_{sfx}"] = ratio(m("learned", time_), m("max", time_))
        for p in agg:
            if p != "cluster":
                out[f"{p}_cost_vs_cluster_to_{sfx}"] = ratio(m(p, cost), m("cluster", cost))
    for p in agg:
        if p != "cluster":
            out[f"{p}_total_cost_vs_cluster"] = ratio(m(p, "cost_usd"), m("cluster", "cost_usd"))
    return {k: v for k, v in out.items() if v is not None}


def cell(s: dict, digits: int = 3, money: bool = False) -> str:
    if s["mean"] is None:
        return "not reached"
    text = f"{'$' if money else ''}{fmt(s['mean'], digits)} ± {fmt(s['std'], 2)}"
    return text


def table_rows(task: str, agg: dict, runs: dict, seeds: int, also=()) -> list:
    """One row per policy at the run's target, then one per policy at each lower target."""
    rows = []
    for t in [None, *(int(x) for x in also)]:
        sfx = ("target_s", "target_s", "target_usd") if t is None else (f"{t}_s", f"{t}_s", f"{t}_usd")
        label = task if t is None else f"{task} (to {t})"
        for policy, a in agg.items():
            reached = a[f"time_to_{sfx[0]}"]["n"]
            rows.append([label, policy, f"{reached}/{seeds}", cell(a[f"time_to_{sfx[0]}"]),
                         cell(a[f"wall_to_{sfx[1]}"]), cell(a[f"cost_to_{sfx[2]}"], money=True),
                         cell(a["final_return"]), cell(a["mean_shards"]), cell(a["rounds"])])
    return rows


HEADERS = ["task", "policy", "reached", "modeled time to target (s)", "wall to target (s)",
           "cost to target", "final return", "shards/round", "rounds"]


def plot(task: str, runs: dict, out_dir: Path) -> list:
    """Shards per round (every seed) and cost against time to target (every run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, (policy, rs) in enumerate(runs.items()):
        color = plt.get_cmap("tab10")(i)
        first_hit = next((j for j, r in enumerate(rs) if r["reached"]), None)
        for j, r in enumerate(rs):
            ax1.plot(range(1, len(r["shards"]) + 1), r["shards"], color=color, alpha=0.8,
                     label=policy if j == 0 else None, drawstyle="steps-mid")
            if r["reached"]:
                ax2.scatter(r["time_to_target_s"], r["cost_to_target_usd"], color=color,
                            label=policy if j == first_hit else None)
    ax1.set(xlabel="round", ylabel="shards", title=f"{task}: shards per round")
    ax2.set(xlabel="modeled time to target (s)", ylabel="dollars to target", xscale="log",
            yscale="log", title=f"{task}: cost against time to target")
    for ax in (ax1, ax2):
        ax.legend(fontsize="small")
    fig.tight_layout()
    path = out_dir / f"{task}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def report_plots(task: str, runs: dict, out_dir: Path) -> list:
    """`jaxrl-dist report`'s figures for every policy's seed-0 run."""
    from jaxrl_dist import report

    loaded = {p: report.load_run(rs[0]["run_dir"]).records for p, rs in runs.items() if rs}
    return report.plot_runs(loaded, out_dir / task)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="cartpole")
    ap.add_argument("--policies", default="max,fixed8,adapt,ramp,learned,cluster")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one seed, a tiny budget")
    ap.add_argument("--out", default=str(RESULTS / "schedulers"))
    ap.add_argument("overrides", nargs="*", help="extra KEY=VALUE for every run")
    args = ap.parse_args()
    configure_cpu()
    extra = list(args.overrides) + (["algo.total_timesteps=20480"] if args.quick else [])
    seeds = 1 if args.quick else args.seeds
    out = {"machine": machine_info(), "seeds": seeds, "extra_overrides": extra, "tasks": {}}
    rows, out_path = [], Path(args.out)
    with tempfile.TemporaryDirectory(prefix="sched-bench-") as tmp:
        for task in args.tasks.split(","):
            runs = {p: [run_one(task, p, s, Path(tmp), extra) for s in range(seeds)]
                    for p in args.policies.split(",")}
            agg = {p: aggregate(rs) for p, rs in runs.items()}
            pngs = plot(task, runs, out_path) + report_plots(task, runs, out_path)
            out["tasks"][task] = {"budget": TASKS[task]["budget"], "overrides": TASKS[task]["overrides"],
                                  "policies": {p: {"overrides": POLICIES[p], "runs": runs[p], "summary": agg[p]}
                                               for p in runs},
                                  "targets": targets(agg, TASKS[task].get("also", ())),
                                  "plots": [str(p) for p in pngs]}
            also = TASKS[task].get("also", ())
            rows += table_rows(task, agg, runs, seeds, also)
            print_table(f"{task} ({TASKS[task]['budget']})", HEADERS, table_rows(task, agg, runs, seeds, also))
            print(json.dumps(out["tasks"][task]["targets"], indent=1))
    write_json(out_path.with_suffix(".json"), out)
    md = [markdown_table(HEADERS, rows), ""]
    for task, t in out["tasks"].items():
        md.append(f"- {task} ({t['budget']}): " + ", ".join(
            f"{k} {fmt(v) if v is not None else '-'}" for k, v in t["targets"].items()))
    out_path.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(f"wrote {out_path.with_suffix('.json')}, {out_path.with_suffix('.md')}")


if __name__ == "__main__":
    main()

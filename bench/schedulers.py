"""Schedulers compared on real training runs, priced by the same cost model.

For each task, variant and policy, `--seeds` runs of the round trainer on the
local backend (every policy's seed `s` starts from the same params and keys).

Policies (`--policies`, comma-separated):

- `fixed1` ... `fixed32`: the same count every round, for every n in
  {1, 2, 4, 8, 16, 32}; per task and variant the best of them in hindsight is
  the *oracle* (dollars and modeled seconds to target without a limit, final
  return under one); `fixedN` adds any other count N beside them (it joins the
  oracle's candidates);
- `max`: always `backend.max_shards` (32); `adapt`: the reward ratio; `ramp`;
- `learned`: the task's own scheduler file (`--learned TASK=PATH`, else the
  preset shipped for the task's env id, else the generalist file, as
  `scheduler=learned` loads the default); `generalist`: one scheduler file for
  every task (`--generalist PATH`, default the shipped `default` preset, else
  the CartPole-v1 preset as a stand-in);
- `cluster`: `max` on the server-based cluster (`cost=vm_cluster`);
  `learned_lambda`, `learned_cloudrun`: `learned` priced as `aws_lambda` or
  `gcp_cloud_run`. All others are priced as `cost=azure_aci`.

Variants (`--variants`): `none` (stop at the target or the step budget),
`budget` (`run.budget_usd` = `--budget-frac` x the dollars the dollar oracle
of `none` spent to reach the target) and `deadline` (`run.deadline_s` =
`--deadline-frac` x the time oracle's modeled seconds to target). Under a
limit the runs do not stop at the target: every one runs until the limit
(`stop_reason` in its summary says so) and the table reports its final return.

Per cell: reached k/n, dollars and modeled seconds to target (mean and 95%
t-interval over the seeds that reached it), final return (the last round's
recent return, as the target rule reads it; mean and interval over all seeds), shards per round, rounds, runs stopped at the limit. Ratios:
`learned` and `generalist` against the oracle, and whether either beats every
fixed count beyond the intervals.

    python bench/schedulers.py                           # CartPole and Acrobot, 3 variants, 3 seeds
    python bench/schedulers.py --resume                  # continue an interrupted matrix
    python bench/schedulers.py --generalist PATH --learned acrobot=PATH2 --resume
                                                         # only the runs whose scheduler file changed run again
    python bench/schedulers.py --quick                   # a smoke run (1 seed, tiny step budget, temp dir)
    python bench/schedulers.py --tasks cartpole --variants deadline --seeds 8 \
        --limits-from bench/results/schedulers_progress.json --out OUT
                                                         # one limit variant alone, more seeds, the same limit
    python bench/schedulers.py --tasks cartpole,hopper --policies max,fixed8,adapt,ramp,learned,cluster \
        --variants none --out bench/results/schedulers_hopper

Writes `OUT.{json,md}`, one JSON per run under `OUT/runs/` (written after every
run; `--resume` reuses those, and the runs recorded in OUT.json, whose overrides
and scheduler file match) and PNGs
under `OUT/`: `shards_TASK.png` (shards per round, every policy, every variant)
and `budget_TASK.png` (the learned schedulers' choice against `budget_left`).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fmt, machine_info, markdown_table, print_table, write_json

from jaxrl_dist.platform import configure_cpu

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parents[1]
FIXED = (1, 2, 4, 8, 16, 32)
LEARNED = ("learned", "generalist")  # the policies that read a scheduler file

POLICIES = {
    **{f"fixed{n}": ["scheduler=fixed", f"scheduler.num_shards={n}"] for n in FIXED},
    "max": ["scheduler=max"],
    "adapt": ["scheduler=adapt"],
    "ramp": ["scheduler=ramp", "scheduler.step=2", "scheduler.every=1"],
    "learned": ["scheduler=learned"],
    "generalist": ["scheduler=learned"],
    "cluster": ["scheduler=max", "cost=vm_cluster"],
    # the same learned training priced on the other serverless presets (warm instances kept)
    "learned_lambda": ["scheduler=learned", "cost=aws_lambda"],
    "learned_cloudrun": ["scheduler=learned", "cost=gcp_cloud_run"],
}


def policy_overrides(policy: str):
    """A policy's config overrides, or None for an unknown name; `fixedN` runs any count N
    (the table's fixed counts are FIXED; others can be added beside them)."""
    m = re.fullmatch(r"fixed([1-9][0-9]*)", policy)
    return ["scheduler=fixed", f"scheduler.num_shards={m[1]}"] if m else POLICIES.get(policy)


DEFAULT_POLICIES = [f"fixed{n}" for n in FIXED] + ["max", "adapt", "learned", "generalist"]

# Each task's settings; `budget` says whether it is the task's full step budget on this machine.
TASKS = {
    "cartpole": {"overrides": ["env=cartpole", "run.target_return=475"], "budget": "full (5e5 steps), target 475"},
    # -100: the env preset's target, the usual "solved" line for Acrobot-v1 (returns run from -500 to about -60)
    "acrobot": {"overrides": ["env=acrobot", "run.target_return=-100"], "budget": "full (5e5 steps), target -100"},
    "hopper": {"overrides": ["env=hopper", "run.target_return=1000"], "also": [300.0],
               "budget": "full (1e6 steps), target 1000"},
    "spaceinvaders": {"overrides": ["env=spaceinvaders", "algo.total_timesteps=100000",
                                    "run.target_return=250", "backend.envs_per_shard=2",
                                    "algo.minibatch_size=64"],
                      "budget": "shortened: 1e5 steps, target 250"},
}
VARIANTS = ("none", "budget", "deadline")
STOP = {"budget": "budget_usd", "deadline": "deadline_s"}  # the stop_reason each limit gives

METRICS = ("time_to_target_s", "wall_to_target_s", "cost_to_target_usd", "final_return",
           "cost_usd", "modeled_seconds", "mean_shards", "rounds")


def task_env_id(task: str) -> str:
    from jaxrl_dist.cli.compose import load_config

    return load_config(TASKS[task]["overrides"]).env.id


def scheduler_file(policy: str, task: str, files: dict):
    """`(path, note)` of the scheduler file `policy` reads on `task`, or `(None, None)`.
    `learned` without `--learned TASK=PATH` reads the preset shipped for the env id, else
    the generalist file (as `scheduler=learned` without a path loads the default)."""
    from jaxrl_dist.scheduling.learned import preset_path

    if policy == "generalist":
        path = Path(files["generalist"])
        stand_in = path.resolve() == preset_path(STAND_IN).resolve()
        return path, f"stand-in: the {STAND_IN} preset" if stand_in else "the generalist file (--generalist)"
    if policy not in ("learned", "learned_lambda", "learned_cloudrun"):
        return None, None
    if task in files["learned"]:
        return Path(files["learned"][task]), "per-task file (--learned)"
    env_id = task_env_id(task)
    if preset_path(env_id).is_file():
        return preset_path(env_id), f"the {env_id} preset"
    return Path(files["generalist"]), f"no {env_id} scheduler of its own: the generalist file"


STAND_IN = "CartPole-v1"  # the generalist's stand-in where no `default` preset is shipped


def shown(path) -> str:
    """`path` relative to the repository when inside it."""
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p)


def digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def run_overrides(task: str, policy: str, seed: int, limit: dict, extra: list, path) -> list:
    """Every override of one run (its cache key, with the scheduler file's digest).
    Under a limit the run goes on past the target, so every policy stops at the limit."""
    out = ["backend=local", "run.progress=false", "run.tensorboard=false", f"seed={seed}",
           f"run.stop_at_target={'false' if limit else 'true'}"]
    out += TASKS[task]["overrides"] + policy_overrides(policy) + [f"run.{k}={v!r}" for k, v in limit.items()]
    if path is not None:
        out.append(f"scheduler.path={path}")
    return out + extra


def series(records: list, limit: dict) -> dict:
    """Per round: shards, cumulative dollars and modeled seconds, the recent return, and
    the share of the budget / deadline left when the scheduler chose (`cost.left_fraction`,
    as the round trainer computes it from the totals before the round)."""
    from jaxrl_dist.scheduling.cost import left_fraction

    usd = [r["cum_cost_usd"] for r in records]
    secs = [r["cum_modeled_s"] for r in records]
    before = lambda xs: [0.0] + xs[:-1]
    return {"shards": [r["num_shards"] for r in records], "cum_usd": usd, "cum_s": secs,
            "return_recent": [r.get("return_recent") for r in records],
            "budget_left": [float(left_fraction(x, limit.get("budget_usd"))) for x in before(usd)],
            "time_left": [float(left_fraction(x, limit.get("deadline_s"))) for x in before(secs)]}


def run_one(task: str, overrides: list, root: Path, limit: dict) -> dict:
    """One training run; its summary figures and its per-round series."""
    import jax

    from jaxrl_dist.cli.compose import load_config
    from jaxrl_dist.trainers.runner import train

    run_dir = root / hashlib.sha256(json.dumps(overrides).encode()).hexdigest()[:12]
    cfg = load_config(overrides + [f"run.dir={run_dir}"])
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # each run's summary table; the bench prints its own
        summary = train(cfg)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out = {k: summary.get(k) for k in METRICS if k in summary}
    for t in TASKS[task].get("also", []):
        out.update(reach(records, t))
    s = series(records, limit)
    out.update({"process_s": time.perf_counter() - t0, "stop_reason": summary.get("stop_reason"),
                "mean_shards": statistics.fmean(s["shards"]) if s["shards"] else None, "rounds": len(s["shards"]),
                "reached": summary.get("time_to_target_s") is not None, "series": s})
    jax.clear_caches()  # every run compiles its own programs; do not keep them all
    return out


def reach(records: list, target: float) -> dict:
    """Modeled time, wall time and dollars when the recent return first reached `target`
    (a lower target than the run's, read from its records; null if never)."""
    hit = next((r for r in records if (r.get("return_recent") or -float("inf")) >= target), None)
    keys = {"cum_modeled_s": "time_to_{}_s", "cum_wall_s": "wall_to_{}_s", "cum_cost_usd": "cost_to_{}_usd"}
    return {name.format(int(target)): hit and hit[k] for k, name in keys.items()}


def cache_key(overrides: list, path) -> dict:
    """A run's identity: its overrides, with the scheduler file named by its content (so
    a checkout elsewhere reuses the cache, and a retrained file at the same path does not)."""
    return {"overrides": [o for o in overrides if not o.startswith("scheduler.path=")],
            "scheduler_sha256": digest(path) if path else None}


def cached_run(cache: Path, task: str, overrides: list, path, limit: dict, ctx) -> tuple:
    """`(key, run)`: with `--resume`, the run cached in `cache` or recorded in the previous
    OUT.json under the same key (overrides, scheduler file digest); else the same run done
    earlier in this process, or a fresh run. Written to `cache` at once."""
    key = cache_key(overrides, path)
    if ctx.resume and cache.is_file():
        saved = json.loads(cache.read_text())
        if saved.get("key") == key:
            return key, saved["run"]
    k, where = json.dumps(key), str(cache.relative_to(ctx.out))
    if ctx.resume and k in ctx.prior:
        run = ctx.prior[k]
    elif k in _DONE:
        run = dict(_DONE[k][1], same_run_as=_DONE[k][0])
    else:
        run = run_one(task, overrides, ctx.root, limit)
    _DONE.setdefault(k, (where, run))
    write_json(cache, {"key": key, "run": run})
    return key, run


def prior_runs(path: Path) -> dict:
    """The runs recorded in a previous OUT.json, by their key (for `--resume` without OUT/runs/)."""
    if not path.is_file():
        return {}
    out = {}
    for t in json.loads(path.read_text())["tasks"].values():
        for v in t["variants"].values():
            for p in v["policies"].values():
                out.update({json.dumps(r["key"]): {k: x for k, x in r.items() if k not in ("seed", "key")}
                            for r in p["runs"] if "key" in r})
    return out


# Runs done in this process by their key: two policies that resolve to the same overrides and
# scheduler file (`learned` and the stand-in `generalist`) share one run
_DONE: dict = {}


def interval(values: list) -> dict:
    """Mean, std and 95% t-interval of the non-null values, and how many there were
    (no interval from fewer than two)."""
    xs = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    out = {"mean": statistics.fmean(xs) if xs else None, "std": None, "lo": None, "hi": None, "n": len(xs)}
    if len(xs) > 1:
        from scipy import stats as st

        half = st.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
        out.update(std=statistics.stdev(xs), lo=out["mean"] - half, hi=out["mean"] + half)
    return out


def final_recent(run: dict):
    """The run's return at its end as the target rule reads it (`return_recent` of the last
    round: the latest rounds holding `run.target_episodes` episodes). Unlike the summary's
    `final_return` (episodes ended in the last 10% of rounds) it has a value when a short
    run's last round ends no episode, as Acrobot's -500 timeouts can: dropping those seeds
    would lift the mean of the worst runs."""
    return next((x for x in reversed(run["series"]["return_recent"]) if x is not None), None)


def aggregate(runs: list, variant: str) -> dict:
    keys = [k for k in runs[0] if k in METRICS or k.startswith(("time_to_", "wall_to_", "cost_to_"))]
    out = {k: interval([r.get(k) for r in runs]) for k in keys}
    out["final_recent"] = interval([final_recent(r) for r in runs])
    out["seeds"] = len(runs)
    out["at_limit"] = sum(r.get("stop_reason") == STOP.get(variant) for r in runs)
    return out


def fixed_in(agg: dict) -> list:
    return [p for p in agg if p.startswith("fixed")]


def oracle(agg: dict, metric: str, higher: bool = False):
    """The fixed count best in hindsight on `metric`: most seeds with a value (reached),
    then the best mean; None without any."""
    scored = [(agg[p][metric]["n"], agg[p][metric]["mean"] * (1 if higher else -1), p)
              for p in fixed_in(agg) if agg[p][metric]["mean"] is not None]
    return max(scored)[2] if scored else None


def beats_fixed(agg: dict, policy: str, metric: str, higher: bool = False) -> dict:
    """Whether `policy` beats every fixed count on `metric` on the means, and beyond the
    95% intervals (its interval clear of each fixed count's; a fixed count with no value
    (never reached) is beaten, one with a single value is compared on it). To-target
    metrics count only when `policy` reached the target in every seed."""
    me, seeds = agg[policy][metric], agg[policy]["seeds"]
    if me["mean"] is None or (metric != "final_recent" and me["n"] < seeds):
        return {"mean": False, "interval": False}
    sign = 1 if higher else -1
    means, clear = [], []
    for f in fixed_in(agg):
        o = agg[f][metric]
        if o["mean"] is None:
            continue
        means.append(sign * (me["mean"] - o["mean"]) > 0)
        mine = me["lo"] if higher else me["hi"]
        theirs = (o["hi"] if higher else o["lo"]) if o["n"] > 1 else o["mean"]
        clear.append(mine is not None and sign * (mine - theirs) > 0)
    return {"mean": all(means), "interval": all(clear)}


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def compare(agg: dict, variant: str) -> dict:
    """The oracle(s) and each learned policy against them: ratios of the means to target
    without a limit, final return under one."""
    m = lambda p, k: agg[p][k]["mean"] if p else None
    if not fixed_in(agg):  # nothing to hold a policy against (and no "beats every" by default)
        return {"oracle": "none: no fixed count was run"}
    if variant == "none":
        out = {"oracle_usd": oracle(agg, "cost_to_target_usd"), "oracle_s": oracle(agg, "time_to_target_s")}
        for p in (x for x in LEARNED if x in agg):
            out[f"{p}_usd_vs_oracle"] = ratio(m(p, "cost_to_target_usd"), m(out["oracle_usd"], "cost_to_target_usd"))
            out[f"{p}_s_vs_oracle"] = ratio(m(p, "time_to_target_s"), m(out["oracle_s"], "time_to_target_s"))
            out[f"{p}_beats_fixed_usd"] = beats_fixed(agg, p, "cost_to_target_usd")
            out[f"{p}_beats_fixed_s"] = beats_fixed(agg, p, "time_to_target_s")
        return out
    out = {"oracle_return": oracle(agg, "final_recent", higher=True)}
    for p in (x for x in LEARNED if x in agg):
        o, mine = m(out["oracle_return"], "final_recent"), m(p, "final_recent")
        out[f"{p}_return_minus_oracle"] = None if o is None or mine is None else mine - o
        out[f"{p}_beats_fixed_return"] = beats_fixed(agg, p, "final_recent", higher=True)
    return out


def to_target(run: dict):
    """`(rounds, shard-rounds)` a run spent up to the round it reached the target, or None."""
    t, sr = run.get("time_to_target_s"), run["series"]
    if t is None:
        return None
    k = next(i for i, s in enumerate(sr["cum_s"]) if s >= t - 1e-9) + 1
    return k, sum(sr["shards"][:k])


FIT_TOLERANCE = 0.05  # how far a round may be from the fitted bill and duration for the bound to hold


def joint_bound(runs: dict, agg: dict, slack: float = 0.05) -> dict | None:
    """Whether any schedule can be within `slack` of both oracles (dollars and modeled
    seconds to target, as `oracle` picks them from `agg`) at once, in the cost model's
    own figures.

    Every round here is billed `a + b * n` dollars and lasts about `round_s` whatever
    its n (a least-squares fit over the fixed runs' rounds), so a run that reaches the
    target in R rounds having used S shard-rounds costs `a R + b S` and takes
    `round_s R`. Within slack of both oracles needs `R <= R_max` and `S <= S_max(R)`.
    The fixed counts (and any policy given) show how many shard-rounds reaching the
    target in so few rounds took: where every one that was fast enough used more than
    the dollars allow, no schedule seen comes near, and a better one would have to
    learn from fewer samples in the same number of updates."""
    import numpy as np

    fixed = fixed_in(runs)
    n, usd, secs = [], [], []
    for p in fixed:
        for r in runs[p]:
            sr = r["series"]
            n += sr["shards"]
            usd += list(np.diff([0.0] + sr["cum_usd"]))
            secs += list(np.diff([0.0] + sr["cum_s"]))
    if len(set(n)) < 2:
        return None
    b, a = np.polyfit(n, usd, 1)
    round_s = float(np.median(secs))
    # the model holds where rounds take the same time at any n and the bill is linear in n
    # (azure_aci: every shard cold, 20 s); not where warm instances or learner time vary it
    off_s = float(np.max(np.abs(np.asarray(secs) - round_s)) / round_s)
    off_usd = float(np.max(np.abs(np.asarray(usd) - (a + b * np.asarray(n)))) / np.mean(usd))
    if max(off_s, off_usd) > FIT_TOLERANCE:
        return {"applies": False, "slack": slack, "why": (
            f"rounds are not billed a + b n at one duration here (seconds off by up to {off_s:.0%}, "
            f"dollars by {off_usd:.0%})")}
    metrics = {"usd": "cost_to_target_usd", "s": "time_to_target_s"}
    oracles = {m: oracle(agg, k) for m, k in metrics.items()}
    if None in oracles.values():
        return None
    best = {m: agg[oracles[m]][k]["mean"] for m, k in metrics.items()}
    spent = {}
    for p, rs in runs.items():
        got = [x for x in map(to_target, rs) if x is not None]
        if len(got) == len(rs):  # every seed reached the target: a mean to compare
            spent[p] = {"rounds": statistics.fmean(x[0] for x in got),
                        "shard_rounds": statistics.fmean(x[1] for x in got),
                        **{m: agg[p][k]["mean"] for m, k in metrics.items()}}
    r_max = (1 + slack) * best["s"] / round_s
    s_max = lambda rounds: float(((1 + slack) * best["usd"] - a * rounds) / b)  # noqa: E731
    for v in spent.values():
        v.update(usd_vs_oracle=v["usd"] / best["usd"], s_vs_oracle=v["s"] / best["s"],
                 within=v["usd"] <= (1 + slack) * best["usd"] and v["s"] <= (1 + slack) * best["s"],
                 fast_enough=v["rounds"] <= r_max, shard_rounds_allowed=s_max(v["rounds"]))
    fast = [v["shard_rounds"] / v["shard_rounds_allowed"] for p, v in spent.items()
            if p in fixed and v["fast_enough"] and v["shard_rounds_allowed"] > 0]
    return {"applies": True, "usd_per_round": float(a), "usd_per_shard_round": float(b), "round_s": round_s,
            "slack": slack, "rounds_max": r_max, "shard_rounds_max": s_max(r_max),
            "fixed_within": [p for p, v in spent.items() if p in fixed and v["within"]],
            "fast_fixed_over_allowed": min(fast, default=None), "policies": spent}


def bound_note(task: str, bound: dict) -> str:
    """One line of what `joint_bound` found."""
    if not bound["applies"]:
        return f"- {task}, within {bound['slack']:.0%} of both oracles: no bound, {bound['why']}"
    f = bound["policies"]
    pts = ", ".join(f"{p} {v['rounds']:.1f} rounds / {v['shard_rounds']:.0f}" for p, v in f.items())
    head = (f"- {task}, within {bound['slack']:.0%} of both oracles: a round costs "
            f"${bound['usd_per_round']:.5f} + ${bound['usd_per_shard_round']:.6f} a shard and lasts "
            f"{bound['round_s']:.2f} s, so the target must fall within {bound['rounds_max']:.1f} rounds "
            f"on at most {bound['shard_rounds_max']:.0f} shard-rounds (fewer rounds allow more); ")
    others = [p for p, v in f.items() if v["within"] and p not in bound["fixed_within"]]
    if bound["fixed_within"]:
        head += f"{', '.join(bound['fixed_within'])} did it"
    else:
        head += (f"no fixed count did (those fast enough used {bound['fast_fixed_over_allowed']:.2f}x "
                 f"the shard-rounds the dollars allow)")
    return head + (f"; {', '.join(others)} did" if others else "") + f". Spent to target: {pts}"


def limits(agg: dict, budget_frac: float, deadline_frac: float) -> dict:
    """Each limit variant's `run.*` value from the no-limit results: a fraction of what the
    dollar (time) oracle spent to reach the target, or of its whole run if it never did."""
    def basis(metric, total):
        p = oracle(agg, metric) or min(fixed_in(agg), key=lambda f: agg[f][total]["mean"])
        value = agg[p][metric]["mean"] if agg[p][metric]["mean"] is not None else agg[p][total]["mean"]
        return p, value
    (pb, usd), (pd, secs) = basis("cost_to_target_usd", "cost_usd"), basis("time_to_target_s", "modeled_seconds")
    return {"budget": {"budget_usd": round(budget_frac * usd, 6), "from": pb, "frac": budget_frac},
            "deadline": {"deadline_s": round(deadline_frac * secs, 3), "from": pd, "frac": deadline_frac}}


def cell(s: dict, money: bool = False) -> str:
    if s["mean"] is None:
        return "not reached"
    d = "$" if money else ""
    if s["lo"] is None:
        return f"{d}{fmt(s['mean'])} (n={s['n']})"
    return f"{d}{fmt(s['mean'])} [{fmt(s['lo'])}, {fmt(s['hi'])}]"


HEADERS = ["task", "variant", "policy", "reached", "dollars to target", "modeled s to target",
           "final return (recent)", "shards/round", "rounds", "stopped at limit"]


def variant_label(variant: str, lim: dict) -> str:
    if variant == "none":
        return "no limit"
    key = STOP[variant]
    value = f"${lim[key]:.4g}" if variant == "budget" else f"{lim[key]:.4g} s"
    return f"{variant} {value} ({lim['frac']}x {lim['from']})"


def table_rows(task: str, variant: str, agg: dict, cmp: dict, lim: dict, also=()) -> list:
    """One row per policy at the run's target (then at each lower target), the oracle marked."""
    marks = {}
    for key, mark in (("oracle_usd", "oracle $"), ("oracle_s", "oracle s"), ("oracle_return", "oracle")):
        if cmp.get(key):
            marks.setdefault(cmp[key], []).append(mark)
    rows = []
    for t in [None, *(int(x) for x in also)]:
        sfx = ("target_usd", "target_s") if t is None else (f"{t}_usd", f"{t}_s")
        label = task if t is None else f"{task} (to {t})"
        for p, a in agg.items():
            name = p + (f" ({', '.join(marks[p])})" if p in marks else "")
            rows.append([label, variant_label(variant, lim), name, f"{a[f'time_to_{sfx[1]}']['n']}/{a['seeds']}",
                         cell(a[f"cost_to_{sfx[0]}"], money=True), cell(a[f"time_to_{sfx[1]}"]),
                         cell(a["final_recent"]), fmt(a["mean_shards"]["mean"]), fmt(a["rounds"]["mean"]),
                         "-" if variant == "none" else f"{a['at_limit']}/{a['seeds']}"])
    return rows


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def shard_axis(ax) -> None:
    ax.set_yscale("log")
    ax.set_yticks(list(FIXED), [str(n) for n in FIXED])
    ax.set_ylim(0.8, 40)


def plot_shards(task: str, runs: dict, out_dir: Path, labels: dict):
    """Shards per round over a run, every policy (seed 0), one panel per variant. Lines get
    thinner policy by policy, so one that coincides with another (max and fixed32) shows."""
    plt = _plt()
    variants = list(runs)
    fig, axes = plt.subplots(1, len(variants), figsize=(5.5 * len(variants), 4.2), squeeze=False)
    for ax, v in zip(axes[0], variants):
        for i, (p, rs) in enumerate(runs[v].items()):
            s = rs[0]["series"]["shards"]
            ax.plot(range(1, len(s) + 1), s, color=plt.get_cmap("tab10")(i % 10), lw=max(1.0, 4.5 - 0.35 * i),
                    ls="-" if i < 10 else "--", label=labels.get(p, p), drawstyle="steps-mid")
        ax.set(xlabel="round", ylabel="shards", title=f"{task}, {v}: shards per round (seed 0)")
        shard_axis(ax)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="center right", fontsize="small")
    fig.tight_layout(rect=(0, 0, 1 - 1.7 / fig.get_figwidth(), 1))  # room for the legend
    path = out_dir / f"shards_{task}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_budget(task: str, runs: dict, lim: dict, out_dir: Path, labels: dict):
    """The learned schedulers' shard count against the budget left when they chose it
    (budget variant, every seed); None when the variant or the policies did not run."""
    learned = {p: rs for p, rs in runs.get("budget", {}).items() if p in LEARNED}
    if not learned:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (p, rs) in enumerate(learned.items()):
        for j, r in enumerate(rs):
            s = r["series"]
            ax.plot(s["budget_left"], s["shards"], marker="os"[i % 2], ms=7 - 3 * i, alpha=0.8,
                    color=plt.get_cmap("tab10")(i), lw=3.0 - i, ls=["-", "--", ":"][j % 3],
                    label=f"{labels.get(p, p)} seed {j}")
    ax.set(xlabel="budget_left (share of run.budget_usd not yet spent)", ylabel="shards chosen",
           title=f"{task}: learned choice against the budget left (${lim['budget_usd']:.4g})", xlim=(1.02, -0.02))
    shard_axis(ax)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = out_dir / f"budget_{task}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


class Ctx(NamedTuple):
    """What every run of one invocation shares."""

    files: dict  # {"generalist": path, "learned": {task: path}}
    extra: list  # KEY=VALUE for every run
    root: Path  # run directories (temporary)
    out: Path  # OUT: OUT.json, OUT.md, OUT/runs/, OUT/*.png
    seeds: int
    resume: bool
    prior: dict  # the previous OUT.json's runs by key (`prior_runs`)


def run_variant(task: str, variant: str, policies: list, lim: dict, ctx: Ctx) -> dict:
    """Every policy's seeds of one task and variant, each from the cache or run and cached."""
    limit = {STOP[variant]: lim[STOP[variant]]} if variant != "none" else {}
    runs = {}
    for p in policies:
        path, _ = scheduler_file(p, task, ctx.files)
        runs[p] = []
        for s in range(ctx.seeds):
            ov = run_overrides(task, p, s, limit, ctx.extra, path)
            cache = ctx.out / "runs" / task / variant / p / f"seed{s}.json"
            key, r = cached_run(cache, task, ov, path, limit, ctx)
            runs[p].append({"seed": s, "key": key, **r})
            print(f"{task} {variant} {p} seed {s}: {r['stop_reason']}, {r['rounds']} rounds, "
                  f"final {fmt(final_recent(r))}, ${fmt(r.get('cost_to_target_usd'))} to target, "
                  f"{r['process_s']:.1f} s", flush=True)
    return runs


def run_task(task: str, variants: list, policies: list, ctx: Ctx, fracs: tuple, sink, given=None) -> dict:
    """A task's variants in order (`none` first: the limits come from it, unless `given`
    holds them); `sink(task, result)` after each variant writes what there is so far."""
    files = {p: scheduler_file(p, task, ctx.files) for p in policies}
    res = {"budget": TASKS[task]["budget"], "overrides": TASKS[task]["overrides"],
           "scheduler_files": {p: {"path": shown(f), "note": n, "sha256": digest(f)}
                               for p, (f, n) in files.items() if f is not None},
           "variants": {}, "plots": []}
    lims, runs = {"none": {}, **(given or {})}, {}
    for v in variants:
        runs[v] = run_variant(task, v, policies, lims[v], ctx)
        agg = {p: aggregate(rs, v) for p, rs in runs[v].items()}
        if v == "none" and not given and fixed_in(agg):  # no fixed counts: no limit variant follows
            lims.update(limits(agg, *fracs))
        cmp = compare(agg, v)
        if v == "none" and (bound := joint_bound(runs[v], agg)) is not None:
            res["bound"] = bound
            print(bound_note(task, bound), flush=True)
        res["variants"][v] = {"limit": lims[v], "compare": cmp, "policies": {
            p: {"overrides": policy_overrides(p), "runs": runs[v][p], "summary": agg[p]} for p in agg}}
        print_table(f"{task}, {variant_label(v, lims[v])}", HEADERS,
                    table_rows(task, v, agg, cmp, lims[v], TASKS[task].get("also", ())))
        print(json.dumps(cmp), flush=True)
        labels = {p: f"{p} (stand-in)" for p, (_, n) in files.items() if n and n.startswith("stand-in")}
        pngs = [plot_shards(task, runs, ctx.out, labels),
                plot_budget(task, runs, lims.get("budget", {}), ctx.out, labels)]
        res["plots"] = [str(p) for p in pngs if p is not None]
        sink(task, res)
    return res


def note_value(x) -> str:
    if isinstance(x, dict):  # beats_fixed's
        return f"(on the means: {'yes' if x['mean'] else 'no'}, beyond the intervals: {'yes' if x['interval'] else 'no'})"
    return x if isinstance(x, str) else fmt(x)


def wide_tables(out: dict) -> list:
    """Two compact tables, a row per policy: dollars and modeled seconds to target without a
    limit, and final return under each limit, a column per task (and limit)."""
    tasks = out["tasks"]
    cols = [(t, v) for t in tasks for v in tasks[t]["variants"]]
    policies = list(dict.fromkeys(p for t, v in cols for p in tasks[t]["variants"][v]["policies"]))

    def get(t, v, p, metric, money=False):
        a = tasks[t]["variants"][v]["policies"].get(p, {}).get("summary")
        return cell(a[metric], money) if a else "-"
    none = [(t, v) for t, v in cols if v == "none"]
    lim = [(t, v) for t, v in cols if v != "none"]
    md = []
    if none:
        heads = ["policy"] + [f"{t} {x}" for t, _ in none for x in ("reached", "dollars to target", "modeled s to target")]
        rows = [[p] + [y for t, v in none for y in (
            f"{tasks[t]['variants'][v]['policies'][p]['summary']['time_to_target_s']['n']}/{out['seeds']}"
            if p in tasks[t]["variants"][v]["policies"] else "-",
            get(t, v, p, "cost_to_target_usd", True), get(t, v, p, "time_to_target_s"))] for p in policies]
        md += [markdown_table(heads, rows), ""]
    if lim:
        heads = ["policy"] + [f"{t}, {variant_label(v, tasks[t]['variants'][v]['limit'])}" for t, v in lim]
        md += [markdown_table(heads, [[p] + [get(t, v, p, "final_recent") for t, v in lim] for p in policies]), ""]
    return md


def markdown(out: dict) -> str:
    rows, notes = [], []
    for task, t in out["tasks"].items():
        for v, r in t["variants"].items():
            agg = {p: x["summary"] for p, x in r["policies"].items()}
            rows += table_rows(task, v, agg, r["compare"], r["limit"], TASKS[task].get("also", ()))
            notes.append(f"- {task}, {variant_label(v, r['limit'])}: " + ", ".join(
                f"{k} {note_value(x)}" for k, x in r["compare"].items()))
        if "bound" in t:
            notes.append(bound_note(task, t["bound"]))
        files = t["scheduler_files"]
        for p, f in files.items():
            notes.append(f"- {task}: `{p}` reads {f['path']} ({f['note']}, sha256 {f['sha256']})")
        if len({f["sha256"] for f in files.values()}) == 1 < len(files):
            notes.append(f"- {task}: {' and '.join(files)} read the same file: their rows are the same runs")
    return "\n".join([markdown_table(HEADERS, rows), "", *wide_tables(out), *notes]) + "\n"


def parse_args():
    from jaxrl_dist.scheduling.learned import preset_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="cartpole,acrobot")
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget-frac", type=float, default=0.6, help="budget: this x the dollar oracle's to target")
    ap.add_argument("--deadline-frac", type=float, default=0.6, help="deadline: this x the time oracle's to target")
    shipped = preset_path("default")
    ap.add_argument("--generalist", default=str(shipped if shipped.is_file() else preset_path(STAND_IN)),
                    help="the generalist scheduler file (default: the shipped default preset, else the "
                         f"{STAND_IN} preset as a stand-in)")
    ap.add_argument("--learned", action="append", default=[], metavar="TASK=PATH",
                    help="a task's own scheduler file (default: the preset shipped for its env id)")
    ap.add_argument("--limits-from", metavar="JSON",
                    help="an earlier OUT.json: each task's budget and deadline as it set them, so a "
                         "limit variant runs alone (say with more seeds) under the same limits")
    ap.add_argument("--resume", action="store_true", help="reuse the runs cached under OUT/runs/")
    ap.add_argument("--quick", action="store_true", help="one seed, a tiny step budget, a temporary OUT")
    ap.add_argument("--out", default=None, help="default bench/results/schedulers")
    ap.add_argument("overrides", nargs="*", help="extra KEY=VALUE for every run")
    return ap.parse_args()


def check_args(args, variants: list, policies: list) -> dict:
    """The scheduler files by role; one line and exit 2 on a bad flag."""
    bad = ([f"--tasks: unknown {t!r}" for t in args.tasks.split(",") if t not in TASKS]
           + [f"--policies: unknown {p!r}" for p in policies if policy_overrides(p) is None]
           + [f"--variants: unknown {v!r}" for v in variants if v not in VARIANTS])
    if any(v != "none" for v in variants) and not fixed_in(dict.fromkeys(policies)) and not args.limits_from:
        bad.append("--variants: a budget or deadline is derived from the fixed counts; add some to --policies")
    learned = dict(x.split("=", 1) for x in args.learned if "=" in x)
    bad += [f"--learned: expected TASK=PATH, got {x!r}" for x in args.learned if "=" not in x]
    bad += [f"--learned: unknown task {t!r}" for t in learned if t not in TASKS]
    bad += [f"--learned: no such file {p}" for p in learned.values() if not Path(p).is_file()]
    if args.limits_from and not Path(args.limits_from).is_file():
        bad.append(f"--limits-from: no such file {args.limits_from}")
    if not Path(args.generalist).is_file():
        bad.append(f"--generalist: no such file {args.generalist}")
    if bad:
        print(f"error: {bad[0]}", file=sys.stderr)
        sys.exit(2)
    return {"generalist": args.generalist, "learned": learned}


def given_limits(path: str, tasks: list) -> dict:
    """`{task: {"budget": ..., "deadline": ...}}` as the earlier output `path` set them; one
    line and exit 2 where it lacks a task or a limit."""
    saved = json.loads(Path(path).read_text()).get("tasks", {})
    out = {t: {v: saved[t]["variants"][v]["limit"] for v in STOP if v in saved.get(t, {}).get("variants", {})}
           for t in tasks}
    missing = [t for t in tasks if set(out[t]) != set(STOP)]
    if missing:
        print(f"error: --limits-from: {path} holds no budget and deadline for {missing[0]!r}", file=sys.stderr)
        sys.exit(2)
    return out


def main() -> None:
    args = parse_args()
    policies, variants = args.policies.split(","), args.variants.split(",")
    if any(v != "none" for v in variants) and "none" not in variants and not args.limits_from:
        variants.insert(0, "none")  # the limits are derived from the no-limit runs
    variants.sort(key=VARIANTS.index)
    files = check_args(args, variants, policies)
    given = given_limits(args.limits_from, args.tasks.split(",")) if args.limits_from else {}
    configure_cpu()
    extra = list(args.overrides) + (["algo.total_timesteps=20480"] if args.quick else [])
    # --quick alone writes under a new temporary directory, left for a look, not over the results
    quick_dir = tempfile.mkdtemp(prefix="sched-quick-") if args.quick and not args.out else None
    out_path = Path(args.out or (quick_dir + "/schedulers" if quick_dir else RESULTS / "schedulers"))
    out_path.mkdir(parents=True, exist_ok=True)
    out = {"machine": machine_info(), "seeds": 1 if args.quick else args.seeds, "extra_overrides": extra,
           "fractions": {"budget": args.budget_frac, "deadline": args.deadline_frac},
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "tasks": {}}

    def sink(task: str, res: dict) -> None:
        out["tasks"][task] = res
        out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        write_json(out_path.with_suffix(".json"), out)
        out_path.with_suffix(".md").write_text(markdown(out))

    with tempfile.TemporaryDirectory(prefix="sched-bench-") as tmp:
        prior = prior_runs(out_path.with_suffix(".json")) if args.resume else {}
        ctx = Ctx(files, extra, Path(tmp), out_path, out["seeds"], args.resume, prior)
        for task in args.tasks.split(","):
            run_task(task, variants, policies, ctx, (args.budget_frac, args.deadline_frac), sink, given.get(task))
    print(f"wrote {out_path.with_suffix('.json')}, {out_path.with_suffix('.md')}, PNGs in {out_path}")


if __name__ == "__main__":
    main()

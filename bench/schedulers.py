"""Schedulers compared on real training runs, priced by the same cost model: one Hydra
multirun a comparison, read with the package's sweep report.

A comparison is one task under one variant. It is one `jaxrl-dist train -m` command: the
round trainer on the local backend, every policy x seed as Hydra sweep overrides
(`scheduler=fixed1,fixed2,...,generalist seed=0,1,2`). The policies that are not a
packaged scheduler preset (`fixedN`, `generalist`, `learned`) are scheduler configs this
script writes under `OUT/conf/scheduler/` and hands to Hydra with `--config-dir`. Each
sweep is then read with `jaxrl_dist.tools.sweep_report`: its `sweep.md` and figures (the
IQM of the final return with rliable's 95% stratified-bootstrap interval, performance
profiles, mean curves), and the same IQM and interval of each policy's dollars and modeled
seconds to the target, final return at the end, shards a round and rounds.

Policies (`--policies`): `fixedN` (N shards every round; the best fixed count in
hindsight is the *oracle*: fewest dollars or modeled seconds to the target without a
limit, highest final return under one), `max`, `adapt`, `ramp` (the packaged presets),
`generalist` (`--generalist PATH`, default the shipped `default` preset) and `learned`
(the task's own scheduler: `--learned TASK=PATH`, else the preset shipped for its env id;
left out where that is the generalist's file).

Variants (`--variants`): `none` (runs stop at the target), `budget` (`run.budget_usd` =
`--budget-frac` x the dollar oracle's dollars to target in `none`) and `deadline`
(`run.deadline_s` = `--deadline-frac` x the time oracle's modeled seconds). Under a limit
runs go on past the target until the limit stops them; the final return is the last
round's recent return, as the target rule reads it. Every run is priced as `cost=azure_aci`
unless an extra override says otherwise (`cost=aws_lambda`).

    python bench/schedulers.py --dry-run        # the commands (limits as placeholders)
    python bench/schedulers.py                  # CartPole and Acrobot, 3 variants, 3 seeds
    python bench/schedulers.py --tasks cartpole --variants budget --seeds 8 --limits-from OUT/schedulers.json
    python bench/schedulers.py --report         # read the sweeps already under OUT again
    python bench/schedulers.py --quick          # a smoke run: CartPole, fixed2 and fixed8, 1 seed, 8192 steps

Writes under OUT (default `bench/out/schedulers`): `TASK_VARIANT/` (the sweep, its
`sweep.md` and figures), `TASK_VARIANT.log` (the command's output), `conf/TASK/` (`--dry-run` writes these too),
`schedulers.json` and `schedulers.md`.
"""
from __future__ import annotations

import argparse
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, fmt, machine_info, markdown_table, write_json  # noqa: E402

OUT = REPO / "bench" / "out" / "schedulers"
FIXED = (1, 2, 4, 8, 16, 32)
PACKAGED = ("max", "adapt", "ramp")  # scheduler presets used as they ship
LEARNED = ("learned", "generalist")  # the policies that read a scheduler file
PRESET = {"learned": "task_learned"}  # a policy whose name is taken by a packaged preset
DEFAULT_POLICIES = [f"fixed{n}" for n in FIXED] + ["max", "adapt", "learned", "generalist"]
TASKS = {  # each task's overrides; -100 is Acrobot-v1's usual "solved" line (returns from -500)
    "cartpole": ["env=cartpole", "run.target_return=475"],
    "acrobot": ["env=acrobot", "run.target_return=-100"],
}
VARIANTS = ("none", "budget", "deadline")
STOP = {"budget": "budget_usd", "deadline": "deadline_s"}  # each limit's key and stop_reason
COMMON = ("trainer=sync", "backend=local", "run.tensorboard=false")
METRICS = {"cost_to_target_usd": "dollars to target", "time_to_target_s": "modeled s to target",
           "final_recent": "final return (recent)", "mean_shards": "shards/round", "rounds": "rounds"}


# ---------------------------------------------------------------- the sweeps


def scheduler_file(policy: str, task: str, files: dict):
    """The scheduler file `policy` reads on `task`; None for a policy without one, or for
    `learned` where the task has no scheduler of its own (it would be the generalist)."""
    from jaxrl_dist.cli.compose import load_config
    from jaxrl_dist.scheduling.learned import preset_path

    if policy == "generalist":
        return Path(files["generalist"]).resolve()
    if policy != "learned":
        return None
    if task in files["learned"]:
        return Path(files["learned"][task]).resolve()
    own = preset_path(load_config(TASKS[task]).env.id)
    return own if own.is_file() else None


def scheduler_config(policy: str, path) -> dict | None:
    """The scheduler preset a policy needs beside the packaged ones (None: packaged)."""
    if m := re.fullmatch(r"fixed([1-9][0-9]*)", policy):
        return {"defaults": ["fixed", "_self_"], "num_shards": int(m[1])}
    if policy in LEARNED:
        return {"defaults": ["learned", "_self_"], "path": str(path)}
    return None


def write_configs(conf: Path, task: str, policies: list, files: dict) -> tuple:
    """Write each policy's scheduler preset under `conf/scheduler/`; `(policies run, notes)`."""
    import yaml

    (conf / "scheduler").mkdir(parents=True, exist_ok=True)
    kept, notes = [], []
    for p in policies:
        path = scheduler_file(p, task, files)
        if p == "learned" and path is None:
            notes.append(f"{task}: no scheduler of its own, so `learned` would be the generalist: left out")
            continue
        cfg = scheduler_config(p, path)
        if cfg is not None:
            (conf / "scheduler" / f"{PRESET.get(p, p)}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        kept.append(p)
    return kept, notes


def sweep_command(task: str, variant: str, policies: list, seeds: int, limit, out: Path, extra: list) -> list:
    """The `jaxrl-dist train -m` arguments of one comparison; `limit` is the variant's value
    (or a placeholder string)."""
    args = ["train", "-m", "--config-dir", str(out / "conf" / task), f"hydra.sweep.dir={out / f'{task}_{variant}'}",
            *COMMON, *TASKS[task], f"run.stop_at_target={'true' if variant == 'none' else 'false'}"]
    if variant != "none":
        args.append(f"run.{STOP[variant]}={limit}")
    args += [f"scheduler={','.join(PRESET.get(p, p) for p in policies)}", f"seed={','.join(map(str, range(seeds)))}"]
    return args + list(extra)


def run_sweep(args: list, log: Path) -> float:
    """Run one multirun (its output to `log`); its wall seconds. Exits on a failed command."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        code = subprocess.run([sys.executable, "-m", "jaxrl_dist", *args], stdout=f, stderr=subprocess.STDOUT,
                              cwd=REPO).returncode
    if code != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
        sys.exit(f"error: jaxrl-dist {args[0]} -m exited {code} ({log}): {tail[0]}")
    return time.perf_counter() - t0


# ---------------------------------------------------------------- reading a sweep


def policy_of(run) -> str:
    """The policy a job ran: its `scheduler=` override, in this script's names."""
    import yaml

    given = yaml.safe_load((Path(run.path) / ".hydra" / "overrides.yaml").read_text()) or []
    name = next(o.split("=", 1)[1] for o in given if o.startswith("scheduler="))
    return {v: k for k, v in PRESET.items()}.get(name, name)


def job(run) -> dict:
    """One job's figures (summary and per-round series) from its run directory."""
    recs, summary = run.records, run.summary or {}
    recent = [r.get("return_recent") for r in recs]
    shards = [r["num_shards"] for r in recs if "num_shards" in r]
    return {"time_to_target_s": summary.get("time_to_target_s"), "cost_to_target_usd": summary.get("cost_to_target_usd"),
            "stop_reason": summary.get("stop_reason"), "rounds": len(shards),
            "mean_shards": statistics.fmean(shards) if shards else None,
            # the return as the target rule reads it at the end (the summary's final_return is
            # null for a short run whose last rounds end no episode, as Acrobot's -500 timeouts can)
            "final_recent": next((x for x in reversed(recent) if x is not None), None),
            "series": {"shards": shards, "cum_usd": [r.get("cum_cost_usd") for r in recs],
                       "cum_s": [r.get("cum_modeled_s") for r in recs], "return_recent": recent}}


def load_jobs(sweep: Path) -> dict:
    """`{policy: [job, ...]}` of a finished sweep, read by the sweep report's loader."""
    from jaxrl_dist.tools.sweep_report import load_sweep

    out: dict = {}
    for group in load_sweep(sweep):
        for run in group.runs:
            out.setdefault(policy_of(run), []).append(job(run))
    return out


def aggregate(jobs: list, variant: str) -> dict:
    """Per metric, `{"iqm", "lo", "hi", "n"}` over the jobs that have a value: the sweep
    report's IQM and 95% stratified-bootstrap interval (rliable), which it computes of the
    final return, so each value is handed over in that place."""
    from jaxrl_dist.tools.report import Run
    from jaxrl_dist.tools.sweep_report import Group, final_scores, iqm_intervals

    groups = [Group(m, "", [Run(None, [], {"final_return": j.get(m)}, None) for j in jobs]) for m in METRICS]
    iqms = iqm_intervals(groups)
    out = {g.label: dict(zip(("iqm", "lo", "hi"), iqms.get(g.label, (None,) * 3)), n=len(final_scores(g)))
           for g in groups}
    out.update(seeds=len(jobs), at_limit=sum(j.get("stop_reason") == STOP.get(variant) for j in jobs))
    return out


def fixed_in(agg: dict) -> list:
    return [p for p in agg if re.fullmatch(r"fixed[0-9]+", p)]


def oracle(agg: dict, metric: str, higher: bool = False):
    """The fixed count best in hindsight on `metric`: most seeds with a value, then the best IQM."""
    scored = [(agg[p][metric]["n"], agg[p][metric]["iqm"] * (1 if higher else -1), p)
              for p in fixed_in(agg) if agg[p][metric]["iqm"] is not None]
    return max(scored)[2] if scored else None


def beats_fixed(agg: dict, policy: str, metric: str, higher: bool = False) -> dict:
    """Whether `policy` beats every fixed count on `metric`: on the IQMs, and beyond the 95%
    intervals. To-target metrics count only when `policy` reached the target in every seed."""
    me = agg[policy][metric]
    if me["iqm"] is None or (metric != "final_recent" and me["n"] < agg[policy]["seeds"]):
        return {"iqm": False, "interval": False}
    sign, better, clear = (1 if higher else -1), [], []
    for f in fixed_in(agg):
        o = agg[f][metric]
        if o["iqm"] is not None:
            better.append(sign * (me["iqm"] - o["iqm"]) > 0)
            clear.append(sign * ((me["lo"] if higher else me["hi"]) - (o["hi"] if higher else o["lo"])) > 0)
    return {"iqm": all(better), "interval": all(clear)}


def compare(agg: dict, variant: str) -> dict:
    """The oracle(s), and each learned policy's ratio (no limit) or difference (a limit) to them."""
    if not fixed_in(agg):
        return {"oracle": "none: no fixed count was run"}
    iqm = lambda p, k: agg[p][k]["iqm"] if p else None  # noqa: E731
    ratio = lambda a, b: None if a is None or not b else a / b  # noqa: E731
    if variant == "none":
        out = {"oracle_usd": oracle(agg, "cost_to_target_usd"), "oracle_s": oracle(agg, "time_to_target_s")}
        for p in (x for x in LEARNED if x in agg):
            for key, metric in (("usd", "cost_to_target_usd"), ("s", "time_to_target_s")):
                out[f"{p}_{key}_vs_oracle"] = ratio(iqm(p, metric), iqm(out[f"oracle_{key}"], metric))
                out[f"{p}_beats_fixed_{key}"] = beats_fixed(agg, p, metric)
        return out
    out = {"oracle_return": oracle(agg, "final_recent", higher=True)}
    for p in (x for x in LEARNED if x in agg):
        o, mine = iqm(out["oracle_return"], "final_recent"), iqm(p, "final_recent")
        out[f"{p}_return_minus_oracle"] = None if o is None or mine is None else mine - o
        out[f"{p}_beats_fixed_return"] = beats_fixed(agg, p, "final_recent", higher=True)
    return out


def limits(agg: dict, budget_frac: float, deadline_frac: float) -> dict:
    """Each limit from the no-limit comparison: a fraction of what the dollar (time) oracle
    spent to reach the target."""
    out = {}
    for variant, metric, frac in (("budget", "cost_to_target_usd", budget_frac),
                                  ("deadline", "time_to_target_s", deadline_frac)):
        p = oracle(agg, metric)
        if p is not None:
            out[variant] = {"value": round(frac * agg[p][metric]["iqm"], 6), "from": p, "frac": frac}
    return out


# ---------------------------------------------------------------- what any schedule can reach


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
    seconds to target) at once, in the cost model's own figures.

    Every round here is billed `a + b * n` dollars and lasts about `round_s` whatever its
    n (a least-squares fit over the fixed runs' rounds), so a run that reaches the target
    in R rounds having used S shard-rounds costs `a R + b S` and takes `round_s R`. Within
    slack of both oracles needs `R <= R_max` and `S <= S_max(R)`. Where every fixed count
    fast enough used more shard-rounds than the dollars allow, a better schedule would
    have to learn from fewer samples in the same number of updates."""
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
    best = {m: agg[oracles[m]][k]["iqm"] for m, k in metrics.items()}
    spent = {}
    for p, rs in runs.items():
        got = [x for x in map(to_target, rs) if x is not None]
        if len(got) == len(rs):  # every seed reached the target
            spent[p] = {"rounds": statistics.fmean(x[0] for x in got),
                        "shard_rounds": statistics.fmean(x[1] for x in got),
                        **{m: agg[p][k]["iqm"] for m, k in metrics.items()}}
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
        return f"{task}, within {bound['slack']:.0%} of both oracles: no bound, {bound['why']}"
    pts = ", ".join(f"{p} {v['rounds']:.1f} rounds / {v['shard_rounds']:.0f}" for p, v in bound["policies"].items())
    did = bound["fixed_within"] or [f"no fixed count (those fast enough used {bound['fast_fixed_over_allowed']:.2f}x"
                                    " the shard-rounds the dollars allow)"]
    return (f"{task}, within {bound['slack']:.0%} of both oracles: a round costs ${bound['usd_per_round']:.5f} + "
            f"${bound['usd_per_shard_round']:.6f} a shard and lasts {bound['round_s']:.2f} s, so the target must "
            f"fall within {bound['rounds_max']:.1f} rounds on at most {bound['shard_rounds_max']:.0f} shard-rounds; "
            f"did: {', '.join(did)}. Spent to target: {pts}")


# ---------------------------------------------------------------- the tables


def cell(s: dict, money: bool = False) -> str:
    if s["iqm"] is None:
        return "-"
    d = "$" if money else ""
    return f"{d}{fmt(s['iqm'])} [{fmt(s['lo'])}, {fmt(s['hi'])}] (n={s['n']})"


def comparison_md(name: str, c: dict) -> list:
    lim = c.get("limit")
    head = f"## {name}" + (f": {STOP[c['variant']]} {lim['value']:g} ({lim['frac']}x {lim['from']})" if lim else "")
    marks = {c["compare"].get(k): m for k, m in (("oracle_usd", "oracle $"), ("oracle_s", "oracle s"),
                                                 ("oracle_return", "oracle"))}
    rows = [[p + (f" ({marks[p]})" if p in marks else ""), f"{a['time_to_target_s']['n']}/{a['seeds']}",
             *(cell(a[m], money=m == "cost_to_target_usd") for m in METRICS),
             "-" if c["variant"] == "none" else f"{a['at_limit']}/{a['seeds']}"]
            for p, a in c["policies"].items()]
    md = [head, "", f"`{c['command']}`", "", markdown_table(["policy", "reached", *METRICS.values(), "stopped at limit"],
                                                            rows), ""]
    md += [f"- {k}: {v}" for k, v in c["compare"].items()]
    md += [f"- {bound_note(c['task'], c['bound'])}"] if c.get("bound") else []
    return md + [f"- {n}" for n in c["notes"]] + [f"- the sweep report: `{c['sweep']}/sweep.md`", ""]


# ---------------------------------------------------------------- main


def parse_args():
    from jaxrl_dist.scheduling.learned import preset_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="cartpole,acrobot", help=f"of {', '.join(TASKS)}")
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget-frac", type=float, default=0.6, help="budget: this x the dollar oracle's to target")
    ap.add_argument("--deadline-frac", type=float, default=0.6, help="deadline: this x the time oracle's to target")
    ap.add_argument("--generalist", default=str(preset_path("default")), help="the generalist's scheduler file")
    ap.add_argument("--learned", action="append", default=[], metavar="TASK=PATH", help="a task's own scheduler file")
    ap.add_argument("--limits-from", metavar="JSON", help="an earlier OUT/schedulers.json: its limits, so a limit "
                    "variant runs without the no-limit sweep (say with more seeds)")
    ap.add_argument("--out", default=None, help=f"default {OUT.relative_to(REPO)}")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--report", action="store_true", help="run nothing: read the sweeps already under OUT")
    ap.add_argument("--quick", action="store_true", help="a smoke run: CartPole, fixed2 and fixed8, 1 seed, 8192 steps")
    ap.add_argument("overrides", nargs="*", help="extra KEY=VALUE for every run")
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.policies, args.variants, args.seeds = "cartpole", "fixed2,fixed8", "none", 1
        args.overrides.append("algo.total_timesteps=8192")
    return args


def check_args(args, tasks: list, variants: list, policies: list) -> dict:
    """The scheduler files by role; one line and exit 2 on a bad flag."""
    learned = dict(x.split("=", 1) for x in args.learned if "=" in x)
    bad = ([f"--tasks: unknown {t!r}" for t in tasks if t not in TASKS]
           + [f"--policies: unknown {p!r}" for p in policies
              if not (re.fullmatch(r"fixed[1-9][0-9]*", p) or p in PACKAGED + LEARNED)]
           + [f"--variants: unknown {v!r}" for v in variants if v not in VARIANTS]
           + [f"--learned: expected TASK=PATH, got {x!r}" for x in args.learned if "=" not in x]
           + [f"--learned: no such file {p}" for p in learned.values() if not Path(p).is_file()]
           + ([f"--generalist: no such file {args.generalist}"] if not Path(args.generalist).is_file() else [])
           + ([f"--limits-from: no such file {args.limits_from}"]
              if args.limits_from and not Path(args.limits_from).is_file() else []))
    if any(v != "none" for v in variants) and not args.limits_from and not fixed_in(dict.fromkeys(policies)):
        bad.append("--variants: a budget or deadline comes from the fixed counts; add some to --policies")
    if bad:
        print(f"error: {bad[0]}", file=sys.stderr)
        sys.exit(2)
    return {"generalist": args.generalist, "learned": learned}


def main() -> None:
    import json

    args = parse_args()
    tasks, policies = args.tasks.split(","), args.policies.split(",")
    variants = sorted(set(args.variants.split(",")) | ({"none"} if not args.limits_from else set()),
                      key=lambda v: VARIANTS.index(v) if v in VARIANTS else -1)
    files = check_args(args, tasks, variants, policies)
    out = Path(args.out or (tempfile.mkdtemp(prefix="schedulers-quick-") if args.quick else OUT)).resolve()
    given = json.loads(Path(args.limits_from).read_text())["limits"] if args.limits_from else {}
    result = {"machine": machine_info(), "seeds": args.seeds, "extra_overrides": args.overrides,
              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "limits": given, "comparisons": {}}
    md = ["# Schedulers on real runs", "", f"Machine: {result['machine'].get('cpu_model')}, "
          f"commit {result['machine'].get('commit')}; IQM [95% stratified-bootstrap interval] over seeds.", ""]
    for task in tasks:
        kept, notes = write_configs(out / "conf" / task, task, policies, files)
        for variant in variants:
            name = f"{task}_{variant}"
            lim = given.get(task, {}).get(variant) if variant != "none" else None
            what = {"budget": "dollar", "deadline": "time"}.get(variant)
            value = lim["value"] if lim else f"<{getattr(args, variant + '_frac', '')} x the {what} oracle in {task}_none>"
            cmd = sweep_command(task, variant, kept, args.seeds, value, out, args.overrides)
            shown = shlex.join(["jaxrl-dist", *cmd])
            if args.dry_run:
                print(shown)
                continue
            if variant != "none" and lim is None:
                print(f"{name}: skipped: no fixed count reached the target in {task}_none, so no {variant}")
                continue
            if not args.report:
                if (out / name).exists():
                    sys.exit(f"error: {out / name} exists: --report reads it, or remove it to run again")
                print(f"{name}: {shown}", flush=True)
                print(f"{name}: {run_sweep(cmd, out / f'{name}.log'):.0f} s", flush=True)
            from jaxrl_dist.tools.sweep_report import sweep_report

            sweep_report(out / name)  # sweep.md and the figures, beside the jobs
            runs = load_jobs(out / name)
            agg = {p: aggregate(rs, variant) for p, rs in runs.items()}
            c = {"task": task, "variant": variant, "command": shown, "sweep": str(out / name), "limit": lim,
                 "notes": notes, "policies": agg, "compare": compare(agg, variant),
                 "bound": joint_bound(runs, agg) if variant == "none" else None}
            if variant == "none" and not args.limits_from:
                given.setdefault(task, {}).update(limits(agg, args.budget_frac, args.deadline_frac))
            result["comparisons"][name] = c
            md += comparison_md(name, c)
            write_json(out / "schedulers.json", result)
            (out / "schedulers.md").write_text("\n".join(md) + "\n")
            print("\n".join(comparison_md(name, c)), flush=True)
    if not args.dry_run:
        print(f"wrote {out / 'schedulers.json'}, {out / 'schedulers.md'}")


if __name__ == "__main__":
    main()

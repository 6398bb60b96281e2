"""The discrete-event simulator (`jaxrl_dist.tools.simulate`) calibrated on
measured runs, checked on held-out ones, then asked about remote actors at scale.

Measured runs: `bench/results/async_remote.json` (sync and async over the HTTP
backend behind loopback latency proxies; `--measured`), or, where there is none,
the local-regime runs of `bench/results/async_vs_sync.json` (`--regime local`:
CartPole on the local backend, actors as threads beside the learner).

The split is fixed before any error is seen. Remote: calibrate on latency 0
and 50 ms, hold out 10 and 20 ms (each with and without stragglers). Local:
calibrate on the homogeneous setting, hold out the one with injected
stragglers. Free parameters (`FIT`): a rollout's seconds alone on a core, the
learner's seconds per chunk, a per-request overhead, and the cores actors and
learner effectively share (2 on this machine, less where other work takes
them; the CPU-contention factor). Calibration minimises the squared log error of
throughput and of the measured medians (rollout, round trip, update) over the
calibration points; every point's predicted env steps/s is then compared with
the measured one (target: within 15% at every held-out point).

Predictions for remote actors (each actor and the learner on a machine of its
own: `Machine.cores=None`, the calibrated rollout, update and overhead) at
1..64 actors, sync (n shards a round) against async (n actors, the same n
chunks an update), at 20 +- 5 ms with and without stragglers.

    python bench/simulate.py                      # the remote runs if measured, else the local regime
    python bench/simulate.py --regime local --evals 120

Writes `bench/results/simulate.{json,md,png}`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import fmt, machine_info, markdown_table, write_json  # noqa: E402

from jaxrl_dist.tools.simulate import (Machine, Measured, Point, Workload, calibrate,  # noqa: E402
                                            predict, relative_error)

RESULTS = Path(__file__).resolve().parent / "results"
REMOTE = RESULTS / "async_remote.json"
LOCAL = RESULTS / "async_vs_sync.json"
FIT = ("compute_s", "update_s_per_chunk", "overhead_s", "cores", "round_overhead_s", "chunk_overhead_s")
# `--inputs measured`: each run's own measured rollout, update and round-trip medians are its
# machine (they hold whatever load the shared machine carried then); only the learner side's
# overheads outside them are fitted
FIT_MEASURED = ("round_overhead_s", "chunk_overhead_s")
FIT_SYNTHETIC = FIT[:4]  # the synthetic runs are made without learner-side overheads
# the local round trainer runs its shards as one vectorised call: what a shard adds to it is fitted too
FIT_LOCAL = FIT[:4] + ("batch_scale",)
START = Machine(compute_s=0.004, update_s_per_chunk=0.0025, update_s_fixed=3e-4, compute_cv=0.1, update_cv=0.05,
                overhead_s=0.003, cores=2.0, batch_scale=0.5)
FIRST_GUESS_S = 0.003  # a fitted overhead's start where the model's default is 0 (the fit works on logs)
CAL_LATENCY_MS = (0.0, 50.0)  # remote: calibration latencies; the others are held out
ACTORS = (1, 2, 4, 8, 16, 32, 64)
SCALE_LATENCY = (0.020, 0.005)  # seconds: mean and jitter per direction at scale
TOLERANCE = 0.15
WARMUP = 4  # bench/async_vs_sync.py's WARMUP_UPDATES: throughput counts from the 4th update
PAPER = {"speedup_8_nodes": 7.13, "convergence": 4.37,
         "source": "TianJi (AAAI 2025): up to 7.13x throughput on 8 nodes, 4.37x faster convergence, "
                   "against its baselines (the paper's figures, not measured here)"}


class Tagged(NamedTuple):
    point: Point
    split: str  # "calibration" | "held-out"


# -- measured runs --------------------------------------------------------------

def _shown(path: Path) -> str:
    """`path` relative to the repository where it is inside it."""
    try:
        return str(path.resolve().relative_to(RESULTS.parent.parent))
    except ValueError:
        return str(path)


def _num(row: dict, key: str, default=None):
    v = row.get(key)
    return default if v is None else v


def _mean(rows: list, key: str):
    xs = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(xs) if xs else None


def remote_workload(row: dict, meta: dict) -> Workload:
    """A run of `async_remote.json` as the simulator's workload (missing optional fields
    take the bench's defaults)."""
    sync, args = row["mode"] == "sync", meta.get("args", {})
    K = int(_num(row, "batch_chunks", 4))
    actors = int(_num(row, "shards", _num(row, "actors_start", K)))
    balance = bool(_num(row, "balance", args.get("balance", True))) and not sync  # asynchronous.balance's default
    instances = _num(row, "instances")
    return Workload(mode=row["mode"], actors=actors, batch_chunks=K,
                    max_staleness=0 if sync else int(_num(row, "max_staleness", 1)),
                    steps_per_chunk=int(_num(row, "steps_per_chunk", 512)), balance=balance,
                    max_actors=None if sync else _num(row, "max_actors", args.get("max_actors")),
                    instances=instances, latency_s=_num(row, "latency_ms", 0.0) / 1e3,
                    jitter_s=_num(row, "jitter_ms", 0.0) / 1e3,
                    straggler_share=_num(row, "straggler_share", 0.0),
                    straggler_factor=_num(row, "straggler_factor", 1.0),
                    straggler_alpha=_num(row, "straggler_alpha", args.get("straggler_alpha", 0.0)),
                    updates=min(int(_num(row, "updates", 150)), 200), warmup=WARMUP)


def measured_of(rows: list) -> Measured:
    sps = _mean(rows, "env_steps_per_s")
    if sps is None:
        sps = _mean(rows, "sps")
    return Measured(sps, _mean(rows, "chunk_compute_s_median"), _mean(rows, "chunk_roundtrip_s_median"),
                    _mean(rows, "update_s_median"))


def pinned(work: Workload, rows: list) -> Workload:
    """An async point run at the actor count its runs' balancer held on average (rounded),
    the balancer off: what the point's throughput is, given the actors it ran."""
    actors = _mean(rows, "actors_mean")
    if work.mode == "sync" or actors is None:
        return work
    return work._replace(actors=max(1, int(round(actors))), balance=False)


def load_remote(path: Path, pin_actors: bool = False) -> tuple:
    """`(tagged points, meta)`: runs of one configuration (seeds) averaged into a point;
    `pin_actors`: async points at their measured actor count (`pinned`)."""
    data = json.loads(path.read_text())
    meta, groups = data.get("meta", {}), {}
    for row in data["runs"]:
        if row.get("env_steps_per_s") is None:
            continue
        groups.setdefault(remote_workload(row, meta)._replace(updates=0), []).append(row)
    points = []
    for work, rows in groups.items():
        work = work._replace(updates=max(WARMUP + 2, min(200, int(statistics.median(
            _num(r, "updates", 150) for r in rows)))))
        held = pinned(work, rows) if pin_actors else work
        tag, work = ("" if held is work else " pinned"), held
        strag = f"stragglers {work.straggler_share:g}x{work.straggler_factor:g}" if work.straggler_share else "none"
        name = (f"{work.mode} S{work.max_staleness} {1e3 * work.latency_s:g}ms {strag} "
                f"{work.actors}a/{work.instances}i K{work.batch_chunks}{tag}")
        split = "calibration" if 1e3 * work.latency_s in CAL_LATENCY_MS else "held-out"
        points.append(Tagged(Point(name, work, measured_of(rows)), split))
    return sorted(points, key=lambda t: (t.split, t.point.name)), meta


LOCAL_MODES = {"sync": 0, "async_s1": 1, "async_s2": 2, "async_s4": 4}


def load_local(path: Path, task: str = "cartpole") -> tuple:
    """The local regime of `async_vs_sync.json`: 4 shards (chunks) of 512 steps, the
    round trainer's shards as one batched call, the async balancer free in 1..8,
    stragglers one slot in 4 three times slower. Calibration: homogeneous."""
    data = json.loads(path.read_text())
    points = []
    for setting in ("homogeneous", "stragglers"):
        for mode, S in LOCAL_MODES.items():
            rows = data["runs"].get(f"{task}/{setting}/{mode}")
            if not rows:
                continue
            sync = mode == "sync"
            work = Workload(mode="sync" if sync else "async", actors=4, batch_chunks=4, max_staleness=S,
                            steps_per_chunk=512, balance=not sync, max_actors=8, batched=sync,
                            slowdown=3.0 if setting == "stragglers" else 1.0,
                            slow_every=4 if setting == "stragglers" else 0,
                            updates=int(statistics.median(r["updates"] for r in rows)))
            m = Measured(statistics.fmean(r["sps"] for r in rows),
                         update_s_median=statistics.fmean(r["learn_ms"] for r in rows) / 1e3)
            split = "calibration" if setting == "homogeneous" else "held-out"
            points.append(Tagged(Point(f"{task} {setting} {mode}", work, m), split))
    return points, {"source": _shown(path), "task": task,
                    "machine": data.get("machine", {})}


# -- calibration, validation, prediction ------------------------------------------

def start_machine(points: list) -> Machine:
    """A first guess from the measured medians where there are any."""
    m = START
    computes = [t.point.measured.chunk_compute_s_median for t in points if t.point.measured.chunk_compute_s_median]
    updates = [(t.point.measured.update_s_median, t.point.work.batch_chunks) for t in points
               if t.point.measured.update_s_median]
    if computes:
        m = m._replace(compute_s=min(computes))
    if updates:
        m = m._replace(update_s_per_chunk=max(1e-5, min(u / k for u, k in updates)))
    return m


def own_machine(point: Point, machine: Machine, ref_update_s: float = None) -> Machine:
    """`machine` with the run's own measured rollout and update medians, and the
    request overhead its round-trip median leaves beside rollout and latency; its
    cores left out (the medians were measured beside whatever shared the cores).
    With `ref_update_s`, the learner process's overheads (`round_overhead_s`,
    `chunk_overhead_s`: CPU work there too) stretch as the run's update did against it."""
    meas, work, out = point.measured, point.work, machine._replace(cores=None)
    if ref_update_s and meas.update_s_median:
        slow = meas.update_s_median / ref_update_s
        out = out._replace(round_overhead_s=machine.round_overhead_s * slow,
                           chunk_overhead_s=machine.chunk_overhead_s * slow)
    if meas.chunk_compute_s_median:
        out = out._replace(compute_s=meas.chunk_compute_s_median)
    if meas.chunk_roundtrip_s_median:
        rest = meas.chunk_roundtrip_s_median - out.compute_s - 2 * work.latency_s
        out = out._replace(overhead_s=max(0.0, rest))
    if meas.update_s_median:
        per_chunk = (meas.update_s_median - machine.update_s_fixed) / point.work.batch_chunks
        out = out._replace(update_s_per_chunk=max(1e-6, per_chunk))
    return out


def least_loaded(points: list, machine: Machine) -> Machine:
    """For predictions from per-run inputs: the smallest rollout and update medians
    measured (the runs the shared machine slowed least)."""
    own = [own_machine(t.point, machine) for t in points]
    return machine._replace(compute_s=min(m.compute_s for m in own), overhead_s=min(m.overhead_s for m in own),
                            update_s_per_chunk=min(m.update_s_per_chunk for m in own), cores=None)


def score(points: list, machine: Machine, seeds, machine_for=None) -> list:
    """Every point's prediction and relative throughput error."""
    out = []
    for t in points:
        pred = predict(t.point.work, machine_for(t.point, machine) if machine_for else machine, seeds)
        meas = t.point.measured
        out.append({"name": t.point.name, "split": t.split, "workload": t.point.work._asdict(),
                    "measured": meas._asdict(), "predicted": pred._asdict(),
                    "error": relative_error(pred.env_steps_per_s, meas.env_steps_per_s)})
    return out


def scale_workloads(n: int, stragglers: tuple, S: int) -> dict:
    """Sync (n shards a round) and async (n actors, n chunks an update) at scale."""
    lat, jit = SCALE_LATENCY
    share, factor = stragglers
    common = dict(actors=n, batch_chunks=n, steps_per_chunk=512, latency_s=lat, jitter_s=jit,
                  straggler_share=share, straggler_factor=factor, updates=100)
    return {"sync": Workload(mode="sync", max_staleness=0, **common),
            "async": Workload(mode="async", max_staleness=S, **common)}


def predictions(machine: Machine, stragglers: tuple, S: int, seeds) -> list:
    remote = machine._replace(cores=None)  # every actor and the learner on a machine of its own
    rows = []
    for strag in ((0.0, 1.0), stragglers):
        for n in ACTORS:
            for mode, work in scale_workloads(n, strag, S).items():
                pred = predict(work, remote, seeds)
                rows.append({"actors": n, "mode": mode, "straggler_share": strag[0],
                             "straggler_factor": strag[1], "max_staleness": work.max_staleness,
                             **pred._asdict()})
    return rows


TAILS = ((0.1, 5.0, 0.0), (0.1, 10.0, 0.0), (0.1, 5.0, 1.5))  # share, factor, Pareto alpha (0: none)


def sensitivity(machine: Machine, seeds, n: int = 8) -> list:
    """Async/sync learned env steps/s at `n` remote actors for staleness bounds and
    straggler tails: what the 8-node figure would take in this model."""
    remote, rows = machine._replace(cores=None), []
    for share, factor, alpha in TAILS:
        for S in (1, 2, 4, 8):
            work = scale_workloads(n, (share, factor), S)
            sync, asyn = (predict(work[m]._replace(straggler_alpha=alpha), remote, seeds) for m in ("sync", "async"))
            rows.append({"actors": n, "max_staleness": S, "straggler_share": share, "straggler_factor": factor,
                         "straggler_alpha": alpha, "ratio_learned": asyn.learned_steps_per_s / sync.learned_steps_per_s,
                         "ratio": asyn.env_steps_per_s / sync.env_steps_per_s})
    return rows


def speedups(rows: list, key: str = "env_steps_per_s") -> dict:
    """async / sync `key` per (stragglers, actors)."""
    by = {(r["straggler_share"], r["actors"], r["mode"]): r[key] for r in rows}
    return {f"{'stragglers' if s else 'none'}/{n}": by[(s, n, "async")] / by[(s, n, "sync")]
            for (s, n, mode) in by if mode == "sync"}


# -- outputs ----------------------------------------------------------------------

def plot(scored: list, rows: list, path: Path, label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(17, 4.8))
    key = "learned_steps_per_s"  # dropped chunks are work, not throughput
    for strag, style in ((0.0, "--"), (max(r["straggler_share"] for r in rows), "-")):
        tail = "stragglers" if strag else "no stragglers"
        for mode, color in (("sync", "tab:blue"), ("async", "tab:orange")):
            pts = [(r["actors"], r[key]) for r in rows if r["mode"] == mode and r["straggler_share"] == strag]
            a.plot(*zip(*pts), style, marker="o", color=color, label=f"{mode}, {tail}")
        ratio = speedups([r for r in rows if r["straggler_share"] == strag], key)
        b.plot(ACTORS, [ratio[f"{'stragglers' if strag else 'none'}/{n}"] for n in ACTORS], style, marker="o",
               color="tab:green", label=f"predicted async/sync, {tail}")
    b.plot([8], [PAPER["speedup_8_nodes"]], "*", ms=16, color="tab:red",
           label="paper's figure (TianJi, AAAI 2025): up to 7.13x\nthroughput on 8 nodes against its baselines\n"
                 "(and 4.37x faster convergence); not measured here")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ACTORS, [str(n) for n in ACTORS])
        ax.set_xlabel("remote actors (n chunks an update)")
        ax.grid(alpha=0.3)
    a.set_ylabel("predicted env steps/s learned")
    a.set_title(f"remote actors, {1e3 * SCALE_LATENCY[0]:g} +- {1e3 * SCALE_LATENCY[1]:g} ms each way")
    a.legend(fontsize=7, handlelength=4)  # long enough to show the dashes
    b.set_ylabel("async / sync throughput")
    b.set_title("predicted speed-up beside the paper's 8-node figure")
    b.set_ylim(0.8, 8.6)
    b.legend(fontsize=7, loc="center left", handlelength=4)
    parity(c, scored, label)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parity(ax, scored: list, label: str) -> None:
    for split, marker in (("calibration", "o"), ("held-out", "^")):
        pts = [(s["measured"]["env_steps_per_s"], s["predicted"]["env_steps_per_s"]) for s in scored
               if s["split"] == split]
        if pts:
            ax.plot(*zip(*pts), marker, ls="", label=split)
    top = max(max(s["measured"]["env_steps_per_s"], s["predicted"]["env_steps_per_s"]) for s in scored) * 1.1
    xs = [0, top]
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, [x * (1 - TOLERANCE) for x in xs], [x * (1 + TOLERANCE) for x in xs], color="gray",
                    alpha=0.2, label=f"+-{TOLERANCE:.0%}")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured env steps/s")
    ax.set_ylabel("predicted env steps/s")
    ax.set_title(label)
    ax.legend(fontsize=7)


def sensitivity_table(rows: list) -> str:
    key = lambda r: (r["straggler_share"], r["straggler_factor"], r["straggler_alpha"])  # noqa: E731
    by = {(*key(r), r["max_staleness"]): r["ratio_learned"] for r in rows}
    table = [[f"{sh:g} x{f:g}" + (f" Pareto({a:g})" if a else "")] + [f"{by[(sh, f, a, S)]:.2f}x" for S in (1, 2, 4, 8)]
             for sh, f, a in sorted({key(r) for r in rows})]
    return markdown_table(["stragglers", "S=1", "S=2", "S=4", "S=8"], table)


def also_table(also: list, source: str) -> list:
    rows = [[s["name"], fmt(s["measured"]["env_steps_per_s"]), fmt(s["predicted"]["env_steps_per_s"]),
             f"{100 * s['error']:+.1f}%"] for s in also]
    within = sum(abs(s["error"]) <= TOLERANCE for s in also)
    return [f"A second measured set ({source}), every point held out:", "",
            markdown_table(["point", "measured steps/s", "predicted", "error"], rows), "",
            f"Second set: max |error| {100 * max(abs(s['error']) for s in also):.1f}%, within {TOLERANCE:.0%}: "
            f"{within} of {len(also)}.", ""]


def markdown(result: dict) -> str:
    fit = result["fit"]
    lines = [f"Regime: {result['regime']} ({result['measured_from']}); calibrated on "
             f"{result['split']['calibration']}, held out {result['split']['held-out']}; inputs: "
             + ("each run's measured rollout and update medians" if result.get("inputs") == "measured"
                else "one fitted machine") + ".", "",
             "Fitted: " + ", ".join(f"{k} = {fmt(v, 4)}" for k, v in fit["machine"].items() if k in fit["fitted"])
             + f" (loss {fmt(fit['loss'])}, {fit['evaluations']} evaluations, {fmt(fit['seconds'])} s)", ""]
    truth = result["source_meta"].get("meta", {}).get("truth")
    if truth:  # synthetic runs: the parameters they were made with
        off = {k: 100 * (fit["machine"][k] / truth[k] - 1) for k in fit["fitted"]}
        lines += ["Made with: " + ", ".join(f"{k} = {fmt(truth[k], 4)} (fitted {off[k]:+.1f}%)" for k in off), ""]
    rows = [[s["name"], s["split"], fmt(s["measured"]["env_steps_per_s"]), fmt(s["predicted"]["env_steps_per_s"]),
             f"{100 * s['error']:+.1f}%", fmt(s["measured"]["update_s_median"]),
             fmt(s["predicted"]["update_s_median"]), fmt(s["predicted"]["staleness_mean"]),
             s["predicted"]["dropped"], fmt(s["predicted"]["learner_idle"])] for s in result["points"]]
    lines += [markdown_table(["point", "split", "measured steps/s", "predicted", "error", "update s (measured)",
                              "update s (predicted)", "staleness mean", "dropped", "learner idle"], rows), ""]
    held = [abs(s["error"]) for s in result["points"] if s["split"] == "held-out"]
    lines += [f"Held-out: max |error| {100 * max(held):.1f}%, every point within {TOLERANCE:.0%}: "
              f"{all(e <= TOLERANCE for e in held)}.", ""]
    if result.get("points_also"):
        lines += also_table(result["points_also"], result["also_from"]["source"])
    rows = [[r["actors"], r["mode"], "yes" if r["straggler_share"] else "no", fmt(r["env_steps_per_s"]),
             fmt(r["learned_steps_per_s"]), fmt(r["updates_per_s"]),
             f"{fmt(r['staleness_mean'])} / {r['staleness_max']}", r["dropped"], fmt(r["learner_idle"])]
            for r in result["predictions"] if r["actors"] in (8, 16, 64)]
    headers = ["actors", "mode", "stragglers", "env steps/s", "learned steps/s", "updates/s",
               "staleness mean / max", "dropped", "learner idle"]
    lines += ["Predicted, remote actors:", "", markdown_table(headers, rows), ""]
    learned = result["speedups_learned"]
    lines += [f"- async/sync {k}: {v:.2f}x (learned: {learned[k]:.2f}x)" for k, v in result["speedups"].items()]
    lines += ["", "Async/sync learned env steps/s at 8 remote actors, by straggler tail and staleness bound:", "",
              sensitivity_table(result["sensitivity"])]
    lines += ["", f"Paper's figure (not measured here): {PAPER['source']}.", ""]
    return "\n".join(lines)


def scale_settings(points: list, regime: str) -> tuple:
    """`(straggler (share, factor), staleness)` for the predictions: the remote runs'
    most common ones, else the remote bench's defaults (10% of requests 5x slower,
    staleness 2); the local runs' stragglers are slowed rollouts, not requests."""
    strag = [(t.point.work.straggler_share, t.point.work.straggler_factor) for t in points
             if t.point.work.straggler_share > 0]
    stale = [t.point.work.max_staleness for t in points if t.point.work.mode == "async"]
    if regime != "remote" or not strag or not stale:
        return (0.1, 5.0), 2
    return max(set(strag), key=strag.count), max(set(stale), key=stale.count)


def run(points: list, source: dict, regime: str, evals: int, seeds, inputs: str = "fitted", also=()) -> dict:
    """Calibrate, score `points` and `also` (a second measured set, all held out), predict."""
    cal = [t.point for t in points if t.split == "calibration"]
    if not cal or len(cal) == len(points):
        raise SystemExit(f"simulate: need calibration and held-out points, got {len(cal)} of {len(points)}")
    t0 = time.perf_counter()
    fields = {"local": FIT_LOCAL, "synthetic": FIT_SYNTHETIC}.get(regime, FIT_MEASURED if inputs == "measured" else FIT)
    ref = min((t.point.measured.update_s_median for t in points if t.point.measured.update_s_median), default=None)
    each = (lambda p, m: own_machine(p, m, ref)) if inputs == "measured" else None
    start = start_machine(points)
    start = start._replace(**{k: FIRST_GUESS_S for k in fields if not getattr(start, k)})
    fit = calibrate(cal, start, fields, seeds, evals, machine_for=each)
    seconds = time.perf_counter() - t0
    print(f"fitted in {seconds:.0f} s ({fit.evaluations} evaluations): {fit.machine}", flush=True)
    scored = score(points, fit.machine, seeds, each)
    machine = least_loaded(points, fit.machine) if inputs == "measured" else fit.machine
    for s in scored:
        print(f"{s['split']:>11} {s['name']}: measured {fmt(s['measured']['env_steps_per_s'])}, "
              f"predicted {fmt(s['predicted']['env_steps_per_s'])} ({100 * s['error']:+.1f}%)")
    stragglers, S = scale_settings(points, regime)
    rows = predictions(machine, stragglers, S, seeds)
    if regime in ("remote", "synthetic"):
        splits = {"calibration": f"latency {CAL_LATENCY_MS} ms", "held-out": "the other latencies"}
    else:
        splits = {"calibration": "homogeneous", "held-out": "stragglers (slowdown 3, one slot in 4)"}
    return {"regime": regime, "measured_from": source.get("source", ""), "source_meta": source,
            "split": splits, "fit": {"machine": fit.machine._asdict(), "fitted": list(fields), "loss": fit.loss,
                                     "evaluations": fit.evaluations, "seconds": seconds, "seeds": list(seeds)},
            "points": scored, "scale": {"latency_s": SCALE_LATENCY, "stragglers": stragglers, "max_staleness": S},
            "predictions": rows, "speedups": speedups(rows), "speedups_learned": speedups(rows, "learned_steps_per_s"),
            "sensitivity": sensitivity(machine, seeds), "inputs": inputs, "scale_machine": machine._asdict(),
            "paper": PAPER, "tolerance": TOLERANCE,
            "points_also": score([t._replace(split="held-out") for t in also], fit.machine, seeds, each)}


SYNTHETIC_TRUTH = Machine(compute_s=0.006, update_s_per_chunk=0.003, update_s_fixed=3e-4, compute_cv=0.1,
                          update_cv=0.05, overhead_s=0.008, cores=1.7)


def synthetic(path: Path, truth: Machine = SYNTHETIC_TRUTH) -> None:
    """Runs in `async_remote.json`'s schema made by the simulator itself with `truth`
    (the remote bench's settings, seeds the calibration never uses): calibrating on
    them must find `truth` again."""
    runs = []
    for lat in (0.0, 10.0, 20.0, 50.0):
        for share in ((0.0, 0.1) if lat else (0.0,)):
            for mode in ("sync", "async"):
                for seed in (101, 102):
                    w = Workload(mode=mode, actors=4 if mode == "sync" else 8, batch_chunks=4,
                                 max_staleness=0 if mode == "sync" else 2, balance=mode == "async", max_actors=16,
                                 instances=4, latency_s=lat / 1e3, jitter_s=lat / 4e3, straggler_share=share,
                                 straggler_factor=5.0, updates=80, warmup=WARMUP)
                    r = predict(w, truth, (seed,))
                    runs.append({"mode": mode, "max_staleness": w.max_staleness, "instances": 4,
                                 "actors_start": w.actors, "actors_mean": r.actors_mean, "batch_chunks": 4,
                                 "latency_ms": lat, "jitter_ms": lat / 4, "straggler_share": share,
                                 "straggler_factor": 5.0 if share else 1.0, "seed": seed, "steps_per_chunk": 512,
                                 "updates": w.updates, **{k: getattr(r, k) for k in (
                                     "env_steps_per_s", "update_s_median", "chunk_compute_s_median",
                                     "chunk_roundtrip_s_median", "staleness_max", "dropped")}})
    write_json(path, {"meta": {"synthetic": True, "truth": truth._asdict(), "args": {"max_actors": 16}},
                      "runs": runs})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--regime", choices=("auto", "remote", "local"), default="auto")
    p.add_argument("--measured", default=None, help=f"default: {REMOTE.name} (remote) or {LOCAL.name} (local)")
    p.add_argument("--evals", type=int, default=160, help="calibration's simulator evaluations at most")
    p.add_argument("--seeds", type=int, default=2, help="simulated seeds a prediction averages")
    p.add_argument("--out", default=str(RESULTS / "simulate"))
    p.add_argument("--inputs", choices=("fitted", "measured"), default="measured",
                   help="remote runs: one fitted machine for all, or each run's measured medians (default)")
    p.add_argument("--also", default=None, help="a second file of remote runs, every point held out")
    p.add_argument("--actors", choices=("balancer", "measured"), default="balancer",
                   help="remote async points: start where the runs started, the balancer free "
                   "(default), or run at the actor count the runs' balancer held, balancer off")
    p.add_argument("--synthetic", action="store_true",
                   help="calibrate on runs the simulator makes with known parameters (a self-check)")
    args = p.parse_args()
    if args.synthetic:
        args.measured = str(RESULTS / "simulate_synthetic_runs.json")
        synthetic(Path(args.measured))
        args.regime, args.out = "remote", str(RESULTS / "simulate_synthetic")
    guess = Path(args.measured).name != LOCAL.name if args.measured else REMOTE.exists()
    regime = args.regime if args.regime != "auto" else ("remote" if guess else "local")
    path = Path(args.measured) if args.measured else (REMOTE if regime == "remote" else LOCAL)
    if not path.is_file():
        raise SystemExit(f"simulate: --measured: no such file {path}")
    if regime == "remote":
        points, meta = load_remote(path, args.actors == "measured")
        source = {"source": _shown(path), "meta": meta}
    else:
        points, source = load_local(path)
    source["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()  # which measured file, wherever it lies
    inputs = args.inputs if regime == "remote" and not args.synthetic else "fitted"
    also = load_remote(Path(args.also), args.actors == "measured")[0] if args.also else ()
    result = run(points, source, "synthetic" if args.synthetic else regime, args.evals, tuple(range(args.seeds)),
                 inputs, also)
    if args.also:
        result["also_from"] = {"source": _shown(Path(args.also)),
                               "sha256": hashlib.sha256(Path(args.also).read_bytes()).hexdigest()}
    result["actors"] = args.actors
    result["machine"] = machine_info()
    out = Path(args.out)
    write_json(out.with_suffix(".json"), result)
    out.with_suffix(".md").write_text(markdown(result))
    label = "runs the simulator made (synthetic)" if args.synthetic else f"measured runs ({regime}) on this machine"
    plot(result["points"], result["predictions"], out.with_suffix(".png"), label)
    print(markdown(result))


if __name__ == "__main__":
    main()

"""Plots and a text summary of finished (or running) runs: `jaxrl-dist report`.

The plotting functions are pure over record lists (the lines of
`metrics.jsonl`), keyed by a label per run, so benchmark scripts can call
`plot_runs(runs, out_dir)` on records they hold in memory. Every figure takes
the keys it needs from whichever records have them: a round trainer's record
carries `num_shards`, the time components and, with a cost model, `modeled_s`
and `cost_usd`; the fused trainer's has steps, return and losses only. A run
that lacks a figure's keys is left out of it, and a figure no run can fill is
not written; both are said in the notes.

Figures (PNG, written with matplotlib's Agg canvas, no pyplot state):

- `return_vs_steps.png`        return against env steps
- `return_vs_modeled_time.png` return against `cum_modeled_s` (or the sum of `modeled_s`)
- `return_vs_wall_time.png`    return against `cum_wall_s` (or the sum of `round_s`)
- `shards_per_round.png`       `num_shards` per round
- `cost.png`                   `cost_usd` per round and `cum_cost_usd`
- `time_breakdown.png`         per-round stacked bars: measured dispatch, wait,
                               transfer, learn and the rest of `round_s`; beside
                               them the modeled components where present (past
                               `MAX_BARS` rounds, stacked steps)
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple, Optional

from jaxrl_dist.config import not_a_run_dir
from jaxrl_dist.scheduling.records import ASYNC_PHASES, PHASE_PREFIX, ROUND_PHASES, STARTUP_PHASES, fold_startup
from jaxrl_dist.tools.files import read_jsonl
from jaxrl_dist.tools.plots import color, figure, save

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.yaml"

# measured time components of a round record, in stacking order; `other` is
# what `round_s` holds beyond them (scheduling, logging, stacking)
MEASURED = ("dispatch_s", "wait_s", "transfer_s", "learn_s")
# modeled components (`jaxrl_dist.scheduling.cost.TIME_KEYS`), in stacking order: recorded as
# `modeled_<name>_s`; names that cannot be mistaken for a measured key are
# accepted bare as well. Other `modeled_*_s` keys are stacked after these.
MODELED = ("setup_s", "invoke_s", "start_s", "actor_s", "transfer_s", "learn_s")
MODELED_PREFIX = "modeled_"
# phases in drawing order (`startup`: the start-up's parts folded into one)
PHASE_ORDER = ("startup", *STARTUP_PHASES, *ROUND_PHASES, *ASYNC_PHASES, "finish")


def _phase_order(name: str) -> tuple:
    """Sort key: `PHASE_ORDER`, then any other phase by name."""
    return (PHASE_ORDER.index(name) if name in PHASE_ORDER else len(PHASE_ORDER), name)


class ReportError(Exception):
    """A bad input, already phrased as the one line to print."""


class Run(NamedTuple):
    path: Path
    records: list
    summary: Optional[dict]
    config: Optional[dict]


# ---------------------------------------------------------------- loading


def read_metrics(path: Path) -> list:
    """Records of a `metrics.jsonl` (`files.read_jsonl`: a cut-off last line, a run still
    writing, is dropped); `ReportError` naming a damaged line before it."""
    try:
        values = read_jsonl(path)
    except ValueError as err:
        raise ReportError(str(err)) from None
    return [rec for rec in values if isinstance(rec, dict)]


def _read_optional(path: Path, parse) -> Optional[dict]:
    try:
        data = parse(path.read_text()) if path.is_file() else None
    except Exception:  # a damaged side file costs its fields, not the report
        return None
    return data if isinstance(data, dict) else None


def load_run(path) -> Run:
    """A run directory's records, summary and config; `ReportError` if it is not one."""
    import yaml

    path = Path(path)
    if not (path / METRICS_FILE).is_file():
        raise ReportError(not_a_run_dir(path, METRICS_FILE))
    try:
        records = read_metrics(path / METRICS_FILE)
    except (OSError, UnicodeDecodeError) as err:
        raise ReportError(f"cannot read {path / METRICS_FILE}: {err}") from err
    summary = _read_optional(path / SUMMARY_FILE, json.loads)
    config = _read_optional(path / CONFIG_FILE, yaml.safe_load)
    return Run(path, with_wall_clock(records, summary, config), summary, config)


def with_wall_clock(records: list, summary: Optional[dict], config: Optional[dict]) -> list:
    """Records with `cum_wall_s`: a fused run's records have none (no rounds), so it is
    the compile time plus each update's share of its chunk's measured time (its env
    steps over the chunk's `sps`, which counts every seed's steps)."""
    if not records or _has(records, "cum_wall_s") or _has(records, "round_s") or not _has(records, "sps"):
        return records
    seeds = int((config or {}).get("num_seeds") or (summary or {}).get("num_seeds") or 1)
    clock = _num((summary or {}).get("compile_seconds"))
    steps = [_num(r.get("env_steps")) for r in records[:2]]
    first = steps[1] - steps[0] if len(steps) == 2 else steps[0]  # a resumed run starts late
    clock, prev, out = clock if math.isfinite(clock) else 0.0, steps[0] - first, []
    for rec in records:
        steps, sps = _num(rec.get("env_steps")), _num(rec.get("sps"))
        if math.isfinite(steps) and math.isfinite(sps) and sps > 0:
            clock += (steps - prev) * seeds / sps
            prev = steps
        out.append({**rec, "cum_wall_s": clock})
    return out


def wall_clock(run: "Run") -> Optional[list]:
    """Seconds since the run started, per record (None if the records cannot say)."""
    return cumulative(run.records, "cum_wall_s", "round_s")


def run_label(run: Run) -> str:
    """The directory name with the config's backend and scheduler, e.g. `a (local/fixed)`."""
    cfg = run.config or {}
    backend = (cfg.get("backend") or {}).get("name")
    # what ran: the summary's (the async trainer's is its balancer, whatever the config's scheduler)
    scheduler = (run.summary or {}).get("scheduler") or (cfg.get("scheduler") or {}).get("name")
    trainer = cfg.get("trainer")
    trainer = trainer.get("name") if isinstance(trainer, dict) else trainer
    if backend == "fused" or trainer == "fused":  # runs from before `trainer=` said `backend=fused`
        return f"{run.path.name} (fused)"
    if backend:
        return f"{run.path.name} ({backend}/{scheduler})" if scheduler else f"{run.path.name} ({backend})"
    return run.path.name


def label_runs(runs: list) -> dict:
    """`{label: records}` with unique labels (a repeated one gets its parent directory)."""
    labels = [run_label(r) for r in runs]
    out = {}
    for run, label in zip(runs, labels):
        if labels.count(label) > 1:
            label = f"{run.path.parent.name}/{label}"
        base, k = label, 2
        while label in out:
            label, k = f"{base} #{k}", k + 1
        out[label] = run.records
    return out


# ---------------------------------------------------------------- series


def _num(x) -> float:
    """A record value as float; None, missing or non-numeric become NaN."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return math.nan
    return float(x)


def _has(records: list, key: str) -> bool:
    return any(math.isfinite(_num(r.get(key))) for r in records)


def column(records: list, key: str) -> list:
    """`key` of every record as a float (NaN where it is missing or not a number)."""
    return [_num(r.get(key)) for r in records]


def _cumsum(values: list) -> list:
    """Running sum that treats a missing value as 0."""
    total, out = 0.0, []
    for v in values:
        total += v if math.isfinite(v) else 0.0
        out.append(total)
    return out


def _diff(values: list) -> list:
    prev, out = 0.0, []
    for v in values:
        out.append(v - prev if math.isfinite(v) else math.nan)
        prev = v if math.isfinite(v) else prev
    return out


def rounds(records: list) -> list:
    """The x axis of per-round figures: `round`, else `update`, else the position."""
    return [_num(r.get("round", r.get("update", i + 1))) for i, r in enumerate(records)]


def cumulative(records: list, cum_key: str, step_key: str) -> Optional[list]:
    """`cum_key` per record, or the running sum of `step_key`; None if neither is there."""
    if _has(records, cum_key):
        return column(records, cum_key)
    if _has(records, step_key):
        return _cumsum(column(records, step_key))
    return None


def per_round_cost(records: list) -> Optional[list]:
    if _has(records, "cost_usd"):
        return column(records, "cost_usd")
    if _has(records, "cum_cost_usd"):
        return _diff(column(records, "cum_cost_usd"))
    return None


def phase_names(records: list) -> list:
    """The phases the records carry (`phase_<name>_s`), in `PHASE_ORDER`, others after."""
    names = {k[len(PHASE_PREFIX):-2] for r in records for k in r if k.startswith(PHASE_PREFIX) and k.endswith("_s")}
    return sorted(names, key=_phase_order)


def measured_components(records: list) -> dict:
    """`{name: per-round seconds}`: the round's phases, which add up to its wall; for a
    run without them, the measured parts present plus `other` (the rest of `round_s`)."""
    phases = phase_names(records)
    if phases:
        return {name: column(records, f"{PHASE_PREFIX}{name}_s") for name in phases}
    parts = {k[:-2]: column(records, k) for k in MEASURED if _has(records, k)}
    if parts and _has(records, "round_s"):
        total = column(records, "round_s")
        known = [sum(v for v in vals if math.isfinite(v)) for vals in zip(*parts.values())]
        parts["other"] = [max(0.0, t - k) if math.isfinite(t) else 0.0 for t, k in zip(total, known)]
    return parts


def modeled_components(records: list) -> dict:
    """`{name: per-round seconds}` of the modeled parts: `modeled_<name>_s` keys, and
    bare `setup_s`/`invoke_s`/`start_s`/`actor_s` (their names are not measured ones)."""
    keys = sorted({k for r in records for k in r
                   if k.startswith(MODELED_PREFIX) and k.endswith("_s") and k != "modeled_s"})
    parts = {k[len(MODELED_PREFIX):-2]: column(records, k) for k in keys if _has(records, k)}
    for k in MODELED:
        name = k[:-2]
        if k not in MEASURED and name not in parts and _has(records, k):
            parts[name] = column(records, k)
    order = {k[:-2]: i for i, k in enumerate(MODELED)}
    return dict(sorted(parts.items(), key=lambda kv: order.get(kv[0], len(order))))


# ---------------------------------------------------------------- figures


def _integer_ticks(*axes) -> None:
    """Whole-number ticks on rounds and shard counts."""
    from matplotlib.ticker import MaxNLocator

    for axis in axes:
        axis.set_major_locator(MaxNLocator(integer=True))


def _left_out(name: str, missing: list, drawn: list, notes: list) -> None:
    """Notes for runs a figure leaves out: `missing` holds `label (reason)` strings."""
    if missing:
        verb = "left out" if drawn else "skipped, no run has its keys:"
        notes.append(f"{name}: {verb} {'; '.join(missing)}")


def _line_figure(runs: dict, out_dir: Path, name: str, title: str, axis: tuple,
                 series, notes: list, step: bool = False) -> Optional[Path]:
    """One axes, a line per run; `series(records)` gives `(x, y)`, or a string
    saying which keys the run lacks (it is then left out)."""
    drawn, missing = [], {}
    for label, records in runs.items():
        xy = series(records) if records else "no records"
        if isinstance(xy, str):
            missing[label] = xy
        else:
            drawn.append((label, xy))
    _left_out(name, [f"{label} ({why})" for label, why in missing.items()], drawn, notes)
    if not drawn:
        return None
    fig, axes = figure()
    ax = axes[0, 0]
    few = max(len(x) for _, (x, _) in drawn) < 40  # dots on the points of short runs
    for label, (x, y) in drawn:
        shade = color(list(runs).index(label))
        if step:
            ax.step(x, y, where="mid", label=label, color=shade)
        else:
            ax.plot(x, y, marker="." if few else None, label=label, color=shade)
    ax.set(title=title, xlabel=axis[0], ylabel=axis[1])
    if step:  # counts per round, from zero
        ax.set_ylim(bottom=0)
        _integer_ticks(ax.xaxis, ax.yaxis)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save(fig, out_dir / name)


def _return_series(x_of, x_keys: str):
    """`(x, return)` per record, x from `x_of(records)` (None when it lacks `x_keys`)."""
    def series(records):
        x = x_of(records)
        lacks = [k for k, ok in ((x_keys, x is not None), ("return", _has(records, "return"))) if not ok]
        if lacks:
            return f"no {' or '.join(lacks)}"
        # a round that finished no episode has no return: the line joins its neighbours
        points = [(a, b) for a, b in zip(x, column(records, "return"))
                  if math.isfinite(a) and math.isfinite(b)]
        return [a for a, _ in points], [b for _, b in points]
    return series


def plot_return_vs_steps(runs: dict, out_dir: Path, notes: list) -> Optional[Path]:
    series = _return_series(lambda rs: column(rs, "env_steps") if _has(rs, "env_steps") else None,
                            "env_steps")
    return _line_figure(runs, out_dir, "return_vs_steps.png", "Return", ("env steps", "return"),
                        series, notes)


def plot_return_vs_modeled_time(runs: dict, out_dir: Path, notes: list) -> Optional[Path]:
    series = _return_series(lambda rs: cumulative(rs, "cum_modeled_s", "modeled_s"),
                            "cum_modeled_s/modeled_s")
    return _line_figure(runs, out_dir, "return_vs_modeled_time.png", "Return on the modeled clock",
                        ("modeled time (s)", "return"), series, notes)


def plot_return_vs_wall_time(runs: dict, out_dir: Path, notes: list) -> Optional[Path]:
    series = _return_series(lambda rs: cumulative(rs, "cum_wall_s", "round_s"), "cum_wall_s/round_s")
    return _line_figure(runs, out_dir, "return_vs_wall_time.png", "Return on the measured clock",
                        ("wall time (s)", "return"), series, notes)


def plot_shards(runs: dict, out_dir: Path, notes: list) -> Optional[Path]:
    def series(records):
        return (rounds(records), column(records, "num_shards")) if _has(records, "num_shards") \
            else "no num_shards"
    return _line_figure(runs, out_dir, "shards_per_round.png", "Shards per round",
                        ("round", "shards"), series, notes, step=True)


def plot_cost(runs: dict, out_dir: Path, notes: list) -> Optional[Path]:
    """Two panels: dollars per round, and cumulative dollars."""
    name, drawn, missing = "cost.png", [], []
    fig, axes = figure(ncols=2)
    for i, (label, records) in enumerate(runs.items()):
        per = per_round_cost(records) if records else None
        if per is None:
            missing.append(f"{label} ({'no cost_usd/cum_cost_usd' if records else 'no records'})")
            continue
        cum = cumulative(records, "cum_cost_usd", "cost_usd")
        x = rounds(records)
        axes[0, 0].step(x, per, where="mid", label=label, color=color(i))
        axes[0, 1].plot(x, cum, label=label, color=color(i))
        drawn.append(label)
    _left_out(name, missing, drawn, notes)
    if not drawn:
        return None
    axes[0, 0].set(title="Dollars per round", xlabel="round", ylabel="USD")
    axes[0, 1].set(title="Cumulative dollars", xlabel="round", ylabel="USD")
    for ax in axes[0]:
        _integer_ticks(ax.xaxis)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return save(fig, out_dir / name)


# a component keeps its colour in every panel (measured and modeled `transfer` alike)
COMPONENT_ORDER = ("dispatch", "wait", "transfer", "learn", "other", "invoke", "start", "actor",
                   "setup", "rollout", "decode", "stack", "schedule", "record", "log", "checkpoint",
                   "startup", "finish", "collect")


def _component_color(name: str):
    from matplotlib import colormaps

    index = COMPONENT_ORDER.index(name) if name in COMPONENT_ORDER else \
        len(COMPONENT_ORDER) + sum(map(ord, name)) % (20 - len(COMPONENT_ORDER))
    return colormaps["tab20"](index)


MAX_BARS = 200  # more rounds than this are drawn as stacked steps (a bar each is slow)


def _stacked(ax, x: list, parts: dict, title: str) -> None:
    bottom = [0.0] * len(x)
    for name, values in parts.items():
        values = [v if math.isfinite(v) else 0.0 for v in values]
        top = [b + v for b, v in zip(bottom, values)]
        if len(x) > MAX_BARS:
            ax.fill_between(x, bottom, top, step="mid", label=name, color=_component_color(name),
                            linewidth=0)
        else:
            ax.bar(x, values, bottom=bottom, width=1.0 if len(x) > 60 else 0.8, label=name,
                   color=_component_color(name), linewidth=0)
        bottom = top
    ax.set(title=title, xlabel="round", ylabel="seconds")
    _integer_ticks(ax.xaxis)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))


def plot_time_breakdown(runs: dict, out_dir: Path, notes: list) -> Optional[Path]:
    """A row per run: measured components stacked per round; modeled ones beside them."""
    name = "time_breakdown.png"
    rows = []
    for label, records in runs.items():
        measured, modeled = measured_components(records), modeled_components(records)
        if measured or modeled:
            rows.append((label, records, measured, modeled))
    lacks = f"no {'/'.join(MEASURED)} or modeled components"
    missing = [f"{label} ({lacks if records else 'no records'})" for label, records in runs.items()
               if label not in {row[0] for row in rows}]
    _left_out(name, missing, rows, notes)
    if not rows:
        return None
    ncols = 2 if any(row[3] for row in rows) else 1
    fig, axes = figure(ncols=ncols, nrows=len(rows), height=3.2)
    for r, (label, records, measured, modeled) in enumerate(rows):
        x = rounds(records)
        for c, (parts, kind) in enumerate(((measured, "measured"), (modeled, "modeled"))[:ncols]):
            if parts:
                _stacked(axes[r, c], x, parts, f"{label}: {kind}")
            else:
                axes[r, c].set_axis_off()
                axes[r, c].set_title(f"{label}: no {kind} components", fontsize="small")
    return save(fig, out_dir / name)


def phase_totals(summary: Optional[dict], records: list) -> dict:
    """`{phase: seconds}` over a run: `summary.json`'s `phase_seconds` (start-up parts
    folded into one `startup`), else the records' phases summed."""
    totals = (summary or {}).get("phase_seconds") or {
        name: sum(v for v in column(records, f"{PHASE_PREFIX}{name}_s") if math.isfinite(v))
        for name in phase_names(records)}
    return fold_startup(totals)


def plot_phase_totals(runs: dict, out_dir: Path, notes: list, summaries: Optional[dict] = None) -> Optional[Path]:
    """One stacked bar per run: its seconds by phase, start-up first."""
    name = "phases.png"
    totals = {label: phase_totals((summaries or {}).get(label), records) for label, records in runs.items()}
    rows = {label: parts for label, parts in totals.items() if parts}
    _left_out(name, [f"{label} (no phases: a run without rounds, or from before they were recorded)"
                     for label in runs if label not in rows], list(rows), notes)
    if not rows:
        return None
    names = sorted({n for parts in rows.values() for n in parts}, key=_phase_order)
    # tall enough for the bars and for the legend beside them (a short figure collapses the axes)
    fig, axes = figure(height=max(1.0 + 0.5 * len(rows), 1.2 + 0.25 * len(names)))
    ax, labels = axes[0, 0], list(rows)
    left = [0.0] * len(labels)
    for n in names:
        widths = [rows[label].get(n, 0.0) for label in labels]
        ax.barh(labels, widths, left=left, label=n, color=_component_color(n))
        left = [a + b for a, b in zip(left, widths)]
    ax.set(title="where the time went", xlabel="seconds")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return save(fig, out_dir / name)


PLOTS = (plot_return_vs_steps, plot_return_vs_modeled_time, plot_return_vs_wall_time,
         plot_shards, plot_cost, plot_time_breakdown)


def make_plots(runs: dict, out_dir, summaries: Optional[dict] = None) -> tuple:
    """Every figure for `runs` (`{label: records}`; `summaries`: `{label: summary.json}`
    where there is one) into `out_dir`; returns `(written paths, notes)`, the notes
    naming each figure or run left out."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, notes = [], []
    for plot in PLOTS:
        path = plot(runs, out_dir, notes)
        if path is not None:
            paths.append(path)
    path = plot_phase_totals(runs, out_dir, notes, summaries)
    return paths + ([path] if path is not None else []), notes


def plot_runs(runs: dict, out_dir) -> list:
    """`make_plots` without the notes: the PNG paths written."""
    return make_plots(runs, out_dir)[0]


# ---------------------------------------------------------------- text


def _fmt(value, spec: str, unit: str = "") -> str:
    x = _num(value)
    return "-" if not math.isfinite(x) else f"{format(x, spec)}{unit}"


def summary_line(label: str, summary: Optional[dict], records: list) -> str:
    """One line: final return, rounds, dollars, modeled and wall time. From
    `summary.json`; a run without one (still running, killed) from its records."""
    s = summary or {}
    last = records[-1] if records else {}
    final = s.get("final_return", last.get("return"))
    n = s.get("rounds", s.get("num_updates", last.get("round", last.get("update"))))
    cost = s.get("cost_usd", last.get("cum_cost_usd"))
    modeled = s.get("modeled_seconds", last.get("cum_modeled_s"))
    wall = s.get("wall_seconds", last.get("cum_wall_s"))
    kind = "rounds" if "rounds" in s or "num_shards" in last else "updates"
    text = (f"{label}: final return {_fmt(final, '.1f')}, {kind} {_fmt(n, '.0f')}, "
            f"cost {'-' if not math.isfinite(_num(cost)) else '$' + format(_num(cost), '.4g')}, "
            f"modeled {_fmt(modeled, '.1f', ' s')}, wall {_fmt(wall, '.1f', ' s')}")
    return text if summary is not None else text + " (no summary.json)"


def report(paths: list, out_dir=None) -> tuple:
    """Load the run directories, write the figures into `out_dir` (default the first
    run directory). Returns `(summary lines, written paths, notes)`; `ReportError`
    names the first path that is not a run directory."""
    runs = [load_run(p) for p in paths]
    labelled = label_runs(runs)
    lines = [summary_line(label, run.summary, run.records)
             for label, run in zip(labelled, runs)]
    out_dir = Path(out_dir) if out_dir else runs[0].path
    try:
        written, notes = make_plots(labelled, out_dir, dict(zip(labelled, (run.summary for run in runs))))
    except OSError as err:
        raise ReportError(f"cannot write the plots to {out_dir}: {err.strerror or err}") from err
    return lines, written, notes

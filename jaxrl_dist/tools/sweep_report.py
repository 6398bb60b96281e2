"""`jaxrl-dist report MULTIRUN_DIR`: a sweep's jobs grouped by their overrides, seeds
aggregated.

A sweep directory is what `jaxrl-dist train -m` writes (`multirun.yaml`, but from the
Optuna sweeper, and one run directory per job); a job with no records (failed, or
stopped before its first) is left out, and a note names it. Jobs whose overrides
differ only in `seed` (and `run.*`/`hydra.*` keys) form a group. Per env id (figure
titles name it), with `rliable` for the final scores:

- `sweep_return_vs_steps[_ENV].png`, `sweep_return_vs_wall_time[_ENV].png`: each
  group's mean return over seeds on a common grid, with a 95% percentile-bootstrap
  band over seeds; groups get their own marker and line style, so identical curves
  stay visible. The time axis is each job's own training clock from its first
  record (`training_clock`): jobs of a sweep share the compile cache, so the first
  job compiles and the others load, and a clock that counted compiles would set
  their curves apart by that alone (the compile seconds are a column of the table);
- `sweep_final_iqm[_ENV].png`: each group's IQM (interquartile mean) of the final
  return over seeds, with a 95% stratified-bootstrap interval;
- `sweep_performance_profile[_ENV].png`: the share of a group's runs whose final
  return exceeds each threshold, with 95% intervals; only groups of at least
  `MIN_PROFILE_RUNS` runs are drawn (a profile of two runs is two steps), and a note
  says which were left out, or that the figure was skipped;
- `sweep.md`: a markdown table (group, env, seeds, mean and IQM of the final return
  with its interval, mean wall and compile seconds), then the notes.

`rliable` needs `pandas<3` (the `report` extra pins it).
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np

from jaxrl_dist.config import needs
from jaxrl_dist.tools.files import markdown_table
from jaxrl_dist.tools.plots import color, figure, save
from jaxrl_dist.tools.report import ReportError, Run, column, load_run, wall_clock

BOOTSTRAP_REPS = 2000
GRID_POINTS = 100
CI = 95
MIN_PROFILE_RUNS = 5  # fewer final returns than this make a profile of a few steps
MARKERS = "os^Dv<>pP*X"
STYLES = ("-", "--", "-.", ":")
_IGNORED = ("seed", "run.", "hydra.", "+hydra.")


class Group(NamedTuple):
    label: str  # the overrides the group's jobs share, seed left out
    env_id: str
    runs: list  # `report.Run`, one a seed


def is_sweep(path) -> bool:
    """A multirun's directory: `multirun.yaml`, or (the Optuna sweeper writes none) job
    directories numbered from 0 that hold Hydra's `.hydra/`."""
    path = Path(path)
    return (path / "multirun.yaml").is_file() or (path / "0" / ".hydra").is_dir()


def _job_overrides(run_dir: Path) -> list:
    import yaml

    path = run_dir / ".hydra" / "overrides.yaml"
    given = yaml.safe_load(path.read_text()) if path.is_file() else []
    return [o for o in given or [] if not o.lstrip("+~").startswith(_IGNORED)]


def _load_jobs(path: Path) -> tuple:
    """`(loaded, left_out)`: each job with records as `(Run, its overrides)`, and the
    names of the jobs without any (a failed job, one stopped before its first record)."""
    jobs = sorted((p for p in path.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    loaded, left_out = [], []
    for job in jobs:
        try:
            loaded.append((load_run(job), frozenset(_job_overrides(job))))
        except ReportError:
            left_out.append(job.name + (" (failed)" if (job / "FAILED").is_file() else ""))
    if not loaded:
        raise ReportError(f"{path}: a sweep directory with no finished job")
    return loaded, left_out


def planned_jobs(path: Path) -> Optional[int]:
    """How many jobs the basic sweeper's `multirun.yaml` asked for (the product of each
    swept override's values, `hydra.sweeper.params` too); None for another sweeper, or
    sweeps that are sampled (`interval(...)`) rather than listed."""
    import yaml
    from hydra.core.override_parser.overrides_parser import OverridesParser

    saved = yaml.safe_load((path / "multirun.yaml").read_text()) if (path / "multirun.yaml").is_file() else None
    hydra = (saved or {}).get("hydra") or {}
    sweeper = hydra.get("sweeper") or {}
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    given = [*((hydra.get("overrides") or {}).get("task") or []),
             *(f"{k}={v}" for k, v in (sweeper.get("params") or {}).items())]
    count = 1
    try:
        for o in OverridesParser.create().parse_overrides(given):
            count *= len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
    except Exception:  # an override this parser cannot list: no count, no note
        return None
    return count


def _never_ran(path: Path) -> list:
    """The note on the jobs a basic sweep planned that have no directory (the multirun
    stopped before them: a Ctrl-C or SIGTERM, or a failed job under a launcher that
    stops), or none."""
    planned = planned_jobs(path)
    never = [] if planned is None else [str(i) for i in range(planned) if not (path / str(i)).is_dir()]
    return [f"jobs the sweep planned that never ran (no directory): {', '.join(never)} of {planned}; "
            "the figures and the table leave them out"] if never else []


def load_sweep(path) -> list:
    """The sweep's jobs with records as `Group`s (a failed job, with none, is left out);
    a group is named by the overrides in which its jobs differ from the others."""
    return _grouped(_load_jobs(Path(path))[0])


def _grouped(loaded: list) -> list:
    # a job left alone (the others failed) is named by its own overrides, not "all jobs"
    common = frozenset.intersection(*(given for _, given in loaded)) if len(loaded) > 1 else frozenset()
    groups: dict = {}
    for run, given in loaded:
        env_id = (run.summary or {}).get("env_id") or ((run.config or {}).get("env") or {}).get("id", "?")
        label = " ".join(sorted(given - common)) or "all jobs"
        groups.setdefault((env_id, label), []).append(run)
    return [Group(label, env_id, runs) for (env_id, label), runs in groups.items()]


# ---------------------------------------------------------------- statistics


def training_clock(run: Run) -> Optional[list]:
    """Seconds per record on the job's own training clock, 0 at its first record (None if
    the records cannot say). The time before that record goes: the compile (which in a
    sweep depends on which job filled the compile cache first), start-up, and the first
    round or chunk, which holds the first call of each program."""
    clock = wall_clock(run)
    start = next((c for c in clock or () if math.isfinite(c)), None)
    return None if start is None else [c - start for c in clock]


def job_curve(run: Run, x_key: str) -> Optional[tuple]:
    """`(x, return)` arrays of one job, over its records with a return: x is `env_steps`,
    or (`x_key="wall"`) its `training_clock`; None when a record lacks x."""
    clock = column(run.records, "env_steps") if x_key == "env_steps" else training_clock(run)
    if clock is None:
        return None
    points = [(x, r["return"]) for x, r in zip(clock, run.records)
              if isinstance(r.get("return"), (int, float))]
    if not points or not all(math.isfinite(x) for x, _ in points):
        return None
    return np.asarray([x for x, _ in points], float), np.asarray([y for _, y in points], float)


def mean_band(curves: list, rng, reps: int = BOOTSTRAP_REPS) -> tuple:
    """Mean over seeds on a common grid, with a 95% percentile-bootstrap band:
    `(grid, mean, low, high)`; each seed's curve is interpolated (not extrapolated)."""
    lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
    grid = np.linspace(lo, hi, GRID_POINTS) if hi > lo else np.array([lo])
    ys = np.stack([np.interp(grid, x, y) for x, y in curves])  # [seeds, grid]
    picks = rng.integers(0, len(ys), size=(reps, len(ys)))
    means = ys[picks].mean(axis=1)
    low, high = np.percentile(means, [(100 - CI) / 2, 100 - (100 - CI) / 2], axis=0)
    return grid, ys.mean(0), low, high


def final_scores(group: Group) -> np.ndarray:
    finals = [(r.summary or {}).get("final_return") for r in group.runs]
    return np.asarray([f for f in finals if isinstance(f, (int, float)) and math.isfinite(f)], float)


def iqm_intervals(groups: list, seed: int = 0) -> dict:
    """`{label: (iqm, low, high)}`: rliable's IQM of the final returns, 95% stratified bootstrap."""
    rly, metrics = _rliable("library"), _rliable("metrics")

    scores = {g.label: final_scores(g)[:, None] for g in groups if len(final_scores(g))}
    if not scores:
        return {}
    with warnings.catch_warnings():  # arch's notice that rliable's random_state is deprecated
        warnings.simplefilter("ignore", FutureWarning)
        point, interval = rly.get_interval_estimates(
            scores, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=BOOTSTRAP_REPS,
            random_state=np.random.RandomState(seed))
    return {k: (float(point[k][0]), float(interval[k][0, 0]), float(interval[k][1, 0])) for k in point}


def performance_profiles(groups: list, seed: int = 0) -> tuple:
    """`(thresholds, {label: (profile, low, high)})` over the groups' final returns."""
    rly = _rliable("library")

    scores = {g.label: final_scores(g)[:, None] for g in groups if len(final_scores(g))}
    every = np.concatenate([s.ravel() for s in scores.values()])
    thresholds = np.linspace(every.min(), every.max(), 50) if every.max() > every.min() else every[:1]
    profiles, cis = rly.create_performance_profile(scores, thresholds, reps=BOOTSTRAP_REPS)
    return thresholds, {k: (profiles[k], cis[k][0], cis[k][1]) for k in profiles}


def _rliable(part: str):
    """rliable's `part` (the `report` extra), or the one line naming the extra."""
    return needs(f"rliable.{part}", "report", "jaxrl-dist report SWEEP_DIR")


# ---------------------------------------------------------------- figures and table


def _style(i: int) -> dict:
    return {"color": color(i), "marker": MARKERS[i % len(MARKERS)], "linestyle": STYLES[i % len(STYLES)],
            "markevery": max(1, GRID_POINTS // 8)}


def plot_curves(groups: list, x_key: str, out: Path, title: str, xlabel: str, rng) -> tuple:
    """One line and band per group; `(path or None, names of groups left out)`."""
    fig, axes = figure()
    ax, drawn, left = axes[0, 0], 0, []
    for i, g in enumerate(groups):
        curves = [c for c in (job_curve(r, x_key) for r in g.runs) if c is not None]
        if not curves:
            left.append(g.label)
            continue
        grid, mean, low, high = mean_band(curves, rng)
        style = _style(i)
        ax.plot(grid, mean, label=f"{g.label} ({len(curves)} seeds)", **style)
        ax.fill_between(grid, low, high, color=style["color"], alpha=0.15)
        drawn += 1
    if not drawn:
        return None, left
    ax.set(title=title, xlabel=xlabel, ylabel="return (mean over seeds, 95% bootstrap band)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save(fig, out), left


def plot_iqm(groups: list, iqm: dict, out: Path, env_id: str) -> Path:
    fig, axes = figure(height=max(2.5, 0.6 * len(iqm) + 1.5))
    ax = axes[0, 0]
    labels = [g.label for g in groups if g.label in iqm]
    for i, label in enumerate(labels):
        point, low, high = iqm[label]
        ax.errorbar([point], [i], xerr=[[point - low], [high - point]], fmt=MARKERS[i % len(MARKERS)],
                    color=_style(i)["color"], capsize=4)
    ax.set_yticks(range(len(labels)), labels, fontsize="small")
    ax.set(title=f"{env_id}: IQM of the final return (95% stratified bootstrap)", xlabel="final return")
    ax.grid(alpha=0.3, axis="x")
    return save(fig, out)


def plot_profiles(groups: list, thresholds, profiles: dict, out: Path, env_id: str) -> Path:
    fig, axes = figure()
    ax = axes[0, 0]
    for i, g in enumerate(groups):
        if g.label not in profiles:
            continue
        profile, low, high = profiles[g.label]
        style = _style(i) | {"markevery": max(1, len(thresholds) // 8)}
        ax.plot(thresholds, profile, label=g.label, **style)
        ax.fill_between(thresholds, low, high, color=style["color"], alpha=0.15)
    ax.set(title=f"{env_id}: performance profile", xlabel="final return threshold",
           ylabel="fraction of runs above it", ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return save(fig, out)


def _num_text(x, spec: str = ".1f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def _mean_of(runs: list, key: str) -> Optional[float]:
    values = [(r.summary or {}).get(key) for r in runs]
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(np.mean(values)) if values else None


TABLE_HEADERS = ("group", "env", "seeds", "final return (mean)", "IQM [95% CI]", "wall (s, mean)",
                 "compile (s, mean)")


def table(groups: list, iqms: dict) -> list:
    """The lines of `sweep.md`'s markdown table: a row per group."""
    rows = []
    for g in groups:
        scores = final_scores(g)
        point, low, high = iqms.get(g.label, (None, None, None))
        iqm = "-" if point is None else f"{point:.1f} [{low:.1f}, {high:.1f}]"
        rows.append([g.label, g.env_id, len(g.runs), _num_text(scores.mean() if len(scores) else None), iqm,
                     _num_text(_mean_of(g.runs, "wall_seconds")), _num_text(_mean_of(g.runs, "compile_seconds"))])
    return markdown_table(TABLE_HEADERS, rows).splitlines()


def _runs_text(counts: list) -> str:
    """`2 runs`, or `2-3 runs` for a range."""
    lo, hi = min(counts), max(counts)
    return f"{lo} run{'' if lo == 1 else 's'}" if lo == hi else f"{lo}-{hi} runs"


def profile_groups(groups: list, where: str = "") -> tuple:
    """`(groups drawn on the performance profile, notes)`: those with at least
    `MIN_PROFILE_RUNS` final returns; the notes name the rest, or say the figure was
    skipped (`where`: the env, for a sweep of several)."""
    counts = {g.label: len(final_scores(g)) for g in groups}
    scored = [g for g in groups if counts[g.label]]
    enough = [g for g in scored if counts[g.label] >= MIN_PROFILE_RUNS]
    few = [g for g in scored if counts[g.label] < MIN_PROFILE_RUNS]
    if not enough:
        return [], [f"performance profile skipped{where}: groups have "
                    f"{_runs_text([counts[g.label] for g in few])}, it needs at least {MIN_PROFILE_RUNS}"]
    notes = [f"performance profile{where}: left out {g.label} ({_runs_text([counts[g.label]])}, "
             f"it needs at least {MIN_PROFILE_RUNS})" for g in few]
    return enough, notes


def _env_figures(mine: list, env_id: str, tag: str, out_dir: Path, rng) -> tuple:
    """One env's figures: `(written paths, notes, IQMs)`."""
    written, notes, where = [], [], f" ({env_id})" if tag else ""
    for key, name, what, xlabel in (
            ("env_steps", "steps", "env steps", "env steps"),
            ("wall", "wall_time", "training time", "training time from each job's first record (s)")):
        p, left = plot_curves(mine, key, out_dir / f"sweep_return_vs_{name}{tag}.png",
                              f"{env_id}: return against {what}", xlabel, rng)
        written += [p] if p else []
        notes += [f"sweep_return_vs_{name}{tag}.png: left out {', '.join(left)} (no such records)"] if left else []
    iqm = iqm_intervals(mine)
    if iqm:
        written.append(plot_iqm(mine, iqm, out_dir / f"sweep_final_iqm{tag}.png", env_id))
        drawn, said = profile_groups(mine, where)
        notes += said
        if drawn:
            thresholds, profiles = performance_profiles(drawn)
            written.append(plot_profiles(mine, thresholds, profiles,  # styles as elsewhere
                                         out_dir / f"sweep_performance_profile{tag}.png", env_id))
    return written, notes, iqm


def sweep_report(path, out_dir=None) -> tuple:
    """Figures and `sweep.md` for the sweep at `path` (into `out_dir`, default `path`);
    `(table lines, written paths, notes)`; `sweep.md` holds the table, then the notes."""
    loaded, left_out = _load_jobs(Path(path))
    groups = _grouped(loaded)
    out_dir = Path(out_dir or path)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    envs = sorted({g.env_id for g in groups})
    written, iqms = [], {}
    notes = [f"jobs left out, with no records: {', '.join(left_out)}"] if left_out else []
    notes += _never_ran(Path(path))
    unfinished = [run.path.name for run, _ in loaded if run.summary is None]
    notes += [f"jobs without summary.json (interrupted, or still running), drawn from their records: "
              f"{', '.join(unfinished)}; one continues with jaxrl-dist train run.resume=DIR"] if unfinished else []
    for env_id in envs:
        tag = "" if len(envs) == 1 else "_" + "".join(c if c.isalnum() else "_" for c in env_id)
        paths, said, iqm = _env_figures([g for g in groups if g.env_id == env_id], env_id, tag, out_dir, rng)
        written, notes = written + paths, notes + said
        iqms.update(iqm)
    lines = table(groups, iqms)
    (out_dir / "sweep.md").write_text("\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else [])) + "\n")
    written.append(out_dir / "sweep.md")
    return lines, written, notes

"""`hydra/launcher=vmap`: a sweep's jobs grouped by their shaping keys, each group trained
as one fused program (`trainers.group`), every job still a Hydra job.

The launcher composes and checks every job's config first. Jobs whose shaping keys are
equal (`config.key_kind`) form a group: its members are the jobs' seeds, with each
job's traced coefficients, trained by one compiled program. Then every job goes
through Hydra's own `run_job` (its `.hydra/`, its job log, the callbacks, the return
value the sweeper reads), with a task function that reports what the group trained.
Jobs that cannot join a group (the round trainers, a job alone in its group, a resumed
run, envpool) and jobs whose config fails run as the basic launcher runs them, one
after another in this process. The plugin imports this module only when a sweep is
launched, so its JAX imports stay off Hydra's start-up scan.
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from omegaconf import OmegaConf, open_dict

from jaxrl_dist.backends import BackendError
from jaxrl_dist.cli import train as train_cli
from jaxrl_dist.cli.compose import one_line, override_keys
from jaxrl_dist.config import ConfigError
from jaxrl_dist.platform import configure_cpu, use_unrolled_threefry
from jaxrl_dist.trainers.group import differing, plan, shaping, train_group
from jaxrl_dist.trainers.interrupt import Interrupted, exit_code, exit_now, signal_name


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Composer:
    """Each job's composed config, as Hydra's `load_sweep_config` makes it, for a fraction
    of the time: one Hydra compose per kind of job (the same config groups chosen, the
    same keys set), the others a copy with their own values set as Hydra sets a
    KEY=VALUE override (`OmegaConf.update(..., merge=True)`). A compose costs ~0.2 s
    here, and a sweep pays two a job: the sweeper's check that each job composes
    (`Sweeper.validate_batch_is_legal`), then the launcher's. `install` puts it in
    place of the config loader's method for this sweep, so the sweeper's check composes
    (and keeps) what the launcher then takes."""

    def __init__(self, load):
        self._load, self._kinds, self._groups, self._made = load, {}, None, {}

    @classmethod
    def install(cls, loader) -> "Composer":
        composer = cls(loader.load_sweep_config)
        loader.load_sweep_config = composer
        return composer

    def __call__(self, master_config, sweep_overrides):
        key = tuple(sweep_overrides)
        if key not in self._made:
            self._made[key] = self._compose(master_config, list(sweep_overrides))
        return self._made[key]

    def take(self, master_config, overrides: list):
        """The job's config, the caller's own (composed now if the sweeper did not ask)."""
        return self._made.pop(tuple(overrides), None) or self._compose(master_config, overrides)

    def _compose(self, master_config, overrides: list):
        parsed = OverridesParser.create().parse_overrides(overrides)
        plain = [] if self._groups is None else [j for j, o in enumerate(parsed) if _is_value(o, self._groups)]
        kind = (tuple(o.input_line for j, o in enumerate(parsed) if j not in plain),
                tuple(parsed[j].key_or_group for j in plain))
        if kind not in self._kinds:
            config = self._load(master_config=master_config, sweep_overrides=overrides)
            self._kinds[kind] = copy.deepcopy(config)
            self._groups = self._groups or set(config.hydra.runtime.choices)
            return config
        config = copy.deepcopy(self._kinds[kind])
        for j in plain:
            OmegaConf.update(config, parsed[j].key_or_group, parsed[j].value(), merge=True)
        task = [o for o in parsed if not o.is_hydra_override()]
        with open_dict(config.hydra):
            config.hydra.overrides.task = [o.input_line for o in task]
            config.hydra.job.override_dirname = _dirname(config, task)
        return config


def _jobs(launcher, job_overrides: Sequence[Sequence[str]], first: int) -> list:
    """Each job's composed config, with its Hydra job number."""
    composer = getattr(launcher, "composer", None) or Composer(launcher.hydra_context.config_loader.load_sweep_config)
    out = []
    for i, overrides in enumerate(job_overrides):
        config = composer.take(launcher.config, list(overrides))
        with open_dict(config):
            config.hydra.job.id = config.hydra.job.num = first + i
        out.append((list(overrides), config))
    return out


def _is_value(o, groups: set) -> bool:
    """A plain KEY=VALUE override of a key the config has (no config group, no +, ~ or ++)."""
    return not (o.is_add() or o.is_delete() or o.is_force_add() or o.is_hydra_override()
                or o.package is not None or o.key_or_group in groups)


def _dirname(config, overrides: list) -> str:
    """`hydra.job.override_dirname`, as Hydra makes it."""
    c = config.hydra.job.config.override_dirname
    lines = sorted(o.input_line for o in overrides if o.key_or_group not in c.exclude_keys)
    return c.item_sep.join(lines).replace("=", c.kv_sep)


def _checked(jobs: list) -> tuple:
    """`(configs, failures)`: each job's validated `Config` (None where it failed) and
    `{index: its one line}`."""
    configs, failures = [], {}
    for i, (overrides, config) in enumerate(jobs):
        try:
            cfg = train_cli._checked(config, overrides)
            if "run.progress" not in override_keys(overrides):
                cfg.run.progress = True  # the group's bar (no member draws its own)
            configs.append(cfg)
        except ConfigError as err:
            configs.append(None)
            failures[i] = f"error: {one_line(err)}"
    return configs, failures


def _output_dir(config) -> Path:
    return Path(str(OmegaConf.select(config, "hydra.sweep.dir"))) / str(OmegaConf.select(config, "hydra.sweep.subdir"))


def _describe(configs: list, groups: list, alone: dict, overrides: Sequence = (), max_members: int = 0) -> None:
    """One line for the plan, one naming the swept keys that split the sweep, and one for
    a job with more seeds than `max_members` (its seeds stay in one program)."""
    ok = [c for c in configs if c is not None]
    split = differing([c for c in ok if c.trainer.name == "fused"]) if len(ok) > 1 else []
    if split:
        _say(f"vmap: {_splitting(split, overrides)}: jobs with different values train in different programs")
    big = max((c.num_seeds for c in ok), default=0)
    if max_members and big > max_members:
        _say(f"vmap: a job of {big} seeds (num_seeds) is more than hydra.launcher.max_members={max_members}; "
             "a job's seeds stay in one program")
    sizes = sorted({sum(configs[i].num_seeds for i in g) for g in groups})
    members = "-".join(str(n) for n in sizes[::max(1, len(sizes) - 1)])  # "4", or "2-6" where they differ
    shapes = len({shaping(configs[g[0]]) for g in groups})  # a group over max_members runs in several programs
    parts = [f"{shapes} group(s) in {len(groups)} program(s) of {members} members (hydra.launcher.max_members)"
             if shapes < len(groups) else f"{len(groups)} group(s) of {members} members, one program each"
             ] if groups else []
    parts += [f"{len(alone)} on {'its' if len(alone) == 1 else 'their'} own"] if alone else []
    failed = len(configs) - len(ok)
    parts += [f"{failed} failed {'its' if failed == 1 else 'their'} checks"] if failed else []
    _say(f"vmap: {len(configs)} jobs: {', '.join(parts)}")


def _splitting(split: list, overrides: Sequence) -> str:
    """What split the sweep: the swept overrides that set shaping keys (`env` through its
    preset's keys), with those keys; else the shaping keys themselves."""
    given = [dict(o.split("=", 1) for o in job if "=" in o) for job in overrides]
    swept = sorted({k for g in given for k in g if len({g2.get(k) for g2 in given}) > 1})
    named = [k for k in swept if k in split or "." not in k.lstrip("+")]  # a key, or a preset group
    keys = f"{', '.join(split[:4])}{f', ... ({len(split)} keys)' if len(split) > 4 else ''}"
    subject, what = (split, "shaping keys") if not named or named == split else (named, f"shaping keys {keys}")
    return f"{', '.join(subject)} {'differs' if len(subject) == 1 else 'differ'} between jobs ({what})"


def launch(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
    """Hydra's `Launcher.launch` for `hydra/launcher=vmap`: one `JobReturn` per job, in order."""
    configure_cpu()  # as the job does, before the checks import the env suites (JAX)
    use_unrolled_threefry()
    setup_globals()
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    Path(str(launcher.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    jobs = _jobs(launcher, job_overrides, initial_job_idx)
    configs, failures = _checked(jobs)
    valid = [i for i, c in enumerate(configs) if c is not None]
    groups, alone = plan([configs[i] for i in valid], launcher.max_members)
    groups = [[valid[i] for i in g] for g in groups]
    alone = {valid[i]: why for i, why in alone.items()}
    _describe(configs, groups, alone, [o for o, _ in jobs], launcher.max_members)
    returns, rows = {}, {}
    unit = "group" if len({shaping(configs[g[0]]) for g in groups}) == len(groups) else "program"
    for g, members in enumerate(groups, 1):
        _run_group(launcher, jobs, configs, members, f"{unit} {g}/{len(groups)}", returns, rows)
    for i in sorted(set(alone) | set(failures)):
        if i in alone:
            _say(f"job {jobs[i][1].hydra.job.num}: on its own ({alone[i]})")
        task = train_cli.trained(None, failures[i]) if i in failures else launcher.task_function
        returns[i] = _run_job(launcher, jobs[i][1], task)
        rows[i] = _row(jobs[i], returns[i], "failed" if i in failures else "alone")
    _table([rows[i] for i in sorted(rows)], [o for o, _ in jobs])
    return [returns[i] for i in range(len(jobs))]


def _run_group(launcher, jobs, configs, members: list, label: str, returns: dict, rows: dict) -> None:
    """Train one group and hand each of its jobs to Hydra with what it trained; a group
    that fails fails each of its jobs with the one line; Ctrl-C exits 130."""
    dirs = [_output_dir(jobs[i][1]) for i in members]
    for i in members:
        _save_overrides(jobs[i][1])

    def finish(summaries: list, failure=None) -> None:
        for i, summary in zip(members, summaries):
            returns[i] = _run_job(launcher, jobs[i][1], train_cli.trained(summary, failure))
            rows[i] = _row(jobs[i], returns[i], label, summary)

    try:
        train_group([configs[i] for i in members], dirs, label, _say, then=finish)
    except (ConfigError, BackendError) as err:
        finish([None] * len(members), f"error: {one_line(err)}")
    except Interrupted:
        _say(f"interrupted: each job of {label} saved a checkpoint in its run dir "
             f"({dirs[0].parent}/*); continue one with run.resume=RUN_DIR")
        finish([None] * len(members))  # each job's .hydra/ and job log, as a job stopped alone has
        raise SystemExit(exit_code()) from None
    except KeyboardInterrupt:  # the second Ctrl-C: where the group was, maybe inside a write
        _say(f"stopped at once ({signal_name()} twice): nothing saved since each job's last checkpoint "
             f"({dirs[0].parent}/*); continue one with run.resume=RUN_DIR")
        exit_now(exit_code())


def _save_overrides(config) -> None:
    """A job's `.hydra/overrides.yaml`, as Hydra writes it, before its group trains
    (`run_job` writes all of `.hydra/` when the group ends): a group stopped at once (a
    second Ctrl-C) still leaves each directory saying which job it is, which `report`
    groups the jobs by."""
    sub = OmegaConf.select(config, "hydra.output_subdir")
    if sub is None:  # hydra.output_subdir=null: no `.hydra/` at all
        return
    where = _output_dir(config) / str(sub)
    where.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(list(config.hydra.overrides.task)), where / "overrides.yaml")


def _run_job(launcher, config, task) -> JobReturn:
    ret = run_job(hydra_context=launcher.hydra_context, task_function=task, config=config,
                  job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    return ret


def _row(job, ret: JobReturn, how: str, summary=None) -> tuple:
    overrides, config = job
    value = ret.return_value if ret.status.name == "COMPLETED" else None
    digest = ""
    if summary is None:  # a job run on its own wrote its summary
        path = _output_dir(config) / "summary.json"
        if path.is_file():
            summary = json.loads(path.read_text())
    if summary:
        digest = str(summary.get("params_sha256", ""))[:12]
    final = summary.get("final_return") if summary else None
    return (str(config.hydra.job.num), overrides, how,
            "-" if final is None else f"{final:.4g}", digest or "-", "-" if value is None else f"{value:.4g}")


def _table(rows: list, overrides: list) -> None:
    """The sweep's jobs: the overrides that differ between them, how each ran, final
    return, params digest, and the objective where it is not the final return (the
    default `run.objective`), so the overrides keep the width."""
    from rich.console import Console
    from rich.table import Table

    common = set.intersection(*(set(o) for o in overrides)) if overrides else set()
    rows = [(r[0], " ".join(o for o in filter_overrides(r[1]) if o not in common) or "-", *r[2:]) for r in rows]
    names = ["job", "overrides", "ran", "final return", "params sha256", "objective"]
    if all(r[5] == r[3] for r in rows):
        names, rows = names[:5], [r[:5] for r in rows]
    table = Table(title="sweep", title_justify="left")
    for name in names:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console().print(table)

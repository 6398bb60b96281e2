"""`jaxrl-dist train`: a Hydra application, run by Hydra's own machinery.

So everything a Hydra user reaches for works: `-m` multirun with sweeps (`seed=1,2,3`,
`range()`, `choice()`), launchers (`hydra/launcher=joblib`, `hydra/launcher=ray`) and
sweepers (`hydra/sweeper=optuna`, whose objective is the summary key `run.objective`),
`--cfg`, `--info`, `--help`, `--config-dir`, `--shell-completion`, `hydra.run.dir` and
`hydra.sweep.dir`; every run directory gets `.hydra/` (config, overrides) and a job log
(`train.log`).

The strict errors stay. Before Hydra starts, the overrides are composed and checked
here: a bad config exits 2 with one line naming the key, and nothing is written. In a
multirun the keys and presets of every sweep value are checked up front the same way;
values are checked by each job, so a bad job fails with its one line, the others run,
and the exit code is non-zero.
"""
from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Sequence

from hydra.experimental.callback import Callback

from jaxrl_dist.trainers import status
from jaxrl_dist.overrides import (CliConfigError, compose, load_config, normalise, one_line, override_keys,
                                  store_defaults, task_preset, validated)

EXIT_CONFIG_ERROR = 2
EXIT_BACKEND_ERROR = 3
EXIT_INTERRUPTED = 130  # the shell's code for a run stopped by Ctrl-C
LOG = logging.getLogger("jaxrl_dist.train")
# Ray rewrites 127.0.0.1 to the host's interface address; this stays on loopback
RAY_LOOPBACK_IP = "127.0.0.2"
_INFO_FLAGS = ("help", "hydra_help", "info", "cfg", "shell_completion", "experimental_rerun")
FAILED_FILE = "FAILED"  # a failed job's exit code and line, in its run dir
_failed: list = []  # exit codes of the jobs that failed in this process
_sweeps: list = []  # the sweep dirs of this process's multiruns


class JobFailed(Exception):
    """A job's one-line failure and its exit code."""

    def __init__(self, line: str, code: int):
        super().__init__(line)
        self.code = code


# --- the job ------------------------------------------------------------------------------


def _config_of(cfg, overrides: Sequence[str], multirun: bool):
    """The job's validated `Config` (a multirun job's bar stays off unless asked for)."""
    import dataclasses

    from omegaconf import OmegaConf

    keys = override_keys(overrides)
    config = validated(OmegaConf.to_container(cfg, resolve=True), keys)
    if multirun and "run.progress" not in keys:  # parallel jobs would draw over each other
        config = dataclasses.replace(config, run=dataclasses.replace(config.run, progress=False))
    return config


def _objective(summary: dict, key: str) -> float:
    """`summary[key]` as a float for a sweeper; NaN where the run has none (no episode
    ended); a key the summary lacks, or a value that is not a number, fails the job."""
    value = summary.get(key, ...)
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        numeric = sorted(k for k, v in summary.items() if isinstance(v, (int, float)) or v is None)
        raise JobFailed(f"error: run.objective: the summary has no number '{key}' "
                        f"(numbers: {', '.join(numeric)})", EXIT_CONFIG_ERROR)
    return float(value)


def _run(cfg, overrides: Sequence[str], output_dir: str, multirun: bool) -> float:
    """Check, prepare JAX, train; the summary's `run.objective` (for sweepers)."""
    from jaxrl_dist.backends import BackendError
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.envs import EnvMakeError
    from jaxrl_dist.platform import configure_cpu, use_unrolled_threefry
    from jaxrl_dist.trainers.interrupt import Interrupted

    try:
        config = _config_of(cfg, overrides, multirun)
        configure_cpu()  # a launcher's worker process has not set up the CPU yet
        with status.showing("loading JAX", config.run.progress):
            use_unrolled_threefry()
            from jaxrl_dist.trainers.runner import train

        LOG.info("run dir %s; overrides: %s", output_dir, " ".join(overrides) or "none")
        summary = train(config, None if config.run.resume else output_dir)
    except (ConfigError, EnvMakeError) as err:
        raise JobFailed(f"error: {one_line(err)}", EXIT_CONFIG_ERROR) from None
    except BackendError as err:  # every retry spent; the last checkpoint is on disk
        raise JobFailed(f"error: {one_line(err)}", EXIT_BACKEND_ERROR) from None
    except Interrupted as err:  # Ctrl-C: the checkpoint is written; a multirun stops too
        LOG.info("%s", err)
        print(err, file=sys.stderr, flush=True)
        raise SystemExit(EXIT_INTERRUPTED) from None
    LOG.info("summary %s", {k: v for k, v in summary.items() if not isinstance(v, (list, dict))})
    return _objective(summary, config.run.objective)


def job(cfg) -> float:
    """Hydra's task function: one training run in the job's output directory.

    A failed job prints its one line, leaves it in `RUN_DIR/FAILED_FILE` (where the
    launching process finds it, whichever process ran the job) and returns NaN,
    which the Optuna sweeper counts as a failed trial; it does not raise, so Hydra
    adds no lines of its own.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra = HydraConfig.get()
    multirun = hydra.mode == RunMode.MULTIRUN
    overrides = list(hydra.overrides.task)
    try:
        return _run(cfg, overrides, hydra.runtime.output_dir, multirun)
    except JobFailed as err:
        LOG.info("failed: %s", err)
        _failed.append(err.code)
        (Path(hydra.runtime.output_dir) / FAILED_FILE).write_text(f"{err.code} {err}\n")
        where = f" [job {hydra.job.num}: {' '.join(overrides)}]" if multirun else ""
        print(f"{err}{where}", file=sys.stderr, flush=True)
        return math.nan


class SweepDirs(Callback):
    """Records each multirun's sweep directory in the launching process."""

    def on_multirun_start(self, config, **kwargs) -> None:
        _sweeps.append(Path(config.hydra.sweep.dir))


def _sweep_failures() -> list:
    """The exit codes the jobs of this process's multiruns left in their run dirs."""
    return [int(f.read_text().split(" ", 1)[0]) for d in _sweeps for f in sorted(d.glob(f"**/{FAILED_FILE}"))]


# --- before Hydra starts --------------------------------------------------------------------


def _parse(argv: Sequence[str]):
    """Hydra's own command line (the one `@hydra.main` reads)."""
    from hydra._internal.utils import get_args_parser  # the parser @hydra.main itself uses

    parser = get_args_parser()
    parser.prog = "jaxrl-dist train"
    return parser.parse_args(list(argv))


def _check(overrides: Sequence[str], args) -> None:
    """Exit-2 checks before Hydra starts: the whole config of a single run; in a
    multirun the keys and presets of the fixed overrides and of every sweep value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from jaxrl_dist.overrides import hydra_message

    dirs, name = [args.config_dir] if args.config_dir else [], args.config_name or "config"
    ours = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    if "backend.token" in override_keys(ours):
        raise CliConfigError("backend.token: a token is not taken on the command line (it would be "
                             "saved in .hydra/ and the shell's history); set $JAXRL_DIST_TOKEN or "
                             "backend.token_file=PATH")
    store_defaults()
    try:
        parsed = OverridesParser.create().parse_overrides(ours)
    except Exception as err:  # Hydra's grammar errors
        raise CliConfigError(hydra_message(err)) from None
    sweeps = [o for o in parsed if o.is_sweep_override()]
    if not args.multirun:
        if sweeps:
            raise CliConfigError(f"{sweeps[0].input_line}: a sweep; run it with -m (multirun)")
        cfg = load_config(ours, dirs, name)
        _check_run_dir(cfg, [o for o in overrides if o not in ours])
        return
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    compose(fixed, dirs, name)
    for o in sweeps:
        try:
            values = list(o.sweep_string_iterator())
        except Exception:  # interval(...) and tagged sweeps: for a sweeper to sample
            values = []
        prefix = o.input_line[: len(o.input_line) - len(o.input_line.lstrip("+~"))]
        for value in values:
            compose(fixed + [f"{prefix}{o.get_key_element()}={value}"], dirs, name)


def _check_run_dir(cfg, hydra_overrides: Sequence[str]) -> None:
    """The run directory can take the run (Hydra would write `.hydra/` there first): a
    new run's is writable and holds no run yet; a resumed run's `config.yaml` loads."""
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.trainers.checkpoint import load_run_config
    from jaxrl_dist.trainers.rundir import check_fresh, check_usable

    given = dict(o.split("=", 1) for o in hydra_overrides if o.startswith("hydra.run.dir="))
    run_dir = given.get("hydra.run.dir") or cfg.run.dir
    try:
        if cfg.run.resume:
            load_run_config(cfg.run.resume)
            check_usable(cfg.run.resume, "run.resume")
        elif run_dir:
            check_usable(run_dir)
            if not cfg.trainer.distributed.process_id:  # the others join process 0's run
                check_fresh(run_dir)
    except ConfigError as err:
        raise CliConfigError(str(err)) from None


def _implied(overrides: Sequence[str], multirun: bool) -> list:
    """Hydra overrides that follow from the user's: `run.dir` (or `run.resume`) is the
    run's Hydra output dir (in a multirun, the sweep dir); the Ray launcher stays on
    loopback without an address; the Optuna sweeper maximises (the objective is a return)."""
    keys = override_keys(overrides)
    given = dict(o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)
    out = []
    if given.get("run.resume") and "hydra.run.dir" not in keys:
        out += [f"hydra.run.dir={given['run.resume']}", "hydra.output_subdir=.hydra/resumed"]
    elif given.get("run.dir") not in (None, "null"):
        key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        out += [] if key in keys else [f"{key}={given['run.dir']}"]
    if given.get("hydra/launcher") == "ray" and not any(k.startswith("hydra.launcher.ray.init") for k in keys):
        out += [f"+hydra.launcher.ray.init._node_ip_address={RAY_LOOPBACK_IP}",
                "+hydra.launcher.ray.init.include_dashboard=false"]
    if given.get("hydra/sweeper") == "optuna" and "hydra.sweeper.direction" not in keys:
        out += ["hydra.sweeper.direction=maximize"]
    return out


def _launch(argv: Sequence[str]) -> int:
    """Run the Hydra app on `argv`; the exit code."""
    import hydra

    from jaxrl_dist.overrides import CONFIG_DIR

    _failed.clear()
    _sweeps.clear()
    store_defaults()
    app = hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")(job)
    saved, sys.argv = sys.argv, ["jaxrl-dist", *argv]  # the name shell completion binds
    try:
        app()
    except SystemExit as exit_:  # Hydra's own failures (it printed them)
        return exit_.code if isinstance(exit_.code, int) else 1
    finally:
        sys.argv = saved
    failures = _sweep_failures() if _sweeps else _failed
    return failures[0] if failures else 0


def main(argv: Sequence[str]) -> int:
    """`jaxrl-dist train ARGV`: check the overrides, then hand them to Hydra."""
    from jaxrl_dist.config import ConfigError

    argv = list(argv)
    if "--print-config" in argv:  # the composed config as the library takes it
        return _print_config([a for a in argv if a != "--print-config"])
    args = _parse(argv)
    if args.shell_completion:
        _complete_after_train()
    flags = list(argv)
    for o in args.overrides:
        flags.remove(o)
    checking = not any(getattr(args, f) for f in _INFO_FLAGS)
    try:
        if checking:
            _join(args.overrides)
        with status.showing("checking the config", checking):
            users = task_preset(args.overrides)  # once: it may make the env to read its spaces
            if checking:
                _check(users, args)
            overrides = normalise(users)
    except (CliConfigError, ConfigError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return _launch(flags + overrides + _implied(overrides, args.multirun))


def _join(overrides: Sequence[str]) -> None:
    """Join a multi-process run (`trainer.distributed.*`) first: checking the config
    imports env suites, and gymnax builds arrays as it loads, which starts JAX's
    backend, after which a process can no longer join."""
    if not any(k.startswith("trainer.distributed.") for k in override_keys(overrides)):
        return
    from jaxrl_dist.config import distributed_config
    from jaxrl_dist.trainers import distributed

    trainer = compose(overrides).get("trainer")
    distributed.initialize(distributed_config(trainer if isinstance(trainer, dict) else None))


def _complete_after_train() -> None:
    """Hydra's completion script asks `jaxrl-dist -sc query=SHELL` about the whole line
    (`$COMP_LINE`); the words it completes are those after `train`."""
    import os

    line = os.environ.get("COMP_LINE", "")
    program, _, rest = line.partition(" ")
    if rest.split(" ", 1)[0] == "train":
        cut = len(line) - len(f"{program} {rest[len('train'):].lstrip(' ')}")
        os.environ["COMP_LINE"] = line[:len(program) + 1] + line[len(program) + 1 + cut:]
        point = int(os.environ.get("COMP_POINT", len(line)))
        os.environ["COMP_POINT"] = str(max(0, point - cut))


def _print_config(overrides: Sequence[str]) -> int:
    import yaml

    from jaxrl_dist.config import to_dict

    try:
        cfg = load_config(overrides)
    except CliConfigError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0

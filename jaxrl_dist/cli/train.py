"""`jaxrl-dist train`: a Hydra application, run by Hydra's own machinery.

So everything a Hydra user reaches for works: `-m` multirun with sweeps (`seed=1,2,3`,
`range()`, `choice()`), launchers (`hydra/launcher=joblib`, `hydra/launcher=ray`) and
sweepers (`hydra/sweeper=optuna`, whose objective is the summary key `run.objective`),
`--cfg`, `--info`, `--help`, `--config-dir`, `--shell-completion`, `hydra.run.dir` and
`hydra.sweep.dir`; every run directory gets `.hydra/` (config, overrides) and a job log.

Hydra composes once; the `Check` callback validates what it composed before Hydra
writes anything (a single run's whole config; in a multirun the keys and presets of
every sweep value), so a bad config exits 2 with one line. In a multirun each job
checks its own values: a bad job fails with its one line, the others run, and the
exit code is non-zero.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Optional, Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from jaxrl_dist.cli import COMMANDS
from jaxrl_dist.cli.compose import (COMPOSE_ERRORS, CONFIG_DIR, OPEN, hydra_message, load_config, normalise, one_line,
                                    override_keys, presets, resumed_backend, saved_backend, store_schemas, task_preset,
                                    unknown_preset)
from jaxrl_dist.config import (SCHEMAS, Config, ConfigError, HttpBackendConfig, RayBackendConfig, check_resumed,
                               did_you_mean, distributed_config, from_job, needs, require, to_dict)
from jaxrl_dist.platform import process_age_s, quiet_ray_start
from jaxrl_dist.trainers import status
from jaxrl_dist.trainers.interrupt import Interrupted, StoppedAtOnce, exit_code, exit_now, resume_with

EXIT_CONFIG_ERROR, EXIT_BACKEND_ERROR, EXIT_INTERRUPTED = 2, 3, 130  # 130: the shell's code for Ctrl-C
EXIT_NO_LEGAL_ACTION = 4  # the env allowed no action where the policy had to act
EXIT_PEER_LOST = 5  # a multi-process run's collective failed: another process is gone
LOG = logging.getLogger("jaxrl_dist.train")
RAY_LOOPBACK_IP = "127.0.0.2"  # Ray rewrites 127.0.0.1 to the host's interface address; this stays on loopback
_VALUE_FLAGS = ("-c", "--cfg", "-p", "--package", "-cp", "--config-path", "-cn", "--config-name", "-cd",
                "--config-dir", "--experimental-rerun")
_INFO_FLAGS = ("-h", "--help", "--hydra-help", "-i", "--info", "-c", "--cfg", "-sc", "--shell-completion",
               "--version", "--experimental-rerun")
# Hydra's flags (argparse also takes a long one's unique prefix: --multi) and this command's own
_HYDRA_FLAGS = (*_VALUE_FLAGS, *_INFO_FLAGS, "-m", "--multirun", "-r", "--run", "--resolve")
_OWN_FLAGS = ("--print-config",)
# set by `jaxrl-dist launch` for its processes: its PID, and the command that starts them again
LAUNCHER_ENV, RESUME_ENV = "JAXRL_DIST_LAUNCHER", "JAXRL_DIST_RESUME_WITH"
FAILED_FILE = "FAILED"  # a failed job's exit code and line, in its run dir
# this process's validated run, failures, sweep dirs, and whether a job has run (its launch counted)
_state = {"checked": None, "failed": [], "sweeps": [], "launched": False}


class JobFailed(Exception):
    """A job's one-line failure and its exit code."""

    def __init__(self, line: str, code: int):
        super().__init__(line)
        self.code = code


# --- checks on what Hydra composed, before it writes anything --------------------------------------


def _checked(cfg, overrides: Sequence[str]) -> Config:
    """The `Config` of a composed job config, validated once (`ConfigError` names the key)."""
    job, keys = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), override_keys(overrides)
    try:
        config = from_job(job, keys)
    except OmegaConfBaseException as err:
        raise ConfigError(hydra_message(err)) from None
    require("scheduler.init_from" not in keys, "scheduler.init_from: only `jaxrl-dist "
            "scheduler train` reads it (the file to fine-tune from); a run loads scheduler.path")
    if config.run.resume:
        check_resumed(config, keys, saved_backend(config.run.resume).get("name"))
    else:  # a resumed run checks the config saved with it
        from jaxrl_dist.trainers.parts import check_parts  # the env suites, network and loss import JAX

        check_parts(config)
    if isinstance(config.backend, HttpBackendConfig):
        needs("httpx", "http", "backend=http", load=False)
    if config.logger.wandb:
        needs("wandb", "wandb", "logger.wandb=true", load=False)
    return config


def _check_run_dir(config: Config, run_dir: Optional[str]) -> None:
    """A new run's directory is writable and holds no run yet; a resumed run's loads."""
    from jaxrl_dist.trainers.rundir import check_fresh, check_resumable, check_usable  # imports JAX

    if config.run.resume:
        check_resumable(config.run.resume)
    elif run_dir:
        check_usable(run_dir)
        if not config.trainer.distributed.process_id:  # the others join process 0's run
            check_fresh(run_dir)


def _check_sweep(config, overrides: Sequence[str]) -> None:
    """Every sweep value's key exists and takes that value (OmegaConf's typed merge of the
    one key, no compose); every swept preset exists."""
    job = OmegaConf.masked_copy(config, [k for k in config if k != "hydra"])
    dirs = _state.get("config_dirs", ())
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        key = o.get_key_element().lstrip("+~")
        try:
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
        except Exception:  # interval(...) and tagged sweeps: for a sweeper to sample
            continue
        for value in values if not key.startswith(("hydra", *OPEN)) else ():
            if key in SCHEMAS or (CONFIG_DIR / key).is_dir():
                if value not in presets(key, dirs):
                    raise ConfigError(unknown_preset(key, value, dirs))
                continue
            try:
                OmegaConf.merge(job, OmegaConf.from_dotlist([f"{key}={value}"]))
            except OmegaConfBaseException as err:
                raise ConfigError(hydra_message(err)) from None


def _check_sweep_dir(config, overrides: Sequence[str]) -> None:
    """The sweep dir can be written, and holds no sweep yet: a sweep numbers its jobs from
    0, so each job of an earlier sweep there would have its `.hydra/` and job log written
    over (before the job itself refused the dir)."""
    from jaxrl_dist.trainers.rundir import check_usable  # imports JAX, as the jobs will

    sweep = Path(str(config.hydra.sweep.dir))
    key = "run.dir" if "run.dir" in override_keys(overrides) else "hydra.sweep.dir"
    held = (["multirun.yaml"] if (sweep / "multirun.yaml").is_file() else []) + sorted(
        p.parent.name for p in sweep.glob("*/.hydra"))
    require(not held, f"{key}: {sweep} already holds a sweep ({', '.join(held[:3])}{', ...' * (len(held) > 3)}); "
            f"pick another {key}")
    check_usable(sweep, key)


def _check_sweeper(config) -> None:
    """The launcher's and sweeper's counts that their plugins take unchecked and then fail
    on deep inside (a traceback, or a study with nothing in it)."""
    for key in ("hydra.sweeper.n_trials", "hydra.sweeper.n_jobs"):  # the Optuna sweeper's
        value = OmegaConf.select(config, key)
        require(value is None or (isinstance(value, int) and value >= 1),
                f"{key} must be a positive integer, got {value!r}")
    jobs = OmegaConf.select(config, "hydra.launcher.n_jobs")  # joblib's: N, or -N for all cores but N-1
    require(jobs != 0, "hydra.launcher.n_jobs=0: joblib takes a positive count (-1: every core)")


def _exit_on_error(check):
    """A callback's check that ends the process with the one line and exit 2: Hydra turns
    a callback's exceptions into warnings, and lets SystemExit through."""

    def checked(self, config, **kwargs) -> None:
        try:
            check(self, config)
        except ConfigError as err:
            status.stop()  # the "checking the config" line: down first, so it is not drawn below the error
            print(f"error: {one_line(err)}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_CONFIG_ERROR) from None

    return checked


class Check(Callback):
    """Validates what Hydra composed before it writes anything; records sweep dirs."""

    @_exit_on_error
    def on_run_start(self, config) -> None:
        checked = _checked(config, list(config.hydra.overrides.task))
        _check_run_dir(checked, config.hydra.run.dir)
        _state["checked"] = checked
        status.stop()  # the "checking the config" line main put up
        if any(str(o).startswith("hydra/launcher=") for o in config.hydra.overrides.hydra):
            print("note: a launcher runs the jobs of a multirun (-m); this single run trains as usual",
                  file=sys.stderr, flush=True)

    @_exit_on_error
    def on_multirun_start(self, config) -> None:
        _check_sweeper(config)
        _check_sweep(config, list(config.hydra.overrides.task))
        _check_sweep_dir(config, list(config.hydra.overrides.task))
        _state["sweeps"].append(Path(config.hydra.sweep.dir))
        status.stop()


# --- the job ------------------------------------------------------------------------------------------


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
    """Validate (a multirun job; a single run was checked before Hydra wrote anything),
    prepare JAX, train; the summary's `run.objective` (for sweepers)."""
    from jaxrl_dist.backends import BackendError  # imports JAX

    NoLegalAction = PeerLost = ()  # match nothing until the trainers (and their errors) are imported
    try:
        config = _state["checked"] if not multirun and _state["checked"] else _checked(cfg, overrides)
        if multirun and "run.progress" not in override_keys(overrides) and not _one_by_one():
            config.run.progress = False  # jobs side by side would draw over each other
        if multirun and isinstance(config.backend, RayBackendConfig) and config.backend.keep_actors is None:
            config.backend.keep_actors = True  # the next job takes the actors over
        with status.showing("loading JAX", config.run.progress):
            from jaxrl_dist.trainers.runner import NoLegalAction, train
        if config.trainer.distributed.num_processes > 1:  # a collective fails when a peer is gone
            from jax.errors import JaxRuntimeError as PeerLost
        LOG.info("run dir %s; overrides: %s", output_dir, " ".join(overrides) or "none")
        launch_s = 0.0 if _state["launched"] else process_age_s()  # a multirun's first job only
        _state["launched"] = True
        summary = train(config, None if config.run.resume else output_dir, launch_s=launch_s, checked=True)
    except ConfigError as err:
        raise JobFailed(f"error: {one_line(err)}", EXIT_CONFIG_ERROR) from None
    except BackendError as err:  # every retry spent; the last checkpoint is on disk
        raise JobFailed(f"error: {one_line(err)}", EXIT_BACKEND_ERROR) from None
    except PeerLost as err:  # `launch` names the process that died; this one says why it stopped
        raise JobFailed(f"error: process {config.trainer.distributed.process_id}: a collective with the other "
                        f"processes failed ({one_line(err)[:200]})", EXIT_PEER_LOST) from None
    except NoLegalAction as err:
        raise JobFailed(f"error: {config.env.id}: {one_line(err)}", EXIT_NO_LEGAL_ACTION) from None
    except Interrupted as err:  # Ctrl-C: the checkpoint is written; a multirun stops too
        LOG.info("%s", err)
        later = "; the multirun stops here: no later job of it runs" if multirun else ""
        print(f"{err}{later}", file=sys.stderr, flush=True)
        if isinstance(err, StoppedAtOnce):
            exit_now(exit_code())
        raise SystemExit(exit_code()) from None  # 130 for Ctrl-C, 143 for SIGTERM
    LOG.info("summary %s", {k: v for k, v in summary.items() if not isinstance(v, (list, dict))})
    return _objective(summary, config.run.objective)


def _one_by_one() -> bool:
    """Whether the multirun's jobs run one after another in this process (Hydra's basic
    launcher), so that each may show its own bar or lines."""
    return str(OmegaConf.select(HydraConfig.get(), "launcher._target_", default="")).endswith(".BasicLauncher")


def job(cfg) -> float:
    """Hydra's task function: one training run in the job's output directory.

    A failed job prints its one line, leaves it in `RUN_DIR/FAILED_FILE` (where the
    launching process finds it, whichever process ran the job) and returns NaN, which
    the Optuna sweeper counts as a failed trial; it does not raise, so Hydra adds no
    lines of its own.
    """
    from jaxrl_dist.platform import configure_cpu, use_unrolled_threefry

    configure_cpu()  # a launcher's worker process has not set up the CPU yet
    use_unrolled_threefry()
    logging.captureWarnings(True)  # Python's warnings (gymnasium's) as records: in the job log, above the bar
    hc = HydraConfig.get()
    return _reported(lambda: _run(cfg, list(hc.overrides.task), hc.runtime.output_dir, hc.mode == RunMode.MULTIRUN))


def _reported(run) -> float:
    """`run()`'s objective; a `JobFailed` printed with the job's overrides, left in
    `RUN_DIR/FAILED_FILE`, and NaN (which the Optuna sweeper counts as a failed trial)."""
    hc = HydraConfig.get()
    failed = Path(hc.runtime.output_dir) / FAILED_FILE
    try:
        objective = run()
    except JobFailed as err:
        LOG.info("failed: %s", err)
        _state["failed"].append(err.code)
        failed.write_text(f"{err.code} {err}\n")
        where = f" [job {hc.job.num}: {' '.join(hc.overrides.task)}]" if hc.mode == RunMode.MULTIRUN else ""
        print(f"{err}{where}", file=sys.stderr, flush=True)
        return math.nan
    failed.unlink(missing_ok=True)  # a failed run resumed to its end has not failed
    return objective


def trained(summary: Optional[dict], failure: Optional[str] = None):
    """Hydra's task function for a job already trained in a group (`hydra/launcher=vmap`):
    its log lines and objective, or its failure's one line; with neither, the group was
    interrupted (its checkpoint is in the run dir) and the objective is NaN."""

    def task(cfg) -> float:
        def run() -> float:
            if failure is not None:
                raise JobFailed(failure, EXIT_CONFIG_ERROR)
            if summary is None:
                LOG.info("interrupted in a group; continue with run.resume=%s", HydraConfig.get().runtime.output_dir)
                return math.nan
            LOG.info("trained in a group; run dir %s", summary["run_dir"])
            LOG.info("summary %s", {k: v for k, v in summary.items() if not isinstance(v, (list, dict))})
            return _objective(summary, str(cfg.run.objective))

        return _reported(run)

    return task


# --- the command line -------------------------------------------------------------------------------


def split(argv: Sequence[str]) -> tuple:
    """`(flags, overrides)`: Hydra's flags (with their values) and the KEY=VALUE overrides."""
    flags, overrides, value_next = [], [], False
    for arg in argv:
        if value_next or arg.startswith("-"):
            flags.append(arg)
            value_next = not value_next and arg in _VALUE_FLAGS
        else:
            overrides.append(arg)
    return flags, overrides


def _full_flags(flags: Sequence[str]) -> list:
    """`flags` with a unique prefix of a long Hydra flag written out (argparse takes
    `--multi` for `--multirun`; the checks here read the whole name); an unknown flag
    is one line naming the closest (`--print-confg`), not Hydra's usage text."""
    out, skip = [], False
    for flag in flags:
        if skip:  # the value of the flag before it (`--cfg job`)
            out.append(flag)
            skip = False
            continue
        name, eq, value = flag.partition("=")
        whole = [f for f in _HYDRA_FLAGS if f.startswith("--") and f.startswith(name)] if name.startswith("--") else []
        if name not in _HYDRA_FLAGS + _OWN_FLAGS:
            require(len(whole) == 1, f"unknown flag '{flag}'{did_you_mean(name, _HYDRA_FLAGS + _OWN_FLAGS, 0.6)}; "
                    "jaxrl-dist train --help lists them")
            name = whole[0]
        out.append(name + eq + value)
        skip = out[-1] in _VALUE_FLAGS
    return out


def _implied(overrides: Sequence[str], multirun: bool) -> list:
    """Hydra overrides that follow from the user's: `run.dir` (or `run.resume`) is the
    run's Hydra output dir (in a multirun, the sweep dir); the Ray launcher stays on
    loopback, logging at warning; the Optuna sweeper maximises (the objective is a return)."""
    keys = override_keys(overrides)
    given = dict(o.lstrip("+~").split("=", 1) for o in overrides if "=" in o)
    out = []
    if given.get("run.resume") and "hydra.run.dir" not in keys:
        out += [f"hydra.run.dir={given['run.resume']}", "hydra.output_subdir=.hydra/resumed"]
    elif given.get("run.dir") not in (None, "null"):
        key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        require(given.get(key, given["run.dir"]) == given["run.dir"], f"run.dir={given['run.dir']} and "
                f"{key}={given.get(key)}: two directories for one run; give one of them")
        out += [] if key in keys else [f"{key}={given['run.dir']}"]
    if given.get("hydra/launcher") == "ray" and not any(k.startswith("hydra.launcher.ray.init") for k in keys):
        out += [f"+hydra.launcher.ray.init._node_ip_address={RAY_LOOPBACK_IP}",
                "+hydra.launcher.ray.init.include_dashboard=false", "+hydra.launcher.ray.init.logging_level=warning"]
    if given.get("hydra/sweeper") == "optuna" and "hydra.sweeper.direction" not in keys:
        out += ["hydra.sweeper.direction=maximize"]
    return out


def _quiet_ray_runtime() -> None:
    """The Ray launcher's runtime (started in this process) says only what matters: no
    notice of its default token authentication, its jobs' line prefixes without colour
    codes in a log. Environment, not overrides: Ray reads them when the launcher starts it."""
    quiet_ray_start()
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def _join(overrides: Sequence[str]) -> None:
    """Join a multi-process run (`trainer.distributed.*`) first: checking the config
    imports env suites, and gymnax builds arrays as it loads, which starts JAX's
    backend, after which a process can no longer join."""
    given = {k[len("trainer.distributed."):]: yaml_value(v) for k, v in
             (o.lstrip("+").split("=", 1) for o in overrides if o.startswith("trainer.distributed."))}
    if given:
        from jaxrl_dist.trainers import distributed

        _die_with_launcher()
        if os.environ.get(RESUME_ENV):  # the stop lines name `launch`, with its flags
            resume_with(os.environ.pop(RESUME_ENV))
        distributed.initialize(distributed_config({"distributed": given}))


def _die_with_launcher() -> None:
    """A process `jaxrl-dist launch` started runs in a session of its own, out of its
    terminal's reach (the launcher hands it Ctrl-C): it is killed when the launcher dies
    (Linux's PR_SET_PDEATHSIG), as it would have been with the terminal."""
    launcher = os.environ.pop(LAUNCHER_ENV, None)
    if not launcher:
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        return
    if os.getppid() != int(launcher):  # the launcher died before the call above
        exit_now(1)


def yaml_value(text: str):
    return OmegaConf.from_dotlist([f"v={text}"]).v


def _set_up_optuna() -> None:
    """Optuna's messages through the logging Hydra set up (plain lines), not Optuna's own
    handler, which writes colour codes even into a file; and a failed trial kept failed.
    The sweeper (hydra-optuna-sweeper 1.3.0) tells Optuna a trial it refused (a NaN
    objective: no episode ended, or the job failed) again as failed, with the same
    values, which Optuna refuses too, ending the whole study; a failed or pruned trial's
    values are dropped here, as the sweeper's own later fix does."""
    optuna = needs("optuna", "sweep", "hydra/sweeper=optuna")  # the Optuna sweeper's own dependency

    optuna.logging.disable_default_handler()
    optuna.logging.enable_propagation()
    tell = optuna.study.Study.tell
    if getattr(tell, "drops_failed_values", False):
        return
    ended = (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)

    def told(self, *args, **kwargs):
        if kwargs.get("state") in ended:
            kwargs["values"] = None
        return tell(self, *args, **kwargs)

    told.drops_failed_values = True
    optuna.study.Study.tell = told


def _absl_keeps_its_stream() -> None:
    """Hydra's logging set-up closes every handler there is; absl's (made when JAX loads)
    closes its stream unless that is the current sys.stderr or stdout. For a caller that
    swapped the streams since (a test's capture) it would close the caller's stream."""
    absl = sys.modules.get("absl.logging")
    if absl is not None:
        absl.get_absl_handler().python_handler.stream = sys.stderr


def _hydra(argv: Sequence[str]) -> int:
    """Run the Hydra app on `argv`; the exit code (Hydra's errors re-raised to be one line)."""
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its own report
    if "hydra/sweeper=optuna" in argv:
        _set_up_optuna()
    _state.update(checked=None, failed=[], sweeps=[], launched=False)
    store_schemas(argv)
    app = hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")(job)
    saved, sys.argv = sys.argv, ["jaxrl-dist", *argv]  # hydra.main reads sys.argv; completion binds the name
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    _absl_keeps_its_stream()
    try:
        app()
    except SystemExit as exit_:  # argparse's usage errors (it printed them), a failed check's exit 2
        return exit_.code if isinstance(exit_.code, int) else 1
    except ValueError as err:  # Optuna's study asked for its best trial where none completed
        if "No trials are completed yet" not in str(err):
            raise
        print("error: hydra/sweeper=optuna: no trial completed, so there is no best trial: each job failed "
              "(its line above) or ended no episode (final return -: no objective; train longer)", file=sys.stderr)
        return (_failures() or [1])[0]
    finally:  # Hydra set up logging for the run; a caller in this process gets its own back
        sys.argv = saved
        root.handlers[:], root.level = handlers, level
    return (_failures() or [0])[0]


def _failures() -> list:
    """The exit codes of this process's failed jobs (a multirun's, from their run dirs)."""
    if not _state["sweeps"]:
        return _state["failed"]
    return [int(f.read_text().split(" ", 1)[0]) for d in _state["sweeps"] for f in sorted(d.glob(f"**/{FAILED_FILE}"))]


def main(argv: Sequence[str]) -> int:
    """`jaxrl-dist train ARGV`: Hydra's flags and KEY=VALUE overrides."""
    flags, users = split(argv)
    try:
        flags = _full_flags(flags)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    multirun = "-m" in flags or "--multirun" in flags
    dirs = [flags[i + 1] for i, f in enumerate(flags[:-1]) if f in ("-cd", "--config-dir")]
    _state["config_dirs"] = dirs
    if "--print-config" in flags:  # the composed config as the library takes it
        if multirun:
            print("error: --print-config prints one run's config: drop -m and the sweep (one value a key)",
                  file=sys.stderr)
            return EXIT_CONFIG_ERROR
        print(OmegaConf.to_yaml(to_dict(load_config(users, dirs))), end="")
        return 0
    try:
        if "--version" in flags:
            print(f"jaxrl-dist {version('jaxrl-dist')} (Hydra {hydra.__version__})")
            return 0
        if any(f in _INFO_FLAGS for f in flags):
            if os.environ.get("COMP_LINE"):  # the shell's words, as typed
                return _hydra(flags + users) if _complete_after_train() else 0
            require(not multirun, f"-m with {next(f for f in flags if f in _INFO_FLAGS)}: Hydra takes one of "
                    "--multirun, --cfg, --info and --shell-completion at a time; drop -m to see one run's")
            return _hydra(flags + normalise(users))  # the config that would train
        chosen = dirs or any(o.startswith("hydra/sweeper=") for o in users)  # a sweeper, or a config dir's
        _check_sweep_overrides(users, multirun, basic=not chosen)
        if "backend.token" in override_keys(users):
            raise ConfigError("backend.token: a token is not taken on the command line (it would be saved "
                              "in .hydra/ and the shell's history); set $JAXRL_DIST_TOKEN or backend.token_file=PATH")
        _join(users)
        with status.showing("checking the config", True):  # taken down once Check has run
            overrides = normalise(task_preset(resumed_backend(users)))
            if "hydra/launcher=ray" in overrides:
                _quiet_ray_runtime()
            return _hydra(flags + overrides + _implied(overrides, multirun))
    except ConfigError as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
    except COMPOSE_ERRORS as err:
        print(f"error: {hydra_message(err, dirs)}", file=sys.stderr)
    return EXIT_CONFIG_ERROR


def _check_sweep_overrides(users: Sequence[str], multirun: bool, basic: bool) -> None:
    """What Hydra would only refuse deep inside, or in its own words: a sweep without -m,
    a sweep of the run's own directory, an interval where the sweeper is the basic one
    (`basic`: no sweeper chosen, and no config dir of the user's that may choose one)."""
    for o in filter(_is_sweep, users):
        key = override_keys([o])[0]
        require(multirun, f"{o}: a sweep; run it with -m (multirun)")
        require(key not in ("run.dir", "run.resume"), f"{o}: a sweep of {key}; a sweep's jobs each get a "
                "directory of their own under one run.dir (a job resumes alone, without -m)")
        require(not (basic and "interval(" in o), f"{o}: interval() is for a sampling sweeper "
                "(hydra/sweeper=optuna); the basic sweeper takes a,b,c, range() or choice()")


def _is_sweep(override: str) -> bool:
    try:
        return any(o.is_sweep_override() for o in OverridesParser.create().parse_overrides([override]))
    except HydraException:
        return False  # a grammar error: Hydra's own parse names it


def _complete_after_train() -> bool:
    """Hydra's completion script asks `jaxrl-dist -sc query=SHELL` about the whole line
    (`$COMP_LINE`); the words it completes are those after `train`. The first word is
    a subcommand (printed here); another subcommand's words are not Hydra's. Returns
    whether Hydra is to complete the line."""
    line = os.environ.get("COMP_LINE", "")
    program, _, rest = line.partition(" ")
    words = line[:int(os.environ.get("COMP_POINT", len(line)))].split(" ")
    if len(words) == 2:  # `jaxrl-dist tr<TAB>`
        print(" ".join(c for c in COMMANDS if c.startswith(words[1])))
        return False
    if rest.split(" ", 1)[0] != "train":
        return False
    cut = len(line) - len(f"{program} {rest[len('train'):].lstrip(' ')}")
    os.environ["COMP_LINE"] = line[:len(program) + 1] + line[len(program) + 1 + cut:]
    point = int(os.environ.get("COMP_POINT", len(line)))
    os.environ["COMP_POINT"] = str(max(0, point - cut))
    return True

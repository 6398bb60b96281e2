"""The run directory and what every trainer writes into it: the files' names, the
directory (fresh, or a run to resume), the compile cache, the params digest, and the
summary table."""
from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import os
import resource
import sys
from pathlib import Path
from typing import Optional

import jax
import numpy as np

from jaxrl_dist.config import (RESUMED, RESUMED_BACKEND, Config, ConfigError, changed_keys, check_resumed, flat, to_dict,
                               without_secrets)
from jaxrl_dist.platform import cpu_model
from jaxrl_dist.trainers import checkpoint
from jaxrl_dist.trainers.logger import MetricsLogger, summary_table
from jaxrl_dist.trainers.tracking import open_tracker

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
# low enough that a small train chunk is cached too; tiny eager ops stay out
CACHE_MIN_COMPILE_SECS = 0.1


def default_run_dir(now: Optional[datetime.datetime] = None) -> Path:
    """`outputs/YYYY-MM-DD/HH-MM-SS` like Hydra's, with a suffix if taken."""
    now = now or datetime.datetime.now()
    base = Path("outputs") / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


def compile_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "jaxrl-dist" / "xla"


def enable_compile_cache(path: Optional[Path] = None) -> Path:
    """Turn on JAX's persistent compilation cache so later runs skip most of the compile."""
    from jax.experimental.compilation_cache import compilation_cache

    path = Path(path or compile_cache_dir())
    path.mkdir(parents=True, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != str(path):
        jax.config.update("jax_compilation_cache_dir", str(path))
        # the cache binds its directory on first use; rebind if it was used before
        compilation_cache.reset_cache()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_SECS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: no size floor
    return path


def params_digest(params) -> str:
    """sha256 of the msgpack bytes of numpy params: equal digests, equal weights."""
    from flax import serialization

    host = jax.tree.map(np.asarray, jax.device_get(params))
    return hashlib.sha256(serialization.to_bytes(host)).hexdigest()


def _commit() -> Optional[str]:
    """The git commit of the package's source tree when it runs from its own checkout
    (not from an installed copy that happens to sit inside some other repository)."""
    import subprocess

    package = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=package,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != package.parent:
        return None
    return lines[1]


def run_metadata() -> dict:
    """What produced a run: package version and commit, jax and jaxlib, the platform
    and its devices (every summary.json carries these)."""
    return dict(_run_metadata())


@functools.lru_cache(maxsize=1)
def _run_metadata() -> dict:
    """`run_metadata`, read once a process: it asks git and the installed metadata
    (~40 ms), which a sweep's jobs in one process asked each."""
    import platform
    from importlib import metadata

    import jaxlib

    try:
        version = metadata.version("jaxrl-dist")
    except metadata.PackageNotFoundError:  # a source tree that is not installed
        version = None
    devices = jax.devices()
    return {"jaxrl_dist_version": version, "commit": _commit(), "jax_version": jax.__version__,
            "jaxlib_version": jaxlib.__version__, "python_version": platform.python_version(),
            "platform": jax.default_backend(), "device_kind": devices[0].device_kind,
            "device_count": len(devices), "host": platform.platform()}


def _library_state() -> dict:
    """Whether the package's sources differ from their commit, and their hash as they
    are on disk now (a measurement names the code it ran, committed or not)."""
    import subprocess

    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.read_bytes())
    dirty = None
    if _commit() is not None:
        try:
            out = subprocess.run(["git", "status", "--porcelain", "--", package.name], cwd=package.parent,
                                 capture_output=True, text=True, timeout=5)
            dirty = bool(out.stdout.strip()) if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            pass
    return {"library_dirty": dirty, "library_hash": digest.hexdigest()[:12]}


def machine_info() -> dict:
    """`run_metadata()` and what a benchmark also names: every device, the host CPU,
    the XLA flags, the compile cache, the library's state, the versions that matter."""
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {**run_metadata(), **_library_state(),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "devices": [str(d) for d in jax.devices()], "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
            "compilation_cache_dir": jax.config.jax_compilation_cache_dir,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "versions": {name: version(name) for name in
                         ("jax", "jaxlib", "flax", "optax", "gymnax", "envpool", "brax", "numpy")}}


def peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def check_fresh(run_dir) -> None:
    """`ConfigError` when `run_dir` already holds a run (its checkpoints), which a new
    run must not write over (the CLI checks this before Hydra writes `.hydra/` there)."""
    ckpt = Path(run_dir) / checkpoint.CHECKPOINT_SUBDIR
    if ckpt.is_dir() and any(ckpt.iterdir()):
        raise ConfigError(f"run.dir: {run_dir} already holds a run; continue it with "
                          f"run.resume={run_dir} or pick another run.dir")


def _make_writable_dir(path: Path) -> None:
    """Make directory `path` and write a temporary file in it (writable, not only there);
    `OSError` where either cannot be done."""
    import tempfile

    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
        pass


def check_usable(run_dir, key: str = "run.dir") -> None:
    """`ConfigError` naming `key` and the path when `run_dir` cannot hold a run: a file,
    a path under a file, or a place where a directory or a file cannot be made.
    Makes the directory (the run would, a moment later)."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}: {path} is a file, not a directory")
    try:
        _make_writable_dir(path)
    except OSError as err:
        raise ConfigError(f"{key}: cannot write a run in {path} ({err.strerror or err})") from None


def _resumed_backend(saved, given):
    """The saved backend config with the `RESUMED_BACKEND` keys `given` sets (when it is the
    same backend): the endpoints, tokens or cluster address the actors are at now."""
    if given.name != saved.name:
        return saved
    return dataclasses.replace(saved, **{key: getattr(given, key) for key in RESUMED_BACKEND
                                         if hasattr(saved, key) and getattr(given, key) not in (None, [], ())})


def check_resumable(run_dir) -> Config:
    """The config saved in `run_dir`, a run `run.resume` can continue: not one that has
    finished (its `summary.json` written and its last update checkpointed), which a resume
    would train no further while writing a summary of nothing over its own. `ConfigError`
    naming `run.resume` otherwise."""
    saved = checkpoint.load_run_config(run_dir)
    check_usable(run_dir, "run.resume")
    try:
        done = json.loads((Path(run_dir) / SUMMARY_FILE).read_text())
        finished = max(checkpoint.saved_steps(run_dir), default=-1) >= int(done["num_updates"])
    except (OSError, ValueError, KeyError, TypeError):  # no summary (killed or stopped early), or a damaged one
        return saved
    if finished:
        steps = done.get("env_steps")
        why = f"stopped by {done.get('stop_reason') or 'algo.total_timesteps'}" + (
            f" after {steps:,} env steps" if isinstance(steps, int) else "")
        raise ConfigError(f"run.resume={run_dir}: that run has finished ({why}); a resumed run trains the config "
                          "saved with it, so there is nothing to continue: start a new run (another run.dir)")
    return saved


def writable_file(path, flag: str) -> Path:
    """`path`, checked to be a file this process can write (its folder made), before the
    work whose result goes there; `ConfigError` naming `flag` and the path otherwise."""
    if str(path).endswith(("/", os.sep)) or Path(path).is_dir():
        raise ConfigError(f"{flag} {path}: a directory; give a file's path")
    path = Path(path)
    try:
        _make_writable_dir(path.parent)
    except OSError as err:
        raise ConfigError(f"{flag} {path}: cannot write there ({err.strerror or err})") from None
    return path


def prepare_run(cfg: Config, run_dir=None, check_keys: bool = False) -> tuple:
    """Resolve the run directory and, for `run.resume`, the saved config.

    A resumed run takes its directory's `config.yaml`; only the `run` keys of
    `config.RESUMED` (which cannot change results) come from `cfg`, and those of
    `config.RESUMED_BACKEND` set there when its backend is the saved one (`check_keys`, for
    a library caller: any other key `cfg` sets to a value the saved config lacks is a
    `ConfigError` naming it, as the CLI's check of its overrides is). A fresh run's
    config is saved there (`config.yaml`), by the first process of a multi-process run.
    With `run.compile_cache`, JAX's persistent compile cache is on from here, for a job
    alone and for each job of a group alike. Returns `(cfg, run_dir, resuming)`.
    """
    resuming = bool(cfg.run.resume)
    if resuming:
        run_dir = Path(cfg.run.resume)
        saved = check_resumable(run_dir)
        if check_keys:
            check_resumed(cfg, changed_keys(cfg, saved), saved.backend.name)
        run = dataclasses.replace(saved.run, dir=str(run_dir), resume=str(run_dir),
                                  **{key: getattr(cfg.run, key) for key in RESUMED})
        trainer = dataclasses.replace(saved.trainer, distributed=cfg.trainer.distributed)  # this launch's processes
        cfg = dataclasses.replace(saved, run=run, backend=_resumed_backend(saved.backend, cfg.backend), trainer=trainer)
        trainer.check(cfg.num_seeds)
    else:
        run_dir = Path(run_dir or cfg.run.dir or default_run_dir())
        check_usable(run_dir)
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=str(run_dir)))
        if jax.process_index() == 0:  # the other processes of a multi-process run join it
            check_fresh(run_dir)
            checkpoint.save_run_config(run_dir, to_dict(cfg))
    if cfg.run.compile_cache:
        enable_compile_cache()
    return cfg, run_dir, resuming



def open_logs(cfg: Config, run_dir: Path, total_steps: int, done_steps: int, history=(), budget=None):
    """The run's `MetricsLogger` and its tracker (None unless `logger.wandb`); `history`
    and `budget` as `MetricsLogger` takes them."""
    config = without_secrets(to_dict(cfg))
    tracker = open_tracker(cfg.logger, config, run_dir)
    hparams = flat(config)
    logger = MetricsLogger(run_dir, total_steps, done_steps, cfg.run.tensorboard, cfg.run.progress,
                           tracker, hparams, history=history, budget=budget)
    return logger, tracker


def finish_run(run_dir: Path, summary, tracker=None, show: bool = True) -> None:
    """Write `summary.json` from the run's `RunSummary`, hand it to the tracker, print
    the table (`show`)."""
    flat = summary.to_json()
    (Path(run_dir) / SUMMARY_FILE).write_text(json.dumps(flat, indent=2) + "\n")
    if tracker is not None:
        tracker.finish(flat)
    if show:
        print_summary(flat)


def print_summary(summary: dict) -> None:
    from rich.console import Console

    Console().print(summary_table(summary))

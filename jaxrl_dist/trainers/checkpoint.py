"""Orbax checkpoints of the whole `RunnerState`, and resuming a run directory.

A checkpoint holds everything the fused trainer carries between chunks:
parameters, optimiser state, RNG keys, normaliser statistics, the update
counter and, for gymnax, the env state itself, so a resumed gymnax run is
bit-identical to an uninterrupted one.

envpool keeps its env state in C++ behind an opaque handle that cannot be
saved: on resume its envs are reset (fresh observations, fresh episode
bookkeeping) while params, optimiser, keys and normaliser statistics are
restored. The resumed run is then a faithful continuation of training but not
bit-identical to an uninterrupted one, and the episodes that were running when
the run stopped are lost from the episode statistics.

Checkpoints are written synchronously: the fused chunk donates its input, so
the arrays must be on disk before the next chunk reuses their buffers. Orbax
writes each step into a temporary directory and renames it when complete, so
a run killed mid-write leaves no half checkpoint behind.

Orbax alone cannot tell a damaged checkpoint from a good one: a truncated or
overwritten data file may restore without an error, other files fail deep in
the restore. So each step gets a manifest after orbax commits it
(`MANIFEST`: the sha256 of every file of the step, written to a temporary
file and renamed). Resuming verifies the newest step against its manifest
before restoring it; a step without a readable manifest (a run killed between
the commit and the manifest, or written before manifests) is restored and
counted damaged on any error. A damaged step is reported in one line and set
aside under `RUN_DIR/DAMAGED_SUBDIR`, and the run resumes from the newest
intact one (`restore_latest`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import jax

from jaxrl_dist.config import (MOVED, SCHEMAS, Config, ConfigError, from_dict, not_a_run_dir, schema,
                               without_secrets)
from jaxrl_dist.core.types import RunnerState, TrainState

CHECKPOINT_SUBDIR = "checkpoints"
CONFIG_FILE = "config.yaml"
MAX_TO_KEEP = 3
MANIFEST = "sha256.json"  # inside each step's directory, beside orbax's files
DAMAGED_SUBDIR = "damaged_checkpoints"  # where resume sets damaged steps aside
ITEM = "default"  # the directory of a step's one item (orbax's name for it)


def _manager(run_dir: Path, read_only: bool = False):
    import orbax.checkpoint as ocp

    # cleanup_tmp_directories: a writer drops a write that a killed run left unfinished; a
    # reader (`eval` beside a live run) must not drop the write that run has in flight
    options = ocp.CheckpointManagerOptions(max_to_keep=MAX_TO_KEEP, create=not read_only, read_only=read_only,
                                           enable_async_checkpointing=False,
                                           cleanup_tmp_directories=not read_only)
    return ocp.CheckpointManager(Path(run_dir).resolve() / CHECKPOINT_SUBDIR, options=options)


def saved_steps(run_dir) -> list:
    """The steps orbax committed in `run_dir` (by their directories' names: an unfinished
    write is a temporary directory), read without starting orbax."""
    root = Path(run_dir) / CHECKPOINT_SUBDIR
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir()) if root.is_dir() else []


def _file_digests(step_dir: Path) -> dict:
    """`{relative path: sha256}` of every file of a step but its manifest (and its temp)."""
    out = {}
    for path in sorted(p for p in step_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(step_dir).as_posix()
        if not rel.startswith(MANIFEST):
            out[rel] = _sha256(path)
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(step_dir: Path) -> None:
    """Record the step's file digests; temp file + rename, so a manifest is whole or absent."""
    tmp = step_dir / f"{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        json.dump({"files": _file_digests(step_dir)}, f, indent=0)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, step_dir / MANIFEST)


def manifest_problem(step_dir: Path) -> Optional[str]:
    """Why a step does not match its manifest (None: it matches, or there is no
    readable manifest to check it by: `has_manifest` tells which)."""
    files = _read_manifest(step_dir)
    if files is None:
        return None
    for rel, digest in files.items():
        path = step_dir / rel
        if not path.is_file():
            return f"{rel} is missing"
        if _sha256(path) != digest:
            return f"{rel} does not match its sha256"
    return None


def has_manifest(step_dir: Path) -> bool:
    return _read_manifest(step_dir) is not None


def _read_manifest(step_dir: Path) -> Optional[dict]:
    try:
        files = json.loads((step_dir / MANIFEST).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    ok = isinstance(files, dict) and files and all(isinstance(v, str) for v in files.values())
    return files if ok else None


@contextlib.contextmanager
def _quiet_orbax():
    """Orbax logs (through absl) each failed read of a damaged step, some lines long."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _quiet_restore():
    """`_quiet_orbax`, and what a failed read of a damaged step writes to stderr itself
    (tensorstore's callbacks into a closed event loop print a traceback each, dozens)
    and warns (coroutines never awaited): kept for the job log, not the terminal."""
    import io
    import warnings

    caught = io.StringIO()
    with _quiet_orbax(), contextlib.redirect_stderr(caught), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    if caught.getvalue():
        logging.getLogger(__name__).debug("while reading checkpoints: %s", caught.getvalue())


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Checkpointer:
    """Saves the runner under `RUN_DIR/checkpoints/<update>`; one manager per run.

    `due(count)` is every trainer's checkpoint schedule: every `every` updates or
    rounds (`run.checkpoint_every`), and every `every_s` seconds since the last save
    or `restart_clock()` (`run.checkpoint_every_s`); 0 turns either off."""

    def __init__(self, run_dir: Path, every: int = 0, every_s: float = 0.0, read_only: bool = False):
        self.run_dir = Path(run_dir).resolve()
        with _quiet_orbax():  # it reads the steps' metadata, and logs a damaged one's
            self._mngr = _manager(run_dir, read_only)
        self.seconds = 0.0  # spent in `save`, for the run summary
        self.every, self.every_s, self._last = int(every), float(every_s), time.monotonic()

    def latest_step(self) -> Optional[int]:
        return self._mngr.latest_step()

    def step_dir(self, step: int) -> Path:
        return self.run_dir / CHECKPOINT_SUBDIR / str(step)

    def restart_clock(self) -> None:
        self._last = time.monotonic()

    def due(self, count: int) -> bool:
        """Whether a checkpoint is due after `count` updates (or rounds): a multiple of
        `every`, or `every_s` seconds since the last."""
        if self.every and count % self.every == 0:
            return True
        return self.every_s > 0 and time.monotonic() - self._last >= self.every_s

    def save(self, runner, step: Optional[int] = None) -> int:
        """Write a state pytree at `step` (default: the runner's update counter), then
        its manifest; skipped if that step exists."""
        import orbax.checkpoint as ocp

        start = time.perf_counter()
        step = int(runner.update) if step is None else int(step)
        if step not in self._mngr.all_steps():
            self._mngr.save(step, args=ocp.args.StandardSave(runner))
            if jax.process_index() == 0:  # a multi-process run's save is collective; one manifest
                write_manifest(self.step_dir(step))
        self.seconds += time.perf_counter() - start
        self._last = time.monotonic()
        return step

    def restore(self, template, step: Optional[int] = None):
        """Restore into the structure, dtypes and shardings of a fresh `template` runner.

        A checkpointer of its own reads the step's one item (orbax's `default`): the
        manager, once a damaged step failed, can refuse the intact steps beside it."""
        import orbax.checkpoint as ocp

        step = self.latest_step() if step is None else step
        path = self.step_dir(step) / ITEM

        def read(like):
            with ocp.StandardCheckpointer() as ckptr:
                return ckptr.restore(path, jax.tree.map(ocp.utils.to_shape_dtype_struct, like))

        try:
            return read(template)
        except Exception as err:
            older = _without_hyper(template)
            if older is None:
                raise
            try:  # a checkpoint written before the train state carried its coefficients
                return _with_hyper(read(older), template)
            except Exception:
                raise err from None

    def restore_latest(self, template, say: Callable[[str], None] = _say):
        """The newest intact checkpoint restored into `template`'s structure (`template`
        itself when there is none, said in one line). Each damaged step is reported in one line and set
        aside; then one line says which step the run resumes from. `ConfigError`
        naming `run.resume` when every step is damaged (nothing is moved then)."""
        damaged = []
        for step in sorted(self._mngr.all_steps(), reverse=True):
            with _quiet_restore():  # its lines about a damaged step: the one line below says it
                state, problem = self._try_restore(step, template)
            if problem is None:
                if (self.step_dir(step) / MANIFEST).exists() and not has_manifest(self.step_dir(step)):
                    say(f"warning: checkpoint {step}'s {MANIFEST} is unreadable: its files were restored "
                        f"without being checked against it ({self.step_dir(step)})")
                if damaged:
                    self._set_aside(damaged)
                    say(f"resuming from checkpoint {step}, the newest intact one ({self.step_dir(step)})")
                return state
            say(f"warning: checkpoint {step} is damaged and not used: {self.step_dir(step)}: {problem}")
            damaged.append(step)
        if damaged:
            raise ConfigError(f"run.resume: no intact checkpoint in {self.run_dir / CHECKPOINT_SUBDIR} "
                              f"(damaged: {', '.join(map(str, damaged))})")
        say(f"run.resume: no checkpoint in {self.run_dir / CHECKPOINT_SUBDIR} yet (the run stopped before "
            "its first): training from the start")
        return template

    def _try_restore(self, step: int, template) -> tuple:
        """`(state, None)`, or `(None, why the step is damaged)`."""
        step_dir = self.step_dir(step)
        problem = manifest_problem(step_dir)
        if problem is not None:
            return None, problem
        try:
            return self.restore(template, step), None
        except Exception as err:  # any failure to read it back means the step is damaged
            what = "" if has_manifest(step_dir) else " (no manifest)"
            return None, f"restore failed{what}: {type(err).__name__}: {' '.join(str(err).split())[:300]}"

    def _set_aside(self, steps: list) -> None:
        """Move damaged steps out of orbax's directory (kept for inspection), so the
        resumed run can write those steps again."""
        for step in steps:
            dest = self.run_dir / DAMAGED_SUBDIR / str(step)
            n = 1
            while dest.exists():
                dest, n = dest.with_name(f"{step}-{n}"), n + 1
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.step_dir(step)), str(dest))
        with _quiet_orbax():
            self._mngr.reload()

    def close(self) -> None:
        self._mngr.close()


def _is_train(x) -> bool:
    return isinstance(x, TrainState)


def _without_hyper(template):
    """`template` with no traced coefficients in its train states (the layout of the
    checkpoints written before them); None where it has none to drop."""
    trains = [x for x in jax.tree.leaves(template, is_leaf=_is_train) if _is_train(x)]
    if not any(t.hyper is not None for t in trains):
        return None
    return jax.tree.map(lambda x: x.replace(hyper=None) if _is_train(x) else x, template, is_leaf=_is_train)


def _with_hyper(restored, template):
    """`restored` with `template`'s coefficients, the config's values such a run started with."""
    return jax.tree.map(lambda r, t: r.replace(hyper=t.hyper) if _is_train(r) else r, restored, template,
                        is_leaf=_is_train)


def host_env_state(spec) -> bool:
    """Whether the env state lives outside JAX (envpool) and cannot be restored."""
    return spec.suite == "envpool"


def resume_runner(restored: RunnerState, fresh: RunnerState, spec) -> RunnerState:
    """The runner to continue from: the restored one, with freshly reset envs for envpool.

    Normaliser statistics stay restored; observations, env handle and the
    running episode counters come from the fresh reset.
    """
    if not host_env_state(spec):
        return restored
    actor = fresh.actor._replace(norm=restored.actor.norm)
    return restored._replace(actor=actor)


def load_run_config(run_dir: Path, key: str = "run.resume") -> Config:
    """The config a run directory was started with; `ConfigError` naming `key` (what
    read the dir: `run.resume`, `eval`) and the file if it is absent or damaged (not
    YAML, not a mapping, unknown keys)."""
    import yaml

    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{key}: {not_a_run_dir(run_dir, CONFIG_FILE)}")
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{key}: {path} is not readable YAML ({_yaml_reason(err)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{key}: {path} is not a mapping of config keys "
                          f"(it holds a {type(data).__name__})")
    try:
        data = _saved_before_the_schemas(data)
        return from_dict(data, ())  # what the run was given was checked when it started
    except (TypeError, ValueError) as err:  # ConfigError, or a value no check foresaw
        raise ConfigError(f"{key}: {path}: {' '.join(str(err).split())}") from None


def _saved_before_the_schemas(data: dict) -> dict:
    """A config saved before `async` moved and before the backends and schedulers had
    schemas of their own (every backend's and scheduler's keys in one mapping): moved,
    and without the keys the chosen one never read, so an older run still resumes."""
    data = {MOVED.get(k, k): v for k, v in data.items()}
    for group in SCHEMAS:
        part = data.get(group)
        if isinstance(part, dict) and isinstance(part.get("name"), str):
            own = {f.name for f in dataclasses.fields(schema(group, part["name"]))}
            data[group] = {k: v for k, v in part.items() if k in own}
    return data


def _yaml_reason(err: Exception) -> str:
    """A YAML error in a few words: the problem and its line, not the quoted snippet."""
    problem, mark = getattr(err, "problem", None), getattr(err, "problem_mark", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1}"
    return " ".join(str(err).split())[:200]


def save_run_config(run_dir: Path, data: dict) -> None:
    """Write `config.yaml`, without secrets: a resumed run reads its token again from
    `backend.token_file` or the environment."""
    import yaml

    (Path(run_dir) / CONFIG_FILE).write_text(yaml.safe_dump(without_secrets(data), sort_keys=False))

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
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import jax

from jaxrl_dist.config import Config, ConfigError, from_dict, without_secrets
from jaxrl_dist.core.types import RunnerState

CHECKPOINT_SUBDIR = "checkpoints"
CONFIG_FILE = "config.yaml"
MAX_TO_KEEP = 3


def _manager(run_dir: Path):
    import orbax.checkpoint as ocp

    # cleanup_tmp_directories: drop a write that a killed run left unfinished
    options = ocp.CheckpointManagerOptions(max_to_keep=MAX_TO_KEEP, create=True,
                                           enable_async_checkpointing=False,
                                           cleanup_tmp_directories=True)
    return ocp.CheckpointManager(Path(run_dir).resolve() / CHECKPOINT_SUBDIR, options=options)


class Checkpointer:
    """Saves the runner under `RUN_DIR/checkpoints/<update>`; one manager per run."""

    def __init__(self, run_dir: Path):
        self._mngr = _manager(run_dir)
        self.seconds = 0.0  # spent in `save`, for the run summary

    def latest_step(self) -> Optional[int]:
        return self._mngr.latest_step()

    def save(self, runner, step: Optional[int] = None) -> int:
        """Write a state pytree at `step` (default: the runner's update counter);
        skipped if that step exists."""
        import orbax.checkpoint as ocp

        start = time.perf_counter()
        step = int(runner.update) if step is None else int(step)
        if step not in self._mngr.all_steps():
            self._mngr.save(step, args=ocp.args.StandardSave(runner))
        self.seconds += time.perf_counter() - start
        return step

    def restore(self, template, step: Optional[int] = None):
        """Restore into the structure, dtypes and shardings of a fresh `template` runner."""
        import orbax.checkpoint as ocp

        step = self.latest_step() if step is None else step
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        return self._mngr.restore(step, args=ocp.args.StandardRestore(abstract))

    def close(self) -> None:
        self._mngr.close()


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


def load_run_config(run_dir: Path) -> Config:
    """The config a run directory was started with; `ConfigError` naming `run.resume` if absent."""
    import yaml

    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"run.resume: no {CONFIG_FILE} in {run_dir}")
    return from_dict(yaml.safe_load(path.read_text()))


def save_run_config(run_dir: Path, data: dict) -> None:
    """Write `config.yaml`, without secrets: a resumed run reads its token again from
    `backend.token_file` or the environment."""
    import yaml

    (Path(run_dir) / CONFIG_FILE).write_text(yaml.safe_dump(without_secrets(data), sort_keys=False))

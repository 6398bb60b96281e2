"""One run over several processes on JAX's own distributed runtime.

Every process runs the same program over one global mesh (`core.mesh`); JAX's
coordinator (process 0) wires them up and the CPU collectives go over gloo. A
process started with `trainer.distributed.*` joins here, before anything asks
JAX for its devices. `jaxrl-dist launch` starts and supervises the processes
(`cli.launch`): a process that dies takes the others down with one line instead
of leaving them waiting for its heartbeat.
"""
from __future__ import annotations

import socket
import time
from pathlib import Path

import jax
import numpy as np

from jaxrl_dist.config import ConfigError, DistributedConfig
from jaxrl_dist.trainers import interrupt


class DistributedError(ConfigError):
    """The coordinator or a peer was not reached: the one line names the key and the timeout."""


_joined = False  # this process has joined (JAX allows it once)


def active(d: DistributedConfig) -> bool:
    return d.num_processes > 1


def initialize(d: DistributedConfig) -> None:
    """Join the run's processes (no-op for one process); raises `DistributedError` when
    they are not all connected within `trainer.distributed.timeout_s` seconds."""
    global _joined
    if not active(d) or _joined:
        return
    if d.process_id:  # JAX's client aborts the process (a fatal log, no exception) on a timeout
        _wait_for_coordinator(d)
    # CPU arrays' collectives across processes (accelerators use their own)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(d.coordinator, d.num_processes, d.process_id,
                                   initialization_timeout=d.timeout_s)
    except Exception as err:  # JAX raises its runtime's errors, several lines long
        reason = " ".join(str(err).split())[:160]
        raise DistributedError(
            f"trainer.distributed.coordinator={d.coordinator}: process {d.process_id} of {d.num_processes} "
            f"did not connect within trainer.distributed.timeout_s={d.timeout_s} s ({reason})") from None
    _joined = True


def _wait_for_coordinator(d: DistributedConfig) -> None:
    """Wait until the coordinator's port accepts connections; `DistributedError` after
    `timeout_s` seconds."""
    host, port = d.coordinator.rsplit(":", 1)
    deadline = time.monotonic() + d.timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            return
        except OSError as err:
            if time.monotonic() >= deadline:
                raise DistributedError(
                    f"trainer.distributed.coordinator={d.coordinator}: not reachable within "
                    f"trainer.distributed.timeout_s={d.timeout_s} s ({err.strerror or err})") from None
            time.sleep(0.2)


def agreed(*flags: bool) -> tuple:
    """Each flag OR-ed over the run's processes (one small allgather), so that every
    process takes the same branch into its next collective: a Ctrl-C that reached one
    process, or a checkpoint time by its own clock, would send it into a save while the
    others ran the next chunk, and the collectives would not match. One process: as given.
    The gather waits in `interrupt.wait_for`, so a Ctrl-C is acknowledged while it waits."""
    if jax.process_count() == 1:
        return tuple(bool(f) for f in flags)
    from jax.experimental import multihost_utils

    every = interrupt.wait_for(multihost_utils.process_allgather, np.asarray(flags, np.int32))
    return tuple(bool(f) for f in np.asarray(every).reshape(-1, len(flags)).any(axis=0))


def is_primary() -> bool:
    """Whether this process writes the run's shared outputs (process 0)."""
    return jax.process_index() == 0


def own_dir(run_dir: Path) -> Path:
    """Where this process writes its logs, metrics and summary: the run directory for
    process 0; `process_<i>/` inside it for the others. Checkpoints are the run's: every
    process writes its part of them into the run directory (orbax's multi-host saves)."""
    index = jax.process_index()
    return Path(run_dir) if index == 0 else Path(run_dir) / f"process_{index}"

"""Backends run a round's actor shards; this module holds the protocol and the registry.

A backend is looked up by `backend.name`: the built-in `local`, `ray` and
`http`, or any class a package registers under the entry-point group
`jaxrl_dist.backends` (so a fork adds one without editing the library):

    [project.entry-points."jaxrl_dist.backends"]
    mine = "my_pkg.backend:MyBackend"

The class is built as `cls(cfg.backend)` and must follow `Backend`.
"""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Protocol

from jaxrl_dist.config import ENTRY_POINTS
from jaxrl_dist.registry import Registry, made, options as plugin_options
from jaxrl_dist.backends.shard import ShardOutput

GROUP = ENTRY_POINTS["backend"]
BUILTIN = {"local": "jaxrl_dist.backends.local:LocalBackend",
           "ray": "jaxrl_dist.backends.ray_backend:RayBackend",
           "http": "jaxrl_dist.backends.http:HttpBackend"}


class BackendError(RuntimeError):
    """A round that could not be completed after every retry."""


class Job(NamedTuple):
    """What a backend is started with: the run's spec, seed and the learner's program."""

    spec: Any  # shard.ShardSpec
    seed: int
    run_id: str
    program: Any  # shard.ShardProgram: templates, and the local backend's rollout
    # the most shards the run may have in flight at once (0: `backend.max_shards`), and the
    # config key(s) that set it, so a backend that reserves resources per shard can check
    # them before the first round and name what to change
    max_shards: int = 0
    shards_key: str = "backend.max_shards"


class ShardTask(NamedTuple):
    slot: int
    key: Any  # raw uint32[2] from shard.shard_key


class ShardInfo(NamedTuple):
    """Per-shard accounting, for the round's metrics."""

    slot: int
    timings: Any  # shard.Timings as the worker saw them
    reset: bool  # the worker reset this slot's envs (a sticky slot it had not seen)
    retries: int
    worker: str
    roundtrip_s: Optional[float] = None  # a remote backend's wait for its answer, retries included


class RoundStats(NamedTuple):
    """A round's (or one shard's) waits and traffic, as the backend measured them."""

    dispatch_s: float = 0.0  # sending the shards off (encoding the params and requests included)
    transfer_s: float = 0.0  # decoding and checking the answers
    wait_s: float = 0.0  # waiting for the shards' answers (their rollouts included)
    bytes_sent: int = 0
    bytes_received: int = 0
    stack_s: float = 0.0  # stacking and padding the answers, writing the slots' states


class RoundResult(NamedTuple):
    """A round's shards, stacked in task order: `traj [T, K, B]`, `bootstrap [K, B]`.

    `K >= len(tasks)`; slots past `len(tasks)` are padding the learner masks.
    The slots' new states are written to the round's `SlotTable`.
    `stats`: the backend's `RoundStats`.
    """

    traj: Any
    bootstrap: Any
    shards: List[ShardInfo]
    stats: RoundStats


class SlotTable:
    """The trainer's stateless (gymnax) slot states, stacked: leaves `[M, ...]`.

    `data` may hold device or host arrays; remote backends read and write one
    slot at a time, the local backend the whole table inside its jit.
    None for sticky (envpool) specs, whose slots live on the workers.
    """

    def __init__(self, data):
        self.data = data

    def get(self, slot: int):
        import jax

        return jax.tree.map(lambda x: x[slot], self.data)

    def put(self, slots: list, states: list) -> None:
        """Write slot states (host side; one copy of the table per call)."""
        import jax
        import numpy as np

        def write(table, *values):
            table = np.array(table)  # a writable host copy
            for slot, v in zip(slots, values):
                table[slot] = np.asarray(v)
            return table

        self.data = jax.tree.map(write, self.data, *states)


class Capabilities(NamedTuple):
    """What a backend can do, declared by the backend: trainers ask this, never its name."""

    one_shard: bool = False  # `run_shard(index, params, task, state)`: one shard, no round around it
    in_process: bool = False  # shards run on this process's cores, beside the learner
    batched: bool = False  # a round's shards run as one batched program (they share its time)
    # `warm(tasks, params, table)`: start what these shards need (actors, compiled programs)
    # and return once they are ready, so that the first round is not also the start-up
    warms: bool = False
    # `prepare(slots, table)`: encode what the next round's requests need from the slots'
    # states while the learner's update runs (the trainer calls it in the update's shadow)
    prepares: bool = False


def capabilities(backend) -> Capabilities:
    """A backend's (instance or class) declared capabilities; none declared: none."""
    return getattr(backend, "capabilities", Capabilities())


class Backend(Protocol):
    name: str
    capabilities: Capabilities

    def start(self, job: Job) -> None: ...

    def run_round(self, round_: int, params, tasks: List[ShardTask],
                  table: Optional[SlotTable]) -> RoundResult: ...

    def close(self) -> None: ...

    # with `capabilities.one_shard`: one shard on its own (the async trainer); `run_shard`
    # below falls back to `run_round` with a one-slot table for the others
    # def run_shard(self, index: int, params, task: ShardTask, state) -> tuple: ...

    # with `capabilities.warms`: see `Capabilities`; the slots' states are left as they are
    # def warm(self, tasks: List[ShardTask], params, table: Optional[SlotTable]) -> None: ...

    # with `capabilities.prepares`: see `Capabilities`; a stale preparation must not be used
    # def prepare(self, slots: List[int], table: Optional[SlotTable]) -> None: ...


def warm(backend, tasks: List[ShardTask], params, table: Optional[SlotTable]) -> None:
    """Start what `tasks` need on `backend` and wait until it is ready (a backend that
    declares no `warms` starts its shards' programs in their first round)."""
    if capabilities(backend).warms:
        backend.warm(tasks, params, table)


def prepare(backend, slots: List[int], table: Optional[SlotTable]) -> None:
    """Let `backend` get the next round's requests for `slots` ready from `table` (a
    backend that declares no `prepares` encodes them in the round)."""
    if capabilities(backend).prepares:
        backend.prepare(slots, table)


class OneSlot:
    """A slot table of one slot's state, so `run_round` can run a single shard."""

    def __init__(self, state):
        self.state = state

    def get(self, slot: int):
        return self.state

    def put(self, slots: list, states: list) -> None:
        self.state = states[0]


def run_shard(backend, index: int, params, task: ShardTask, state) -> tuple:
    """Run one shard (the `index`-th of its slot) from slot state `state` (None for
    sticky specs); returns `(output, info, stats)`: a `shard.ShardOutput` (`[T, B]`
    trajectory, the slot's new state, `[B]` bootstrap), its `ShardInfo` and the
    backend's dispatch/wait/transfer stats."""
    import numpy as np

    if capabilities(backend).one_shard:
        return backend.run_shard(index, params, task, state)
    table = None if state is None else OneSlot(state)
    result = backend.run_round(index, params, [task], table)
    out = ShardOutput(_first(result.traj), None if table is None else table.state,
                      np.asarray(result.bootstrap)[0])
    return out, result.shards[0], result.stats


def _first(traj):
    """Shard 0 of a stacked `[T, K, B]` trajectory, on the host."""
    import jax
    import numpy as np

    return jax.tree.map(lambda x: np.asarray(x)[:, 0], traj)


BACKENDS = Registry("backend", "backend.name", GROUP, BUILTIN)


def available() -> list:
    """Backend names: the built-ins, then plugins' entry points."""
    return BACKENDS.names()


def make_backend(backend_cfg) -> Backend:
    """The backend `backend_cfg.name` names, built as `cls(backend_cfg)`, or as
    `cls(backend_cfg, options)` for a plugin that declares `Options` (`backend.options`);
    `ConfigError` (one line) for an unknown name or a bad option."""
    cls = BACKENDS.get(backend_cfg.name)
    opts = plugin_options(cls, backend_cfg.options, "backend.options")
    return made("backend.name", backend_cfg.name, cls, "cls(cfg.backend[, options]), a Backend",
                ("start", "run_round", "close"), backend_cfg, *(() if opts is None else (opts,)))


def bucket(n: int, max_shards: int) -> int:
    """Shard count padded to a power of two (capped at `max_shards`): a handful
    of compiled shapes serve every `n`."""
    k = 1
    while k < n:
        k *= 2
    return min(k, max_shards) if n <= max_shards else n


class Stacker:
    """Stacks shards' outputs as they arrive into `[T, k, B]` trajectory and `[k, B]`
    bootstrap buffers (host arrays, zero past the last shard put), allocated on the first
    `put` from that output's shapes."""

    def __init__(self, k: int):
        self.k, self.traj, self.boot = k, None, None

    def put(self, i: int, out) -> None:
        """Shard `i`'s output (`shard.ShardOutput` or anything with `traj` and `bootstrap`)."""
        import jax
        import numpy as np

        if self.traj is None:
            zeros = lambda x, axis: np.zeros(x.shape[:axis] + (self.k,) + x.shape[axis:], x.dtype)  # noqa: E731
            self.traj = jax.tree.map(lambda x: zeros(np.asarray(x), 1), out.traj)
            self.boot = zeros(np.asarray(out.bootstrap), 0)
        for buf, x in zip(jax.tree.leaves(self.traj), jax.tree.leaves(out.traj)):
            buf[:, i] = x
        self.boot[i] = out.bootstrap

    def result(self) -> tuple:
        return self.traj, self.boot


def stack_outputs(outputs: list, k: int):
    """Host-side: per-shard `[T, B]` trajectories and `[B]` bootstraps stacked
    to `[T, k, B]` / `[k, B]`, zero-padded past `len(outputs)`."""
    stacker = Stacker(k)
    for i, out in enumerate(outputs):
        stacker.put(i, out)
    return stacker.result()


__all__ = ["Backend", "BackendError", "RoundStats", "Capabilities", "capabilities", "Job", "ShardTask", "ShardInfo", "RoundResult", "SlotTable", "OneSlot",
           "run_shard", "warm",
           "make_backend", "available", "bucket", "stack_outputs", "Stacker", "GROUP"]

"""In-process backend: a round's shards run as one jitted call.

For gymnax the `n` shards are `n` seeds of one core rollout (`shard.ShardProgram.stacked`),
gathered from and scattered back to the slot table inside the same jit. `n`
is padded to a power of two (`bucket`), so a changing shard count compiles a
handful of shapes at most, never one per round. envpool slots run one after
another on in-process `ShardWorker` pools that keep their C++ state.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.backends import (BackendError, Capabilities, RoundStats, Job, RoundResult, ShardInfo, SlotTable,
                                 bucket, stack_outputs)
from jaxrl_dist.backends.retry import GaveUp, RetryPolicy
from jaxrl_dist.backends.shard import ShardWorker, Timings


def _merge(x):
    """`[K, B, ...]` per-slot leaves to the stacked rollout layout `[K * B, ...]`."""
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def make_round_fn(program, k: int):
    """Jitted `(params, table[M], idx[k], keys[k, 2]) -> (table, traj[T, k, B], bootstrap[k, B])`."""
    return jax.jit(make_round_body(program, k), donate_argnums=1)


def make_round_body(program, k: int):
    """`make_round_fn`'s function, not jitted (the learned scheduler's training vmaps it).

    Padding entries of `idx` are `M` (out of range): they read a clamped slot
    and their writes are dropped.
    """
    run = program.stacked(k)

    def round_fn(params, table, idx, keys):
        actors = jax.tree.map(lambda x: _merge(jnp.take(x, idx, axis=0, mode="clip")), table)
        actors, traj, boot = run(params, actors, keys)
        new = jax.tree.map(lambda x, old: x.reshape((k,) + old.shape[1:]), actors, table)
        table = jax.tree.map(lambda t, v: t.at[idx].set(v, mode="drop"), table, new)
        return table, traj, boot

    return round_fn


def _stats(wait_s: float, stack_s: float = 0.0) -> RoundStats:
    """In process nothing is sent: the round is waiting on the shards (and stacking
    sticky slots' outputs)."""
    return RoundStats(wait_s=wait_s, stack_s=stack_s)


class LocalBackend:
    """Shards in this process: a round is one jitted, batched call; one shard runs alone too."""

    name = "local"
    capabilities = Capabilities(one_shard=True, in_process=True, batched=True, warms=True)

    def __init__(self, cfg):
        self.cfg = cfg
        self._fns = {}
        self._worker = ShardWorker("local")
        self.retry = RetryPolicy.from_config(cfg)

    def start(self, job: Job) -> None:
        self.job = job

    def _attempt(self, fn):
        """`(fn(), retries)` under the retry policy (`fn` reuses the same keys each try)."""
        try:
            return self.retry.call(lambda _: fn())
        except GaveUp as gave_up:  # the last failure ends the run
            why = f"local shard failed after {GaveUp.count(gave_up.tries)}: {gave_up.error}"
            raise BackendError(why) from gave_up.error

    def warm(self, tasks, params, table) -> None:
        """Compile the round program for `len(tasks)` shards: run it once on a copy of the
        slots' states and drop the answers (an envpool slot's shard would step its envs:
        those compile in their first round)."""
        if table is not None:  # this class's round, not a subclass's: warming is not a round to count
            LocalBackend.run_round(self, 0, params, tasks, SlotTable(jax.tree.map(jnp.array, table.data)))

    def run_round(self, round_: int, params, tasks, table) -> RoundResult:
        t0 = time.time()
        if self.job.spec.sticky:
            return self._run_sticky(params, tasks, t0)
        n, M = len(tasks), self.cfg.max_shards
        k = bucket(n, M)
        if k not in self._fns:
            self._fns[k] = make_round_fn(self.job.program, k)
        idx = np.full((k,), M, np.int32)
        idx[:n] = [t.slot for t in tasks]
        keys = np.zeros((k, 2), np.uint32)
        keys[:n] = [t.key for t in tasks]
        run = lambda: jax.block_until_ready(self._fns[k](params, table.data, idx, keys))
        (data, traj, boot), retries = self._attempt(run)
        table.data = data
        t1 = time.time()
        timing = Timings(t0, t0, t1, t1 - t0)
        shards = [ShardInfo(t.slot, timing, False, retries, "local") for t in tasks]
        return RoundResult(traj, boot, shards, _stats(t1 - t0))

    def run_shard(self, index: int, params, task, state) -> tuple:
        """One shard from `state` (the async trainer): the worker's single-shard program."""
        t0 = time.time()
        run = lambda: self._worker.run(self.job.spec, params, state, task.key, task.slot,  # noqa: E731
                                       self.job.run_id, self.job.seed)
        (out, timing, reset), retries = self._attempt(run)
        return out, ShardInfo(task.slot, timing, reset, retries, "local"), _stats(time.time() - t0)

    def _run_sticky(self, params, tasks, t0) -> RoundResult:
        outs, shards = [], []
        for t in tasks:
            run = lambda: self._worker.run(self.job.spec, params, None, t.key, t.slot,
                                           self.job.run_id, self.job.seed)
            (out, timing, reset), retries = self._attempt(run)
            outs.append(out)
            shards.append(ShardInfo(t.slot, timing, reset, retries, "local"))
        t1 = time.time()
        traj, boot = stack_outputs(outs, bucket(len(tasks), self.cfg.max_shards))
        return RoundResult(traj, boot, shards, _stats(t1 - t0, time.time() - t1))

    def close(self) -> None:
        self._fns.clear()

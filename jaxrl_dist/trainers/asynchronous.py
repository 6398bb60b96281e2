"""The async trainer (`trainer=async`): actors produce, the learner consumes, no round barrier.

Each active actor owns a slot and runs **chunks** back to back on the backend
(a chunk is one shard: a `[T, B]` rollout of the slot's envs), each with the
newest params it can get and tagged with that params version. On the local
backend an actor is a thread calling the in-process shard; on Ray, a thread
feeding the buffer from its slot's Ray actor; on HTTP, a thread whose finished
invocation is replaced at once by a new one with the newest params. The
learner takes `asynchronous.batch_chunks` (`K`) chunks as they arrive, runs the core's
PPO update on them and publishes the next version.

**Staleness.** Chunks are numbered by tickets in the order actors claim them,
and ticket `i` may start only once `i < (version + max_staleness + 1) * K +
dropped`: the learner consumes `K` chunks per version, so a chunk started then
is learned from within `max_staleness` versions, and actors wait for fresh
params rather than make data that would be thrown away. A chunk that still
arrives too late (a straggler overtaken by faster actors) is dropped, counted,
and never learned from: staleness never exceeds the bound. With
`max_staleness=0` each version's `K` chunks all use that version, on slots
`0..K-1`, and the learner is the round trainer's: the very parameters of
`scheduler=fixed scheduler.num_shards=K`.

**Off-policy correction.** A stale chunk's samples get PPO's ratio against
their behaviour log-probs, and V-trace-corrected GAE (`ppo.make_batch`):
truncated importance weights on the TD errors and traces, values from the
current value function. V-trace rather than IMPACT's target network: it needs
no second set of params to store, publish and checkpoint, and where the lag
is 0 it is GAE exactly, so the staleness-0 case is the sync trainer.

**Balance.** Every `asynchronous.balance_every` updates the trainer compares actor
production capacity (active actors / mean seconds per chunk) with learner
consumption capacity (`K` / mean seconds per update) and starts or stops one
actor when they differ by more than `asynchronous.balance_tolerance`. Capacities
assume each actor adds production; where actors share CPUs with each other and
the learner, one more can make less. So the trainer also measures the chunks/s
the learner took at each actor count, and `balance` does not step to a count
measured slower (it tries the other way instead): the count climbs to the
fastest one measured (`learned_rate_by_actors` in summary.json).

**Keys and resume.** An actor's `c`-th chunk on slot `s` uses the round
trainer's key of round `c`, slot `s`; update `u` the learner key of round `u`.
A checkpoint holds, per slot, the env state after its last chunk the learner
took (learned or dropped) and that chunk count, so a resumed run makes the
chunks that were still queued or running again, identically: none is lost or
learned twice. A dead Ray actor or HTTP instance is the backend's to replace
(same keys); an actor whose shard fails after every retry stops the run with
the last checkpoint on disk.
"""
from __future__ import annotations

import heapq
import os
import queue
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.backends import BackendError, Job, ShardTask, SlotTable, capabilities, run_shard
from jaxrl_dist.backends import warm as warm_backend
from jaxrl_dist.backends.shard import learn_key, round_keys
from jaxrl_dist.config import Config
from jaxrl_dist.scheduling.balance import Balancer, ticket_allowed
from jaxrl_dist.scheduling.cost import AsyncAccount
from jaxrl_dist.scheduling.records import Cost, Record, steps_done
from jaxrl_dist.trainers import interrupt
from jaxrl_dist.trainers.accounting import Clocks, charged_bytes, shard_seconds, straggle, tree_bytes
from jaxrl_dist.trainers.rounds import (ShardState, ShardTrainer, limit_reason, recent_return_of, target_reason,
                                        update_record, zero_outputs)
from jaxrl_dist.trainers.summary import AsyncFigures


class Chunk(NamedTuple):
    slot: int
    index: int  # the slot's chunk count: its key is round `index`'s
    version: int  # params version it was made with
    output: Any  # shard.ShardOutput: traj `[T, B]`, slot state after it (None: sticky), bootstrap `[B]`
    info: Any  # `backends.ShardInfo`
    stats: dict  # the backend's dispatch/wait/transfer seconds and bytes
    factor: float  # injected slowdown
    busy_s: float  # the actor's seconds on it (dispatch to delivery)


class Dispatched(NamedTuple):
    """An update handed to the bookkeeping thread: dispatched, its metrics still computing."""

    train: Any  # the state after it (its params are published once computed)
    version: int  # the params version it makes
    chunks: list  # the chunks it learns from
    dropped: list  # chunks dropped as too stale while collecting
    metrics: Any
    lag: Any  # `[K]` versions each learned chunk is behind
    dispatched: float  # `time.perf_counter()` when it was dispatched
    # the learner loop's phases for it (`collect`: waiting for the chunks, the previous
    # update computing meanwhile; `dispatch`: handing the update to XLA) and their wall
    phases: dict = {}
    loop_s: float = 0.0


class Gate:
    """Tickets, the newest params and the staleness rule (see the module doc)."""

    def __init__(self, K: int, max_staleness: int, version: int, params):
        self.K, self.S = K, max_staleness
        self.cond = threading.Condition()
        self.version, self.params = version, params
        self.next, self.free, self.dropped = version * K, [], 0
        self.stopping = False

    def claim(self) -> int:
        with self.cond:
            if self.free:
                return heapq.heappop(self.free)
            self.next += 1
            return self.next - 1

    def release(self, ticket: int) -> None:
        with self.cond:
            heapq.heappush(self.free, ticket)

    def allowed(self, ticket: int) -> bool:
        return ticket_allowed(ticket, self.version, self.S, self.K, self.dropped)

    def wait(self, ticket: int):
        """`(params, version)` once `ticket` may start; None when the run stops."""
        with self.cond:
            self.cond.wait_for(lambda: self.stopping or self.allowed(ticket))
            return None if self.stopping else (self.params, self.version)

    def publish(self, params, version: int) -> None:
        with self.cond:
            self.params, self.version = params, version
            self.cond.notify_all()

    def refund(self) -> None:
        """A dropped chunk's ticket is made again: one more may start."""
        with self.cond:
            self.dropped += 1
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()


class ActorPool:
    """The actors: one thread per active slot, each running its slot's chunks back to
    back under the staleness gate and delivering them to one queue."""

    def __init__(self, cfg: Config, backend, gate: Gate, counts, base):
        self.cfg, self.backend, self.gate = cfg, backend, gate
        self.queue, self.lock, self.threads = queue.Queue(), threading.Lock(), {}
        self.wanted = [False] * cfg.backend.max_shards
        self.counts = [int(c) for c in np.asarray(counts)]  # chunks made per slot
        self.base = base  # `[M, ...]` host slot states of the checkpoint (None: sticky)
        self.produced = {}  # slot -> its state after its last delivered chunk

    def slot_state(self, slot: int):
        """The slot's env state after its last delivered chunk (None: sticky)."""
        if self.base is None:
            return None
        if slot in self.produced:
            return self.produced[slot]
        return jax.tree.map(lambda x: x[slot], self.base)

    def _start(self, slot: int) -> None:
        """Run slot `slot`'s chunks from where its last delivered one left off."""
        t = threading.Thread(target=self._actor, args=(slot, self.slot_state(slot)), daemon=True,
                             name=f"jaxrl-dist-actor-{slot}")
        self.threads[slot] = t
        t.start()

    def _actor(self, slot: int, state) -> None:
        ticket = self.gate.claim()
        try:
            while ticket is not None:
                got = self.gate.wait(ticket)
                if got is None:
                    self.gate.release(ticket)
                    return
                chunk = self._chunk(slot, state, *got)
                state = chunk.output.actor
                ticket = self._deliver(chunk)
        except Exception as err:  # the backend spent its retries: the learner stops the run
            self.queue.put(err)

    def _chunk(self, slot: int, state, params, version: int) -> Chunk:
        """The slot's next chunk, made with `params` of `version`."""
        index, t0 = self.counts[slot], time.perf_counter()
        keys, _ = round_keys(self.cfg.seed, index, [slot])
        out, info, stats = run_shard(self.backend, index, params, ShardTask(slot, keys[0]), state)
        factor = float(straggle([info], self.cfg.backend, self.produced, index)[0])
        return Chunk(slot, index, version, out, info, stats, factor, time.perf_counter() - t0)

    def _deliver(self, chunk: Chunk) -> Optional[int]:
        """Queue a chunk and claim the actor's next ticket in one step (so that at
        staleness 0 every actor holds one ticket of the next version before this
        version's last chunk can arrive); None when the actor stops here."""
        with self.lock:
            s = chunk.slot
            self.counts[s] = chunk.index + 1
            self.produced[s] = chunk.output.actor
            go_on = self.wanted[s] and not self.gate.stopping
            ticket = self.gate.claim() if go_on else None
            self.queue.put(chunk)
            if not go_on:
                del self.threads[s]
            return ticket

    def set_active(self, n: int) -> None:
        """Start or stop actors (lowest free slots first) until `n` are wanted."""
        with self.lock:
            wanted = [s for s, w in enumerate(self.wanted) if w]
            for s in wanted[n:]:
                self.wanted[s] = False
            for s in range(len(self.wanted)):
                if len(wanted) >= n:
                    break
                if not self.wanted[s] and s not in self.threads:
                    self.wanted[s] = True
                    wanted.append(s)
                    self._start(s)

    def collect(self, version: int) -> tuple:
        """`K` chunks fresh enough for `version`, and the ones dropped as too stale."""
        a, b = self.cfg.asynchronous, self.cfg.backend
        patience = b.shard_timeout * (b.max_retries + 1) + 60.0  # every actor's retries, and more
        fresh, dropped = [], []
        while len(fresh) < a.batch_chunks:
            try:
                item = self.queue.get(timeout=patience)
            except queue.Empty:
                raise BackendError(f"async: no chunk arrived in {patience:g} s") from None
            if isinstance(item, Exception):
                raise item if isinstance(item, BackendError) else BackendError(
                    f"actor failed: {type(item).__name__}: {item}") from item
            if version - item.version <= a.max_staleness:
                fresh.append(item)
            else:
                dropped.append(item)
                self.gate.refund()
        return sorted(fresh, key=lambda c: (c.slot, c.index)), dropped

    def stop(self) -> None:
        self.gate.stop()
        b = self.cfg.backend
        for t in list(self.threads.values()):
            t.join(timeout=b.shard_timeout * (b.max_retries + 1) + 5)


def actor_range(cfg: Config, backend) -> tuple:
    """`(actors at the start, most the balancer may run)`. Unset, the start is `K`, or
    on a backend whose shards run on this process's cores (with staleness allowed) at
    most one actor a core: there actors compete with each other and the learner, and
    the balancer adds more if production falls short."""
    a, b = cfg.asynchronous, cfg.backend
    top = a.max_actors if a.max_actors is not None else b.max_shards
    first = a.actors
    if first is None:
        first = a.batch_chunks
        if capabilities(backend).in_process and a.max_staleness > 0:
            first = max(a.min_actors, min(first, os.cpu_count() or 1))
    return first, top


def advance_ledger(states: dict, counts: list, chunks: list) -> None:
    """Move each slot's checkpointed state and chunk count past the chunks taken, only
    forward: an update lists its learned chunks, then its dropped ones, and a dropped
    chunk can be older than a learned one of its slot (a slot's chunks arrive in order,
    so every older one has been taken by then). Moving back would make a resumed run
    learn the newer chunk twice."""
    for c in chunks:
        if c.index + 1 > counts[c.slot]:
            states[c.slot] = c.output.actor
            counts[c.slot] = c.index + 1


class AsyncTrainer(ShardTrainer):
    """The async run: the shared parts (learner, backend, checkpointer), an actor pool
    with its staleness gate, and a balancer; `run()` trains to the end."""

    keeps_counts = True

    def __init__(self, cfg: Config, run_dir: Path, resuming: bool):
        super().__init__(cfg, run_dir, resuming)
        self.pool, self.balancer, self.account = None, None, None
        self.staleness, self.dropped_total = Counter(), 0
        self._ledger = {}  # slot -> state after its last taken chunk (what a checkpoint holds)
        self._ledger_counts = [int(c) for c in np.asarray(self.state.counts)]
        self._done = queue.Queue()  # updates for the bookkeeping thread
        self._late_stop, self._books_error = None, None
        self._param_bytes, self._last_update_t = 0, time.perf_counter()
        self._learn_chunks, self._warm = self._learn_fn(), None

    def expected_shards(self) -> float:
        return float(self.cfg.asynchronous.batch_chunks)  # the learner takes K chunks an update

    # -- learner -----------------------------------------------------------

    def _learn_fn(self):
        """Jitted `(train, outputs, key, lag) -> (train, metrics)`: the core update on
        `K` chunks stacked inside the same program (no host round trip), not donating
        its state, so the params it returns can go to the actors as they are."""
        K, learn = self.cfg.asynchronous.batch_chunks, self.learner.update_fn

        def learn_chunks(train, outputs, seed, version, lag=None):
            traj = jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *[o[0] for o in outputs])
            boot = jnp.stack([o[1] for o in outputs])
            # seed and version are arguments: as constants they would change the program,
            # and miss the persistent compile cache, with every seed
            return learn(train, traj, boot, K, learn_key(seed, version), lag)

        return jax.jit(learn_chunks)

    def _learn(self, train, chunks: list, version: int):
        outputs = self.placed([(c.output.traj, c.output.bootstrap) for c in chunks])
        lag = np.array([version - c.version for c in chunks], np.int32)
        self._warm.join()
        args = (train, outputs, np.int32(self.cfg.seed), np.int32(version))
        if self.cfg.asynchronous.max_staleness:
            train, metrics = self._learn_chunks(*args, lag)
        else:  # exactly the round trainer's update
            train, metrics = self._learn_chunks(*args)
        return train, metrics, lag  # dispatched: bookkeeping waits for the metrics

    def _warm_learner(self, train) -> threading.Thread:
        """Compile the update on zeros while the actors start. With `max_staleness` > 0
        every update takes the corrected variant: a chunk with lag 0 gets weights of
        exactly 1 and its own values there, so it is GAE, and one program compiles
        at start-up instead of two."""
        K = self.cfg.asynchronous.batch_chunks
        args = (train, self.placed([zero_outputs(self.program)] * K), np.int32(0), np.int32(0))
        if self.cfg.asynchronous.max_staleness:
            args += (np.zeros((K,), np.int32),)
        return self.warm(self._learn_chunks, *args)

    # -- the run -----------------------------------------------------------

    def run(self, logger, history: list, t_start: Optional[float] = None) -> list:
        """Learn update after update until `algo.total_timesteps` or a `run.*` stop
        condition (`self.stop_reason`); returns this run's records (one per update).

        This thread only collects, learns and publishes; a bookkeeping thread
        writes each update's record, cost, checkpoint and balance decision while
        the next update computes (and stops the run at the target or budget)."""
        self._setup_run(t_start)
        train, version = self.state.train, int(self.state.round)
        env_steps = steps_done(history, self.learner.steps_per_shard)
        for rec in history:  # a resumed run's summary counts the whole run's chunks, as its env steps do
            self.staleness.update(rec.detail.get("staleness", ()))
            self.dropped_total += int(rec.detail.get("dropped", 0))
        records = []
        books = threading.Thread(target=self._bookkeeping, args=(logger, list(history), records),
                                 daemon=True, name="jaxrl-dist-books")
        try:
            self._start_up(train, t_start)
            self._last_update_t = self.rounds_t0  # the first update's time starts after the start-up
            self._actors_on(train, version)
            self.ckpt.restart_clock()  # `run.checkpoint_every_s` counts training time
            books.start()
            while self._stop(version, env_steps) is None:
                train, done = self._update(train, version)
                version += 1
                env_steps += done * self.learner.steps_per_shard
        finally:
            self._done.put(None)
            if books.is_alive():
                books.join()
            if self.pool is not None:
                self.pool.stop()
            self.settle()
            self.backend.close()
        if self._books_error is not None:
            raise self._books_error
        self._save_async(train, version)
        self.finish()
        if self.stop_reason == "interrupted":
            raise interrupt.Interrupted(self.cfg.run.dir, version)
        return records

    @property
    def balancing(self) -> bool:
        """`asynchronous.balance`, but for staleness 0: each version then takes its `K` chunks
        from `K` actors, so more cannot produce more (and the run stays the sync trainer's)."""
        return self.cfg.asynchronous.balance and self.cfg.asynchronous.max_staleness > 0

    def _start_up(self, train, t_start: Optional[float]) -> None:
        """Start the backend and the first actors' shard programs while the learner's
        compile warms in a thread: the start-up phases."""
        laps = self.start_laps(t_start)
        first, top = actor_range(self.cfg, self.backend)  # the most actors (slots) in flight at once
        most = (top, "asynchronous.max_actors/backend.max_shards") if self.balancing else (
            first, "asynchronous.actors")
        self.backend.start(Job(self.spec, self.cfg.seed, uuid.uuid4().hex, self.program, *most))
        laps.lap("backend")
        self._warm = self._warm_learner(train)
        table = None if self.state.table is None else SlotTable(self.state.table)
        tasks = [ShardTask(s, np.zeros(2, np.uint32)) for s in range(first)]
        if capabilities(self.backend).in_process:  # the actors share one single-shard program
            if table is not None:
                run_shard(self.backend, 0, train.params, tasks[0], table.get(0))
        else:
            warm_backend(self.backend, tasks, train.params, table)
        laps.lap("actors")
        self._warm.join()
        laps.lap("learner")
        self.started(laps)

    def _setup_run(self, t_start: Optional[float]) -> None:
        """The cost account and both clocks, continuing a resumed run's."""
        first, top = actor_range(self.cfg, self.backend)
        modeled, usd, wall = (float(x) for x in self.state.clock)
        self.account = AsyncAccount(self.cfg.cost, self.cfg.backend.max_shards, int(self.state.round),
                                    modeled, usd,
                                    prewarm=range(first, top) if self.balancing else ())
        self.clocks = Clocks(self.account, wall, self.process_start(t_start))
        self._param_bytes = tree_bytes(self.state.train.params)
        self._last_update_t = time.perf_counter()

    def _actors_on(self, train, version: int) -> None:
        a = self.cfg.asynchronous
        first, top = actor_range(self.cfg, self.backend)
        gate = Gate(a.batch_chunks, a.max_staleness, version, train.params)
        self.pool = ActorPool(self.cfg, self.backend, gate, self.state.counts, self.state.table)
        self.balancer = Balancer(a, first, top)
        self.pool.set_active(first)

    def _bookkeeping(self, logger, so_far: list, records: list) -> None:
        """Each update's record, log line, checkpoint and balance step, in order."""
        env_steps = steps_done(so_far, self.learner.steps_per_shard)
        try:
            while (item := self._done.get()) is not None:
                rec = self._book(item, env_steps, so_far)
                env_steps = rec.env_steps
                logger.log([rec])
                records.append(rec)
                self._after(item.train, item.version, so_far)
        except Exception as err:  # the learner stops at its next check and re-raises it
            self._books_error, self._late_stop = err, "error"

    def _book(self, item: Dispatched, env_steps: int, so_far: list) -> Record:
        """Wait for one update, publish its params and make its record."""
        metrics, times = self._finished(item.metrics, item.dispatched)
        # published once computed: an actor given params still in flight would
        # wait for the update instead of working beside it
        self.pool.gate.publish(item.train.params, item.version)
        self._take(item.chunks + item.dropped)
        self.balancer.observe(item.chunks + item.dropped, len(item.chunks))
        rec = self._record(item, env_steps, metrics, times)
        so_far.append(rec)
        rec = so_far[-1] = rec.replace(return_recent=recent_return_of(so_far, self.cfg.run.target_episodes))
        return rec

    def _after(self, train, version: int, so_far: list) -> None:
        """The late stop conditions, the checkpoint and the balance step of an update."""
        a = self.cfg.asynchronous
        self._late_stop = self._late_stop or self._stop_late(so_far)
        if self.ckpt.due(version):
            self._save_async(train, version)
        if self.balancing and version % a.balance_every == 0:
            self.pool.set_active(self.balancer.step())

    def _take(self, chunks: list) -> None:
        """Move the checkpointed slot states and counts past chunks the learner took."""
        advance_ledger(self._ledger, self._ledger_counts, chunks)

    def _stop(self, version: int, env_steps: int) -> Optional[str]:
        """Why the learner stops before update `version + 1` (None: go on): the step
        or update budget here, the target or dollar budget as bookkeeping found them."""
        self.stop_reason = (self._late_stop or limit_reason(self.cfg, version, env_steps)
                            or ("interrupted" if interrupt.requested() else None))
        return self.stop_reason

    def _finished(self, metrics, dispatched: float) -> tuple:
        """Wait for an update's metrics; `(metrics, times)`. Its compute began when it
        was dispatched or when the update before it finished, whichever was later."""
        metrics = jax.device_get(metrics)
        done = time.perf_counter()
        times = {"learn": done - max(dispatched, self._last_update_t), "update": done - self._last_update_t}
        self._last_update_t = done
        self.balancer.note_update(times["learn"])
        return metrics, times

    def _stop_late(self, records: list) -> Optional[str]:
        """The stop conditions that need the records: target reached, dollars or modeled
        seconds spent (found after the update that reached them: updates overlap, so the
        one that would pass a limit cannot be told in advance)."""
        target, run = target_reason(self.cfg, records), self.cfg.run
        if target is not None:
            return target
        if run.budget_usd is not None and self.account.usd >= run.budget_usd:
            return "budget_usd"
        if run.deadline_s is not None and self.account.now >= run.deadline_s:
            return "deadline_s"
        return None

    def _update(self, train, version: int):
        """Collect `K` chunks and dispatch the update; bookkeeping publishes version + 1
        when it has computed. Returns `(train, chunks taken)`."""
        chunks, dropped = self.pool.collect(version)
        t1 = self.laps.lap("collect")
        train, metrics, lag = self._learn(train, chunks, version)
        self.staleness.update(int(x) for x in lag)
        self.dropped_total += len(dropped)
        self.laps.lap("dispatch")
        phases, wall = self.laps.take()
        self._done.put(Dispatched(train=train, version=version + 1, chunks=chunks, dropped=dropped,
                                  metrics=metrics, lag=lag, dispatched=t1, phases=phases, loop_s=wall))
        return train, len(chunks) + len(dropped)

    def _record(self, item: Dispatched, env_steps: int, metrics, times: dict) -> Record:
        """One update's record, cost included."""
        steps, chunks, lag = self.learner.steps_per_shard, item.chunks, item.lag
        taken = chunks + item.dropped
        dt = max(times["update"], 1e-9)
        detail = {"staleness_max": int(lag.max()), "staleness_mean": float(lag.mean()),
                  "staleness": [int(x) for x in lag],  # per chunk learned: a resumed run's histogram reads them
                  "dropped": len(item.dropped), "actors_active": self.balancer.active,
                  # what the active actors make (each a chunk in its mean time), against what
                  # the learner took: the balancer's comparison (taken counts would equal it)
                  "production_rate": self.balancer.active * steps / max(float(np.mean([c.busy_s for c in taken])),
                                                                        1e-9),
                  "consumption_rate": len(chunks) * steps / dt,  # env steps/s learned from
                  "chunks": [[c.slot, c.index, c.version] for c in taken],
                  # per chunk: the worker's compute, and the wait for it (the backend's, else the actor's)
                  "shard_compute_s": [c.info.timings.finished - c.info.timings.started for c in taken],
                  "shard_roundtrip_s": [c.busy_s if c.info.roundtrip_s is None else c.info.roundtrip_s
                                        for c in taken],
                  "loop_s": item.loop_s}  # the learner loop's wall for this update: its phases' sum
        return update_record(metrics, update=item.version, env_steps=env_steps + len(taken) * steps,
                             sps=len(chunks) * steps / dt, num_shards=len(taken), learn_s=times["learn"],
                             round_s=times["update"], retries=sum(c.info.retries for c in taken),
                             slot_resets=sum(bool(c.info.reset) and c.index > 0 for c in taken),
                             cost=self._charge(item.version, chunks, item.dropped, times["learn"]), detail=detail,
                             phases=item.phases)

    def _charge(self, u: int, chunks: list, dropped: list, learn_s: float) -> Cost:
        """Bill the chunks taken and the update on the async modeled clock. Dropped
        chunks are billed but do not hold the update up: the learner discards a
        late chunk whenever it comes."""
        arrivals = [self._bill(c) for c in chunks]
        for c in dropped:
            self._bill(c)
        rc = self.account.update(arrivals, learn_s, u)
        return self.clocks.cost(rc, self.account.cold_billed, modeled_wait_s=rc.components["wait_s"])

    def _bill(self, c: Chunk) -> float:
        """Bill one chunk on the modeled clock; returns its modeled arrival."""
        seconds = shard_seconds([c.info])[0] * c.factor
        moved = charged_bytes(c.stats, 1, self._param_bytes, tree_bytes((c.output.traj, c.output.bootstrap)))
        return self.account.chunk(c.slot, c.version, seconds, moved)

    def _save_async(self, train, version: int) -> None:
        table = self.state.table
        if table is not None and self._ledger:
            slots = SlotTable(table)
            slots.put(list(self._ledger), list(self._ledger.values()))
            table = slots.data
        self.save(ShardState(train=train, table=table, round=np.int32(version),
                             counts=np.array(self._ledger_counts, np.int32)))

    def figures(self) -> dict:
        total = sum(self.staleness.values())
        rates = self.balancer.rates if self.balancer else {}
        return {"scheduler": "balance" if self.balancing else "none",
                "staleness": AsyncFigures(
                    max_staleness=self.cfg.asynchronous.max_staleness,
                    staleness_histogram={str(k): v for k, v in sorted(self.staleness.items())},
                    staleness_mean=(sum(k * v for k, v in self.staleness.items()) / total) if total else None,
                    dropped_chunks=self.dropped_total,
                    actors_active_final=self.balancer.active if self.balancer else None,
                    # env steps/s learned while n actors ran (the balancer's measurements)
                    learned_rate_by_actors={str(n): r * self.learner.steps_per_shard
                                            for n, r in sorted(rates.items())})}

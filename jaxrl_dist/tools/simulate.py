"""A discrete-event model of the round trainer and the async trainer, for actor
counts and latencies this machine cannot run.

A **request** (one shard, or one async chunk) is: a fixed `overhead_s` (client
and server: wire format, HTTP, dispatch), the params' way out (`latency_s` +-
`jitter_s`, normal, clipped at 0), the queue at its instance (each serve
instance runs one shard at a time; slot `s` goes to instance `s % instances`),
the rollout (`compute_s`, lognormal spread `compute_cv`), an injected slowdown
(`slowdown`, one chunk in `slow_every`: `trainers.sync.straggle`'s rule, a wait
that uses no CPU), and the trajectory's way back. A share `straggler_share` of
requests are stragglers: both their delays are `straggler_factor` times longer
(times a Pareto(`straggler_alpha`) draw where that is positive): the latency
proxy's model (`tests/tools/faultproxy.py`), which delays each direction's
message once, whole.

**Sync** (`trainers/sync.py`): each round sends `actors` shards at once, waits
for the slowest and runs the update on all of them. With `batched` (the local
backend) the round's shards are one vectorised call, `compute_s * (1 +
batch_scale * (actors - 1))` long.

**Async** (`trainers/asynchronous.py`): each active actor runs chunks back to
back under the trainer's staleness gate (`balance.ticket_allowed`: ticket `i`
starts once `i < (version + max_staleness + 1) * K + dropped`, with the params
published last); the learner takes chunks as they come, drops one more than
`max_staleness` versions behind the update it collects for (refunding its
ticket), dispatches an update on every `K` fresh ones and goes on collecting
while it computes (JAX's async dispatch); an update publishes the next version
when it ends. With `balance`, every `balance_every` updates the trainer's own
`Balancer` (on the simulated clock) starts or stops an actor.

**Cores.** `Machine.cores=None`: every actor and the learner have a machine of
their own (remote actors). A number: they share that many cores, processor
sharing: `m` jobs at once each run at `min(1, cores / m)` of a core (rollouts,
and the update; the injected slowdown and the network waits use none). On the
measuring machine this is what makes actors slow the learner down.

The learner's update on `n` chunks takes `update_s_fixed + n * update_s_per_chunk`
(the form `jaxrl-dist calibrate` fits, `profile.Profile`). Randomness is drawn
per slot and chunk index (and per update), so two runs with the same seed meet
the same draws even where their events interleave differently (common random
numbers for calibration). simpy is imported lazily (`pip install jaxrl-dist[sim]`).

Figures (`SimResult`) are measured as `bench/async_vs_sync.py` measures real runs:
env steps taken (learned or dropped) and updates between the `warmup`-th update
and the last, over the seconds between them.
"""
from __future__ import annotations

import heapq
import statistics
from typing import NamedTuple, Optional

import numpy as np

from jaxrl_dist.scheduling.balance import Balancer, ticket_allowed

MODES = ("sync", "async")
_BLOCK = 64  # draws made at once per slot


class Workload(NamedTuple):
    """What a run sets: trainer, actors, learner batch, staleness, network."""

    mode: str = "async"  # "sync" | "async"
    actors: int = 4  # sync: shards a round; async: actors at the start
    batch_chunks: int = 4  # asynchronous.batch_chunks (K)
    max_staleness: int = 1
    steps_per_chunk: int = 512  # env steps in one chunk (num_steps x envs per shard)
    balance: bool = False  # asynchronous.balance
    min_actors: int = 1
    max_actors: Optional[int] = None  # None: `actors`
    balance_tolerance: float = 0.2
    balance_every: int = 4
    instances: Optional[int] = None  # serve instances; None: one per slot
    latency_s: float = 0.0  # each direction, mean
    jitter_s: float = 0.0  # each direction, normal std
    straggler_share: float = 0.0  # of requests
    straggler_factor: float = 1.0  # a straggler's delays, times the sampled ones ...
    straggler_alpha: float = 0.0  # ... times a Pareto(alpha) draw >= 1 when alpha > 0 (a heavy tail)
    slowdown: float = 1.0  # injected compute stragglers (backend.slowdown) ...
    slow_every: int = 0  # ... one chunk in this many (0: none)
    batched: bool = False  # sync: a round's shards run as one vectorised call, one job (the local backend)
    updates: int = 120  # updates (rounds) simulated
    warmup: int = 4  # updates before the measured window (bench/async_vs_sync.py's)


class Machine(NamedTuple):
    """What the hardware and software stack take (seconds): the calibrated part."""

    compute_s: float = 0.004  # one chunk's rollout alone on a core, median
    update_s_per_chunk: float = 0.0025  # learner: per chunk learned from ...
    update_s_fixed: float = 3e-4  # ... and per update
    compute_cv: float = 0.05  # lognormal sigma of a rollout's time
    update_cv: float = 0.02
    overhead_s: float = 0.0  # each request, not on the shared cores
    cores: Optional[float] = None  # cores actors and learner share; None: each its own
    batch_scale: float = 1.0  # a batched call of n shards takes compute_s * (1 + batch_scale * (n - 1))
    # the round trainer's own work each round besides the update (decode and stack the shards,
    # the record and its log line); the async trainer does it on its bookkeeping thread
    round_overhead_s: float = 0.0
    # an async actor's own work per chunk outside the request (its keys, packing the params,
    # decoding the answer); a round packs and decodes in its round_overhead_s
    chunk_overhead_s: float = 0.0


class SimResult(NamedTuple):
    env_steps_per_s: float  # made and taken (learned or dropped), as the trainers count env steps
    learned_steps_per_s: float  # learned from
    updates_per_s: float
    staleness_mean: float  # over learned chunks
    staleness_max: int
    dropped: int  # chunks too stale to learn from
    learner_idle: float  # share of the measured window the learner did not compute
    actors_mean: float  # active actors, averaged over updates
    chunk_compute_s_median: float  # a rollout's seconds (on shared cores: slowed)
    chunk_roundtrip_s_median: float  # a request's seconds, sent to answered
    update_s_median: float
    wall_s: float  # simulated seconds to the last update


class Chunk(NamedTuple):
    slot: int
    index: int  # the slot's chunk count
    version: int  # params version it was made with
    busy_s: float  # dispatch to delivery (what the balancer measures)
    roundtrip_s: float  # the request alone, sent to answered (what the HTTP backend measures)
    compute_s: float


def check(work: Workload, machine: Machine) -> None:
    """A clear error naming the field for a workload the model cannot run."""
    if work.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {work.mode!r}")
    for key in ("actors", "batch_chunks", "steps_per_chunk", "updates", "balance_every"):
        if getattr(work, key) < 1:
            raise ValueError(f"{key} must be >= 1, got {getattr(work, key)}")
    if work.max_staleness < 0 or not 0 <= work.warmup < work.updates:
        raise ValueError("max_staleness must be >= 0 and warmup in 0..updates-1")
    if not 0.0 <= work.straggler_share <= 1.0:
        raise ValueError(f"straggler_share must be in [0, 1], got {work.straggler_share}")
    if work.straggler_factor < 1.0 or work.straggler_alpha < 0:
        raise ValueError("straggler_factor must be >= 1 and straggler_alpha >= 0")
    for key in ("latency_s", "jitter_s"):  # a negative mean delay would deliver before it was sent
        if not getattr(work, key) >= 0:
            raise ValueError(f"{key} must be >= 0 seconds, got {getattr(work, key)}")
    if work.slowdown < 1.0 or work.slow_every < 0 or (work.instances is not None and work.instances < 1):
        raise ValueError("slowdown must be >= 1, slow_every >= 0 and instances >= 1 or None")
    if machine.cores is not None and not machine.cores > 0:
        raise ValueError(f"cores must be positive or None, got {machine.cores}")
    if min(machine.compute_s, machine.update_s_per_chunk, machine.update_s_fixed, machine.overhead_s,
           machine.round_overhead_s, machine.chunk_overhead_s) < 0:
        raise ValueError("machine seconds must be >= 0")


def simulate(work: Workload, machine: Machine, seed: int = 0) -> SimResult:
    """One simulated run; deterministic given `seed`."""
    check(work, machine)
    import simpy  # optional: the [sim] extra

    sim = _Sim(simpy, work, machine, seed)
    return sim.run()


def update_seconds(machine: Machine, chunks: int) -> float:
    """The learner's median seconds for an update on `chunks` chunks, alone on its cores."""
    return machine.update_s_fixed + chunks * machine.update_s_per_chunk


def slowed(work: Workload, slots, index: int) -> bool:
    """Whether a call of `slots` at chunk (round) `index` waits for an injected
    straggler: `trainers.sync.straggle`'s rule, the slot's first chunk exempt."""
    k = work.slow_every
    return bool(k) and work.slowdown > 1.0 and index > 0 and any((s + index) % k == k - 1 for s in slots)


class SharedCores:
    """Processor sharing: `m` jobs at once each get `min(1, cores / m)` of a core."""

    def __init__(self, env, cores: float):
        self.env, self.cores = env, cores
        self.jobs: dict = {}  # event -> core-seconds left
        self.last, self.wake = env.now, env.event()
        env.process(self._loop())

    def _rate(self) -> float:
        return min(1.0, self.cores / len(self.jobs)) if self.jobs else 1.0

    def _advance(self) -> None:
        done, rate = self.env.now - self.last, self._rate()
        for ev in self.jobs:
            self.jobs[ev] -= done * rate
        self.last = self.env.now

    def run(self, work: float):
        """An event that fires when `work` core-seconds have been done."""
        self._advance()
        ev = self.env.event()
        self.jobs[ev] = work
        if not self.wake.triggered:
            self.wake.succeed()
        return ev

    def _loop(self):
        while True:
            if not self.jobs:
                yield self.wake
            else:
                yield self.env.timeout(max(0.0, min(self.jobs.values()) / self._rate())) | self.wake
            self._advance()
            if self.wake.triggered:
                self.wake = self.env.event()
            for ev in [e for e, left in self.jobs.items() if left <= 1e-12]:
                del self.jobs[ev]
                ev.succeed()


class Draws:
    """Per-key streams of `[compute z, up z, down z, straggler u, tail u]` rows, one row per
    chunk index, made in blocks (common random numbers across parameter sets)."""

    def __init__(self, seed: int):
        self.seed, self.rows = seed, {}

    def row(self, key: int, index: int) -> np.ndarray:
        rows = self.rows.setdefault(key, [])
        while len(rows) * _BLOCK <= index:
            rng = np.random.default_rng([self.seed, key, len(rows)])
            block = rng.standard_normal((_BLOCK, 5))
            block[:, 3:] = rng.random((_BLOCK, 2))
            rows.append(block)
        return rows[index // _BLOCK][index % _BLOCK]


UPDATE_KEY = 1 << 30  # the learner's draws: this key, index = update


class _Sim:
    """One run's state; `run()` drives it (sync rounds or the async pipeline)."""

    def __init__(self, simpy, work: Workload, machine: Machine, seed: int):
        self.simpy, self.w, self.m = simpy, work, machine
        self.env = simpy.Environment()
        self.draws = Draws(seed)
        self.cpu = SharedCores(self.env, machine.cores) if machine.cores is not None else None
        top = max(work.max_actors or work.actors, work.actors)
        n_inst = work.instances if work.instances is not None else max(top, work.actors)
        self.instances = [simpy.Resource(self.env, capacity=1) for _ in range(n_inst)]
        self.records: list = []  # per update: (time, chunks taken so far, learned so far, active actors)
        self.busy: list = []  # learner compute intervals
        self.lags: list = []
        self.dropped = 0
        self.chunks: list = []  # every chunk delivered (its compute and round trip)
        self.updates_s: list = []

    # -- the pieces both trainers share ---------------------------------------

    def _cpu(self, work: float):
        return self.cpu.run(work) if self.cpu is not None else self.env.timeout(work)

    def _delays(self, z_up: float, z_down: float, u: float, v: float) -> tuple:
        w = self.w
        up = max(0.0, w.latency_s + w.jitter_s * z_up)
        down = max(0.0, w.latency_s + w.jitter_s * z_down)
        f = 1.0
        if u < w.straggler_share:
            f = w.straggler_factor * ((1.0 - v) ** (-1.0 / w.straggler_alpha) if w.straggler_alpha > 0 else 1.0)
        return up * f, down * f

    def request(self, slot: int, index: int, version: int, shards: int = 1):
        """One shard or chunk (or `shards` as one call), sent to answered (a simpy
        process); returns its `Chunk`."""
        env, m, w = self.env, self.m, self.w
        z_c, z_up, z_down, u, v = self.draws.row(slot, index)
        up, down = self._delays(z_up, z_down, u, v)
        t0 = env.now
        yield env.timeout(m.overhead_s + up)
        with self.instances[slot % len(self.instances)].request() as req:
            yield req
            c0 = env.now
            yield self._cpu((1 + m.batch_scale * (shards - 1)) * m.compute_s * float(np.exp(m.compute_cv * z_c)))
            compute = env.now - c0
            if slowed(w, range(slot, slot + shards), index):
                yield env.timeout((w.slowdown - 1.0) * compute)  # a slower machine: no CPU used here
        yield env.timeout(down)
        trip = env.now - t0
        if w.mode == "async":
            yield env.timeout(m.chunk_overhead_s)
        chunk = Chunk(slot, index, version, env.now - t0, trip, compute)
        self.chunks.append(chunk)
        return chunk

    def learn(self, version: int, chunks: int):
        """The update on `chunks` chunks (a simpy process); records its interval."""
        z = self.draws.row(UPDATE_KEY, version)[0]
        t0 = self.env.now
        yield self._cpu(update_seconds(self.m, chunks) * float(np.exp(self.m.update_cv * z)))
        self.busy.append((t0, self.env.now))
        self.updates_s.append(self.env.now - t0)

    # -- sync -------------------------------------------------------------------

    def _sync(self):
        n, taken = self.w.actors, 0
        for r in range(self.w.updates):
            if self.w.batched:
                yield self.env.process(self.request(0, r, r, n))
            else:
                yield self.env.all_of([self.env.process(self.request(s, r, r)) for s in range(n)])
            yield self.env.timeout(self.m.round_overhead_s)
            yield self.env.process(self.learn(r, n))
            taken += n
            self.lags.extend([0] * n)
            self.records.append((self.env.now, taken, taken, n))

    def run(self) -> SimResult:
        if self.w.mode == "sync":
            self.env.run(self.env.process(self._sync()))
        else:
            _Async(self).start()
            self.env.run(self.done)
        return self.result()

    def result(self) -> SimResult:
        w, rec = self.w, self.records
        (t0, c0, l0, _), (t1, c1, l1, _) = rec[w.warmup - 1] if w.warmup else (0.0, 0, 0, 0), rec[-1]
        span = max(t1 - t0, 1e-12)
        busy = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in self.busy)
        med = lambda xs: float(statistics.median(xs)) if xs else float("nan")  # noqa: E731
        return SimResult((c1 - c0) * w.steps_per_chunk / span, (l1 - l0) * w.steps_per_chunk / span,
                         (len(rec) - w.warmup) / span,
                         float(np.mean(self.lags)) if self.lags else 0.0, int(max(self.lags, default=0)),
                         self.dropped, _share(1.0 - busy / span), float(np.mean([r[3] for r in rec])),
                         med([c.compute_s for c in self.chunks]), med([c.roundtrip_s for c in self.chunks]),
                         med(self.updates_s), rec[-1][0])


def _share(x: float) -> float:
    """`x` clipped to [0, 1], float noise (a busy learner's 1e-16 idle) read as 0."""
    return 0.0 if x < 1e-9 else min(1.0, x)


class _Async:
    """The async trainer's pipeline: gate, actors, the collecting learner, the
    device computing dispatched updates in order, bookkeeping and balance."""

    def __init__(self, sim: _Sim):
        self.s, w = sim, sim.w
        env = sim.env
        self.version, self.next, self.free, self.stopping = 0, 0, [], False
        self.waiters: list = []  # (ticket, event) waiting at the gate
        self.top = max(w.max_actors or w.actors, w.actors)
        self.wanted, self.alive, self.counts = [False] * self.top, set(), [0] * self.top
        self.queue = sim.simpy.Store(env)  # delivered chunks
        self.device = sim.simpy.Store(env)  # dispatched updates
        self.balancer = Balancer(w, w.actors, self.top, clock=lambda: env.now)
        self.taken = self.learned = 0
        sim.done = env.event()

    def start(self) -> None:
        self.set_active(self.s.w.actors)
        self.s.env.process(self._learner())
        self.s.env.process(self._device())

    # the gate (trainers.asynchronous.Gate)
    def claim(self) -> int:
        if self.free:
            return heapq.heappop(self.free)
        self.next += 1
        return self.next - 1

    def allowed(self, ticket: int) -> bool:
        w = self.s.w
        return ticket_allowed(ticket, self.version, w.max_staleness, w.batch_chunks, self.s.dropped)

    def wake(self) -> None:
        keep = []
        for ticket, ev in self.waiters:
            (ev.succeed() if self.stopping or self.allowed(ticket) else keep.append((ticket, ev)))
        self.waiters = keep

    def gate(self, ticket: int):
        if not (self.stopping or self.allowed(ticket)):
            ev = self.s.env.event()
            self.waiters.append((ticket, ev))
            yield ev

    # the actors (trainers.asynchronous.ActorPool)
    def set_active(self, n: int) -> None:
        wanted = [s for s, on in enumerate(self.wanted) if on]
        for s in wanted[n:]:
            self.wanted[s] = False
        for s in range(self.top):
            if len(wanted) >= n:
                break
            if not self.wanted[s] and s not in self.alive:
                self.wanted[s] = True
                wanted.append(s)
                self.alive.add(s)
                self.s.env.process(self._actor(s))

    def _actor(self, slot: int):
        ticket = self.claim()
        while True:
            yield from self.gate(ticket)
            if self.stopping:
                heapq.heappush(self.free, ticket)
                return
            chunk = yield self.s.env.process(self.s.request(slot, self.counts[slot], self.version))
            self.counts[slot] += 1
            go_on = self.wanted[slot] and not self.stopping
            ticket = self.claim() if go_on else None
            self.queue.put(chunk)
            if not go_on:
                self.alive.discard(slot)
                return

    # the learner: collect K fresh chunks, dispatch, go on
    def _learner(self):
        w, version = self.s.w, 0
        while version < w.updates:
            fresh, dropped = [], []
            while len(fresh) < w.batch_chunks:
                chunk = yield self.queue.get()
                if version - chunk.version <= w.max_staleness:
                    fresh.append(chunk)
                else:
                    dropped.append(chunk)
                    self.s.dropped += 1
                    self.wake()
            yield self.device.put((version, fresh, dropped))
            version += 1

    def _device(self):
        w = self.s.w
        while True:
            version, fresh, dropped = yield self.device.get()
            yield self.s.env.process(self.s.learn(version, w.batch_chunks))
            self.version = version + 1  # published
            self.wake()
            self._book(version, fresh, dropped)
            if self.version == w.updates:
                self.stopping = True
                self.wake()
                self.s.done.succeed()
                return

    def _book(self, version: int, fresh: list, dropped: list) -> None:
        s, w = self.s, self.s.w
        s.lags.extend(version - c.version for c in fresh)
        self.taken += len(fresh) + len(dropped)
        self.balancer.observe(fresh + dropped, len(fresh))
        self.balancer.note_update(s.updates_s[-1])
        self.learned += len(fresh)
        s.records.append((s.env.now, self.taken, self.learned, self.balancer.active))
        if w.balance and self.version % w.balance_every == 0:
            self.set_active(self.balancer.step())


# -- calibration --------------------------------------------------------------

MEDIANS = ("chunk_compute_s_median", "chunk_roundtrip_s_median", "update_s_median")
MEDIAN_WEIGHT = 0.5  # a measured median's squared log error counts half a throughput's


class Measured(NamedTuple):
    """What a real run measured (None: not measured)."""

    env_steps_per_s: float
    chunk_compute_s_median: Optional[float] = None
    chunk_roundtrip_s_median: Optional[float] = None
    update_s_median: Optional[float] = None


class Point(NamedTuple):
    name: str
    work: Workload
    measured: Measured


class Fit(NamedTuple):
    machine: Machine
    loss: float  # mean over points of `point_loss`
    evaluations: int


def predict(work: Workload, machine: Machine, seeds=(0,)) -> SimResult:
    """`simulate` averaged over `seeds` (every field a mean)."""
    runs = [simulate(work, machine, s) for s in seeds]
    return SimResult(*(type(v)(np.mean([getattr(r, k) for r in runs])) if not isinstance(v, int)
                       else int(max(getattr(r, k) for r in runs))
                       for k, v in zip(SimResult._fields, runs[0])))


def point_loss(pred: SimResult, meas: Measured) -> float:
    """Squared log error of throughput, plus `MEDIAN_WEIGHT` times each measured median's."""
    loss = float(np.log(pred.env_steps_per_s / meas.env_steps_per_s)) ** 2
    for key in MEDIANS:
        want, got = getattr(meas, key), getattr(pred, key)
        if want and got and np.isfinite(got):
            loss += MEDIAN_WEIGHT * float(np.log(got / want)) ** 2
    return loss


def calibrate(points: list, base: Machine, fit: tuple, seeds=(0,), max_evals: int = 200, machine_for=None) -> Fit:
    """The `Machine` whose fields `fit` (positive) minimise the mean `point_loss` over
    `points`, from `base`: Nelder-Mead on their logs (the simulator is piecewise
    constant in places, so no gradients), each evaluation simulating every point
    with the same seeds (common random numbers make the loss deterministic).
    `machine_for(point, machine)`: the machine a point runs on (default: `machine`),
    for runs whose own measured component times stand in for fitted ones."""
    from scipy.optimize import minimize  # scipy comes with jax; loaded only here

    x0 = np.log([float(getattr(base, k)) for k in fit])

    def machine_at(x) -> Machine:
        return base._replace(**{k: float(v) for k, v in zip(fit, np.exp(x))})

    def loss(x) -> float:
        m = machine_at(x)
        each = machine_for or (lambda _, mach: mach)
        return float(np.mean([point_loss(predict(p.work, each(p, m), seeds), p.measured) for p in points]))

    simplex = np.vstack([x0] + [x0 + 0.5 * e for e in np.eye(len(fit))])  # +65% steps: a wide first look
    res = minimize(loss, x0, method="Nelder-Mead",
                   options={"maxfev": max_evals, "xatol": 1e-3, "fatol": 1e-7, "initial_simplex": simplex})
    return Fit(machine_at(res.x), float(res.fun), int(res.nfev))


def relative_error(pred: float, meas: float) -> float:
    """`(pred - meas) / meas`."""
    return (pred - meas) / meas

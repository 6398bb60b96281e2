"""The cost model: a round's modeled cloud seconds and dollars.

A round on the modeled clock is

    invoke_s + start_s + actor_s + transfer_s + learn_s

(one request latency, the slowest start-up among the round's instances, cold
or warm, the slowest shard, the bytes moved at `transfer_bytes_per_s`, the
learner's update). Dollars, for `kind: serverless`: per shard, its billed
seconds (its compute, plus its start-up where `start_billed`, rounded up to
`billing_granularity_s`, at least `min_billed_s`) times its vCPU and memory
price, plus `request_usd`. For `kind: cluster`: every node for the whole round,
idle or not, and once per run the cluster's start-up (`setup_cost`). Both
kinds add the learner's machine for the round's modeled seconds.

A slot's instance is cold the first time it runs and whenever it has been idle
`keep_warm_s` or longer on the modeled clock (`SlotClock`).

`round_cost`, `cold_slots` and `advance` are written with array ops only
(`numpy`, or `jax.numpy` when any argument is a JAX array), so jitted code can
call them with a traced shard count `n`. `CostAccount` is the round
trainer's host-side running total.
"""
from __future__ import annotations

import sys
from collections import deque
from typing import Any, NamedTuple

import numpy as np

TIME_KEYS = ("invoke_s", "start_s", "actor_s", "transfer_s", "learn_s", "setup_s")
USD_KEYS = ("shard_usd", "learner_usd")
RECENT_ROUNDS = 3  # rounds the next round's cost is estimated from (for the budget stop)


class RoundCost(NamedTuple):
    """Modeled seconds and dollars of a round; `components` holds `TIME_KEYS` (seconds)
    and `USD_KEYS` (dollars: actors, whether functions or cluster nodes; learner)."""

    modeled_s: Any
    usd: Any
    components: dict


class SlotClock(NamedTuple):
    """Where the modeled clock is, and when each slot's instance last finished a shard."""

    now: Any  # modeled seconds since the run started: the next round starts here
    last_end: Any  # [M] modeled time each slot last finished; -inf: never ran


def _xp(*args):
    """`jax.numpy` if any argument is a JAX array (tracers included), else numpy."""
    if "jax" in sys.modules:
        import jax

        if any(isinstance(a, jax.Array) for a in args):
            import jax.numpy as jnp

            return jnp
    return np


class Left(NamedTuple):
    """What a run has left of its limits, as a scheduler sees it (`left_fraction`)."""

    budget: float = 1.0  # of run.budget_usd
    time: float = 1.0  # of run.deadline_s
    usd: float = float("inf")  # dollars left of run.budget_usd (inf: none)
    seconds: float = float("inf")  # modeled seconds left of run.deadline_s (inf: none)


def left_fraction(spent, limit, xp=np):
    """The share of `limit` not yet spent, in [0, 1]; 1.0 without a limit (None or inf).

    The one definition of the schedulers' `budget_left` (dollars so far against
    `run.budget_usd`) and `time_left` (modeled seconds so far against
    `run.deadline_s`), in the scheduling MDP and in a live run."""
    if limit is None:
        return 1.0
    return xp.clip(1.0 - spent / limit, 0.0, 1.0)


def run_left(run_cfg, modeled_s: float, usd: float) -> Left:
    """A live run's `Left` from its modeled seconds and dollars so far."""
    budget, deadline = run_cfg.budget_usd, run_cfg.deadline_s
    return Left(float(left_fraction(usd, budget)), float(left_fraction(modeled_s, deadline)),
                float("inf") if budget is None else max(budget - usd, 0.0),
                float("inf") if deadline is None else max(deadline - modeled_s, 0.0))


def billed_seconds(cfg, seconds, xp=np):
    """What a platform bills for `seconds` of use: rounded up to a multiple of
    `billing_granularity_s`, at least `min_billed_s`."""
    g = cfg.billing_granularity_s
    if g > 0:
        # round first: 0.3 / 0.1 is 2.9999999999999996 and must not bill a fourth unit
        seconds = xp.ceil(xp.round(seconds / g, 6)) * g
    return xp.maximum(seconds, cfg.min_billed_s)


def _actor_usd(cfg, shard_s, start_each, real, modeled_s, xp):
    """Dollars for the actors: per billed shard (serverless) or every node for the round (cluster)."""
    if cfg.kind == "cluster":
        return modeled_s * cfg.cluster_nodes * cfg.cluster_node_hour_usd / 3600.0
    used = shard_s + start_each if cfg.start_billed else shard_s
    rate = cfg.vcpus_per_shard * cfg.vcpu_second_usd + cfg.gb_per_shard * cfg.gb_second_usd
    per_shard = billed_seconds(cfg, used, xp) * rate + cfg.request_usd
    return xp.sum(xp.where(real, per_shard, 0.0))


def round_cost(cfg, n, shard_s, bytes_moved, learn_s, cold) -> RoundCost:
    """One round of `n` shards under `cfg` (a `CostConfig`).

    shard_s: `[K]` compute seconds of slots `0..K-1`; only the first `n` count
    (so `K` may be a padded, static size and `n` traced). bytes_moved: bytes
    sent and received in the round. learn_s: the learner update's seconds.
    cold: `[K]` (or a scalar for all) whether each slot's instance starts cold.
    """
    xp = _xp(n, shard_s, bytes_moved, learn_s, cold)
    shard_s = xp.asarray(shard_s) * 1.0
    K = shard_s.shape[0]
    real = xp.arange(K) < n
    start_each = xp.where(xp.broadcast_to(xp.asarray(cold), (K,)), cfg.cold_start_s, cfg.warm_start_s)
    parts = {"invoke_s": xp.where(n > 0, cfg.invoke_s, 0.0),
             "start_s": xp.max(xp.where(real, start_each, 0.0)),
             "actor_s": xp.max(xp.where(real, shard_s, 0.0)),
             "transfer_s": bytes_moved / cfg.transfer_bytes_per_s,
             "learn_s": learn_s * 1.0, "setup_s": xp.zeros(())}
    modeled = parts["invoke_s"] + parts["start_s"] + parts["actor_s"] + parts["transfer_s"] + parts["learn_s"]
    parts["shard_usd"] = _actor_usd(cfg, shard_s, start_each, real, modeled, xp)
    parts["learner_usd"] = modeled * cfg.learner_hour_usd / 3600.0
    return RoundCost(modeled, parts["shard_usd"] + parts["learner_usd"], parts)


def setup_cost(cfg) -> RoundCost:
    """Billed once at the start of a run: a cluster's start-up, nodes and learner
    paid while it boots. Zero for serverless platforms."""
    s = float(cfg.cluster_start_s) if cfg.kind == "cluster" else 0.0
    parts = {k: 0.0 for k in TIME_KEYS}
    parts["setup_s"] = s
    parts["shard_usd"] = s * cfg.cluster_nodes * cfg.cluster_node_hour_usd / 3600.0
    parts["learner_usd"] = s * cfg.learner_hour_usd / 3600.0
    return RoundCost(s, parts["shard_usd"] + parts["learner_usd"], parts)


def combine(a: RoundCost, b: RoundCost) -> RoundCost:
    """Two costs billed as one round (a run's set-up with its first round)."""
    parts = {k: a.components[k] + b.components[k] for k in TIME_KEYS + USD_KEYS}
    return RoundCost(a.modeled_s + b.modeled_s, a.usd + b.usd, parts)


def new_clock(max_shards: int, now: float = 0.0, xp=np) -> SlotClock:
    """A clock at `now` whose slots have never run (all start cold); `xp=jax.numpy`
    gives float32 leaves, so a jitted loop carrying it keeps one signature."""
    dtype = np.float64 if xp is np else xp.float32
    return SlotClock(xp.asarray(now, dtype), xp.full((max_shards,), -np.inf, dtype))


def cold_slots(cfg, clock: SlotClock):
    """`[M]` whether each slot's instance would start cold in a round starting now."""
    return (clock.now - clock.last_end) >= cfg.keep_warm_s


def advance(clock: SlotClock, n, rc: RoundCost) -> SlotClock:
    """The clock after a round of `n` shards costing `rc`: slots `0..n-1` finished
    when the round's actor phase ended; the next round starts when this one ends."""
    xp = _xp(n, clock.last_end, rc.modeled_s)
    c = rc.components
    end = clock.now + c["setup_s"] + c["invoke_s"] + c["start_s"] + c["actor_s"]
    ran = xp.arange(clock.last_end.shape[0]) < n
    return SlotClock(clock.now + rc.modeled_s, xp.where(ran, end, clock.last_end))


class Estimate(NamedTuple):
    shard_s: float  # slowest shard
    bytes_per_shard: float
    learn_s: float


class CostAccount:
    """The round trainer's running cost: the modeled clock, the slots' warmth and the
    dollars so far. A resumed run continues the totals; its instances start cold."""

    def __init__(self, cfg, max_shards: int, modeled_s: float = 0.0, usd: float = 0.0):
        self.cfg, self.usd = cfg, float(usd)
        self.clock = new_clock(max_shards, float(modeled_s))
        self._setup = setup_cost(cfg)  # billed with this process's first round
        self._recent = deque(maxlen=RECENT_ROUNDS)

    def _cost(self, n: int, shard_s, bytes_moved: float, learn_s: float):
        cold = cold_slots(self.cfg, self.clock)[:n]
        rc = round_cost(self.cfg, n, np.asarray(shard_s, np.float64), float(bytes_moved), float(learn_s), cold)
        if self._setup is not None:
            rc = combine(self._setup, rc)
        return rc, int(cold.sum())

    def charge(self, n: int, shard_s, bytes_moved: float, learn_s: float):
        """Bill a finished round; returns `(RoundCost of python floats, cold shard count)`."""
        rc, cold = self._cost(n, shard_s, bytes_moved, learn_s)
        self._setup = None
        self.clock = advance(self.clock, n, rc)
        self.usd += float(rc.usd)
        self._recent.append(Estimate(float(np.max(shard_s)), bytes_moved / n, float(learn_s)))
        parts = {k: float(v) for k, v in rc.components.items()}
        return RoundCost(float(rc.modeled_s), float(rc.usd), parts), cold

    def modeled_now(self) -> float:
        return float(self.clock.now)

    def estimate(self, n: int) -> tuple:
        """`(modeled seconds, dollars)` a round of `n` shards starting now should take:
        every shard as slow as the slowest of the last few rounds, their largest learner
        time and bytes per shard (before any round: no compute, only start-up, minimum
        billing and fees)."""
        seen = list(self._recent) or [Estimate(0.0, 0.0, 0.0)]
        shard_s = max(e.shard_s for e in seen)
        moved = max(e.bytes_per_shard for e in seen) * n
        rc, _ = self._cost(n, np.full((n,), shard_s), moved, max(e.learn_s for e in seen))
        return float(rc.modeled_s), float(rc.usd)


class AsyncAccount:
    """The async trainer's running cost, on a modeled clock that replays its pipeline.

    A chunk (one shard's rollout) starts when its actor is free and the params
    version it used had been published, and arrives `invoke + start (cold or
    warm) + compute + transfer` later; an update starts when the learner is
    free and its last chunk has arrived, and publishes the next version when
    it ends. Dollars: serverless bills every chunk, dropped ones too, as a
    shard; a cluster bills its nodes for the modeled time; the learner's
    machine is billed for the modeled time. A cluster's start-up is billed
    with this process's first update, as in `CostAccount`.

    `prewarm`: slots whose serverless instances are started at the run's start
    by an empty invocation (billed with the first update), warm by the time
    their actor runs: the ones the balancer may start mid-run. Without it a
    started actor's cold start would hold up the update that learns from its
    first chunk; the async trainer cannot see that (its actors start at no
    cost), so the replay would charge a wait that a serverless deployment of
    it avoids by warming the instances it may use.
    """

    def __init__(self, cfg, max_shards: int, version: int, modeled_s: float = 0.0, usd: float = 0.0,
                 prewarm=()):
        self.cfg, self.usd, self.now = cfg, float(usd), float(modeled_s)
        self._setup = setup_cost(cfg)
        start = self.now + self._setup.modeled_s
        self.actor_free = np.full((max_shards,), start)
        self.last_end = np.full((max_shards,), -np.inf)
        self.first_version, self.published = version, [start]  # when each version was published
        self.learner_free = start
        self.chunk_usd = 0.0  # chunks billed since the last update
        self.cold = 0  # of those, the ones whose instance started cold ...
        self.cold_billed = 0  # ... and that count at the last update (its record's `cold_shards`)
        for slot in prewarm if cfg.kind == "serverless" else ():
            self.chunk(slot, version, 0.0, 0.0)

    def modeled_now(self) -> float:
        return self.now

    def chunk(self, slot: int, version: int, shard_s: float, bytes_moved: float) -> float:
        """Bill one chunk of `slot` made with params `version`; returns its modeled arrival."""
        start = max(self.actor_free[slot], self.published[version - self.first_version])
        cold = np.array([start - self.last_end[slot] >= self.cfg.keep_warm_s])
        rc = round_cost(self.cfg, 1, np.array([shard_s]), float(bytes_moved), 0.0, cold)
        c = rc.components
        done = start + c["invoke_s"] + c["start_s"] + c["actor_s"]
        self.last_end[slot] = done
        self.cold += int(cold[0])
        self.actor_free[slot] = done + c["transfer_s"]
        if self.cfg.kind == "serverless":
            self.chunk_usd += float(c["shard_usd"])
        return float(self.actor_free[slot])

    def update(self, arrivals: list, learn_s: float, next_version: int) -> RoundCost:
        """Bill an update that learned from chunks arriving at `arrivals` (modeled)."""
        start = max([self.learner_free] + list(arrivals))
        end = start + learn_s
        self.learner_free = end
        self.published.append(end)  # kept whole: a dropped straggler may be any age
        assert len(self.published) == next_version - self.first_version + 1
        setup_s = self._setup.modeled_s if self._setup is not None else 0.0
        parts = {k: 0.0 for k in TIME_KEYS}
        # the learner's wait for data since its last update (a cluster's start-up apart)
        parts.update({"learn_s": float(learn_s), "wait_s": float(start - self.now - setup_s)})
        dt, self.now = end - self.now, end
        cfg = self.cfg
        nodes = dt * cfg.cluster_nodes * cfg.cluster_node_hour_usd / 3600.0 if cfg.kind == "cluster" else 0.0
        parts["shard_usd"] = self.chunk_usd + nodes
        parts["learner_usd"] = dt * cfg.learner_hour_usd / 3600.0
        if self._setup is not None:  # its time is in dt already; its nodes were billed above
            parts["setup_s"] = self._setup.modeled_s
            self._setup = None
        self.chunk_usd, self.cold_billed, self.cold = 0.0, self.cold, 0
        usd = parts["shard_usd"] + parts["learner_usd"]
        self.usd += usd
        return RoundCost(dt, usd, parts)

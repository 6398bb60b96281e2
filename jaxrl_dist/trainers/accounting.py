"""What the round-based trainers count beside the learning: busy and billed seconds,
injected stragglers, the bytes a round is charged for, its modeled cost, and the two
clocks (modeled and measured) with the dollars that a checkpoint carries on.

Shared by the sync and the async trainer (`trainers.rounds` holds their skeleton);
everything here is host-side bookkeeping over a round's `backends.ShardInfo`s.
"""
from __future__ import annotations

import time
from typing import NamedTuple, Optional

import jax
import numpy as np

from jaxrl_dist.backends import RoundStats
from jaxrl_dist.scheduling.cost import TIME_KEYS, USD_KEYS
from jaxrl_dist.scheduling.records import STARTUP_PREFIX, Cost
from jaxrl_dist.scheduling.target import reached

# the clocks and dollars a checkpoint holds, so that a resumed run's cost continues from
# the checkpoint, not from whatever the metrics file last says
CLOCK_FIELDS = ("cum_modeled_s", "cum_usd", "cum_wall_s")


def fresh_clock() -> np.ndarray:
    return np.zeros((len(CLOCK_FIELDS),), np.float64)


def busy_seconds(shards) -> float:
    """The busiest worker's compute time in a round: per worker, the length of
    the union of its shards' [started, finished] intervals (shards a worker ran
    together count once), then the max over workers."""
    by_worker: dict = {}
    for s in shards:
        by_worker.setdefault(s.worker, []).append((s.timings.started, s.timings.finished))
    best = 0.0
    for spans in by_worker.values():
        total, end = 0.0, float("-inf")
        for a, b in sorted(spans):
            total += max(0.0, b - max(a, end))
            end = max(end, b)
        best = max(best, total)
    return best


def shard_seconds(shards, less: float = 0.0, billed: bool = False) -> list:
    """Each shard's compute seconds for the cost model (`billed`: the seconds its worker
    billed). Shards a worker ran as one batch (the local backend's single jitted call:
    same worker, start and end) share the batch's time, as if each had run alone on its
    own instance. `less`: seconds taken off each batch first (this process's compile)."""
    span = lambda s: (s.worker, s.timings.started, s.timings.finished)  # noqa: E731
    count: dict = {}
    for s in shards:
        count[span(s)] = count.get(span(s), 0) + 1
    took = (lambda s: s.timings.billed) if billed else (lambda s: s.timings.finished - s.timings.started)
    return [max(0.0, took(s) - less) / count[span(s)] for s in shards]


def straggle(shards, b, seen, index: int) -> np.ndarray:
    """Injected stragglers (`backend.slowdown`, benchmarks): one shard in every
    `backend.slow_every` takes `slowdown` times as long, the one of slot `s` and
    index `index` (the round, or the async actor's chunk) with
    `(s + index) % slow_every == slow_every - 1`: a round of `slow_every` shards
    has one, on a slot that moves round by round, and any number of async
    actors meets them at the same rate, so none can keep clear of them by its
    choice of slots. Waits until the slowest such shard would have finished;
    returns each shard's factor, which stretches its billed compute too. A slot's
    first shard in this process (`seen`: the slots that ran before) is not slowed:
    its time is mostly the rollout's compile, which would make the straggler a
    start-up effect."""
    k = b.slow_every
    factors = np.array([b.slowdown if (s.slot + index) % k == k - 1 and s.slot in seen else 1.0
                        for s in shards])
    ends = [s.timings.finished + (f - 1.0) * (s.timings.finished - s.timings.started)
            for s, f in zip(shards, factors) if f > 1.0]
    if ends:
        time.sleep(max(0.0, max(ends) - time.time()))
    return factors


class Laps:
    """A stopwatch over contiguous phases: `lap(name)` charges the time since the
    previous lap to `name`, so the phases of a stretch add up to its wall."""

    def __init__(self):
        self.t = self.t0 = time.perf_counter()
        self.phases: dict = {}

    def lap(self, name: str) -> float:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.t
        self.t = now
        return now

    def split(self, parts: dict, rest: str) -> None:
        """Close the lap as `parts` (seconds by phase) measured inside it, the time they
        miss (the caller's own bookkeeping, a pause of the process) charged to `rest`,
        so that the phases still add up to the wall."""
        now = time.perf_counter()
        parts = {**parts, rest: parts.get(rest, 0.0) + max(0.0, now - self.t - sum(parts.values()))}
        for k, v in parts.items():
            self.phases[k] = self.phases.get(k, 0.0) + v
        self.t = now

    def take(self) -> tuple:
        """`(phases, wall)` since the last `take` (or the start); starts the next stretch."""
        phases, wall = self.phases, self.t - self.t0
        self.phases, self.t0 = {}, self.t
        return phases, wall


def backend_phases(result, slowed_s: float = 0.0) -> dict:
    """A round's backend part (`RoundResult.stats` and its shards' own timings) as
    phases: `rollout` is the slowest shard's compute as its worker timed it (plus
    `slowed_s`, an injected straggler's extra wait), `wait` the rest of the wait for
    the answers (queueing, the network, the workers' decoding and encoding)."""
    st = result.stats
    slowest = max((s.timings.finished - s.timings.started for s in result.shards), default=0.0)
    rollout = min(float(st.wait_s), slowest)
    return {"dispatch": float(st.dispatch_s), "rollout": rollout + slowed_s, "wait": float(st.wait_s) - rollout,
            "decode": float(st.transfer_s), "stack": float(st.stack_s)}


class PhaseFigures(NamedTuple):
    """Where a shard trainer's time went, for its summary: the start-up, each phase's
    seconds over the run (`startup_<name>`, `ROUND_PHASES`, `finish`), and the rounds'
    walls up to the first that reached `run.target_return` (start-up apart; None when
    no round of this process did)."""

    startup_seconds: float
    phase_seconds: dict
    train_to_target_s: Optional[float]


def phase_figures(startup: dict, records: list, tail: dict, target_return: Optional[float]) -> PhaseFigures:
    """`PhaseFigures` of this process's round records (`Record.phases`) and the trainer's
    `startup` and `tail` phases."""
    totals = {f"{STARTUP_PREFIX}{k}": v for k, v in startup.items()}
    for phases in [rec.phases for rec in records] + [tail]:
        for k, v in phases.items():
            totals[k] = totals.get(k, 0.0) + v
    hit = next((i for i, rec in enumerate(records) if reached(rec, target_return)), None)
    to_target = None if hit is None else sum(rec.round_s for rec in records[:hit + 1])
    return PhaseFigures(sum(startup.values()), totals, to_target)


def tree_bytes(tree) -> int:
    """The bytes of a pytree's arrays (params, or a shard's trajectory and bootstrap)."""
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def charged_bytes(stats: RoundStats, n: int, param_bytes: int, payload_bytes: int) -> int:
    """Bytes `n` shards moved. A backend that moves none (local) is charged what a
    remote one would move uncompressed: the params to each shard, and each
    shard's payload (trajectory and bootstrap values) back."""
    return int(stats.bytes_sent) + int(stats.bytes_received) or n * (param_bytes + payload_bytes)


def moved_bytes(result, n: int, param_bytes: int) -> int:
    """`charged_bytes` of a round (its `[T, K, B]` outputs hold `K` shards' payloads)."""
    back = tree_bytes((result.traj, result.bootstrap))
    return charged_bytes(result.stats, n, param_bytes, back // result.bootstrap.shape[0])


class Clocks:
    """The measured clock of a run (continuing a checkpoint's `wall` seconds) and what
    a record's `Cost` and a checkpoint's clock are made from. `account`: the trainer's
    cost account (`CostAccount` or `AsyncAccount`, started at the checkpoint's modeled
    seconds and dollars), read through `modeled_now()` and `usd`."""

    def __init__(self, account, wall: float, t_start: Optional[float]):
        self.account = account
        # the wall origin in `time.perf_counter()` time (`t_start`, else now)
        self.wall0 = (time.perf_counter() if t_start is None else t_start) - wall

    def wall(self) -> float:
        return time.perf_counter() - self.wall0

    def now(self) -> np.ndarray:
        """`CLOCK_FIELDS` now, for a checkpoint."""
        return np.array([self.account.modeled_now(), self.account.usd, self.wall()], np.float64)

    def cost(self, rc, cold: int = 0, **extra) -> Cost:
        """A round's (or async update's) modeled cost `rc` and the running totals of both
        clocks; `extra`: more modeled components under their JSON names."""
        parts = {f"modeled_{k}": rc.components[k] for k in TIME_KEYS}
        parts.update({k: rc.components[k] for k in USD_KEYS}, **extra)
        return Cost(modeled_s=float(rc.modeled_s), usd=float(rc.usd), cum_modeled_s=self.account.modeled_now(),
                    cum_usd=self.account.usd, cum_wall_s=self.wall(), cold_shards=cold, components=parts)


class CostFigures(NamedTuple):
    """Both clocks and the dollars of a run, for its summary: totals, each modeled
    component summed, and where the first round reaching `run.target_return` put
    each clock (None when no round did)."""

    stop_reason: Optional[str]
    cost_preset: str
    cost_usd: float
    modeled_seconds: float
    target_return: Optional[float]
    time_to_target_s: Optional[float]
    wall_to_target_s: Optional[float]
    cost_to_target_usd: Optional[float]
    components: dict  # `modeled_<TIME_KEYS>` seconds and `USD_KEYS` dollars, summed

    def to_json(self) -> dict:
        out = self._asdict()
        return {**{k: v for k, v in out.items() if k != "components"}, **self.components}


def cost_figures(records: list, stop_reason: Optional[str], cost_preset: str,
                 target_return: Optional[float]) -> CostFigures:
    """`CostFigures` of a run's round records (`cost_preset`: `cost.name`; `target_return`:
    `run.target_return`)."""
    costs = [rec.cost for rec in records if rec.cost is not None]
    last = costs[-1] if costs else None
    hit = next((rec.cost for rec in records if reached(rec, target_return)), None)
    at = lambda attr: None if hit is None else getattr(hit, attr)  # noqa: E731
    keys = [f"modeled_{k}" for k in TIME_KEYS] + list(USD_KEYS)
    keys += sorted({k for c in costs for k in c.components} - set(keys))  # the async learner's wait, so they add up
    return CostFigures(
        stop_reason=stop_reason, cost_preset=cost_preset, cost_usd=last.cum_usd if last else 0.0,
        modeled_seconds=last.cum_modeled_s if last else 0.0, target_return=target_return,
        time_to_target_s=at("cum_modeled_s"), wall_to_target_s=at("cum_wall_s"),
        cost_to_target_usd=at("cum_usd"),
        components={k: sum(c.components.get(k, 0.0) for c in costs) for k in keys})

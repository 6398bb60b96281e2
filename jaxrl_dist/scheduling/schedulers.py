"""Schedulers pick how many actor shards each round runs.

`make_scheduler(cfg.scheduler, cfg.backend, cfg)` returns a `Scheduler`:

- `num_shards(round_, history) -> n`: `round_` is the 0-based round index (it
  continues across a resume), `history` the per-round records so far
  (`scheduling.records.Record`: `ret`, `losses`, `num_shards`, `round_s` ...);
- `expected_shards()`: the mean `n` the run is expected to use, which sizes the
  learning-rate schedule (rounds = total steps / (mean n * steps per shard));
- `most_shards()`: the most shards a round may ask for (the backend's checks);
- `sees_limits` (False on the base): when True the round trainer calls
  `num_shards(round_, history, left)` with `left` a `cost.Left` (the share of
  `run.budget_usd` and of `run.deadline_s` not yet spent; 1.0 without the key).

Built in: `fixed`, `max`, `adapt` (reward ratio) and `ramp`. Another scheduler
subclasses `Scheduler`, implements `propose(round_, history) -> float` (the base
rounds it and clips it to `[min_shards, max_shards]`) and is registered in
`BUILTIN` or under the entry-point group `jaxrl_dist.schedulers`.

A learned scheduler's view of a run is `learned.features` (`learned.FEATURES`).
"""
from __future__ import annotations

import math
from typing import Callable, Protocol, runtime_checkable

import numpy as np

from jaxrl_dist.config import ENTRY_POINTS, ConfigError, as_schema, require
from jaxrl_dist.registry import Registry, made, options as plugin_options

GROUP = ENTRY_POINTS["scheduler"]
BUILTIN = {"fixed": "jaxrl_dist.scheduling.schedulers:FixedScheduler",
           "max": "jaxrl_dist.scheduling.schedulers:MaxScheduler",
           "adapt": "jaxrl_dist.scheduling.schedulers:AdaptScheduler",
           "ramp": "jaxrl_dist.scheduling.schedulers:RampScheduler",
           "learned": "jaxrl_dist.scheduling.learned:LearnedScheduler"}


def shard_range(cfg, backend_cfg) -> tuple:
    """`(min_shards, max_shards)` with `scheduler.max_shards` null meaning
    `backend.max_shards`; a bound the backend has no slots for is an error."""
    hi = backend_cfg.max_shards if cfg.max_shards is None else cfg.max_shards
    if hi > backend_cfg.max_shards:
        raise ConfigError(f"scheduler.max_shards={hi} exceeds backend.max_shards={backend_cfg.max_shards}")
    if cfg.min_shards > hi:
        raise ConfigError(f"scheduler.min_shards={cfg.min_shards} exceeds the shard bound {hi} "
                          f"(scheduler.max_shards, or backend.max_shards when it is null)")
    return cfg.min_shards, hi


def run_mean(plan: Callable, clip: Callable, total_steps: int, steps_per_shard: int) -> float:
    """Mean shards per round of `plan(round_, progress) -> n` run the way the round
    trainer runs it: rounds until `total_steps` env steps, `progress` being the
    fraction of them done before the round."""
    steps = shards = rounds = 0
    while steps < total_steps:
        n = clip(plan(rounds, steps / total_steps))
        shards, steps, rounds = shards + n, steps + n * steps_per_shard, rounds + 1
    return shards / max(rounds, 1)


@runtime_checkable
class RoundScheduler(Protocol):
    """What the round trainer asks of a scheduler (the module doc); `Scheduler` has it all."""

    sees_limits: bool

    def num_shards(self, round_: int, history: list) -> int: ...

    def expected_shards(self) -> float: ...

    def most_shards(self) -> int: ...


class Scheduler:
    """Base: resolves the shard bounds, rounds and clips `propose`, and averages
    `plan` over the run for `expected_shards`."""

    name = "base"
    sees_limits = False  # True: `num_shards` also takes what is left of the run's limits (`cost.Left`)

    def __init__(self, cfg, backend_cfg, full=None):
        self.cfg, self.full = cfg, full  # `full`: the whole `Config`, when the caller has it
        self.min_shards, self.max_shards = shard_range(cfg, backend_cfg)
        self.steps_per_shard = backend_cfg.envs_per_shard * (full.algo.num_steps if full else 0)

    def num_shards(self, round_: int, history: list) -> int:
        return self.clip(self.propose(round_, history))

    def clip(self, n: float) -> int:
        """Round half up (not Python's half-to-even) and clip to the bounds."""
        require(isinstance(n, (int, float, np.number)) and not isinstance(n, bool) and math.isfinite(n),
                f"scheduler.name={self.cfg.name}: propose returned {n!r}; it gives a number of shards")
        return int(min(max(math.floor(n + 0.5), self.min_shards), self.max_shards))

    def propose(self, round_: int, history: list) -> float:
        raise ConfigError(f"scheduler.name={self.cfg.name}: {type(self).__name__} does not define propose(round_, "
                          "history), which Scheduler's num_shards and expected_shards call (define it, or both)")

    def plan(self, round_: int, progress: float) -> float:
        """The `n` expected at `round_` with a fraction `progress` of the env steps
        done, without a history; what `expected_shards` averages."""
        return self.propose(round_, [])

    def most_shards(self) -> int:
        """The most shards a round of this scheduler may ask for."""
        return self.max_shards

    def expected_shards(self) -> float:
        """Mean shards per round over the run; without the full config (total
        steps unknown), the middle of the bounds."""
        if self.full is None:
            return (self.min_shards + self.max_shards) / 2
        return run_mean(self.plan, self.clip, self.full.algo.total_timesteps, self.steps_per_shard)


class FixedScheduler(Scheduler):
    """The same `scheduler.num_shards` every round (bounds: 1..backend.max_shards;
    `min_shards`/`max_shards` do not apply)."""

    name = "fixed"

    def __init__(self, cfg, backend_cfg, full=None):
        super().__init__(cfg, backend_cfg, full)
        self.min_shards, self.max_shards = 1, backend_cfg.max_shards
        self.n = cfg.num_shards

    def propose(self, round_: int, history: list) -> float:
        return self.n

    def most_shards(self) -> int:
        return self.clip(self.n)

    def expected_shards(self) -> float:
        return float(self.clip(self.n))


class MaxScheduler(Scheduler):
    """Always `scheduler.max_shards` (null: `backend.max_shards`): the baseline."""

    name = "max"

    def propose(self, round_: int, history: list) -> float:
        return self.max_shards

    def expected_shards(self) -> float:
        return float(self.max_shards)


class RampScheduler(Scheduler):
    """`min_shards`, plus `step` shards every `every` rounds, up to `max_shards`."""

    name = "ramp"

    def propose(self, round_: int, history: list) -> float:
        return self.min_shards + self.cfg.step * (round_ // self.cfg.every)

    def plan(self, round_: int, progress: float) -> float:
        return self.propose(round_, [])


def finite_returns(history: list) -> list:
    """The rounds' `return` values that exist (a round may finish no episode)."""
    out = []
    for rec in history:
        x = rec.ret
        if x is not None and math.isfinite(x):
            out.append(float(x))
    return out


def return_bounds(returns: list, min_return, max_return) -> tuple:
    """`(lo, hi)`: the configured return range, a null end replaced by the running
    min or max of `returns` (non-empty)."""
    lo = min(returns) if min_return is None else float(min_return)
    hi = max(returns) if max_return is None else float(max_return)
    return lo, hi


def return_ratio(x: float, lo: float, hi: float, hi_fixed: bool) -> float:
    """`x` normalised to [0, 1] between `lo` and `hi`. An empty range means all
    returns so far are equal (0), or, with a fixed `hi`, all are at or above it (1)."""
    if hi <= lo:
        return 1.0 if hi_fixed and x >= hi else 0.0
    return float(np.clip((x - lo) / (hi - lo), 0.0, 1.0))


class AdaptScheduler(Scheduler):
    """Reward ratio: n grows with the return, from `min_shards` at
    `scheduler.min_return` to `max_shards` at `scheduler.max_return`.

    More actors as the return improves, as in the published reward-ratio
    scheduler: early on the policy changes a lot between rounds and a small,
    cheap batch is enough; near the target a bigger batch steadies the
    gradient. The ratio is the mean of the per-round ratios of the last
    `scheduler.window` rounds that finished an episode (each clipped to
    [0, 1]), so one lucky round does not jump n; no return yet gives
    `min_shards`. A null `min_return`/`max_return` uses the running min/max
    of the returns seen.
    """

    name = "adapt"

    def ratio(self, history: list) -> float:
        returns = finite_returns(history)
        if not returns:
            return 0.0
        lo, hi = return_bounds(returns, self.cfg.min_return, self.cfg.max_return)
        hi_fixed = self.cfg.max_return is not None
        return float(np.mean([return_ratio(x, lo, hi, hi_fixed) for x in returns[-self.cfg.window:]]))

    def propose(self, round_: int, history: list) -> float:
        return self.plan(round_, self.ratio(history))

    def plan(self, round_: int, progress: float) -> float:
        """`progress` stands in for the ratio: `expected_shards` assumes the
        return climbs linearly in env steps from min to max over the run."""
        return self.min_shards + progress * (self.max_shards - self.min_shards)


SCHEDULERS = Registry("scheduler", "scheduler.name", GROUP, BUILTIN)


def available() -> list:
    """Scheduler names: the built-ins, then plugins' entry points."""
    return SCHEDULERS.names()


def make_scheduler(cfg, backend_cfg, full=None) -> Scheduler:
    """The scheduler `cfg.name` names. `full`, the whole `Config`, lets
    `expected_shards` follow the run's length; a plugin that declares `Options` gets
    them (`scheduler.options`) as the keyword `options`; `ConfigError` names a bad key."""
    cls = SCHEDULERS.get(cfg.name)
    cfg = as_schema("scheduler", cfg)
    opts = plugin_options(cls, cfg.options, "scheduler.options")
    extra = {} if opts is None else {"options": opts}
    # what the round trainer calls, checked before any round
    return made("scheduler.name", cfg.name, cls, "a subclass of jaxrl_dist.scheduling.schedulers.Scheduler",
                ("num_shards", "expected_shards", "most_shards", "sees_limits"), cfg, backend_cfg,
                *(() if full is None else (full,)), **extra)

"""The async trainer's staleness and balance rules, shared by the trainer and the
simulator (`tools.simulate`): which chunk tickets may start under the
staleness bound, and how many actors run next (`balance`, and `Balancer`, its
bookkeeping of production, consumption and the rate measured at each count)."""
from __future__ import annotations

import time
from collections import deque
from typing import Optional

import numpy as np


def ticket_allowed(ticket: int, version: int, max_staleness: int, K: int, dropped: int) -> bool:
    """Whether chunk ticket `ticket` may start while params `version` are the newest
    published: the learner consumes `K` chunks a version, so a chunk started now is
    learned from within `max_staleness` versions; every dropped chunk frees one ticket."""
    return ticket < (version + max_staleness + 1) * K + dropped


def balance(active: int, production: float, consumption: float, tolerance: float,
            lo: int, hi: int, rates: Optional[dict] = None) -> int:
    """Active actors for the next window: one fewer when production capacity
    (chunks/s) exceeds consumption capacity by more than `tolerance`, one more
    when it falls short by more, clipped to `lo..hi`.

    `rates` (actors -> chunks/s the learner took while that many ran) guards
    the step: capacities assume actors add production independently, which is
    false where they share CPUs (or an interpreter) with each other and the
    learner. A level measured slower than this one is not stepped to; a
    level not yet measured is tried unless the level behind this one was
    faster; when the capacities' way is closed the other way is tried, so the
    count climbs to the fastest level measured.
    """
    if not (production > 0 and consumption > 0):
        return active
    ratio = production / consumption
    step = -1 if ratio > 1.0 + tolerance else 1 if ratio < 1.0 - tolerance else 0
    if step == 0 or not rates or active not in rates:
        return min(hi, max(lo, active + step))
    here = rates[active]

    def worth(n: int, came_from: int) -> bool:
        if not lo <= n <= hi:
            return False
        if n in rates:
            return rates[n] > here
        return not (came_from in rates and rates[came_from] > here)

    if worth(active + step, active - step):
        return active + step
    return active - step if worth(active - step, active + step) else active


class Balancer:
    """Production against consumption, and the learned rate measured at each actor count:
    decides how many actors run (see `balance`)."""

    def __init__(self, a, active: int, top: int, clock=time.perf_counter):
        # `clock`: seconds now; the simulator passes its simulated clock
        self.a, self.active, self.top, self.clock = a, active, top, clock
        self.chunk_s = deque(maxlen=64)  # the actors' seconds per chunk
        self.update_s = deque(maxlen=a.balance_every)  # the learner's seconds per update
        # learned chunks/s per actor count, and where the current level's window began
        self.rates, self.learned, self.level_start = {}, 0, None

    def observe(self, taken: list, learned: int) -> None:
        """An update's chunks: those taken (learned or dropped), `learned` of them learned."""
        self.chunk_s.extend(c.busy_s for c in taken)
        self.learned += learned
        if self.level_start is None:  # windows start after the first update: no start-up
            self.level_start = (self.clock(), self.learned)

    def note_update(self, learn_s: float) -> None:
        """The learner's seconds on one update."""
        self.update_s.append(learn_s)

    def step(self) -> int:
        """The actor count to run next (measures the current level's rate first)."""
        if not self.chunk_s or not self.update_s or self.level_start is None:
            return self.active
        production = self.active / float(np.mean(self.chunk_s))
        consumption = self.a.batch_chunks / float(np.mean(self.update_s))
        now, (t0, learned0) = self.clock(), self.level_start
        rate = (self.learned - learned0) / max(now - t0, 1e-9)
        old = self.rates.get(self.active)
        self.rates[self.active] = rate if old is None else 0.5 * (old + rate)
        self.active = balance(self.active, production, consumption, self.a.balance_tolerance,
                              self.a.min_actors, self.top, self.rates)
        self.level_start = (now, self.learned)
        return self.active

"""The async trainer's two pure rules, shared by the trainer and the simulator
(`scheduling.simulate`): which chunk tickets may start under the staleness bound,
and how many actors the balancer runs next."""
from __future__ import annotations

from typing import Optional


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

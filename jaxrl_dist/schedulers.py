"""Schedulers pick how many actor shards each round runs.

`make_scheduler(cfg.scheduler, cfg.backend)` returns an object with
`num_shards(round_, history) -> n`, `history` being the per-round metric
records so far.
"""
from __future__ import annotations

from jaxrl_dist.config import ConfigError


class FixedScheduler:
    """The same `scheduler.num_shards` every round."""

    name = "fixed"

    def __init__(self, cfg, backend_cfg):
        self.n = cfg.num_shards

    def num_shards(self, round_: int, history: list) -> int:
        return self.n

    def expected_shards(self) -> float:
        """Shards per round on average, for sizing the LR schedule."""
        return float(self.n)


SCHEDULERS = {"fixed": FixedScheduler}


def make_scheduler(cfg, backend_cfg):
    if cfg.name not in SCHEDULERS:
        raise ConfigError(f"scheduler.name: unknown scheduler {cfg.name!r} "
                          f"(available: {', '.join(sorted(SCHEDULERS))})")
    return SCHEDULERS[cfg.name](cfg, backend_cfg)

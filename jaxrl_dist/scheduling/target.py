"""The target rule: when a run's recent return counts as `run.target_return` reached.
Array ops only, so the scheduling MDP runs it under jit as the trainers run it on
their records."""
from __future__ import annotations

import numpy as np

TARGET_ROUNDS = 16  # rounds at most that `recent_return` averages over


def recent_return(sums, counts, min_episodes: int, xp=np):
    """Mean return of the latest episodes: whole rounds, newest first (`sums[W]`,
    `counts[W]`, index 0 the latest round), back until `min_episodes` episodes
    are in. One lucky episode in a small round is not "the target reached".
    NaN without any episode. Array ops only: the scheduling MDP runs it under jit."""
    before = xp.cumsum(counts) - counts  # episodes in the newer rounds
    take = before < min_episodes
    total = xp.sum(xp.where(take, counts, 0.0))
    return xp.where(total > 0, xp.sum(xp.where(take, sums, 0.0)) / xp.maximum(total, 1.0), xp.nan)


def reached(rec: dict, target) -> bool:
    """Whether a round's recent return (`return_recent`) reached `run.target_return`
    (never without a target)."""
    ret = rec.return_recent
    return target is not None and ret is not None and ret >= target

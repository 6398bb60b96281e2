"""The env adapter protocol and the episode bookkeeping shared by all suites."""
from __future__ import annotations

from typing import Any, Protocol, Tuple

import jax
import jax.numpy as jnp

from jaxrl_dist.core.types import EnvSpec, EpisodeStats, StepOut


class EnvMakeError(ValueError):
    """An env id or suite that cannot be made; the message names it."""


class EnvAdapter(Protocol):
    """A flat batch of `num_envs` environments whose `step` runs inside jit.

    `reset` may run on the host (envpool) and is called once, outside jit.
    `step` takes `[N]` actions (continuous: `[N, A]`, already clipped) and
    either one key per env (`[N]`) or a single key to split, and returns the
    new env state and a `StepOut` of `[N, ...]` arrays. Envs whose randomness
    lives outside JAX (envpool) ignore the keys.
    """

    spec: EnvSpec
    num_envs: int

    def reset(self, key: jax.Array) -> Tuple[Any, jax.Array]: ...

    def step(self, env_state: Any, action: jax.Array, key: jax.Array) -> Tuple[Any, StepOut]: ...


def init_episodes(num_envs: int) -> EpisodeStats:
    return EpisodeStats(jnp.zeros((num_envs,), jnp.float32), jnp.zeros((num_envs,), jnp.int32))


def track_episodes(stats: EpisodeStats, out: StepOut):
    """Accumulate episode return/length across auto-resets.

    Returns the new stats, the return of each episode that ended on this step
    (0 elsewhere) and the `[N]` mask of those ends.
    """
    ret = stats.ep_return + out.log_reward * out.valid
    length = stats.ep_length + out.valid.astype(jnp.int32)
    end = out.episode_end & out.valid
    done_return = jnp.where(end, ret, 0.0)
    new = EpisodeStats(jnp.where(end, 0.0, ret), jnp.where(end, 0, length))
    return new, done_return, end

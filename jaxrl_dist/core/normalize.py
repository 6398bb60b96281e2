"""Running observation normalisation and reward scaling, as pure functions.

Statistics are per seed; the rollout vmaps these functions over the seed axis.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_dist.core.types import NormState, RunningMoments

_EPS = 1e-8


def init_moments(shape) -> RunningMoments:
    return RunningMoments(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32),
                          jnp.asarray(1e-4, jnp.float32))


def init_norm(obs_shape, num_envs: int) -> NormState:
    return NormState(init_moments(obs_shape), init_moments(()), jnp.zeros((num_envs,), jnp.float32))


def update_moments(m: RunningMoments, x: jax.Array) -> RunningMoments:
    """Merge the moments of the batch `x` (`[B, ...]`) into `m` (Chan et al.).

    The batch axis is reduced with a unit axis behind it: XLA then sums it in
    order, the same whether this runs alone or vmapped beside other seeds or
    shards (a reduction over the minor axis is vectorised differently for
    different batch sizes, which changes the last bit).
    """
    x = x.astype(jnp.float32)[..., None]
    b_mean, b_var, b_count = x.mean(0)[..., 0], x.var(0)[..., 0], x.shape[0]
    delta = b_mean - m.mean
    total = m.count + b_count
    mean = m.mean + delta * b_count / total
    m2 = m.var * m.count + b_var * b_count + delta**2 * m.count * b_count / total
    return RunningMoments(mean, m2 / total, total)


def normalize(m: RunningMoments, x: jax.Array, clip: float) -> jax.Array:
    z = (x.astype(jnp.float32) - m.mean) / jnp.sqrt(m.var + _EPS)
    return jnp.clip(z, -clip, clip)


def scale_reward(norm: NormState, reward, done, gamma: float, clip: float):
    """Divide rewards by the running std of the discounted return (`[B]` each)."""
    disc = norm.disc_return * gamma + reward
    ret = update_moments(norm.ret, disc)
    scaled = jnp.clip(reward / jnp.sqrt(ret.var + _EPS), -clip, clip)
    return norm._replace(ret=ret, disc_return=jnp.where(done, 0.0, disc)), scaled

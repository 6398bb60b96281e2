"""`core.rng.permutation` and `rng.argsort`: the same indices as JAX's own shuffle and
stable argsort (PPO's minibatch plans depend on every index), ties and sizes included."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxrl_dist.core import rng

_PERMUTATION = jax.jit(rng.permutation, static_argnums=1)  # a compile per size, not per draw
_ARGSORT = jax.jit(rng.argsort)
FEW = settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@FEW
@given(n=st.sampled_from([1, 2, 3, 128, 512, 1625, 1626]), seed=st.integers(0, 2 ** 31 - 1))  # 1626: two rounds
def test_permutation_is_jaxs(n, seed):
    key = rng.key(seed)
    np.testing.assert_array_equal(_PERMUTATION(key, n), jax.random.permutation(key, n))


@FEW
@given(values=st.lists(st.integers(0, 5), min_size=1, max_size=300))
def test_argsort_keeps_ties_in_index_order(values):
    for x in (jnp.asarray(values, jnp.uint32), jnp.asarray(values, jnp.float32) / 3):
        np.testing.assert_array_equal(_ARGSORT(x), jnp.argsort(x, stable=True))


def test_vmapped_and_jitted_as_ppo_draws_them():
    keys = jax.random.split(rng.key(7), 16)  # PPO's plan: one shuffle per epoch and seed
    ours = jax.jit(jax.vmap(lambda k: rng.permutation(k, 512)))(keys)
    np.testing.assert_array_equal(ours, jax.vmap(lambda k: jax.random.permutation(k, 512))(keys))
    x = jnp.where(jnp.arange(600) % 3 == 0, jax.random.uniform(keys[0], (600,)), 2.0)  # padded: ties at 2.0
    np.testing.assert_array_equal(_ARGSORT(x), jnp.argsort(x, stable=True))
    assert rng.argsort(jnp.zeros(2 ** 16)).tolist() == list(range(2 ** 16))  # above the packing's range

"""PRNG keys for the trainers.

Keys are threefry keys, which are vmap-invariant: a seed's (or a shard's)
random stream is the same whether it runs alone, vmapped beside others, or on
another device. (The faster `rbg` keys are not: under vmap their bits depend
on the whole batch.) State pytrees hold the raw `uint32` key data, so
checkpoints and wire formats see plain arrays; jitted code wraps it back.

On CPU the threefry hash is faster lowered unrolled (the same bits); that is
an opt-in of the entry points, `jaxrl_dist.platform.use_unrolled_threefry`,
since it goes through JAX's private API.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

IMPL = "threefry2x32"


def key(seed: int) -> jax.Array:
    """A typed key from an integer seed."""
    return jax.random.key(seed, impl=IMPL)


def wrap(data: jax.Array) -> jax.Array:
    """Typed keys from raw key data (any leading axes)."""
    return jax.random.wrap_key_data(data, impl=IMPL)


def unwrap(keys: jax.Array) -> jax.Array:
    """Raw `uint32` key data of typed keys."""
    return jax.random.key_data(keys)


def permutation(k: jax.Array, n: int) -> jax.Array:
    """`jax.random.permutation(k, n)`, the same indices: its rounds of stable sorts by
    random bits, each done by `argsort` (PPO shuffles every epoch's batch with it)."""
    x = jnp.arange(n, dtype=jnp.int32)
    for _ in range(int(np.ceil(3 * np.log(max(1, n)) / np.log(np.iinfo(np.uint32).max)))):
        k, sub = jax.random.split(k)
        x = x[argsort(jax.random.bits(sub, (n,), jnp.uint32))]
    return x


def argsort(x: jax.Array) -> jax.Array:
    """`jnp.argsort(x, stable=True)` of a 1-D array. XLA:CPU runs a sort that carries a
    second array (the indices) through a comparator call per comparison, ~5x slower than
    a sort of one array: on CPU below 2**16 elements this sorts twice, `x` alone and then
    its ranks packed with the indices into one uint32 (rank << 16 | index), whose order
    is the stable one (ties keep index order)."""
    n = x.shape[0]
    if n >= 2 ** 16 or jax.default_backend() != "cpu":
        return jnp.argsort(x, stable=True)
    rank = jnp.searchsorted(jnp.sort(x), x, side="left").astype(jnp.uint32)  # equal values: equal ranks
    return (jnp.sort((rank << 16) | jnp.arange(n, dtype=jnp.uint32)) & 0xFFFF).astype(jnp.int32)

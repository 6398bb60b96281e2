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

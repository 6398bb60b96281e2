"""PRNG keys for the trainers.

Keys use XLA's RngBitGenerator (`unsafe_rbg`): on CPU, threefry lowers to a
rolled loop per random call, which dominated the per-step cost of small
rollouts. State pytrees hold the raw `uint32` key data so checkpoints and
wire formats see plain arrays; jitted code wraps it back with `wrap`.
"""
from __future__ import annotations

import jax

IMPL = "unsafe_rbg"


def key(seed: int) -> jax.Array:
    """A typed key from an integer seed."""
    return jax.random.key(seed, impl=IMPL)


def wrap(data: jax.Array) -> jax.Array:
    """Typed keys from raw key data (any leading axes)."""
    return jax.random.wrap_key_data(data, impl=IMPL)


def unwrap(keys: jax.Array) -> jax.Array:
    """Raw `uint32` key data of typed keys."""
    return jax.random.key_data(keys)

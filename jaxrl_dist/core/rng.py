"""PRNG keys for the trainers.

Keys are threefry keys, which are vmap-invariant: a seed's (or a shard's)
random stream is the same whether it runs alone, vmapped beside others, or on
another device. (The faster `rbg` keys are not: under vmap their bits depend
on the whole batch.) State pytrees hold the raw `uint32` key data, so
checkpoints and wire formats see plain arrays; jitted code wraps it back.

On CPU, JAX lowers the threefry hash to a rolled 5-round loop to keep
compiles small; inside a rollout step that loop costs more than the hash, so
`use_unrolled_threefry` gives CPU the unrolled lowering other platforms use
(the same bits).
"""
from __future__ import annotations

import jax

IMPL = "threefry2x32"


def use_unrolled_threefry() -> bool:
    """Lower threefry unrolled on CPU too; False where this JAX has no such hook."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as threefry
    except ImportError:
        return False
    rule = getattr(threefry, "_threefry2x32_lowering_rule", None)
    primitive = getattr(threefry, "threefry2x32_p", None)
    if rule is None or primitive is None:
        return False
    mlir.register_lowering(primitive, rule, platform="cpu")
    return True


use_unrolled_threefry()


def key(seed: int) -> jax.Array:
    """A typed key from an integer seed."""
    return jax.random.key(seed, impl=IMPL)


def wrap(data: jax.Array) -> jax.Array:
    """Typed keys from raw key data (any leading axes)."""
    return jax.random.wrap_key_data(data, impl=IMPL)


def unwrap(keys: jax.Array) -> jax.Array:
    """Raw `uint32` key data of typed keys."""
    return jax.random.key_data(keys)

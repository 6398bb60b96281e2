"""The env adapter protocol every suite follows (the core rollout steps any such adapter)."""
from __future__ import annotations

import importlib.util
from typing import Any, Protocol, Tuple

import jax

from jaxrl_dist.config import ConfigError
from jaxrl_dist.core.types import EnvSpec, StepOut


class EnvMakeError(ConfigError):
    """An env id or suite that cannot be made; the message names it (a config error)."""


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

    # optional: `frame(env_state, index, obs) -> uint8 [H, W, 3]`, a picture of env
    # `index` (for `jaxrl-dist eval eval.video=true`); adapters without one do not render


def image_frame(gray, scale: int = 1):
    """An RGB picture of one env's 2-D observation image (an Atari stack's newest frame,
    or a MinAtar grid's channel numbers), scaled to 0-255 and enlarged `scale` times
    (nearest)."""
    import numpy as np

    gray = np.asarray(gray, np.float32)
    top = float(gray.max()) or 1.0
    gray = (gray / top * 255).astype(np.uint8).repeat(scale, 0).repeat(scale, 1)
    return np.stack([gray] * 3, axis=-1)


class Suite:
    """A registered env suite (`env.suite`): the package it needs, and how to make its envs.
    Plugins may follow this shape without subclassing it (see `envs.SUITES`)."""

    package = ""  # the importable package the suite needs
    hint = ""  # how to install it, for the error when it is missing

    @classmethod
    def installed(cls) -> bool:
        return importlib.util.find_spec(cls.package) is not None

    @staticmethod
    def has(env_id: str) -> bool:
        raise NotImplementedError

    @staticmethod
    def ids() -> list:
        """Its env ids, for "did you mean" (optional: a plugin may list none)."""
        return []

    @staticmethod
    def make(env_id: str, num_envs: int, seed: int = 0, num_threads: int = 0, kwargs=None) -> EnvAdapter:
        raise NotImplementedError

"""Env wrappers (`env.wrapper`): an adapter around an env adapter, in a registry.

A wrapper is a callable `(env, options) -> env` (`EnvWrapper`): it takes an
adapter of the `base.EnvAdapter` protocol and its options (the `Options`
dataclass it declares, filled from `env.wrapper_options` by `registry.options`)
and returns an adapter of the same protocol. `make_env` applies it after making
the env, so every trainer, the evaluator and a shard worker see the wrapped env.

The built-in `hide` removes entries of a 1-D observation (partial
observability: `env.wrapper=hide env.wrapper_options.indices=[1,3]` shows
CartPole only its position and angle). A fork adds its own under the entry-point
group `jaxrl_dist.env_wrappers`:

    [project.entry-points."jaxrl_dist.env_wrappers"]
    noisy = "my_fork.wrappers:NoisyObs"
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Protocol

import numpy as np

from jaxrl_dist.config import ConfigError
from jaxrl_dist.envs.base import EnvAdapter
from jaxrl_dist.registry import Registry
from jaxrl_dist.registry import options as plugin_options

__all__ = ["WRAPPERS", "EnvWrapper", "HideObs", "check_wrapper", "wrap"]

WRAPPERS = Registry("env wrapper", "env.wrapper", "jaxrl_dist.env_wrappers",
                    {"hide": "jaxrl_dist.envs.wrappers:HideObs"})


class EnvWrapper(Protocol):
    """`(env, options) -> env`: `options` is the wrapper's `Options` instance (None when it
    declares none); the result follows `base.EnvAdapter` (its `spec` describes what it
    returns: a wrapper that changes the observation changes `spec.obs_shape` too)."""

    def __call__(self, env: EnvAdapter, options: Any) -> EnvAdapter: ...


def check_wrapper(name: Optional[str], given: Optional[Mapping] = None) -> Any:
    """The registered wrapper `name` and its checked options, as `(wrapper, options)`; None
    for no wrapper (null or empty: `given` is unused, as a preset's keys for a trainer it
    does not run are). `ConfigError` (one line) names `env.wrapper` or
    `env.wrapper_options.<option>`."""
    if not name:
        return None
    target = WRAPPERS.get(name)
    return target, plugin_options(target, given or {}, "env.wrapper_options")


def wrap(env: EnvAdapter, name: Optional[str], given: Optional[Mapping] = None) -> EnvAdapter:
    """`env` inside the wrapper `name` with options `given` (`env` itself for no wrapper)."""
    found = check_wrapper(name, given)
    if found is None:
        return env
    target, opts = found
    return target(env, opts)


def _hidden_entries(spec, indices: List[int]) -> np.ndarray:
    """The entries of `spec`'s 1-D observation that stay, in order; `ConfigError` naming
    `env.wrapper_options.indices` and the observation's size for anything else."""
    key, shape = "env.wrapper_options.indices", tuple(spec.obs_shape)
    if len(shape) != 1:
        raise ConfigError(f"{key}: hide takes a 1-D observation; {spec.env_id} observes {list(shape)}")
    size = shape[0]
    where = f"{spec.env_id}'s observation has {size} entries, 0..{size - 1}"
    if not indices:
        raise ConfigError(f"{key}: empty; give the entries to hide ({where})")
    bad = [i for i in indices if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size]
    if bad:
        raise ConfigError(f"{key}: {bad[0]!r} is out of range ({where})")
    if len(set(indices)) != len(indices):
        twice = next(i for i in indices if indices.count(i) > 1)
        raise ConfigError(f"{key}: {twice} is given twice ({where})")
    if len(indices) == size:
        raise ConfigError(f"{key}: hides every entry ({where}); keep at least one")
    return np.asarray([i for i in range(size) if i not in set(indices)], np.int32)


class HideObs:
    """`env.wrapper=hide`: `env` with the entries `indices` of its 1-D observation removed
    (`[N, D] -> [N, D - len(indices)]`), in `reset`'s observation and in `step`'s `obs`
    and `final_obs`; every other `StepOut` field and every other attribute of the inner
    adapter (`frame`, `action_mask`, `pool`, ...) are the inner env's."""

    @dataclass
    class Options:
        indices: List[int] = field(default_factory=list)  # entries of the observation to hide

    def __init__(self, env: EnvAdapter, options: "HideObs.Options"):
        self.inner = env
        self.keep = _hidden_entries(env.spec, list(options.indices))
        self.spec = env.spec._replace(obs_shape=(len(self.keep),))
        self.num_envs = env.num_envs

    def observe(self, obs):
        """`obs[..., D]` (numpy or JAX) with the hidden entries removed; None stays None."""
        return None if obs is None else obs[..., self.keep]

    def reset(self, key):
        env_state, obs = self.inner.reset(key)
        return env_state, self.observe(obs)

    def step(self, env_state, action, key):
        env_state, out = self.inner.step(env_state, action, key)
        return env_state, out._replace(obs=self.observe(out.obs), final_obs=self.observe(out.final_obs))

    def __getattr__(self, name: str):
        # only reached for names this wrapper lacks; "inner" itself missing (a copy being
        # built) must not recurse
        if name == "inner" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)

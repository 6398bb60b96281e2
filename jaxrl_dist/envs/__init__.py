"""Env makers behind one adapter protocol (see `base.EnvAdapter`)."""
from __future__ import annotations

import importlib.util

from jaxrl_dist.envs.base import EnvAdapter, EnvMakeError

__all__ = ["EnvAdapter", "EnvMakeError", "make_env", "resolve_suite"]

_EXTRA_HINT = {"envpool": "pip install 'jaxrl-dist[envpool]'", "gymnax": "pip install gymnax six"}


def _installed(suite: str) -> bool:
    return importlib.util.find_spec(suite) is not None


def _known(suite: str, env_id: str) -> bool:
    if suite == "gymnax":
        from jaxrl_dist.envs.gymnax_env import gymnax_ids

        return env_id in gymnax_ids()
    from jaxrl_dist.envs.envpool_env import envpool_ids

    return env_id in envpool_ids()


def resolve_suite(env_id: str, suite: str = "auto") -> str:
    """The suite that provides `env_id`; raises `EnvMakeError` naming the id or the extra."""
    if suite not in ("auto", "gymnax", "envpool"):
        raise EnvMakeError(f"env.suite must be gymnax, envpool or auto, got {suite!r}")
    candidates = ("gymnax", "envpool") if suite == "auto" else (suite,)
    for name in candidates:
        if _installed(name) and _known(name, env_id):
            return name
    if suite != "auto" and not _installed(suite):
        raise EnvMakeError(f"env.suite={suite} is not installed: {_EXTRA_HINT[suite]}")
    if suite == "auto" and not _installed("envpool"):
        raise EnvMakeError(f"unknown env.id {env_id!r}: not a gymnax id, and envpool ids need "
                           f"the envpool extra ({_EXTRA_HINT['envpool']})")
    where = "gymnax or envpool" if suite == "auto" else suite
    raise EnvMakeError(f"unknown env.id {env_id!r}: {where} has no such environment")


def make_env(env_id: str, num_envs: int, suite: str = "auto", seed: int = 0,
             num_threads: int = 0, kwargs: dict | None = None) -> EnvAdapter:
    """A flat batch of `num_envs` envs of `env_id` from gymnax or envpool."""
    suite = resolve_suite(env_id, suite)
    try:
        if suite == "gymnax":
            from jaxrl_dist.envs.gymnax_env import GymnaxEnv

            return GymnaxEnv(env_id, num_envs, kwargs)
        from jaxrl_dist.envs.envpool_env import EnvpoolEnv

        return EnvpoolEnv(env_id, num_envs, seed, num_threads, kwargs)
    except TypeError as err:  # an env.kwargs entry the maker does not take
        raise EnvMakeError(f"env.kwargs not accepted by {suite} {env_id!r}: {err}") from err

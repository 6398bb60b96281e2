"""Env suites behind one adapter protocol (see `base.EnvAdapter`), in a registry.

`env.suite` names a suite: the built-in `gymnax`, `jumanji`, `envpool` and `brax`, or a plugin
registered under the entry-point group `jaxrl_dist.env_suites` (a class or
object with `installed()`, `has(env_id)`, `make(env_id, num_envs, seed,
num_threads, kwargs)`, a `hint` for installing it and, optionally, `ids()` for "did
you mean"). `auto` takes the first
installed suite that has the id: gymnax, jumanji, envpool, brax, then plugins by name.
"""
from __future__ import annotations

from jaxrl_dist.core.networks import is_frame_stack
from jaxrl_dist.config import ConfigError, EnvConfig, did_you_mean
from jaxrl_dist.envs.base import EnvAdapter, EnvMakeError
from jaxrl_dist.envs.wrappers import check_wrapper, wrap
from jaxrl_dist.registry import Registry, check_call

__all__ = ["EnvAdapter", "EnvMakeError", "SUITES", "check_wrapper", "env_of", "make_env", "resolve_suite"]

SUITES = Registry("env suite", "env.suite", "jaxrl_dist.env_suites",
                  {"gymnax": "jaxrl_dist.envs.gymnax_env:GymnaxSuite",
                   "envpool": "jaxrl_dist.envs.envpool_env:EnvpoolSuite",
                   "brax": "jaxrl_dist.envs.brax_env:BraxSuite",
                   "jumanji": "jaxrl_dist.envs.jumanji_env:JumanjiSuite"})
# `auto` tries these before plugins; jumanji before envpool, whose Knapsack-v1 and Snake-v1
# have no legal-action masks (and a dict observation its adapter does not take)
_FIRST = ("gymnax", "jumanji", "envpool", "brax")


_SUITE_NEEDS = ("installed", "has", "make", "hint")  # what a suite plugin has (the module docstring)


def _suite(name: str):
    """The registered suite `name`, its lookup errors phrased as env errors; one that
    lacks part of the suite contract is one line naming it, not an AttributeError."""
    try:
        found = SUITES.get(name)
    except ConfigError as err:
        raise EnvMakeError(str(err)) from err
    missing = [m for m in _SUITE_NEEDS if not hasattr(found, m)]
    if missing:
        raise EnvMakeError(f"env.suite: the suite {name!r} lacks {', '.join(missing)} (a suite has installed(), "
                           "has(env_id), make(env_id, num_envs, seed, num_threads, kwargs) and hint)")
    return found


def _order() -> list:
    return list(_FIRST) + [n for n in SUITES.names() if n not in _FIRST]


def resolve_suite(env_id: str, suite: str = "auto") -> str:
    """The suite that provides `env_id`; raises `EnvMakeError` naming the id, the suite or
    the extra to install (`ConfigError` for a suite name nobody registered)."""
    if suite != "auto":
        found = _suite(suite)
        if not found.installed():
            raise EnvMakeError(f"env.suite={suite} is not installed: {found.hint}")
        if not found.has(env_id):
            raise EnvMakeError(f"unknown env.id {env_id!r}{_closest(env_id, [found])}: {suite} has no such environment")
        return suite
    for name in _order():  # one at a time: a plugin that fails to import troubles only ids no other suite has
        found = _suite(name)
        if found.installed() and found.has(env_id):
            return name
    installed = [s for s in map(_suite, _order()) if s.installed()]
    closest = _closest(env_id, installed)
    if not _suite("envpool").installed():
        raise EnvMakeError(f"unknown env.id {env_id!r}{closest}: not a gymnax id, and envpool ids need "
                           f"the envpool extra ({_suite('envpool').hint})")
    raise EnvMakeError(f"unknown env.id {env_id!r}{closest}: no registered suite ({', '.join(_order())}) "
                       f"has such an environment")


def _closest(env_id: str, suites: list) -> str:
    """` (did you mean 'X'?)` over the ids the installed `suites` list."""
    return did_you_mean(env_id, [i for s in suites for i in getattr(s, "ids", lambda: [])()])


# a maker's arguments the run passes from its own keys, not from `env.kwargs`
_OWN_KEYS = {"num_envs": "env.num_envs (or backend.envs_per_shard)", "seed": "seed",
             "num_threads": "env.num_threads"}


def make_env(env_id: str, num_envs: int, suite: str = "auto", seed: int = 0,
             num_threads: int = 0, kwargs: dict | None = None, wrapper: str | None = None,
             wrapper_options: dict | None = None) -> EnvAdapter:
    """A flat batch of `num_envs` envs of `env_id` from the suite that has it, inside the
    env wrapper `wrapper` (`envs.wrappers.WRAPPERS`) with `wrapper_options` when given."""
    check_wrapper(wrapper, wrapper_options)  # before the env: a misspelt name builds none
    taken = sorted(set(kwargs or {}) & set(_OWN_KEYS))
    if taken:  # the suite's maker gets these from the config's own keys
        raise EnvMakeError(f"env.kwargs.{taken[0]}: the run sets it; use {_OWN_KEYS[taken[0]]} instead")
    suite = resolve_suite(env_id, suite)
    make = _suite(suite).make
    try:
        check_call(f"env.suite={suite}: its make cannot be called as make(env_id, num_envs, seed, num_threads, "
                   "kwargs)", make, env_id, num_envs, seed, num_threads, kwargs)
    except ConfigError as err:  # an env error, as the suite's others are
        raise EnvMakeError(str(err)) from None
    try:
        env = make(env_id, num_envs, seed, num_threads, kwargs)
    except TypeError as err:  # an env.kwargs entry the maker does not take
        raise EnvMakeError(f"env.kwargs not accepted by {suite} {env_id!r}: {err}") from err
    return wrap(_checked_adapter(env, suite, env_id, num_envs), wrapper, wrapper_options)


def _checked_adapter(env, suite: str, env_id: str, num_envs: int) -> EnvAdapter:
    """What a suite made: an env adapter of `num_envs` envs (a suite plugin's mistake is
    one line here, not a wrong step count or an AttributeError later)."""
    missing = [a for a in ("spec", "num_envs", "reset", "step") if not hasattr(env, a)]
    if missing:
        raise EnvMakeError(f"env.suite={suite}: make({env_id!r}, ...) returned a {type(env).__name__}, which lacks "
                           f"{', '.join(missing)} (an env adapter: jaxrl_dist.envs.base.EnvAdapter)")
    if env.num_envs != num_envs:
        raise EnvMakeError(f"env.suite={suite}: make({env_id!r}, num_envs={num_envs}) returned {env.num_envs} envs")
    return env


def env_of(env: EnvConfig, num_envs: int, seed: int) -> EnvAdapter:
    """`make_env` for a config's `env` group: `num_envs` envs of it, seeded `seed`."""
    return make_env(env.id, num_envs, env.suite, seed, env.num_threads, env.kwargs, env.wrapper,
                    env.wrapper_options)


def task_family(spec) -> str:
    """What kind of task an env is, from its spaces and suite; `configs/env/auto_<family>`
    holds the defaults for an `env.id` that has no preset of its own.

    image: stacked frames for the CNN (envpool Atari); grid: small image-like
    observations for the MLP (MinAtar); mujoco: continuous actions on envpool;
    continuous: continuous actions elsewhere (gymnax); discrete: the rest.
    """
    if is_frame_stack(spec.obs_shape):
        return "image"
    if len(spec.obs_shape) > 1:
        return "grid"
    if not spec.discrete:
        return "mujoco" if spec.suite == "envpool" else "continuous"
    return "discrete"

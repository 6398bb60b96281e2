"""brax environments: JAX-native rigid-body physics, vmapped over the flat env batch.

Like gymnax, a brax env is a pure function of its state, so the fused trainer
jits physics, policy and PPO update into one program. brax's own training
wrappers are not used: its `AutoResetWrapper` restarts every env from the one
state it was first reset to, and its `EpisodeWrapper` folds the time limit
into `done`. Here each ended env gets a fresh random reset, and the time
limit (`env.kwargs.episode_length`, 1000 as in gym's MuJoCo tasks) is a
truncation, kept apart from the task's own termination: the transition
keeps the pre-reset observation as `final_obs`, so truncation bootstraps.

`env.kwargs.pipeline` picks brax's physics pipeline (brax calls it
`backend`): generalized, positional, spring or mjx. The default, positional,
is the second fastest on CPU here (spring is about twice as fast) and the one
on which PPO learns Hopper best per step and per second (bench/RESULTS.md).
"""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.core.types import EnvSpec, StepOut
from jaxrl_dist.envs.base import EnvMakeError, Suite
from jaxrl_dist.envs.gymnax_env import _per_env_keys

LOG = logging.getLogger(__name__)
PIPELINES = ("generalized", "positional", "spring", "mjx")
DEFAULT_PIPELINE = "positional"
EPISODE_LENGTH = 1000


def import_brax_envs():
    """`brax.envs`, quietly: mujoco's MJX prints to stdout when its optional warp
    backend is missing, and brax warns on every system load that it is in
    maintenance mode; neither is about this run."""
    with contextlib.redirect_stdout(io.StringIO()):
        from brax import envs
    return envs


def brax_ids() -> list:
    # brax lists its tasks only in this registry (`register_environment` adds to it)
    return sorted(import_brax_envs()._envs)


class BraxState(NamedTuple):
    """A batch of brax envs; every leaf has the leading `[N]` env axis."""

    inner: Any  # brax `envs.State`: physics state, observation, reward, done, metrics
    steps: jax.Array  # `[N]` int32: steps taken in the current episode


def _strong(tree):
    """The same values, strongly typed (brax builds some leaves from Python scalars);
    a state whose types change between calls would recompile or fail `lax.cond`."""
    return jax.tree.map(lambda x: jnp.asarray(x, x.dtype), tree)


def _where(mask, new, old):
    """`new` where `mask[N]`, else `old`, leaf by leaf."""
    pick = lambda a, b: jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)  # noqa: E731
    return jax.tree.map(pick, new, old)


def _make(env_id: str, kwargs: dict):
    """The brax env `env_id` with `kwargs` (its constructor's, plus `pipeline`) and the
    episode length; errors name the `env.kwargs` entry."""
    kwargs = dict(kwargs)
    pipeline = kwargs.pop("pipeline", DEFAULT_PIPELINE)
    if pipeline not in PIPELINES:
        raise EnvMakeError(f"env.kwargs.pipeline must be one of {', '.join(PIPELINES)}, "
                           f"got {pipeline!r}")
    length = kwargs.pop("episode_length", EPISODE_LENGTH)
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise EnvMakeError(f"env.kwargs.episode_length must be a positive integer, got {length!r}")
    envs = import_brax_envs()
    with warnings.catch_warnings(), _mujoco_warnings_logged():
        warnings.filterwarnings("ignore", message="Brax System", category=UserWarning)
        return envs.get_environment(env_id, backend=pipeline, **kwargs), length


@contextlib.contextmanager
def _mujoco_warnings_logged():
    """MuJoCo's warnings go to this module's logger while a model loads; by default
    MuJoCo writes them to MUJOCO_LOG.TXT in the working directory (halfcheetah's
    model uses the deprecated `settotalmass`)."""
    import mujoco

    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(lambda msg: LOG.info("mujoco: %s", msg))
    try:
        yield
    finally:
        mujoco.set_mju_user_warning(previous)


def _action_bounds(env):
    """`[A]` low and high: the actuators' control range (brax envs without a physics
    system, such as `fast`, take brax's usual [-1, 1])."""
    sys = getattr(env, "sys", None)
    if sys is None:
        size = int(env.action_size)
        return -np.ones(size, np.float32), np.ones(size, np.float32)
    low, high = np.asarray(sys.actuator.ctrl_range, np.float32).T
    return low, high


class BraxEnv:
    """`num_envs` copies of one brax env, stepped with `vmap`, reset where they end."""

    def __init__(self, env_id: str, num_envs: int, kwargs: dict | None = None):
        self.env, self.episode_length = _make(env_id, kwargs or {})
        self.num_envs = num_envs
        obs = jax.eval_shape(self.env.reset, jax.random.key(0)).obs
        if not isinstance(obs, jax.ShapeDtypeStruct):
            raise EnvMakeError(f"env.id {env_id!r}: brax observations that are dicts are not "
                               "supported (only flat arrays)")
        low, high = _action_bounds(self.env)
        self.spec = EnvSpec(env_id, "brax", tuple(obs.shape), np.dtype(obs.dtype), False,
                            int(self.env.action_size), low, high)
        self._reset = jax.jit(jax.vmap(self.env.reset))

    def reset(self, key):
        inner = _strong(self._reset(jax.random.split(key, self.num_envs)))
        return BraxState(inner, jnp.zeros((self.num_envs,), jnp.int32)), inner.obs

    def step(self, env_state: BraxState, action, key):
        keys = _per_env_keys(key, action.shape[0])
        nxt = _strong(jax.vmap(self.env.step)(env_state.inner, action))
        steps = env_state.steps + 1
        term = nxt.done.astype(bool)
        trunc = (steps >= self.episode_length) & ~term
        done = term | trunc
        # a reset costs about a physics step: only run it when some env ended
        inner = jax.lax.cond(done.any(), lambda: _where(done, self._fresh(keys, nxt), nxt),
                             lambda: nxt)
        reward = nxt.reward.astype(jnp.float32)
        out = StepOut(obs=inner.obs, final_obs=nxt.obs, reward=reward, terminated=term,
                      truncated=trunc, valid=jnp.ones_like(term), log_reward=reward,
                      episode_end=done)
        return BraxState(inner, jnp.where(done, 0, steps)), out

    def _fresh(self, keys, like):
        """Freshly reset envs, with `like`'s info entries (some envs only add them in `step`)."""
        fresh = _strong(jax.vmap(self.env.reset)(keys))
        return fresh.replace(info={**like.info, **fresh.info})


class BraxSuite(Suite):
    """`env.suite=brax`: brax's physics tasks (hopper, halfcheetah, ant, ...), vmapped and
    jitted with the policy."""

    package = "brax"
    hint = "pip install 'jaxrl-dist[brax]'"

    @staticmethod
    def has(env_id: str) -> bool:
        return env_id in brax_ids()

    ids = staticmethod(brax_ids)

    @staticmethod
    def make(env_id: str, num_envs: int, seed: int = 0, num_threads: int = 0, kwargs=None):
        return BraxEnv(env_id, num_envs, kwargs)

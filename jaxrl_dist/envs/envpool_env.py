"""envpool environments through envpool's XLA interface, so rollouts stay in jit.

envpool's XLA step cannot be vmapped: all seeds and envs share one pool of
`num_envs` envs (seeds are slices of it). envpool resets an env on the step
*after* its episode ended; that step ignores the action and returns reward 0,
so it is marked `valid=False` and masked out of the loss. On the step that
ends an episode envpool returns the final observation itself, which is what
truncation bootstraps from.

MuJoCo tasks speak float64; JAX runs in float32 here, so the XLA functions are
built and called inside a scoped `jax.enable_x64` and cast at the boundary.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.core.types import EnvSpec, StepOut
from jaxrl_dist.envs.base import EnvMakeError, Suite, image_frame

# Atari preprocessing beyond envpool's defaults (84x84 gray, 4-frame stack):
# episodic life and reward clipping, the standard PPO Atari setting.
_ATARI_OPTIONS = {"episodic_life": True, "reward_clip": True}


class EnvpoolState(NamedTuple):
    handle: jax.Array  # envpool's opaque XLA handle (uint8 bytes)
    prev_done: jax.Array  # `[N]` the last step ended an episode: next is a reset step


def envpool_ids() -> list:
    import envpool

    return list(envpool.list_all_envs())


def _float32(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float64 else dtype


@contextlib.contextmanager
def _quiet_spaces():
    """envpool's gymnasium spaces have float64 bounds that gymnasium casts to float32,
    warning each time a space is made: noise a user can do nothing about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*precision lowered by casting to float32", UserWarning)
        yield


def _space_spec(env_id: str, pool) -> EnvSpec:
    with _quiet_spaces():
        obs_space, act_space = pool.observation_space, pool.action_space
    obs_dtype = _float32(obs_space.dtype)
    if hasattr(act_space, "n"):
        return EnvSpec(env_id, "envpool", tuple(obs_space.shape), obs_dtype, True,
                       int(act_space.n), delayed_reset=True)
    low = np.asarray(act_space.low, np.float32)
    high = np.asarray(act_space.high, np.float32)
    return EnvSpec(env_id, "envpool", tuple(obs_space.shape), obs_dtype, False,
                   int(np.prod(act_space.shape)), low, high, delayed_reset=True)


def make_pool(env_id: str, num_envs: int, seed: int, num_threads: int = 0, kwargs=None):
    """An envpool gymnasium pool with this project's defaults for the task family."""
    import envpool

    fields = envpool.make_spec(env_id).config._fields
    options = {k: v for k, v in _ATARI_OPTIONS.items() if k in fields}
    options.update(kwargs or {})
    if num_threads:
        options["num_threads"] = num_threads
    with _quiet_spaces():
        return envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs,
                            seed=seed, **options)


class EnvpoolEnv:
    """A pool of `num_envs` envpool envs stepped through XLA custom calls."""

    def __init__(self, env_id: str, num_envs: int, seed: int = 0, num_threads: int = 0,
                 kwargs: dict | None = None):
        self.pool = make_pool(env_id, num_envs, seed, num_threads, kwargs)
        self.num_envs = num_envs
        self.spec = _space_spec(env_id, self.pool)
        self._action_dtype = self.pool.spec.action_array_spec["action"].dtype
        with jax.enable_x64(True):
            self._handle, _recv, _send, self._step = self.pool.xla()

    def reset(self, key=None):
        obs, _info = self.pool.reset()
        state = EnvpoolState(jnp.asarray(self._handle), jnp.zeros((self.num_envs,), bool))
        return state, jnp.asarray(obs.astype(self.spec.obs_dtype, copy=False))

    def frame(self, env_state, index: int, obs):
        """Env `index` as an RGB picture: an Atari frame stack's newest frame; envpool
        renders nothing else (its MuJoCo envs have no renderer here)."""
        if len(self.spec.obs_shape) != 3:
            raise EnvMakeError(f"eval.video: envpool does not render {self.spec.env_id} (only image "
                               "observations, such as Atari's, make a video)")
        return image_frame(np.asarray(obs[index])[-1], scale=2)  # [C, H, W]: the newest frame

    def step(self, env_state: EnvpoolState, action, key=None):
        env_ids = jnp.arange(self.num_envs, dtype=jnp.int32)
        with jax.enable_x64(True):
            handle, (obs, reward, term, trunc, info) = self._step(
                env_state.handle, action.astype(self._action_dtype), env_ids)
            obs = obs.astype(self.spec.obs_dtype)
            reward = reward.astype(jnp.float32)
            log_reward = info["reward"].astype(jnp.float32) if "reward" in info else reward
            game_over = info["terminated"].astype(bool) if "terminated" in info else term
        term, trunc = term.astype(bool), trunc.astype(bool) & ~term.astype(bool)
        done = term | trunc
        out = StepOut(obs=obs, final_obs=obs, reward=reward, terminated=term, truncated=trunc,
                      valid=~env_state.prev_done, log_reward=log_reward,
                      episode_end=game_over | trunc)
        return EnvpoolState(handle, done), out


class EnvpoolSuite(Suite):
    """`env.suite=envpool`: C++ env pools stepped from the host (Atari, MuJoCo, classic control)."""

    package = "envpool"
    hint = "pip install 'jaxrl-dist[envpool]'"

    @staticmethod
    def has(env_id: str) -> bool:
        return env_id in envpool_ids()

    ids = staticmethod(envpool_ids)

    @staticmethod
    def make(env_id: str, num_envs: int, seed: int = 0, num_threads: int = 0, kwargs=None):
        return EnvpoolEnv(env_id, num_envs, seed, num_threads, kwargs)

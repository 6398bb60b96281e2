"""gymnax environments: pure JAX, vmapped over the flat env batch, auto-reset."""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.config import needs
from jaxrl_dist.core.types import EnvSpec, StepOut
from jaxrl_dist.envs.base import EnvMakeError, Suite, image_frame
from jaxrl_dist.platform import defer_import


# gymnax imports its rendering libraries (seaborn pulls in scipy) at module
# level, about a second of start-up that training never uses: they load on
# first attribute access instead.
_RENDER_MODULES = ("seaborn", "matplotlib.pyplot")


def import_gymnax():
    """`import gymnax`, with its rendering dependencies loaded lazily."""
    if "gymnax" not in sys.modules:
        for name in _RENDER_MODULES:
            defer_import(name)
    import gymnax

    return gymnax


def gymnax_ids() -> list:
    return list(import_gymnax().registered_envs)


def _space_spec(env_id: str, env, params) -> EnvSpec:
    from gymnax.environments import spaces

    obs_space = env.observation_space(params)
    act_space = env.action_space(params)
    obs_dtype = np.dtype(getattr(obs_space, "dtype", np.float32))
    if isinstance(act_space, spaces.Discrete):
        return EnvSpec(env_id, "gymnax", tuple(obs_space.shape), obs_dtype, True, int(act_space.n))
    shape = tuple(act_space.shape) or (1,)
    low = np.broadcast_to(np.asarray(act_space.low, np.float32), shape)
    high = np.broadcast_to(np.asarray(act_space.high, np.float32), shape)
    return EnvSpec(env_id, "gymnax", tuple(obs_space.shape), obs_dtype, False, int(np.prod(shape)),
                   low, high)


def _per_env_keys(key, n: int):
    """`[n]` keys: `key` itself if it holds one key per env, else `n` split from it."""
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    single = key.ndim == (0 if typed else 1)
    return jax.random.split(key, n) if single else key


class GymnaxEnv:
    """`num_envs` copies of one gymnax env, stepped with `vmap`."""

    def __init__(self, env_id: str, num_envs: int, kwargs: dict | None = None):
        self.env, self.params = import_gymnax().make(env_id, **(kwargs or {}))
        self.num_envs = num_envs
        self.spec = _space_spec(env_id, self.env, self.params)
        # gymnax continuous envs with a scalar action space take a scalar
        self._scalar_action = (not self.spec.discrete
                               and tuple(self.env.action_space(self.params).shape) == ())

    def reset(self, key):
        keys = jax.random.split(key, self.num_envs)
        obs, state = jax.vmap(self.env.reset, (0, None))(keys, self.params)
        # some resets return weakly typed leaves that `step` returns strongly
        # typed; a state whose types change between calls would recompile
        strong = lambda x: jnp.asarray(x, x.dtype)
        return jax.tree.map(strong, state), strong(obs)

    def step(self, env_state, action, key):
        keys = _per_env_keys(key, action.shape[0])
        if self._scalar_action:
            action = action[..., 0]
        obs, state, reward, term, trunc, info = jax.vmap(self.env.step, (0, 0, 0, None))(
            keys, env_state, action, self.params)
        term = term.astype(bool)
        trunc = trunc.astype(bool) & ~term
        ones = jnp.ones_like(term)
        reward = reward.astype(jnp.float32)
        out = StepOut(obs=obs, final_obs=info["final_observation"], reward=reward,
                      terminated=term, truncated=trunc, valid=ones, log_reward=reward,
                      episode_end=term | trunc)
        return state, out

    def frame(self, env_state, index: int, obs):
        """Env `index` as an RGB picture: classic control through gymnasium's renderer
        (needs pygame), image-like observations (MinAtar) from the observation."""
        import numpy as np

        if len(self.spec.obs_shape) == 2:  # [H, W] (bsuite's Catch): the grid itself
            return image_frame(np.asarray(obs[index]), scale=16)
        if len(self.spec.obs_shape) == 3:  # [H, W, C]: each lit cell shows which channel lit it
            grid = np.asarray(obs[index])
            return image_frame((grid * np.arange(1, grid.shape[-1] + 1)).max(-1), scale=16)
        gym_env, vis_gym = self._renderer()
        one = jax.tree.map(lambda x: np.asarray(x)[index], env_state)
        gym_env.unwrapped.state = vis_gym.get_gym_state(one, self.spec.env_id)
        if self.spec.env_id == "Pendulum-v1":
            gym_env.unwrapped.last_u = np.asarray(one.last_u, dtype=np.float64)
        return gym_env.render()

    def _renderer(self):
        """One gymnasium env in rgb_array mode, its physics set to this env's params
        (gymnax's own adapter makes a new one per frame: ~70 ms each)."""
        if getattr(self, "_gym", None) is None:
            import os

            os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame: no sound card, no display
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
            needs("pygame", "video", "a picture of a classic-control env (eval.video=true)")
            import gymnasium
            from gymnax.visualize import vis_gym

            if self.spec.env_id not in vis_gym.SUPPORTED_GYM_ENVS:
                raise EnvMakeError(f"eval.video: gymnax has no renderer for {self.spec.env_id}")
            gym_env = gymnasium.make(self.spec.env_id, render_mode="rgb_array")
            gym_env.reset()
            vis_gym.set_gym_params(gym_env.unwrapped, self.spec.env_id, self.params)
            self._gym = (gym_env, vis_gym)
        return self._gym


class GymnaxSuite(Suite):
    """`env.suite=gymnax`: pure-JAX envs, vmapped and jitted with the policy."""

    package = "gymnax"
    hint = "pip install gymnax six"

    @staticmethod
    def has(env_id: str) -> bool:
        return env_id in gymnax_ids()

    ids = staticmethod(gymnax_ids)

    @staticmethod
    def make(env_id: str, num_envs: int, seed: int = 0, num_threads: int = 0, kwargs=None):
        return GymnaxEnv(env_id, num_envs, kwargs)

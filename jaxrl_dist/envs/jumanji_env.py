"""Jumanji environments: pure JAX with the legal actions of each state (an action mask),
vmapped over the flat env batch, auto-reset.

The policy sees one flat float32 vector per env: the observation's leaves, in their
pytree order, each flattened and cast, except `action_mask`, which travels apart as
`StepOut.action_mask` (`EnvSpec.masked`). A state with no legal action ends its episode
(terminated): jumanji's Snake steps on after its snake is walled in, although any move
then loses, and elsewhere (Knapsack, TSP, 2048) jumanji itself ends the episode there;
a masked policy is never asked to act with nothing to choose from.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.core.types import EnvSpec, StepOut
from jaxrl_dist.envs.base import EnvMakeError, Suite

# jumanji's registered tasks with one discrete action and an action mask that need no data
# at run time (Sokoban loads its levels from a hub; Minesweeper, JobShop, BinPack... act
# with several discrete choices at once)
ENV_IDS = ("Knapsack-v1", "Snake-v1", "TSP-v1", "CVRP-v1", "Game2048-v1", "Maze-v0",
           "GraphColoring-v1", "SlidingTilePuzzle-v0", "PacMan-v1")
MASK_FIELD = "action_mask"


class JumanjiState(NamedTuple):
    """A batch's env state: jumanji's `[N]` states and the legal actions of each env's
    current observation (`[N, A]` bool), the mask its next action is judged by."""

    inner: Any
    mask: jax.Array


def _observe(observation):
    """One env's jumanji observation as `(flat float32 [D], action_mask [A] bool)`."""
    parts, mask = [], None
    for path, leaf in jax.tree_util.tree_flatten_with_path(observation)[0]:
        if getattr(path[-1], "name", getattr(path[-1], "key", None)) == MASK_FIELD:
            mask = jnp.asarray(leaf, bool)
        else:
            parts.append(jnp.ravel(jnp.asarray(leaf, jnp.float32)))
    return jnp.concatenate(parts), mask


def _strong(tree):
    """`tree` with weakly typed leaves made strong: a reset's state and a step's must have
    the same types, or the rollout's carry would change type (and recompile)."""
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.asarray(x).dtype), tree)


def _env_keys(key, n: int):
    """`[n]` raw `uint32` keys: `key` itself if it holds one per env, else `n` split from it.
    Raw, because jumanji keeps keys in its state, which stays a pytree of plain arrays."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return jax.random.split(key, n) if key.ndim == 1 else key


def _spec(env_id: str, env, observation) -> EnvSpec:
    """The spec of `env`, from the shapes of its first `observation` (`eval_shape`'s)."""
    from jumanji import specs

    act = env.action_spec
    if not isinstance(act, specs.DiscreteArray) or isinstance(act, specs.MultiDiscreteArray):
        raise EnvMakeError(f"env.id {env_id!r}: jumanji action {type(act).__name__}, "
                           "not one discrete choice")
    obs, mask = jax.eval_shape(_observe, observation)
    if mask is None:
        raise EnvMakeError(f"env.id {env_id!r}: its jumanji observation has no {MASK_FIELD}")
    return EnvSpec(env_id, "jumanji", tuple(obs.shape), np.dtype(np.float32), True,
                   int(act.num_values), masked=True)


def _serializable(state) -> None:
    """Register each dataclass type in jumanji's `state` (nested ones too) with flax's
    serialization, as a mapping of its fields, so the shard wire can carry a slot's env
    state to a worker and back (checked against the spec's template like any array)."""
    from flax import serialization

    if not dataclasses.is_dataclass(state) or isinstance(state, type):
        return
    names = [f.name for f in dataclasses.fields(state)]
    serialization.register_serialization_state(
        type(state),
        lambda x: {n: serialization.to_state_dict(getattr(x, n)) for n in names},
        lambda x, d: dataclasses.replace(x, **{n: serialization.from_state_dict(getattr(x, n), d[n], name=n)
                                              for n in names}),
        override=True)
    for n in names:
        _serializable(getattr(state, n))


class JumanjiEnv:
    """`num_envs` copies of one jumanji env, stepped with `vmap`; see the module docstring
    for the observation and the mask."""

    def __init__(self, env_id: str, num_envs: int, kwargs: dict | None = None):
        import jumanji

        self.env = jumanji.make(env_id, **(kwargs or {}))
        self.num_envs = num_envs
        state, timestep = jax.eval_shape(self.env.reset, jax.random.PRNGKey(0))  # traced once, for both
        self.spec = _spec(env_id, self.env, timestep.observation)
        _serializable(state)

    def _reset_one(self, key):
        state, timestep = self.env.reset(key)
        obs, mask = _observe(timestep.observation)
        return state, obs, mask

    def reset(self, key):
        state, obs, mask = jax.vmap(self._reset_one)(_env_keys(key, self.num_envs))
        return JumanjiState(_strong(state), mask), obs

    def action_mask(self, env_state: JumanjiState) -> jax.Array:
        """`[N, A]` bool: the legal actions of the observation `env_state` came with."""
        return env_state.mask

    def _step_one(self, state, mask, action, key):
        """One env's step and, where its episode ended, the next episode's start."""
        illegal = ~mask[action]  # judged by the state the action was taken in
        state, timestep = self.env.step(state, action)
        final_obs, final_mask = _observe(timestep.observation)
        last = timestep.last()
        term = jnp.where(last, timestep.discount == 0, ~final_mask.any())
        trunc = last & ~term
        done = term | trunc
        new_state, new_obs, new_mask = self._reset_one(key)
        state = jax.tree.map(lambda new, old: jnp.where(done, new, old), new_state, state)
        out = StepOut(obs=jnp.where(done, new_obs, final_obs), final_obs=final_obs,
                      reward=jnp.asarray(timestep.reward, jnp.float32), terminated=term,
                      truncated=trunc, valid=jnp.ones_like(done), log_reward=None,
                      episode_end=done, action_mask=jnp.where(done, new_mask, final_mask),
                      illegal=illegal)
        return state, out._replace(log_reward=out.reward)

    def step(self, env_state: JumanjiState, action, key):
        keys = _env_keys(key, action.shape[0])
        action = action.astype(self.env.action_spec.dtype)
        state, out = jax.vmap(self._step_one)(env_state.inner, env_state.mask, action, keys)
        return JumanjiState(_strong(state), out.action_mask), out


def random_legal_return(env_id: str, episodes: int, seed: int = 0, max_steps: int = 10_000,
                        kwargs: dict | None = None) -> np.ndarray:
    """`[episodes]` returns of a uniform random choice among the legal actions, one
    episode per env side by side (NaN where one had not ended after `max_steps` steps):
    the baseline a masked policy has to beat."""
    env = JumanjiEnv(env_id, episodes, kwargs)

    def body(carry):
        t, key, state, ret, ended = carry
        key, act_key, env_key = jax.random.split(key, 3)
        logits = jnp.where(env.action_mask(state), 0.0, -jnp.inf)
        action = jax.random.categorical(act_key, logits)
        state, out = env.step(state, action, env_key)
        ret = ret + jnp.where(ended, 0.0, out.reward)
        return t + 1, key, state, ret, ended | out.episode_end

    @jax.jit
    def play(key):
        key, reset_key = jax.random.split(key)
        state, _ = env.reset(reset_key)
        zeros = jnp.zeros((episodes,), jnp.float32)
        carry = (0, key, state, zeros, zeros.astype(bool))
        _, _, _, ret, ended = jax.lax.while_loop(
            lambda c: (c[0] < max_steps) & ~c[4].all(), body, carry)
        return jnp.where(ended, ret, jnp.nan)

    return np.asarray(play(jax.random.PRNGKey(seed)))


class JumanjiSuite(Suite):
    """`env.suite=jumanji`: pure-JAX envs with legal-action masks, vmapped and jitted with
    the policy (`algo.action_mask`)."""

    package = "jumanji"
    hint = "pip install 'jaxrl-dist[jumanji]'"

    @staticmethod
    def has(env_id: str) -> bool:
        return env_id in ENV_IDS

    @staticmethod
    def ids() -> list:
        return list(ENV_IDS)

    @staticmethod
    def make(env_id: str, num_envs: int, seed: int = 0, num_threads: int = 0, kwargs=None):
        return JumanjiEnv(env_id, num_envs, kwargs)

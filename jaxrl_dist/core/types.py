"""Pytrees that cross function boundaries.

Axis conventions: `S` seeds, `T` time steps, `B` envs per seed, `N = S * B`
envs in one flat env batch. Trajectories are time-major: `[T, S, B, ...]`.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax
from flax import struct


class EnvSpec(NamedTuple):
    """Static description of an environment, read from its spaces."""

    env_id: str
    suite: str
    obs_shape: tuple
    obs_dtype: Any
    discrete: bool
    num_actions: int  # discrete: number of actions; continuous: action dim
    action_low: Any = None  # continuous only, numpy arrays
    action_high: Any = None
    # envpool resets on the step *after* a done; that step is not a real
    # transition and is masked out of the loss.
    delayed_reset: bool = False
    # the env gives the legal actions of each observation (`StepOut.action_mask`)
    masked: bool = False


class StepOut(NamedTuple):
    """What one env step returns for a flat batch `[N, ...]`."""

    obs: jax.Array  # observation the policy acts on next (after any reset)
    final_obs: jax.Array  # observation the transition ended in (before reset)
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    valid: jax.Array  # False where the transition was an envpool reset step
    log_reward: jax.Array  # reward for episode logging (unclipped, unscaled)
    episode_end: jax.Array  # the real end of an episode (not a lost life)
    # masked envs (`EnvSpec.masked`): `[N, A]` bool, the legal actions of `obs`
    action_mask: Any = None
    # masked envs: `[N]` bool, the action the env received was not legal in its state
    illegal: Any = None


class EpisodeStats(NamedTuple):
    """Running episode return/length that survives auto-reset. `[N]` each."""

    ep_return: jax.Array
    ep_length: jax.Array


class RunningMoments(NamedTuple):
    """Running mean/variance (parallel Welford) of a stream of arrays."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array


class NormState(NamedTuple):
    """Observation normaliser and reward scaler statistics of one seed."""

    obs: RunningMoments
    ret: RunningMoments  # moments of the discounted return, for reward scaling
    disc_return: jax.Array  # `[B]` running discounted return per env


class Transition(NamedTuple):
    """One rollout step of every env. Leading axes `[T, S, B]` when stacked."""

    obs: jax.Array
    final_obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    valid: jax.Array
    # episode bookkeeping for logging (not used by the loss)
    done_return: jax.Array  # undiscounted return of an episode ending here, else 0
    done: jax.Array
    # recurrent policies: `[T, ...]` bool, the carry was reset before this step's observation
    reset: Any = None
    # recurrent policies: the segment's initial carry, `[1, ...]` (one time step, the
    # carry before the first observation), so every tree op over the time axis keeps it
    carry: Any = None
    action_mask: Any = None  # masked envs: the legal actions of `obs`
    # recurrent policies: the value of the observation the transition ended in (the
    # bootstrap of a truncated episode), computed in the rollout with the carry it needs
    next_value: Any = None
    illegal: Any = None  # masked envs: the env received an action not legal in its state


class TrainState(struct.PyTreeNode):
    """Learner state of one seed: parameters, optimiser state, gradient-step count, and
    its traced coefficients (`ppo.Hyper`; None: the constants of `tx` and the options).

    `tx` works on the parameters raveled into one vector (see `ppo.make_update`).
    """

    params: Any
    opt_state: optax.OptState
    step: jax.Array
    apply_fn: Any = struct.field(pytree_node=False)
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    hyper: Any = None


class ActorState(NamedTuple):
    """Everything a rollout carries between calls (all seeds)."""

    env_state: Any  # flat `[N]` env state (gymnax pytree or envpool handle)
    obs: jax.Array  # `[N, ...]` raw last observation
    episodes: EpisodeStats
    norm: NormState  # leading `[S]`
    carry: Any = None  # recurrent policies: `[N, ...]` the hidden state after the last step
    reset: Any = None  # recurrent policies: `[N]` bool, `obs` starts an episode
    mask: Any = None  # masked envs: `[N, A]` bool, the legal actions of `obs`


class RunnerState(NamedTuple):
    """The fused trainer's whole state; checkpointed as one pytree."""

    train: TrainState  # leading `[S]`
    actor: ActorState
    key: jax.Array  # `[S, ...]` raw key data (see `rng`)
    update: jax.Array  # scalar update counter

"""The actor's work: a jitted T-step rollout of the current policy.

One `lax.scan` over time; the policy is vmapped over the seed axis `S` while
the env steps one flat batch of `N = S * B` envs (envpool cannot be vmapped).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_dist.core import networks, normalize
from jaxrl_dist.core.types import ActorState, EpisodeStats, StepOut, Transition



def init_episodes(num_envs: int) -> EpisodeStats:
    return EpisodeStats(jnp.zeros((num_envs,), jnp.float32), jnp.zeros((num_envs,), jnp.int32))


def track_episodes(stats: EpisodeStats, out: StepOut):
    """Accumulate episode return/length across auto-resets.

    Returns the new stats, the return of each episode that ended on this step
    (0 elsewhere) and the `[N]` mask of those ends.
    """
    ret = stats.ep_return + out.log_reward * out.valid
    length = stats.ep_length + out.valid.astype(jnp.int32)
    end = out.episode_end & out.valid
    done_return = jnp.where(end, ret, 0.0)
    new = EpisodeStats(jnp.where(end, 0.0, ret), jnp.where(end, 0, length))
    return new, done_return, end


class RolloutOptions(NamedTuple):
    """Static rollout settings (closed over, never traced)."""

    num_steps: int
    num_seeds: int
    normalize_obs: bool
    normalize_reward: bool
    gamma: float
    clip_obs: float = 10.0
    clip_reward: float = 10.0
    unroll: int = 1
    mask_actions: bool = False  # sample from the env's legal actions (`StepOut.action_mask`)


def init_actor(env, key, num_seeds: int, network=None, mask_actions: bool = False) -> ActorState:
    """Reset the env batch and build fresh per-seed normaliser statistics, a recurrent
    `network`'s zero carry (reset flags set) and, with `mask_actions`, the first legal
    actions."""
    env_state, obs = env.reset(key)
    per_seed = env.num_envs // num_seeds
    norm = jax.vmap(lambda _: normalize.init_norm(env.spec.obs_shape, per_seed))(
        jnp.arange(num_seeds))
    # seed the observation statistics with the first observations
    norm = norm._replace(obs=jax.vmap(normalize.update_moments)(norm.obs, _by_seed(obs, num_seeds)))
    carry = None if network is None else networks.initial_carry(network, env.num_envs)
    reset = None if carry is None else jnp.ones((env.num_envs,), bool)
    mask = env.action_mask(env_state) if mask_actions else None
    return ActorState(env_state, obs, init_episodes(env.num_envs), norm, carry, reset, mask)


def _by_seed(x, num_seeds):
    return jax.tree.map(lambda x: x.reshape((num_seeds, x.shape[0] // num_seeds) + x.shape[1:]), x)


def _flat(x):
    return jax.tree.map(lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:]), x)


def make_policy_step(network, spec, opts: RolloutOptions):
    """`policy(params[S], carry[S,B], obs_norm[S,B], reset[S,B], mask[S,B], key[S]) ->
    (carry, action, env_action, log_prob, value)`; carry, reset and mask may be None."""

    def one_seed(params, carry, obs, reset, mask, key):
        carry, out = networks.step(network, params, carry, obs, reset)
        out = networks.mask_logits(out, mask)
        action = networks.sample_action(out, key, spec.discrete)
        return carry, action, networks.log_prob(out, action, spec.discrete), out.value

    def policy(params, carry, obs, reset, mask, keys):
        carry, action, logp, value = jax.vmap(one_seed)(params, carry, obs, reset, mask, keys)
        env_action = action
        if not spec.discrete:  # the env sees the clipped action; the loss the sampled one
            env_action = jnp.clip(action, spec.action_low, spec.action_high)
        return carry, action, env_action, logp, value

    return policy


def _update_norm(opts: RolloutOptions, norm, raw_obs, reward, done, gamma):
    """The step's normaliser statistics and its (scaled, when on) flat `[N]` rewards."""
    S = opts.num_seeds
    if opts.normalize_obs:
        norm = norm._replace(obs=jax.vmap(normalize.update_moments)(norm.obs, _by_seed(raw_obs, S)))
    if opts.normalize_reward:
        norm, reward = jax.vmap(normalize.scale_reward, (0, 0, 0, 0, None))(
            norm, _by_seed(reward, S), _by_seed(done, S), gamma, opts.clip_reward)
        return norm, _flat(reward)
    return norm, reward


def make_rollout(env, network, opts: RolloutOptions):
    """Build `rollout(params[S], actor, key[S], gamma[S]=None) -> (actor, traj[T,S,B], last_value[S,B])`.

    `network` is the flax module (feed-forward, or recurrent: `core.recurrent`).
    `gamma` (each seed's traced discount, for reward scaling; None: `opts.gamma`).
    `traj.obs` is normalised when observation normalisation is on;
    `traj.final_obs` is `None` for envs whose final observation is the next one.
    `last_value` is the value of the observation the rollout stopped at: the
    bootstrap for the last step of those envs (jit drops it where unused).
    A recurrent network's carry rides in the actor state, reset where an episode
    starts; `traj.carry` is the segment's initial carry (`[1, S, B, ...]`),
    `traj.reset` the flags each step was taken with, and `traj.next_value` the
    value of each transition's final observation under the carry it needs.
    """
    S = opts.num_seeds
    env_step = _make_env_step(env, network, opts)
    observe, values = _observer(opts), _values(network)
    seeds = lambda x: None if x is None else _by_seed(x, S)  # noqa: E731

    def rollout(params, actor: ActorState, key, gamma=None):
        keys = jnp.swapaxes(jax.vmap(lambda k: jax.random.split(k, opts.num_steps))(key), 0, 1)
        gamma = jnp.full((S,), opts.gamma, jnp.float32) if gamma is None else gamma

        def scan_step(actor, step_keys):
            return env_step(params, actor, step_keys, gamma)

        first = actor.carry
        actor, traj = jax.lax.scan(scan_step, actor, keys, unroll=opts.unroll)
        traj = traj._replace(carry=jax.tree.map(lambda c: _by_seed(c, S)[None], first))
        last_value = values(params, seeds(actor.carry), observe(actor.norm, actor.obs), seeds(actor.reset))
        return actor, traj, last_value

    return rollout


def _observer(opts: RolloutOptions):
    """`observe(norm, obs[N]) -> obs[S, B]`, normalised when observation normalisation is on."""
    norm_obs = jax.vmap(normalize.normalize, (0, 0, None))

    def observe(norm, obs):
        obs = _by_seed(obs, opts.num_seeds)
        return norm_obs(norm.obs, obs, opts.clip_obs) if opts.normalize_obs else obs

    return observe


def _values(network):
    """`values(params[S], carry[S,B], obs[S,B], reset[S,B]) -> value[S,B]` of one step."""

    def values(params, carry, obs, reset):
        step = lambda p, c, o, r: networks.step(network, p, c, o, r)[1].value  # noqa: E731
        return jax.vmap(step)(params, carry, obs, reset)

    return values


def _make_env_step(env, network, opts: RolloutOptions):
    """`env_step(params[S], actor, keys[S], gamma[S]) -> (actor, Transition[S, B])`: one
    step of the policy and the envs (the body of `make_rollout`'s scan)."""
    spec, S = env.spec, opts.num_seeds
    policy = make_policy_step(network, spec, opts)
    recurrent = networks.is_recurrent(network)
    observe, values = _observer(opts), _values(network)
    seeds = lambda x: None if x is None else _by_seed(x, S)  # noqa: E731

    def env_step(params, actor: ActorState, keys, gamma):
        step_keys = jax.vmap(jax.random.split)(keys)  # [S, 2]
        obs = observe(actor.norm, actor.obs)
        reset, mask = seeds(actor.reset), seeds(actor.mask)
        carry, action, env_action, logp, value = policy(params, seeds(actor.carry), obs, reset, mask,
                                                        step_keys[:, 0])
        # each seed's envs draw from that seed's stream, so a seed's data does not
        # depend on which other seeds share the batch (or the device)
        env_keys = jax.vmap(lambda k: jax.random.split(k, env_action.shape[1]))(step_keys[:, 1])
        env_state, out = env.step(actor.env_state, _flat(env_action), _flat(env_keys))
        episodes, done_return, ended = track_episodes(actor.episodes, out)
        done = out.terminated | out.truncated
        norm, reward = _update_norm(opts, actor.norm, out.obs, out.reward, done, gamma)
        final_obs = None if spec.delayed_reset else observe(norm, out.final_obs)
        next_value = None
        if recurrent:  # a final observation's value needs the carry this step left
            next_value = final_obs if final_obs is None else values(
                params, carry, final_obs, jnp.zeros(done.shape, bool).reshape(S, -1))
            final_obs = None
        tr = Transition(obs=obs, final_obs=final_obs, action=action, log_prob=logp, value=value,
                        reward=_by_seed(reward, S), terminated=_by_seed(out.terminated, S),
                        truncated=_by_seed(out.truncated, S), valid=_by_seed(out.valid, S),
                        done_return=_by_seed(done_return, S), done=_by_seed(ended, S),
                        reset=reset, action_mask=mask, next_value=next_value,
                        illegal=seeds(out.illegal))
        # envpool's reset step (invalid) returns a new episode's first observation
        next_reset = None if not recurrent else (~out.valid if spec.delayed_reset else done)
        next_mask = out.action_mask if opts.mask_actions else None
        return ActorState(env_state, out.obs, episodes, norm, _flat(carry), next_reset, next_mask), tr

    return env_step

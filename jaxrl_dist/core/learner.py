"""The one learner: parameter init, the optimiser, the CPU rules and the jitted update
program that the fused, sync and async trainers and the scheduling MDP all use.

A learner update takes the `[T, K, B]` trajectories of `K` shard slots (the
first `n` real, the rest padding it masks out) and runs the core PPO update
(`ppo.make_update`) once over them. The fused trainer runs the same update on
its own `[T, B]` batch (`make_setup` in `trainers.fused` builds it from the
pieces here).
"""
from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_dist.core import mesh as meshes, networks, ppo, rng
from jaxrl_dist.core.types import TrainState


class Learner(NamedTuple):
    """The learner's static pieces."""

    network: Any  # flax module: `apply(params, obs) -> PolicyOutput`
    spec: Any  # the env's `EnvSpec`
    tx: Any
    update: Any  # jitted (train, traj[T,K,B], boot[K,B], n, key, lag=None) -> (train, metrics)
    num_rounds: int  # rounds the LR schedule and the run are sized for
    steps_per_shard: int
    update_fn: Any = None  # `update`, not jitted
    hyper: Any = None  # `ppo.Hyper` of `algo`: the traced coefficients each train state starts with


def loop_free(network) -> bool:
    """Whether the update must stay out of XLA loops on this platform.

    On CPU, convolution gradients inside a `while` loop run about 20x slower
    than the same ops outside one (measured: 4 Nature-CNN minibatch steps take
    54 s in a `lax.scan`, 3 s unrolled). CNN updates are therefore unrolled
    (and the fused trainer's chunks hold one update); the rollout scan only
    runs the forward pass, which is unaffected.
    """
    return getattr(network, "torso", None) == "cnn" and jax.default_backend() == "cpu"


def tx_maker(a, grad_steps: int):
    """`(lr, max_grad_norm) -> optimiser` for `algo`: the LR decays over `grad_steps`
    when `algo.anneal_lr` (`PPOOptions.make_tx`: each update builds it from its
    member's traced values)."""
    return partial(ppo.make_optimizer, adam_eps=a.adam_eps, anneal_steps=grad_steps if a.anneal_lr else 0)


def make_optimizer(a, grad_steps: int):
    """`algo`'s optimiser with its values as constants (the train state's `tx`: it
    initialises the optimiser state, whose shapes do not depend on them)."""
    return tx_maker(a, grad_steps)(a.lr, a.max_grad_norm)


# one program per network and observation spec (same bits as flax's op-by-op init): it
# lands in the persistent compile cache across processes and in JAX's own within one
_jitted_init_params = jax.jit(networks.init_params, static_argnums=(0, 1, 2))


def init_train_state(network, tx, spec, key, jit_params: bool = False, hyper=None) -> TrainState:
    """Parameters and optimiser state of one seed, with its traced coefficients `hyper`
    (`ppo.Hyper`; None: the constants of `tx`); `jit_params`: the params from one
    jitted program (a fresh CLI process with a warm compile cache: ~0.5 s here, not the
    1-2.5 s of the op-by-op init), else op by op (vmappable, traceable)."""
    init = _jitted_init_params if jit_params else networks.init_params
    params = init(network, tuple(spec.obs_shape), spec.obs_dtype, key)
    hyper = None if hyper is None else jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), hyper)
    return TrainState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32),
                      apply_fn=network.apply, tx=tx, hyper=hyper)


def episode_metrics(done_return, done, axis=None) -> dict:
    """Sum and count of the episodes that ended in a rollout (reduced over `axis`),
    and their mean return (NaN without any)."""
    ret_sum = done_return.sum(axis=axis)
    count = done.sum(axis=axis).astype(jnp.float32)
    return {"episode_return_sum": ret_sum, "episodes": count,
            "return_mean": jnp.where(count > 0, ret_sum / jnp.maximum(count, 1.0), jnp.nan)}


def mask_metrics(traj, axis=None) -> dict:
    """Of a masked env's trajectory (reduced over `axis`): `illegal_actions`, the actions
    the envs received that were not legal in their state (as the envs counted them), and
    `no_legal_actions`, the steps the policy had to act on with no legal action (an
    error the trainers raise: see `trainers.logger.check_legal`). Empty for other envs."""
    out = {}
    if traj.illegal is not None:
        out["illegal_actions"] = (traj.illegal & traj.valid).sum(axis=axis).astype(jnp.float32)
    if traj.action_mask is not None:
        stuck = ~traj.action_mask.any(-1) & traj.valid
        out["no_legal_actions"] = stuck.sum(axis=axis).astype(jnp.float32)
    return out


def make_learn_fn(apply_fn, opts: ppo.PPOOptions):
    """`learn(train, traj[T,K,B], boot[K,B], n, key, lag=None) -> (train, metrics)`, not
    jitted (the learned scheduler's training runs it inside its own program).
    `lag` (`[K]`, the async trainer's): params versions each shard's data lags
    the learner by; shards with a lag get the off-policy correction."""
    update = ppo.make_update(apply_fn, opts._replace(masked=True))

    def learn(train: TrainState, traj, boot, n, key, lag=None):
        K = boot.shape[0]
        real = (jnp.arange(K) < n)[None, :, None]
        traj = traj._replace(valid=traj.valid & real, done=traj.done & real,
                             done_return=jnp.where(real, traj.done_return, 0.0))
        flat = jax.tree.map(lambda x: x.reshape((x.shape[0], -1) + x.shape[3:]), traj)
        by_sample = lambda m: jnp.broadcast_to(m, traj.valid.shape).reshape(flat.valid.shape)  # noqa: E731
        stale = None if lag is None else by_sample((jnp.asarray(lag) > 0)[None, :, None])
        train, metrics = update(train, flat, boot.reshape(-1), key, by_sample(real), stale)
        metrics.update(episode_metrics(flat.done_return, flat.done))
        metrics.update(mask_metrics(flat))
        return train, metrics

    return learn


def grad_steps(a, num_rounds: int) -> int:
    """Optimiser steps the LR schedule decays over: by samples under `algo.minibatch_size`
    (a round of n shards takes n times the steps), else a fixed count per round."""
    if a.minibatch_size:
        return a.update_epochs * (a.total_timesteps // a.minibatch_size)
    return num_rounds * a.update_epochs * a.num_minibatches


def update_sharding(trainer, envs_per_shard: int):
    """Where an update's minibatch samples go under `trainer.devices` (None: one device);
    each shard's envs must split evenly over the data axis."""
    mesh = meshes.data_mesh(trainer, envs_per_shard, "backend.envs_per_shard")
    return None if mesh is None else meshes.samples(mesh)


def make_learner(a, network, spec, expected_shards: float, *, envs_per_shard: int, rho_bar: float = 1.0,
                 c_bar: float = 1.0, sharding=None) -> Learner:
    """The shard trainers' learner for the `algo.*` keys `a`, with rounds of
    `expected_shards` shards of `envs_per_shard` envs sizing the LR schedule; `rho_bar`
    and `c_bar`: the V-trace truncations of a stale chunk (`asynchronous.*`); over
    several devices (`sharding`, `update_sharding`'s) each minibatch's samples are split
    over them and the gradients averaged."""
    steps_per_shard = envs_per_shard * a.num_steps
    num_rounds = max(1, int(round(a.total_timesteps / (expected_shards * steps_per_shard))))
    make_tx = tx_maker(a, grad_steps(a, num_rounds))
    opts = ppo.options(a, discrete=spec.discrete, masked=True, unroll=loop_free(network),
                       minibatch_size=a.minibatch_size or 0, rho_bar=rho_bar, c_bar=c_bar,
                       batch_sharding=sharding, make_tx=make_tx)
    fn = make_learn_fn(network.apply, opts)
    return Learner(network, spec, make_tx(a.lr, a.max_grad_norm), jax.jit(fn, donate_argnums=0), num_rounds,
                   steps_per_shard, fn, ppo.hyper(a))


def init_train(learner: Learner, seed: int) -> TrainState:
    return init_train_from_key(learner, jax.random.fold_in(rng.key(seed), 3))


def init_train_from_key(learner: Learner, key) -> TrainState:
    return init_train_state(learner.network, learner.tx, learner.spec, key, jit_params=True, hyper=learner.hyper)

"""The single-process fast path: rollout + PPO update repeated inside one jit.

`make_train_chunk` scans `K` updates in one compiled call; the runner calls it
repeatedly (the same executable every time) so it can log and checkpoint
between chunks. With `K` equal to the number of updates the whole training is
one call. Seeds are a leading axis on every piece of state.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_dist.core import learner, mesh as meshes, ppo, rng
from jaxrl_dist.config import Config, ConfigError, Derived, check_policy, derive, num_minibatches, require, validate
from jaxrl_dist.core.networks import check_output, is_recurrent, make_network
from jaxrl_dist.core.rollout import RolloutOptions, init_actor, make_rollout
from jaxrl_dist.core.types import RunnerState


class Setup(NamedTuple):
    """Everything static that a trainer closes over."""

    cfg: Config
    derived: Derived
    network: Any
    tx: Any
    rollout_opts: RolloutOptions
    ppo_opts: ppo.PPOOptions
    loop_free: bool = False  # each chunk is one update with unrolled minibatches
    mesh: Any = None  # `trainer.devices` > 1: the seeds x data mesh (`core.mesh`)
    hyper: Any = None  # `ppo.Hyper` of `cfg.algo`, every seed's traced coefficients at the start


def data_mesh(cfg: Config, spec) -> Optional[Mesh]:
    """The mesh `trainer.devices` asks for (None for one device); a `ConfigError` naming
    the keys and counts where the devices or the env count do not fit it."""
    if spec.suite == "envpool" and meshes.mesh_shape(cfg.trainer, jax.device_count()) is not None:
        raise ConfigError(f"trainer.devices={cfg.trainer.devices}: envpool steps one pool on the host; "
                          "data-parallel training needs a JAX env suite (gymnax, brax)")
    return meshes.data_mesh(cfg.trainer, cfg.env.num_envs, "env.num_envs")


def make_setup(cfg: Config, spec, unroll: int = 1, network=None, loss=None) -> Setup:
    """Everything static for `cfg` on an env with `spec`; `network` (a flax module) and
    `loss` (a loss function) replace the ones `algo.network` and `algo.loss` name."""
    mesh = data_mesh(cfg, spec)
    derived = derive(cfg, continuous=not spec.discrete)
    a = cfg.algo
    network = (check_output(network, spec, "make_train(network=...)") if network is not None
               else make_network(spec, a.network, a.hidden_sizes, a.activation, a.network_options))
    mask = check_policy(cfg, spec.suite, is_recurrent(network), spec.masked)
    m = num_minibatches(a, derived.batch_size)
    make_tx = learner.tx_maker(a, derived.num_updates * a.update_epochs * m)
    ropts = RolloutOptions(a.num_steps, cfg.num_seeds, derived.normalize_obs,
                           derived.normalize_reward, a.gamma, cfg.env.clip_obs,
                           cfg.env.clip_reward, unroll, mask)
    loop_free = learner.loop_free(network)
    # the fused batch is never padded: minibatch_size only sets the count `m`
    popts = ppo.options(a, loss, discrete=spec.discrete, masked=spec.delayed_reset, unroll=loop_free,
                        num_minibatches=m, batch_sharding=mesh and meshes.samples(mesh), make_tx=make_tx)
    return Setup(cfg, derived, network, make_tx(a.lr, a.max_grad_norm), ropts, popts, loop_free, mesh,
                 ppo.hyper(a))


def init_runner(setup: Setup, env, seed: int, hyper=None) -> RunnerState:
    """Fresh state for `num_seeds` seeds, each with the traced coefficients `hyper`
    (`ppo.Hyper` of scalars; None: `setup.hyper`); resets the env (host side for envpool)."""
    S = setup.cfg.num_seeds
    hyper = setup.hyper if hyper is None else hyper
    init_key, env_key, run_key = jax.random.split(rng.key(seed), 3)
    init = lambda k: learner.init_train_state(setup.network, setup.tx, env.spec, k, hyper=hyper)  # noqa: E731
    keys = jax.random.split(init_key, S)
    if isinstance(keys, jax.core.Tracer) and jax.default_backend() == "cpu":
        # inside a jit on CPU a loop over seeds, not a vmap: XLA:CPU can lose the
        # completion of a program holding several batched QRs (the orthogonal inits) and
        # never return. Same bits; called eagerly, the vmap runs op by op, one QR at a time.
        train = jax.lax.map(init, keys)
    else:
        train = jax.vmap(init)(keys)
    actor = init_actor(env, env_key, S, setup.network, setup.rollout_opts.mask_actions)
    keys = rng.unwrap(jax.random.split(run_key, S))
    return RunnerState(train, actor, keys, jnp.zeros((), jnp.int32))


def make_update_step(setup: Setup, env):
    """`step(runner) -> (runner, metrics)`: one rollout and one PPO update per seed."""
    apply_fn = setup.network.apply
    rollout = make_rollout(env, setup.network, setup.rollout_opts)
    update = jax.vmap(ppo.make_update(apply_fn, setup.ppo_opts),
                      spmd_axis_name=meshes.SEEDS if setup.mesh is not None else None)

    def step(runner: RunnerState, _=None):
        keys = jax.vmap(lambda k: jax.random.split(k, 3))(rng.wrap(runner.key))
        actor, traj, last_value = rollout(runner.train.params, runner.actor, keys[:, 1],
                                          runner.train.hyper.gamma)
        seed_major = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), traj)
        train, metrics = update(runner.train, seed_major, last_value, keys[:, 2])
        metrics.update(learner.episode_metrics(traj.done_return, traj.done, axis=(0, 2)))
        metrics.update(learner.mask_metrics(traj, axis=(0, 2)))
        return RunnerState(train, actor, rng.unwrap(keys[:, 0]), runner.update + 1), metrics

    return step


def seed_devices(setup: Setup, spec) -> list:
    """The devices the seeds are split over: as many local devices as divide
    `num_seeds` (one on a single-device host, for envpool and for one seed).

    Seeds are independent, so each device runs its slice with no
    communication; on CPU, `--xla_force_host_platform_device_count` turns the
    cores into devices and the seeds then use all of them.
    """
    S = setup.cfg.num_seeds
    if spec.suite == "envpool":  # one C++ pool steps every seed's envs
        return jax.local_devices()[:1]
    count = max(d for d in range(1, jax.local_device_count() + 1) if S % d == 0)
    return jax.local_devices()[:count]


def _local_setup(setup: Setup, num_devices: int) -> Setup:
    """The setup one device runs: its slice of the seeds."""
    S = setup.cfg.num_seeds // num_devices
    cfg = dataclasses.replace(setup.cfg, num_seeds=S)
    return setup._replace(cfg=cfg, rollout_opts=setup.rollout_opts._replace(num_seeds=S))


def _seed_sharded(chunk, devices):
    """`chunk` run with every state leaf's leading (seed or env) axis split over `devices`."""
    mesh = Mesh(np.array(devices), ("seeds",))

    def spec(x):
        return P("seeds") if x.ndim else P()

    def run(runner):
        specs = jax.tree.map(spec, runner)
        return jax.shard_map(chunk, mesh=mesh, in_specs=(specs,), out_specs=(specs, P(None, "seeds")),
                             check_vma=False)(runner)

    return run


def runner_shardings(setup: Setup, env):
    """Where each leaf of the runner state lives on `setup.mesh`: the flat env batch
    (`[N]`, seed-major) and the per-env return of the reward scaling (`[S, B]`) over
    seeds x data, every other per-seed leaf (params, optimiser, normaliser moments,
    keys) over seeds and replicated over data, scalars everywhere."""
    mesh, N = setup.mesh, env.num_envs
    shapes = jax.eval_shape(lambda: init_runner(setup, env, 0))

    def place(path, x):
        where = jax.tree_util.keystr(path)
        if not x.ndim:
            return NamedSharding(mesh, P())
        if where.startswith(".actor") and ".norm" not in where and x.shape[0] == N:
            return NamedSharding(mesh, P((meshes.SEEDS, meshes.DATA)))
        if where.endswith(".disc_return"):
            return NamedSharding(mesh, P(meshes.SEEDS, meshes.DATA))
        return NamedSharding(mesh, P(meshes.SEEDS))

    return jax.tree_util.tree_map_with_path(place, shapes)


def make_train_chunk(setup: Setup, env, num_updates: int):
    """Jitted `chunk(runner) -> (runner, metrics[K, S])` running `K = num_updates` updates.

    With `setup.loop_free` a chunk is one update (`K` must be 1). Seeds are
    split over `seed_devices`; on a mesh (`trainer.devices` > 1) the runner lives
    where `runner_shardings` says and the metrics are replicated.
    """
    devices = [None] if setup.mesh is not None else seed_devices(setup, env.spec)
    step = make_update_step(_local_setup(setup, len(devices)), env)
    if setup.loop_free:
        if num_updates != 1:
            raise ValueError(f"a loop-free setup runs one update per chunk, got {num_updates}")

        def chunk(runner: RunnerState):
            runner, metrics = step(runner)
            return runner, jax.tree.map(lambda x: x[None], metrics)
    else:
        def chunk(runner: RunnerState):
            return jax.lax.scan(step, runner, None, length=num_updates)

    if setup.mesh is not None:
        where = runner_shardings(setup, env)
        return jax.jit(chunk, in_shardings=(where,), out_shardings=(where, meshes.replicated(setup.mesh)),
                       donate_argnums=0)
    if len(devices) > 1:
        chunk = _seed_sharded(chunk, devices)
    return jax.jit(chunk, donate_argnums=0)


def make_train(cfg: Config, env, unroll: int = 1, network=None, loss=None):
    """Whole training: `train(seed) -> (runner, metrics[U, S])`.

    The env is reset on the host first (envpool needs that), then every
    update runs inside a single compiled program; a loop-free setup (CNN on
    CPU) calls its one-update program once per update instead.
    """
    validate(cfg)
    envs = cfg.env.num_envs * cfg.num_seeds
    require(env.num_envs == envs, f"make_train: the env has {env.num_envs} envs; the config's seeds need "
            f"env.num_envs*num_seeds={envs} (make_env(cfg.env.id, cfg.env.num_envs * cfg.num_seeds))")
    setup = make_setup(cfg, env.spec, unroll, network, loss)
    updates = setup.derived.num_updates
    chunk = make_train_chunk(setup, env, 1 if setup.loop_free else updates)

    def train(seed: int):
        runner = init_runner(setup, env, seed)
        if not setup.loop_free:
            return chunk(runner)
        parts = []
        for _ in range(updates):
            runner, metrics = chunk(runner)
            parts.append(metrics)
        return runner, jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)

    return train


def chunk_size(num_updates: int, log_chunks: int, checkpoint_every: int = 0,
               loop_free: bool = False) -> int:
    """`K` dividing `num_updates` (and `checkpoint_every`), so every chunk call reuses
    one executable, with about `log_chunks` chunks in the run: of the divisors up to
    twice `num_updates / log_chunks`, the nearest to it by ratio (on a tie the larger).

    Each call costs about a millisecond of launch on CPU; taking the largest divisor
    below the target instead gave 976 updates 61 chunks of 16, not 16 of 61. A
    loop-free setup always gets 1.
    """
    if loop_free:
        return 1
    limit = int(num_updates if not checkpoint_every else np.gcd(num_updates, checkpoint_every))
    target = max(1.0, num_updates / max(1, log_chunks))
    sizes = [k for k in range(1, int(min(limit, 2 * target)) + 1) if limit % k == 0]
    return min(sizes, key=lambda k: (abs(math.log(k / target)), -k))

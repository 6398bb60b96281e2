"""Training the learned scheduler: the scheduling MDP (`scheduling.mdp`) of a task,
trained (or fine-tuned) with the fused trainer's PPO (`jaxrl-dist scheduler train`)."""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.config import AlgoConfig, Config, ConfigError, EnvConfig
from jaxrl_dist.scheduling.learned import Trained
from jaxrl_dist.scheduling.mdp import FEATURES, Scale, SchedOptions, SchedulingEnv
from jaxrl_dist.scheduling.profile import Profile, load_profile, profile_file
from jaxrl_dist.trainers import fused


def task_and_options(cfg: Config, max_rounds: int, time_weight: float, target_bonus: float,
                     profile=None, scale: Optional[Scale] = None):
    """`(task config, SchedOptions)` of a scheduling MDP from the task's config `cfg`
    (`jaxrl-dist scheduler train` composes it with `backend=local`; `bench/scheduler_mdp.py`).

    The task runs on the local backend with `scheduler.max_shards` (else
    `backend.max_shards`) slots. `profile`: a `Profile`, a profile file, or None
    for the one shipped for `env.id` (else the defaults). `scale`: None for the
    task's return range, `scheduler.min_return`..`max_return` (else 0..target).
    """
    target = cfg.run.target_return
    if target is None:
        raise ConfigError("run.target_return: the scheduler is trained to reach a target return")
    M = cfg.scheduler.max_shards or cfg.backend.max_shards
    cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, max_shards=M))
    if not isinstance(profile, Profile):
        found = profile_file(cfg.env.id, profile)
        profile = load_profile(found) if found else Profile()
    s = cfg.scheduler
    scale = scale or Scale(s.min_return or 0.0, s.max_return or target, max_rounds, M)
    return cfg, SchedOptions(M, max_rounds, target, time_weight, target_bonus, profile, scale)


def scheduler_config(env: SchedulingEnv, num_envs: int, num_steps: int, updates: int,
                     hidden=(64, 64), lr: float = 3e-4):
    """The core PPO's config for training the scheduler on `env`."""
    return Config(env=EnvConfig(id=env.spec.env_id, num_envs=num_envs),
                  algo=AlgoConfig(total_timesteps=num_envs * num_steps * updates, num_steps=num_steps,
                                  update_epochs=4, num_minibatches=2, lr=lr, ent_coef=0.01,
                                  hidden_sizes=tuple(hidden)))


def train_scheduler(env: SchedulingEnv, num_steps: int, updates: int, seed: int = 0,
                    init_from=None, chunk: int = 1, log=print) -> Trained:
    """Train (or fine-tune, from a `Trained`) the scheduler policy with `fused`'s PPO."""
    M = init_from.meta["max_shards"] if init_from is not None else env.opts.max_shards
    if M != env.opts.max_shards:  # the policy head has one logit per n: checked before compiling
        raise ConfigError(f"scheduler.init_from: that scheduler chooses from 1..{M} shards; "
                          f"set scheduler.max_shards={M} to fine-tune it")
    cfg = scheduler_config(env, env.num_envs, num_steps, updates)
    setup = fused.make_setup(cfg, env.spec)
    step = fused.make_train_chunk(setup, env, chunk)
    runner = fused.init_runner(setup, env, seed)
    if init_from is not None:
        params = jax.tree.map(lambda x: jnp.asarray(x)[None], init_from.params)
        runner = runner._replace(train=runner.train.replace(params=params))
    for u in range(0, updates, chunk):
        runner, metrics = step(runner)
        ret = np.asarray(metrics["return_mean"])
        log(f"scheduler update {u + chunk}/{updates}: episode return "
            f"{np.nanmean(ret) if np.isfinite(ret).any() else float('nan'):.3f}, "
            f"episodes {float(np.sum(metrics['episodes'])):.0f}")
    params = jax.tree.map(lambda x: np.asarray(x[0]), runner.train.params)
    return Trained(params, _meta(env, cfg))


def _meta(env: SchedulingEnv, cfg) -> dict:
    o = env.opts
    return {"env_id": env.task_cfg.env.id, "cost": dataclasses.asdict(env.cost_cfg),
            "max_shards": o.max_shards, "scale": o.scale._asdict(), "profile": o.profile._asdict(),
            "max_rounds": o.max_rounds, "target_return": o.target_return,
            "time_weight": o.time_weight, "target_bonus": o.target_bonus,
            "budgets": list(o.budgets), "deadlines": list(o.deadlines), "no_limit": o.no_limit,
            "features": list(FEATURES), "hidden_sizes": list(cfg.algo.hidden_sizes),
            "activation": cfg.algo.activation}

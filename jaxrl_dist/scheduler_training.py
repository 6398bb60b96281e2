"""Training the learned scheduler: the scheduling MDP (`scheduling.mdp`) of a task,
trained (or fine-tuned) with the fused trainer's PPO (`jaxrl-dist scheduler train`)."""
from __future__ import annotations

import dataclasses
import sys
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.config import AlgoConfig, Config, ConfigError, EnvConfig, LearnedSchedulerConfig
from jaxrl_dist.scheduling import learned
from jaxrl_dist.scheduling.learned import Trained
from jaxrl_dist.scheduling.mdp import BASE_FEATURES, FEATURES, Scale, SchedOptions, SchedulingEnv, feature_columns
from jaxrl_dist.scheduling.profile import Profile, load_profile, measured_on, profile_file
from jaxrl_dist.scheduling.schedulers import shard_range
from jaxrl_dist.trainers import fused


def task_and_options(cfg: Config, max_rounds: int, time_weight: float, target_bonus: float,
                     profile=None, scale: Optional[Scale] = None, limits: Optional[dict] = None):
    """`(task config, SchedOptions)` of a scheduling MDP from the task's config `cfg`
    (`jaxrl-dist scheduler train` composes it with `backend=local`; `bench/scheduler_mdp.py`).

    The task runs on the local backend with `scheduler.max_shards` (else
    `backend.max_shards`) slots. `profile`: a `Profile`, a profile file, or None
    for the one shipped for `env.id` (else the defaults). `scale`: None for the
    task's return range, `scheduler.min_return`..`max_return` (else 0..target).
    `limits`: `SchedOptions` fields to override for the limits episodes draw and what
    they earn under one (`budgets`, `deadlines`: `(lo, hi)`; `limit_reward`).
    """
    target = cfg.run.target_return
    if target is None:
        raise ConfigError("run.target_return: the scheduler is trained to reach a target return")
    s = cfg.scheduler
    if not isinstance(s, LearnedSchedulerConfig):  # min_return, max_return, init_from are its keys
        raise ConfigError(f"scheduler={s.name}: scheduler train trains a learned scheduler; drop scheduler= "
                          "(its keys: scheduler.max_shards, min_return, max_return, init_from)")
    M = shard_range(s, cfg.backend)[1]  # a file for more shards than the backend has: no run could load it
    cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, max_shards=M))
    if not isinstance(profile, Profile):
        found = profile_file(cfg.env.id, profile)
        profile = load_profile(found) if found else Profile()
        other = measured_on(found) if found else None
        if other not in (None, cfg.env.id):  # one --profile for several tasks, or a copied file
            print(f"note: {cfg.env.id} is modeled with the latencies of {other} (the profile {found} was "
                  f"measured on it; jaxrl-dist calibrate env.id={cfg.env.id} measures its own)", file=sys.stderr)
    if scale is None:
        key = "run.target_return" if s.max_return is None else "scheduler.max_return"
        scale = Scale(*learned.return_range(cfg, s.max_return or target, key), max_rounds, M)
    return cfg, SchedOptions(M, max_rounds, target, time_weight, target_bonus, profile, scale,
                             **(limits or {}))


def features_for(given: Optional[str], init=None) -> tuple:
    """The feature names a scheduler trains on: `given` is "base", "all" or names,
    comma-separated (`scheduler train --features`); None gives the base set, and when
    fine-tuning from `init`, whatever more that file reads (each in `FEATURES`' order)."""
    if given is None:
        more = set(init.meta.get("features") or ()) if init is not None else set()
        return tuple(f for f in FEATURES if f in BASE_FEATURES or f in more)
    names = {"base": BASE_FEATURES, "all": FEATURES}.get(given) or tuple(given.split(","))
    feature_columns(names)  # one line naming an unknown one, before anything compiles
    return tuple(names)


def scheduler_config(env: SchedulingEnv, num_envs: int, num_steps: int, updates: int,
                     hidden=(64, 64), recipe: Optional["Recipe"] = None):
    """The core PPO's config for training the scheduler on `env`."""
    r = recipe or Recipe()
    return Config(env=EnvConfig(id=env.spec.env_id, num_envs=num_envs),
                  algo=AlgoConfig(total_timesteps=num_envs * num_steps * updates, num_steps=num_steps,
                                  update_epochs=r.epochs, num_minibatches=r.minibatches, lr=r.lr,
                                  ent_coef=r.ent_coef, hidden_sizes=tuple(hidden)))


class Recipe(NamedTuple):
    """The scheduler's own PPO settings. Its network is tiny next to the task runs its
    samples cost, so more epochs over each rollout are nearly free."""

    epochs: int = 4
    minibatches: int = 2
    lr: float = 3e-4
    ent_coef: float = 0.01


def train_scheduler(envs, num_steps: int, updates: int, seed: int = 0, init_from=None,
                    chunk: int = 1, log=print, recipe: Optional[Recipe] = None) -> Trained:
    """Train (or fine-tune, from a `Trained`) one scheduler policy with `fused`'s PPO.

    `envs`: a `SchedulingEnv` or several (one per task, the same shard range and
    episode count): `updates` counts every task's, taken in turn, each task's
    episodes carrying on where its last update left them, one policy and one
    optimiser for all (a generalist)."""
    envs = list(envs) if isinstance(envs, (list, tuple)) else [envs]
    check_tasks(envs, init_from)
    cfg = scheduler_config(envs[0], envs[0].num_envs, num_steps, updates, recipe=recipe)
    setup = fused.make_setup(cfg, envs[0].spec)
    steps = [fused.make_train_chunk(setup, env, chunk) for env in envs]
    runners = [fused.init_runner(setup, env, seed + i) for i, env in enumerate(envs)]
    train = runners[0].train
    if init_from is not None:  # a file of fewer features starts as the same policy over the task's
        init_from = learned.widen(init_from, envs[0].opts.features)
        train = train.replace(params=jax.tree.map(lambda x: jnp.asarray(x)[None], init_from.params))
    for k, u in enumerate(range(0, updates, chunk)):
        i = k % len(envs)
        runners[i], metrics = steps[i](runners[i]._replace(train=train))
        train = runners[i].train
        ret = np.asarray(metrics["return_mean"])
        log(f"scheduler update {u + chunk}/{updates} ({envs[i].task_cfg.env.id}): episode return "
            f"{np.nanmean(ret) if np.isfinite(ret).any() else float('nan'):.3f}, "
            f"episodes {float(np.sum(metrics['episodes'])):.0f}")
    params = jax.tree.map(lambda x: np.asarray(x[0]), train.params)
    return Trained(params, _meta(envs, cfg))


def check_tasks(envs: list, init_from) -> None:
    """One policy head for every task and the file it starts from: refused before compiling."""
    M = init_from.meta["max_shards"] if init_from is not None else envs[0].opts.max_shards
    if M != envs[0].opts.max_shards:  # the policy head has one logit per n
        raise ConfigError(f"scheduler.init_from: that scheduler chooses from 1..{M} shards; "
                          f"set scheduler.max_shards={M} to fine-tune it")
    for env in envs[1:]:
        if env.opts.max_shards != M or env.num_envs != envs[0].num_envs:
            raise ConfigError(f"scheduler.max_shards: every task of one scheduler chooses from 1..{M} "
                              f"shards; {env.task_cfg.env.id} has {env.opts.max_shards}")
        if env.opts.features != envs[0].opts.features:
            raise ConfigError(f"--features: every task of one scheduler sees the same features; "
                              f"{env.task_cfg.env.id} sees {', '.join(env.opts.features)}")


def _task_meta(env: SchedulingEnv) -> dict:
    o = env.opts
    return {"env_id": env.task_cfg.env.id, "scale": o.scale._asdict(), "profile": o.profile._asdict(),
            "max_rounds": o.max_rounds, "target_return": o.target_return}


def _meta(envs: list, cfg) -> dict:
    """The file's metadata: the first task's fields at the top level (what a one-task
    file has always held) and every task's under `tasks`."""
    o = envs[0].opts
    return {**_task_meta(envs[0]), "tasks": [_task_meta(e) for e in envs],
            "cost": dataclasses.asdict(envs[0].cost_cfg), "max_shards": o.max_shards,
            "time_weight": o.time_weight, "target_bonus": o.target_bonus, "limit_reward": o.limit_reward,
            "budgets": list(o.budgets), "deadlines": list(o.deadlines), "no_limit": o.no_limit,
            "features": list(o.features), "hidden_sizes": list(cfg.algo.hidden_sizes),
            "activation": cfg.algo.activation,
            "recipe": {"epochs": cfg.algo.update_epochs, "minibatches": cfg.algo.num_minibatches,
                       "lr": cfg.algo.lr, "ent_coef": cfg.algo.ent_coef}}

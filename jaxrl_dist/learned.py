"""The learned scheduler: a flax policy over round features, trained with the core PPO.

Training runs on a *scheduling MDP* (`SchedulingEnv`, an ordinary env adapter):
an episode is one whole training run of the task; each step is one round whose
action `a` runs `n = a + 1` shards. The inner run is the round trainer's own
math in JAX (the local backend's round function and the learner's update,
padded to `M = scheduler.max_shards` slots and masked, so `n` never
recompiles), vmapped over episodes, on the *modeled* clock: a shard's seconds
come from a latency profile (`Profile`), a round's seconds and dollars from
the cost model (`cost.round_cost`). The scheduler itself then trains with
`fused.make_train_chunk`, the same PPO as every task. Profiles come from
`jaxrl-dist calibrate` (`jaxrl_dist.calibrate`); one ships per calibrated env
under `presets/profiles/`, and `Profile()`'s defaults stand in elsewhere.

Reward per round: `-(w * modeled_s / ref_s + (1 - w) * usd / ref_usd)`, where
`ref_s` and `ref_usd` are one round at `M` shards (so a round costs about -1
at most) and `w = scheduler.time_weight`; reaching `run.target_return` ends
the episode with `+scheduler.target_bonus`. An episode that reaches
`scheduler.max_rounds` is truncated (it bootstraps; no bonus).
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist import cost, rng
from jaxrl_dist.types import EnvSpec, StepOut

FEATURES = ("round_frac", "loss", "return", "approx_kl", "learn_frac", "actor_frac",
            "round_s", "budget_left", "n_frac")
PRESETS = Path(__file__).resolve().parent / "presets" / "schedulers"
PROFILES = Path(__file__).resolve().parent / "presets" / "profiles"


class Profile(NamedTuple):
    """Latency profile for the modeled clock (seconds, bytes); see `calibrate`."""

    step_s: float = 7e-6  # one env step of one shard's envs, policy included
    learn_s_fixed: float = 1e-3
    learn_s_per_sample: float = 5e-6
    bytes_per_shard: float = 48e3
    jitter_cv: float = 0.1  # stragglers: shard time x lognormal(0, cv)
    # Measured on the calibrating machine and kept for reading only (None: not measured);
    # the modeled clock takes transfer rates and start-up from the cost preset, whose
    # figures are the platform's, not this machine's loopback or process start.
    transfer_s_per_byte: Optional[float] = None
    cold_start_s: Optional[float] = None


class Scale(NamedTuple):
    """Per-task normalisers of the features, fixed when the scheduler is trained."""

    return_lo: float
    return_hi: float
    max_rounds: int
    max_shards: int


class RoundObs(NamedTuple):
    """The raw per-round quantities a scheduler sees (scalars; numpy or jnp)."""

    round: Any
    loss: Any
    ret: Any
    approx_kl: Any
    learn_s: Any
    actor_s: Any
    round_s: Any
    budget_left: Any
    n: Any


def features(o: RoundObs, s: Scale, xp=jnp):
    """`[F]` float32, each roughly in [0, 1] or [-1, 1], so one network moves between tasks."""
    span = max(s.return_hi - s.return_lo, 1e-6)
    t = xp.maximum(o.round_s, 1e-6)
    return xp.stack([
        xp.minimum(o.round / s.max_rounds, 1.0),
        xp.tanh(o.loss / 10.0),
        xp.clip((o.ret - s.return_lo) / span, -1.0, 2.0),
        xp.tanh(o.approx_kl * 100.0),
        xp.clip(o.learn_s / t, 0.0, 1.0),
        xp.clip(o.actor_s / t, 0.0, 1.0),
        xp.tanh(xp.log1p(o.round_s)),
        xp.clip(o.budget_left, 0.0, 1.0),
        o.n / s.max_shards,
    ]).astype(xp.float32)


def obs_from_records(history: list, s: Scale, budget_left: float = 1.0) -> RoundObs:
    """The latest round's `RoundObs` from the round trainer's records (zeros before any)."""
    if not history:
        return RoundObs(0.0, 0.0, s.return_lo, 0.0, 0.0, 0.0, 0.0, budget_left, 0.0)
    last = history[-1]
    ret = next((r["return_recent"] for r in reversed(history) if r.get("return_recent") is not None),
               s.return_lo)
    return RoundObs(float(len(history)), last.get("loss") or 0.0, ret, last.get("approx_kl") or 0.0,
                    last["learn_s"], last.get("busy_s", 0.0), last["round_s"], budget_left,
                    float(last["num_shards"]))


class Inner(NamedTuple):
    """One episode of the scheduling MDP: a task's training run, mid-way."""

    train: Any  # the task's TrainState
    table: Any  # its slots' states, leaves [M, ...]
    clock: Any  # cost.SlotClock on the modeled clock
    usd: Any  # dollars so far
    obs: RoundObs  # what the scheduler saw after the last round
    key: Any
    sums: Any  # [rounds.TARGET_ROUNDS] episode return sums of the latest rounds, newest first
    counts: Any  # their episode counts


class SchedOptions(NamedTuple):
    """Static settings of the scheduling MDP."""

    max_shards: int
    max_rounds: int
    target_return: float
    time_weight: float
    target_bonus: float
    profile: Profile
    scale: Scale


def task_and_options(overrides, max_rounds: int, time_weight: float, target_bonus: float,
                     profile=None, scale: Optional[Scale] = None):
    """`(task config, SchedOptions)` of a scheduling MDP from the task's config overrides
    (`jaxrl-dist scheduler train`, `bench/scheduler_mdp.py`).

    The task runs on the local backend with `scheduler.max_shards` (else
    `backend.max_shards`) slots. `profile`: a `Profile`, a profile file, or None
    for the one shipped for `env.id` (else the defaults). `scale`: None for the
    task's return range, `scheduler.min_return`..`max_return` (else 0..target).
    """
    from jaxrl_dist.cli import CliConfigError, load_config

    cfg = load_config(list(overrides) + ["backend=local"])
    target = cfg.run.target_return
    if target is None:
        raise CliConfigError("run.target_return: the scheduler is trained to reach a target return")
    M = cfg.scheduler.max_shards or cfg.backend.max_shards
    cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, max_shards=M))
    if not isinstance(profile, Profile):
        found = profile_file(cfg.env.id, profile)
        profile = load_profile(found) if found else Profile()
    s = cfg.scheduler
    scale = scale or Scale(s.min_return or 0.0, s.max_return or target, max_rounds, M)
    return cfg, SchedOptions(M, max_rounds, target, time_weight, target_bonus, profile, scale)


class SchedulingEnv:
    """`num_envs` parallel training runs of one task; the action is the next round's `n - 1`.

    Follows `envs.base.EnvAdapter`, so the core rollout and PPO train on it
    unchanged. The task's learner, slots and round function are the round
    trainer's (`rounds.make_learner`, `rounds.init_table`, the local backend's
    round body), closed over and vmapped over episodes.
    """

    def __init__(self, task_cfg, cost_cfg, opts: SchedOptions, num_envs: int):
        from jaxrl_dist.backends.local import make_round_body
        from jaxrl_dist.envs import resolve_suite
        from jaxrl_dist.rounds import make_learner
        from jaxrl_dist.shard import ShardProgram, spec_from_config

        self.task_cfg, self.cost_cfg, self.opts, self.num_envs = task_cfg, cost_cfg, opts, num_envs
        suite = resolve_suite(task_cfg.env.id, task_cfg.env.suite)
        if suite != "gymnax":  # the inner runs are vmapped JAX programs: no C++ envs inside
            from jaxrl_dist.config import ConfigError

            raise ConfigError(f"env.id: the scheduling MDP runs the task in JAX (gymnax); {task_cfg.env.id} "
                              f"runs on {suite}: schedule it with a gymnax task's scheduler")
        self.program = ShardProgram(spec_from_config(task_cfg, suite, False))
        M = opts.max_shards
        self.learner = make_learner(task_cfg, self.program, M / 2)
        self.round_body = make_round_body(self.program, M)
        self.spec = EnvSpec(f"scheduler/{task_cfg.env.id}", "gymnax", (len(FEATURES),), jnp.float32,
                            True, M)
        self.steps_per_shard = task_cfg.backend.envs_per_shard * task_cfg.algo.num_steps
        self.ref = self._reference()

    def _reference(self) -> tuple:
        """Seconds and dollars of one warm round at `M` shards: the reward's units."""
        M, p = self.opts.max_shards, self.opts.profile
        # cold, as a round after an idle gap longer than keep_warm_s is billed
        rc = cost.round_cost(self.cost_cfg, M, np.full((M,), p.step_s * self.task_cfg.algo.num_steps),
                             M * p.bytes_per_shard,
                             p.learn_s_fixed + p.learn_s_per_sample * M * self.steps_per_shard, True)
        return max(float(rc.modeled_s), 1e-9), max(float(rc.usd), 1e-12)

    def _init_one(self, key) -> Inner:
        from jaxrl_dist.rounds import TARGET_ROUNDS, init_train_from_key

        M = self.opts.max_shards
        k_train, k_slots, k_next = jax.random.split(key, 3)
        train = init_train_from_key(self.learner, k_train)
        table = jax.vmap(lambda k: self.program.init_slot(k))(jax.random.split(k_slots, M))
        clock = cost.SlotClock(jnp.zeros(()), jnp.full((M,), -jnp.inf))
        s = self.opts.scale
        obs = RoundObs(*(jnp.zeros(()) for _ in RoundObs._fields))._replace(
            ret=jnp.asarray(s.return_lo, jnp.float32), budget_left=jnp.ones(()))
        window = jnp.zeros((TARGET_ROUNDS,))
        return Inner(train, table, clock, jnp.zeros(()), obs, k_next, window, window)

    def reset(self, key):
        inner = jax.vmap(self._init_one)(jax.random.split(key, self.num_envs))
        return inner, jax.vmap(lambda o: features(o, self.opts.scale))(inner.obs)

    def _round(self, inner: Inner, n):
        """One task round of `n` shards on the modeled clock: `(inner, RoundCost, return)`."""
        from jaxrl_dist.rounds import recent_return

        M, p, T = self.opts.max_shards, self.opts.profile, self.task_cfg.algo.num_steps
        key, k_shards, k_learn, k_jitter = jax.random.split(inner.key, 4)
        idx = jnp.where(jnp.arange(M) < n, jnp.arange(M), M)
        keys = rng.unwrap(jax.random.split(k_shards, M))
        table, traj, boot = self.round_body(inner.train.params, inner.table, idx, keys)
        train, m = self.learner.update_fn(inner.train, traj, boot, n, k_learn)
        jitter = jnp.exp(p.jitter_cv * jax.random.normal(k_jitter, (M,)))
        shard_s = p.step_s * T * jitter
        learn_s = p.learn_s_fixed + p.learn_s_per_sample * n * self.steps_per_shard
        cold = cost.cold_slots(self.cost_cfg, inner.clock)
        rc = cost.round_cost(self.cost_cfg, n, shard_s, n * p.bytes_per_shard, learn_s, cold)
        sums = jnp.roll(inner.sums, 1).at[0].set(m["episode_return_sum"])
        counts = jnp.roll(inner.counts, 1).at[0].set(m["episodes"])
        recent = recent_return(sums, counts, self.task_cfg.run.target_episodes, jnp)
        ret = jnp.where(jnp.isnan(recent), inner.obs.ret, recent)
        obs = RoundObs(inner.obs.round + 1, m["loss"], ret, m["approx_kl"], learn_s,
                       jnp.max(jnp.where(jnp.arange(M) < n, shard_s, 0.0)), rc.modeled_s,
                       jnp.ones(()), n.astype(jnp.float32))
        clock = cost.advance(inner.clock, n, rc)
        return Inner(train, table, clock, inner.usd + rc.usd, obs, key, sums, counts), rc, ret

    def _step_one(self, inner: Inner, action, key):
        o, s = self.opts, self.opts.scale
        n = jnp.clip(action + 1, 1, o.max_shards).astype(jnp.int32)
        new, rc, ret = self._round(inner, n)
        ref_s, ref_usd = self.ref
        reached = ret >= o.target_return
        truncated = (new.obs.round >= o.max_rounds) & ~reached
        reward = -(o.time_weight * rc.modeled_s / ref_s + (1 - o.time_weight) * rc.usd / ref_usd)
        reward = reward + jnp.where(reached, o.target_bonus, 0.0)
        final = features(new.obs, s)
        done = reached | truncated
        fresh = self._init_one(key)
        nxt = jax.tree.map(lambda a, b: jnp.where(done, a, b), fresh, new)
        out = StepOut(features(nxt.obs, s), final, reward.astype(jnp.float32), reached, truncated,
                      jnp.ones((), bool), reward.astype(jnp.float32), done)
        return nxt, out

    def step(self, state: Inner, action, key):
        keys = key if key.ndim >= 1 and key.shape[0] == self.num_envs else jax.random.split(key, self.num_envs)
        return jax.vmap(self._step_one)(state, action, keys)


class Trained(NamedTuple):
    """A scheduler checkpoint: policy params and what they were trained for."""

    params: Any
    meta: dict  # env_id, cost, max_shards, scale, options, features, hidden_sizes


def scheduler_config(env: SchedulingEnv, num_envs: int, num_steps: int, updates: int,
                     hidden=(64, 64), lr: float = 3e-4):
    """The core PPO's config for training the scheduler on `env`."""
    from jaxrl_dist.config import AlgoConfig, Config, EnvConfig

    return Config(env=EnvConfig(id=env.spec.env_id, num_envs=num_envs),
                  algo=AlgoConfig(total_timesteps=num_envs * num_steps * updates, num_steps=num_steps,
                                  update_epochs=4, num_minibatches=2, lr=lr, ent_coef=0.01,
                                  hidden_sizes=tuple(hidden)))


def train_scheduler(env: SchedulingEnv, num_steps: int, updates: int, seed: int = 0,
                    init_from=None, chunk: int = 1, log=print) -> Trained:
    """Train (or fine-tune, from a `Trained`) the scheduler policy with `fused`'s PPO."""
    from jaxrl_dist import fused
    from jaxrl_dist.config import ConfigError

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
            "features": list(FEATURES), "hidden_sizes": list(cfg.algo.hidden_sizes),
            "activation": cfg.algo.activation}


def save(trained: Trained, path) -> Path:
    """A small msgpack file (flax.serialization): params plus JSON metadata."""
    from flax import serialization

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(serialization.msgpack_serialize(
        {"params": serialization.to_state_dict(trained.params), "meta": json.dumps(trained.meta)}))
    return path


def load(path) -> Trained:
    from flax import serialization

    data = serialization.msgpack_restore(Path(path).read_bytes())
    return Trained(data["params"], json.loads(data["meta"]))


def policy(trained: Trained):
    """`act(features[F]) -> n`: the greedy shard count of a trained scheduler."""
    from jaxrl_dist.networks import make_network

    m = trained.meta
    spec = EnvSpec("scheduler", "gymnax", (len(FEATURES),), np.float32, True, m["max_shards"])
    net = make_network(spec, "mlp", tuple(m["hidden_sizes"]), m["activation"])
    apply = jax.jit(net.apply)

    def act(x) -> int:
        return int(np.argmax(np.asarray(apply(trained.params, x[None]).logits[0]))) + 1

    return act


class LearnedScheduler:
    """`scheduler=learned`: the trained policy's greedy n from the last round's features.

    Loads `scheduler.path`, else the preset shipped for `env.id`, else (with a
    note) the CartPole-v1 preset. A scheduler trained on another task sees this
    task's returns scaled by its own range (`scale_for`).
    """

    name = "learned"

    def __init__(self, cfg, backend_cfg, full=None):
        from jaxrl_dist.config import ConfigError

        env_id = full.env.id if full is not None else "CartPole-v1"
        path = Path(cfg.path) if cfg.path else preset_path(env_id)
        if not cfg.path and not path.is_file():
            print(f"note: no scheduler preset for env.id {env_id!r}; using {FALLBACK}'s "
                  f"(train one with `jaxrl-dist scheduler train`)", file=sys.stderr)
            path = preset_path(FALLBACK)
        if not path.is_file():
            raise ConfigError(f"scheduler.path: no such file {path}; train one with `jaxrl-dist scheduler train`")
        trained = load(path)
        M = trained.meta["max_shards"]
        if M > backend_cfg.max_shards:
            raise ConfigError(f"backend.max_shards={backend_cfg.max_shards} is below the "
                              f"{M} shards the scheduler in {path} chooses from")
        self.trained, self.act = trained, policy(trained)
        self.scale = scale_for(trained, full)

    def num_shards(self, round_: int, history: list, budget_left: float = 1.0) -> int:
        obs = obs_from_records(history, self.scale, budget_left)
        return self.act(np.asarray(features(obs, self.scale, np)))

    def expected_shards(self) -> float:
        return self.scale.max_shards / 2  # what the policy was trained with (SchedulingEnv)


FALLBACK = "CartPole-v1"


def scale_for(trained: Trained, full=None) -> Scale:
    """The trained scale, with the return range of the task it now schedules when that
    is another task: `scheduler.min_return` (or 0) up to `run.target_return` (or
    `scheduler.max_return`)."""
    from jaxrl_dist.config import ConfigError

    s = Scale(**trained.meta["scale"])
    if full is None or trained.meta["env_id"] == full.env.id:
        return s
    hi = full.run.target_return if full.run.target_return is not None else full.scheduler.max_return
    if hi is None:
        raise ConfigError(f"run.target_return: the scheduler was trained on {trained.meta['env_id']}; "
                          f"set {full.env.id}'s target (or scheduler.max_return) to scale its returns")
    lo = full.scheduler.min_return if full.scheduler.min_return is not None else 0.0
    return s._replace(return_lo=float(lo), return_hi=float(hi))


def preset_path(env_id: str) -> Path:
    return PRESETS / f"{env_id}.msgpack"


def profile_file(env_id: str, path=None) -> Optional[Path]:
    """The profile file a task's scheduling MDP uses: `path`, else the one shipped for
    `env_id`; None where neither is (the MDP then uses `Profile()`)."""
    if path is not None:
        return Path(path)
    shipped = PROFILES / f"{env_id}.json"
    return shipped if shipped.is_file() else None


def save_profile(profile: Profile, path, meta: Optional[dict] = None) -> Path:
    """JSON: the `Profile` fields at the top level, how they were measured under `meta`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**profile._asdict(), "meta": meta or {}}, indent=2) + "\n")
    return path


def load_profile(path) -> Profile:
    """A profile file (`save_profile`'s). Fields it lacks keep `Profile`'s defaults, so
    files from before a field existed still load; `ConfigError` names a bad field."""
    from jaxrl_dist.config import ConfigError

    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"profile {path}: cannot read it ({err.strerror or err})") from err
    except json.JSONDecodeError as err:
        raise ConfigError(f"profile {path}: not JSON ({err.msg} at line {err.lineno})") from err
    if not isinstance(data, dict):
        raise ConfigError(f"profile {path}: expected a JSON object of Profile fields")
    unknown = sorted(set(data) - set(Profile._fields) - {"meta"})
    if unknown:
        raise ConfigError(f"profile {path}: unknown field {unknown[0]!r} "
                          f"(fields: {', '.join(Profile._fields)}, meta)")
    return Profile(**{k: _profile_value(v, k, path) for k, v in data.items() if k != "meta"})


def _profile_value(value, name: str, path):
    """A field's number: finite, >= 0 (`step_s` > 0); None only where the default is None."""
    from jaxrl_dist.config import ConfigError

    if value is None and Profile._field_defaults[name] is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or value < 0 or (name == "step_s" and value == 0):
        least = "> 0" if name == "step_s" else ">= 0"
        raise ConfigError(f"profile {path}: {name} must be a finite number {least}, got {value!r}")
    return float(value)

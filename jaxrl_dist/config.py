"""Frozen dataclass configs for every group, strict loading and validation.

The library takes these objects; Hydra and YAML live only in `cli.py`.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional, Union


class ConfigError(ValueError):
    """A bad config value; the message names the key."""


@dataclass(frozen=True)
class EnvConfig:
    id: str = "CartPole-v1"
    suite: str = "auto"  # gymnax | envpool | brax | a plugin's name | auto (the first suite with env.id)
    num_envs: int = 4
    normalize_obs: Union[bool, str] = "auto"  # auto: on for continuous actions
    normalize_reward: Union[bool, str] = "auto"
    clip_obs: float = 10.0
    clip_reward: float = 10.0
    num_threads: int = 0  # envpool worker threads; 0 lets envpool choose
    kwargs: dict = field(default_factory=dict)  # extra arguments to the env maker


@dataclass(frozen=True)
class AlgoConfig:
    name: str = "ppo"
    total_timesteps: int = 500_000
    num_steps: int = 128
    update_epochs: int = 4
    num_minibatches: int = 4
    # set: minibatches of this many samples instead, so the round trainer's bigger rounds
    # take more gradient steps (the fused trainer splits its batch into batch/size)
    minibatch_size: Optional[int] = None
    lr: float = 1e-3
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    clip_vloss: bool = False
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    adam_eps: float = 1e-5
    network: str = "auto"  # mlp | cnn | auto (cnn for image observations) | a plugin's name
    network_options: dict = field(default_factory=dict)  # a plugin network's options
    loss: str = "ppo"  # ppo (clipped surrogate) | a plugin's name
    loss_options: dict = field(default_factory=dict)  # a plugin loss's options
    hidden_sizes: tuple = (64, 64)
    activation: str = "tanh"  # tanh | relu


@dataclass(frozen=True)
class RunConfig:
    dir: Optional[str] = None  # run directory; default outputs/DATE/TIME
    checkpoint_every: int = 0  # updates between checkpoints; 0: only at the end
    # seconds of training between checkpoints (checked between chunks, rounds or
    # updates), so an interrupted default run can resume; 0: off
    checkpoint_every_s: float = 300.0
    resume: Optional[str] = None  # a run directory to continue
    compile_cache: bool = True
    progress: bool = True
    log_chunks: int = 20  # host round-trips for logging over the whole run
    objective: str = "final_return"  # the summary key a run returns to a Hydra sweeper (optuna)
    tensorboard: bool = True
    # a JAX profiler trace written under this directory (TensorBoard's profile plugin or
    # Perfetto read it): the fused trainer's training loop (its compile is timed apart),
    # the round trainers' whole run; null: none
    profile_dir: Optional[str] = None
    # round trainer only (the fused trainer ignores them)
    target_return: Optional[float] = None  # the recent return >= this is "target reached"
    target_episodes: int = 10  # the recent return: latest whole rounds holding this many episodes
    stop_at_target: bool = False  # stop after the first round that reaches the target
    budget_usd: Optional[float] = None  # stop before a round would take modeled dollars past this
    deadline_s: Optional[float] = None  # stop before a round would take the modeled clock past this
    max_rounds: Optional[int] = None  # stop after this many rounds


@dataclass(frozen=True)
class LoggerConfig:
    """Experiment trackers beside metrics.jsonl and TensorBoard (`run.tensorboard`)."""

    wandb: bool = False  # log the config, every metric and the summary to Weights & Biases
    wandb_project: str = "jaxrl-dist"
    wandb_entity: Optional[str] = None
    wandb_group: Optional[str] = None  # e.g. one name for a sweep's jobs
    wandb_mode: Optional[str] = None  # online | offline | disabled; null: W&B's own ($WANDB_MODE)
    # at most this many of a log point's records go to W&B (evenly spaced, the last one
    # included; 0: all): each W&B row costs ~0.3 ms of CPU, which a fused CartPole run
    # of 976 updates feels (bench/wandb_overhead.py); metrics.jsonl and TensorBoard keep all
    wandb_per_chunk: int = 4


@dataclass(frozen=True)
class EvalConfig:
    """`jaxrl-dist eval RUN_DIR eval.KEY=VALUE`: what `evaluation.evaluate` runs."""

    episodes: int = 10  # one episode per env, all side by side
    deterministic: bool = True  # the most likely action; false samples the policy
    seed: int = 0  # the eval envs' and (stochastic) actions' seed
    seed_index: int = 0  # which seed of a fused multi-seed run
    max_steps: int = 100_000  # an episode not ended by then counts as not ended
    video: bool = False  # an MP4 of episode 0 (RUN_DIR/eval.mp4): gymnax classic control, MinAtar, Atari
    video_fps: int = 30


# env ids a serve instance runs unless `serve.allowed_envs` says otherwise: the presets'
DEFAULT_ALLOWED_ENVS = ("CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0",
                        "Breakout-MinAtar", "Pong-v5", "Breakout-v5", "Qbert-v5",
                        "SpaceInvaders-v5", "Gravitar-v5", "Hopper-v3", "HalfCheetah-v3",
                        "Humanoid-v3")


@dataclass(frozen=True)
class BackendConfig:
    """Where actor shards run (for `trainer=sync` and `trainer=async`)."""

    name: str = "local"  # local | ray | http | a plugin's name
    options: dict = field(default_factory=dict)  # a plugin backend's options
    max_shards: int = 32  # slots: envs whose episodes continue across rounds
    envs_per_shard: int = 4
    shard_timeout: float = 60.0  # seconds before a shard is retried
    max_retries: int = 2  # extra tries of a failed shard, with the same keys
    retry_backoff_s: float = 0.05  # the first wait before a retry (jittered); it doubles each try ...
    retry_backoff_max_s: float = 2.0  # ... up to this (a 429/503 Retry-After can ask for longer)
    address: Optional[str] = None  # ray: cluster address ("auto", "ray://h:p"); null starts one
    num_cpus: float = 1.0  # ray: CPUs reserved per actor (fractions allowed)
    memory_mb: Optional[float] = None  # ray: memory reserved per actor (null: none reserved)
    urls: tuple = ()  # http: function endpoints
    # http: bearer token, for library callers (the CLI refuses it, and config.yaml never
    # holds it); null reads `token_file`, else $JAXRL_DIST_TOKEN
    token: Optional[str] = None
    token_file: Optional[str] = None  # http: a file whose contents are the bearer token
    compression: str = "deflate"  # http: deflate | none
    # injected stragglers (benchmarks): one shard in `slow_every` runs `slowdown` times slower
    # (see `rounds.straggle`)
    slowdown: float = 1.0
    slow_every: int = 4


def check_scheduler(cfg) -> None:
    """Checks of `SchedulerConfig` on its own (run when it is built); the bound
    against `backend.max_shards` is checked by `shard_range`."""
    for key in ("min_shards", "window", "step", "every"):
        value = getattr(cfg, key)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"scheduler.{key} must be a positive integer, got {value!r}")
    if cfg.max_shards is not None and (not isinstance(cfg.max_shards, int) or cfg.max_shards < 1):
        raise ConfigError(f"scheduler.max_shards must be a positive integer or null, got {cfg.max_shards!r}")
    if cfg.max_shards is not None and cfg.min_shards > cfg.max_shards:
        raise ConfigError(f"scheduler.min_shards={cfg.min_shards} exceeds scheduler.max_shards={cfg.max_shards}")
    for key in ("min_return", "max_return"):
        value = getattr(cfg, key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise ConfigError(f"scheduler.{key} must be a number or null, got {value!r}")
    if None not in (cfg.min_return, cfg.max_return) and cfg.min_return >= cfg.max_return:
        raise ConfigError(f"scheduler.min_return={cfg.min_return} must be below "
                          f"scheduler.max_return={cfg.max_return}")


@dataclass(frozen=True)
class SchedulerConfig:
    """How many shards each round runs (`jaxrl_dist/scheduling/schedulers.py`)."""

    name: str = "fixed"  # fixed | max | adapt | ramp | a plugin's name
    num_shards: int = 4  # fixed: shards per round
    min_shards: int = 1  # adapt, ramp: fewest shards
    max_shards: Optional[int] = None  # max, adapt, ramp: most shards; null: backend.max_shards
    min_return: Optional[float] = None  # adapt: return at min_shards; null: running min
    max_return: Optional[float] = None  # adapt: return at max_shards; null: running max
    window: int = 5  # adapt: rounds (with a return) averaged
    step: int = 1  # ramp: shards added ...
    every: int = 2  # ramp: ... every this many rounds
    path: Optional[str] = None  # learned: a trained scheduler file; null: the shipped default
    init_from: Optional[str] = None  # `scheduler train`: a scheduler file to fine-tune from
    options: dict = field(default_factory=dict)  # a plugin scheduler's options

    def __post_init__(self):
        check_scheduler(self)


@dataclass(frozen=True)
class ServeConfig:
    """The actor function (`jaxrl-dist serve`)."""

    host: str = "127.0.0.1"
    port: int = 8000  # $PORT wins when set
    token: Optional[str] = None  # null reads $JAXRL_DIST_TOKEN; empty string: no auth
    max_body_mb: float = 64.0
    allowed_envs: tuple = DEFAULT_ALLOWED_ENVS
    # env id -> {kwarg: "bool" | {min, max} | {choices: [...]}}: the env_kwargs a request may set
    allowed_env_kwargs: dict = field(default_factory=dict)
    max_slot: int = 1024  # slots 0..max_slot-1
    max_envs: int = 256  # envs per shard (spec.num_envs)
    max_rollout_mb: float = 512.0  # one shard's trajectory, estimated from the env's observations
    max_programs: int = 16  # compiled specs kept (least recently used out)
    max_pools: int = 8  # envpool slot pools kept
    max_concurrent: int = 8  # requests running or queued for the worker; beyond it 503
    body_timeout_s: float = 10.0  # to read a request's body (408 past it)
    header_timeout_s: float = 10.0  # to read a request's headers (the connection is closed)
    rollout_timeout_s: float = 600.0  # one shard in the worker process, which is restarted past it


@dataclass(frozen=True)
class CostConfig:
    """Prices and latencies of one platform (`jaxrl_dist.scheduling.cost`); the defaults are the
    `azure_aci` preset, whose sources are in `jaxrl_dist/configs/cost/azure_aci.yaml`."""

    name: str = "azure_aci"
    kind: str = "serverless"  # serverless: billed per shard | cluster: billed for its whole life
    vcpu_second_usd: float = 0.00001125
    gb_second_usd: float = 0.0000012361
    request_usd: float = 0.0  # per shard invocation
    vcpus_per_shard: float = 1.0
    gb_per_shard: float = 1.5
    billing_granularity_s: float = 1.0  # billed time is rounded up to a multiple of this
    min_billed_s: float = 0.0
    start_billed: bool = True  # the instance's start-up is billed with its shard
    cold_start_s: float = 20.0  # a new instance's start-up
    warm_start_s: float = 0.0  # an instance kept warm
    invoke_s: float = 0.01  # request latency, once per round (shards are sent in parallel)
    keep_warm_s: float = 0.0  # an instance stays warm this long after its last shard
    transfer_bytes_per_s: float = 125_000_000.0
    learner_hour_usd: float = 0.192  # the learner's machine, billed for the whole modeled run
    cluster_nodes: int = 0  # cluster kind: nodes billed from start-up to the end
    cluster_node_hour_usd: float = 0.0
    cluster_start_s: float = 0.0  # cluster kind: start-up, billed once at the start of a run


@dataclass(frozen=True)
class AsyncConfig:
    """The async trainer (`trainer=async`, `jaxrl_dist/trainers/asynchronous.py`); YAML key `async`."""

    max_staleness: int = 1  # params versions a learned-from chunk may lag the learner by
    batch_chunks: int = 4  # chunks (one shard's rollout each) per learner update
    actors: Optional[int] = None  # actors at the start; null: batch_chunks (local, staleness > 0: <= one a core)
    min_actors: int = 1  # the balancer's range of active actors ...
    max_actors: Optional[int] = None  # ... null: backend.max_shards
    balance: bool = True  # adapt the active actors to the learner's consumption
    balance_tolerance: float = 0.2  # production within this fraction of consumption is balanced
    balance_every: int = 4  # updates between balance decisions
    rho_bar: float = 1.0  # V-trace truncation of the importance weights (targets)
    c_bar: float = 1.0  # V-trace truncation of the trace coefficients


TRAINERS = ("fused", "sync", "async")


@dataclass(frozen=True)
class DistributedConfig:
    """One training run over several processes on JAX's own distributed runtime
    (`trainer.distributed.*`; `jaxrl-dist launch` sets them for each process it starts)."""

    coordinator: Optional[str] = None  # HOST:PORT of process 0's coordinator; null: one process
    num_processes: int = 1
    process_id: int = 0
    timeout_s: int = 60  # a coordinator not reached (or a peer missing) within this fails the run


@dataclass(frozen=True)
class TrainerConfig:
    """Which trainer runs (`trainer=fused|sync|async`); its own keys live beside `name`."""

    name: str = "fused"  # fused: one jitted program | sync: rounds of shards | async: no round barrier
    # devices the learner uses: all | N; over several, a mesh of `seed_axis` x data devices:
    # each seed's envs (fused) or each update's samples (sync, async) split over the data axis,
    # gradients averaged, params replicated. 1: one device (the fused trainer still spreads
    # seeds over the local devices that divide num_seeds, as independent programs)
    devices: str = "1"
    seed_axis: int = 1  # devices of the mesh's seeds axis (fused; must divide num_seeds)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)


@dataclass(frozen=True)
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    run: RunConfig = field(default_factory=RunConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    asynchronous: AsyncConfig = field(default_factory=AsyncConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0
    num_seeds: int = 1


# YAML keys that are Python keywords, and the fields that hold them
KEY_ALIASES = {"async": "asynchronous"}


class Derived(NamedTuple):
    """Values computed from a config, in one place."""

    batch_size: int  # per seed per update: num_envs * num_steps
    minibatch_size: int
    num_updates: int
    normalize_obs: bool
    normalize_reward: bool


def coerce(value: Any, default: Any, key: str) -> Any:
    """Cast a YAML/CLI value to the type of the field's default."""
    if isinstance(default, bool) or (isinstance(default, str) and isinstance(value, bool)):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if isinstance(default, tuple):
        if isinstance(value, (list, tuple)):
            return tuple(value)
        raise ConfigError(f"{key}: expected a list, got {value!r}")
    if isinstance(default, dict):
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError(f"{key}: expected a mapping, got {value!r}")
    return value


def _build(cls, data: dict, prefix: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    defaults = cls()
    kwargs = {}
    for key_name, value in (data or {}).items():
        name = KEY_ALIASES.get(key_name, key_name) if not prefix else key_name
        key = f"{prefix}{key_name}"
        if name not in fields:
            raise ConfigError(f"unknown config key '{key}'")
        default = getattr(defaults, name)
        if dataclasses.is_dataclass(default):
            if not isinstance(value, dict):
                raise ConfigError(f"{key}: expected a mapping, got {value!r}")
            kwargs[name] = _build(type(default), value, key + ".")
        elif value is None:
            kwargs[name] = None
        else:
            kwargs[name] = coerce(value, default, key) if default is not None else value
    return cls(**kwargs)


def from_dict(data: dict, user_keys=()) -> Config:
    """Build a `Config` from nested plain dicts; unknown keys are errors, and so is a
    key in `user_keys` (the keys a user set: the CLI's overrides) that the chosen
    trainer ignores. `trainer` may be given as a plain name (`{"trainer": "sync"}`)."""
    data = dict(data or {})
    if isinstance(data.get("trainer"), str):
        data["trainer"] = {"name": data["trainer"]}
    cfg = validate(_build(Config, data, ""))
    check_used(cfg, user_keys)
    return cfg


# the one line for the old spelling of the fused trainer (the CLI's `backend=fused` too)
FUSED_IS_A_TRAINER = ("the fused trainer is chosen with trainer=fused now "
                      "(backend= only says where shards run: local, ray, http)")

# key prefixes each trainer never reads
_IGNORED = {
    "fused": ("backend.", "scheduler.", "async.", "cost.", "run.target_return", "run.stop_at_target",
              "run.budget_usd", "run.deadline_s", "run.max_rounds", "run.target_episodes"),
    "sync": ("async.",),
    "async": ("scheduler.",),
}


def check_used(cfg: Config, keys) -> None:
    """A key the user set that the chosen trainer ignores is an error naming it."""
    name = cfg.trainer.name
    for key in keys:
        if any(key == p or key.startswith(p) or f"{key}." == p for p in _IGNORED.get(name, ())):
            what = " (set trainer=sync or async, or drop the key)" if name == "fused" else "; drop the key"
            raise ConfigError(f"{key}: trainer={name} does not use it{what}")
    if "algo.num_minibatches" in keys and cfg.algo.minibatch_size is not None:
        raise ConfigError(f"algo.num_minibatches: ignored while algo.minibatch_size="
                          f"{cfg.algo.minibatch_size} is set; set algo.minibatch_size=null to use it")


def without_secrets(data: dict) -> dict:
    """A `to_dict` config with its secrets (`backend.token`) taken out: what is saved
    with a run or sent to a tracker."""
    if (data.get("backend") or {}).get("token") is None:
        return data
    return {**data, "backend": {**data["backend"], "token": None}}


def to_dict(cfg: Config) -> dict:
    """Plain nested dict of a config (tuples as lists), for YAML/JSON."""

    def plain(x):
        if isinstance(x, tuple):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    out = plain(dataclasses.asdict(cfg))
    for key, name in KEY_ALIASES.items():
        out[key] = out.pop(name)
    return out


def _resolve_auto(value, key: str, continuous: bool) -> bool:
    if value == "auto":
        return continuous
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{key}: expected true, false or auto, got {value!r}")


def _check_positive(cfg: Config) -> None:
    checks = {
        "env.num_envs": cfg.env.num_envs,
        "algo.total_timesteps": cfg.algo.total_timesteps,
        "algo.num_steps": cfg.algo.num_steps,
        "algo.update_epochs": cfg.algo.update_epochs,
        "algo.num_minibatches": cfg.algo.num_minibatches,
        "algo.lr": cfg.algo.lr,
        "num_seeds": cfg.num_seeds,
        "run.log_chunks": cfg.run.log_chunks,
        "run.target_episodes": cfg.run.target_episodes,
    }
    for key, value in checks.items():
        if value <= 0:
            raise ConfigError(f"{key} must be positive, got {value}")
    if cfg.run.checkpoint_every < 0:
        raise ConfigError(f"run.checkpoint_every must be >= 0, got {cfg.run.checkpoint_every}")
    if not cfg.run.checkpoint_every_s >= 0:  # NaN too
        raise ConfigError(f"run.checkpoint_every_s must be >= 0 (0: off), got {cfg.run.checkpoint_every_s}")
    if any(h <= 0 for h in cfg.algo.hidden_sizes) or not cfg.algo.hidden_sizes:
        raise ConfigError(f"algo.hidden_sizes must be positive sizes, got {list(cfg.algo.hidden_sizes)}")


def _check_rounds(cfg: Config) -> None:
    """The round trainer's keys (checked only when a shard backend is chosen)."""
    b, s = cfg.backend, cfg.scheduler
    for key, value in {"backend.max_shards": b.max_shards, "backend.envs_per_shard": b.envs_per_shard,
                       "backend.shard_timeout": b.shard_timeout,
                       "scheduler.num_shards": s.num_shards}.items():
        if value <= 0:
            raise ConfigError(f"{key} must be positive, got {value}")
    if b.max_retries < 0:
        raise ConfigError(f"backend.max_retries must be >= 0, got {b.max_retries}")
    for key in ("retry_backoff_s", "retry_backoff_max_s"):
        if getattr(b, key) < 0:
            raise ConfigError(f"backend.{key} must be >= 0, got {getattr(b, key)}")
    if s.name == "fixed" and s.num_shards > b.max_shards and cfg.trainer.name == "sync":
        raise ConfigError(f"scheduler.num_shards={s.num_shards} exceeds backend.max_shards={b.max_shards}")
    if cfg.num_seeds != 1:
        raise ConfigError(f"num_seeds: the round trainer trains one seed, got {cfg.num_seeds}")
    if b.compression not in ("deflate", "none"):
        raise ConfigError(f"backend.compression must be deflate or none, got {b.compression!r}")
    shard_batch = b.envs_per_shard * cfg.algo.num_steps
    _check_split(cfg.algo, shard_batch, "one shard's batch backend.envs_per_shard*algo.num_steps")
    if b.name == "http" and not b.urls:
        raise ConfigError("backend.urls: the http backend needs at least one endpoint")
    for i, url in enumerate(b.urls):
        _check_url(url, f"backend.urls[{i}]")
    if not b.num_cpus >= 0:
        raise ConfigError(f"backend.num_cpus must be >= 0 (fractions allowed), got {b.num_cpus}")
    if b.memory_mb is not None and (isinstance(b.memory_mb, bool) or not isinstance(b.memory_mb, (int, float))
                                    or not 0 < b.memory_mb < math.inf):
        raise ConfigError(f"backend.memory_mb must be a positive number of MB or null, got {b.memory_mb!r}")
    if b.slowdown < 1.0:
        raise ConfigError(f"backend.slowdown must be >= 1 (a factor), got {b.slowdown}")
    if b.slow_every <= 0:
        raise ConfigError(f"backend.slow_every must be positive, got {b.slow_every}")


def _check_url(url, key: str) -> None:
    """An endpoint is `http(s)://host[:port][/path]`, checked here rather than at the
    first request, where the error would name the URL but not the key."""
    from urllib.parse import urlsplit

    why = None
    if not isinstance(url, str):
        why = "expected a string"
    else:
        try:
            parts = urlsplit(url)
            port = parts.port  # ValueError when not a number in 0..65535
        except ValueError as err:
            parts, port, why = None, None, str(err)
        if parts is not None and parts.scheme not in ("http", "https"):
            why = "the scheme must be http or https"
        elif parts is not None and not parts.hostname:
            why = "no host"
        elif port == 0:
            why = "port 0"
    if why:
        raise ConfigError(f"{key}: {url!r} is not an http(s) URL like http://HOST:PORT ({why})")


def _check_async(cfg: Config) -> None:
    """`async.*` keys (checked when `trainer=async`)."""
    a, b = cfg.asynchronous, cfg.backend
    if a.max_staleness < 0:
        raise ConfigError(f"async.max_staleness must be >= 0, got {a.max_staleness}")
    for key in ("batch_chunks", "min_actors", "balance_every"):
        if getattr(a, key) <= 0:
            raise ConfigError(f"async.{key} must be positive, got {getattr(a, key)}")
    top = a.max_actors if a.max_actors is not None else b.max_shards
    if top > b.max_shards:
        raise ConfigError(f"async.max_actors={top} exceeds backend.max_shards={b.max_shards}")
    start = a.actors if a.actors is not None else a.batch_chunks
    if not a.min_actors <= start <= top:
        raise ConfigError(f"async.actors={start} is outside async.min_actors..max_actors "
                          f"({a.min_actors}..{top})")
    if not a.balance_tolerance > 0:
        raise ConfigError(f"async.balance_tolerance must be positive, got {a.balance_tolerance}")
    if a.rho_bar <= 0 or a.c_bar <= 0:
        raise ConfigError("async.rho_bar and async.c_bar must be positive")


def _check_split(a: AlgoConfig, batch: int, what: str) -> None:
    """The batch must split evenly into minibatches (by count, or by `minibatch_size`)."""
    mb = a.minibatch_size
    if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb <= 0):
        raise ConfigError(f"algo.minibatch_size must be a positive integer or null, got {mb!r}")
    if mb is not None and batch % mb:
        raise ConfigError(f"algo.minibatch_size={mb} does not divide {what}={batch}")
    if mb is None and batch % a.num_minibatches:
        raise ConfigError(f"algo.num_minibatches={a.num_minibatches} does not divide {what}={batch}")


def num_minibatches(a: AlgoConfig, batch: int) -> int:
    """Minibatches per epoch of a `batch`-sample update."""
    return batch // a.minibatch_size if a.minibatch_size else a.num_minibatches


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_stops(run: RunConfig) -> None:
    """The round trainer's stop conditions: null (off) or a sane number."""
    if run.target_return is not None and not _is_number(run.target_return):
        raise ConfigError(f"run.target_return: expected a number or null, got {run.target_return!r}")
    if run.budget_usd is not None and not (_is_number(run.budget_usd) and run.budget_usd > 0):
        raise ConfigError(f"run.budget_usd must be a positive number or null, got {run.budget_usd!r}")
    if run.deadline_s is not None and not (_is_number(run.deadline_s) and run.deadline_s > 0):
        raise ConfigError(f"run.deadline_s must be a positive number of seconds or null, got {run.deadline_s!r}")
    rounds = run.max_rounds
    if rounds is not None and not (isinstance(rounds, int) and not isinstance(rounds, bool) and rounds > 0):
        raise ConfigError(f"run.max_rounds must be a positive integer or null, got {rounds!r}")


def _check_cost(c: CostConfig) -> None:
    if c.kind not in ("serverless", "cluster"):
        raise ConfigError(f"cost.kind must be serverless or cluster, got {c.kind!r}")
    for f in dataclasses.fields(c):
        value = getattr(c, f.name)
        if _is_number(value) and value < 0:
            raise ConfigError(f"cost.{f.name} must be >= 0, got {value}")
    if c.transfer_bytes_per_s <= 0:
        raise ConfigError(f"cost.transfer_bytes_per_s must be positive, got {c.transfer_bytes_per_s}")
    if c.kind == "cluster" and c.cluster_nodes < 1:
        raise ConfigError(f"cost.cluster_nodes: a cluster needs at least one node, got {c.cluster_nodes}")


def validate(cfg: Config) -> Config:
    """Check a config without touching JAX; raises `ConfigError` naming the key."""
    _check_positive(cfg)
    _check_stops(cfg.run)
    _check_cost(cfg.cost)
    if cfg.backend.name == "fused":
        raise ConfigError(f"backend=fused: {FUSED_IS_A_TRAINER}")
    if cfg.logger.wandb_per_chunk < 0:
        raise ConfigError(f"logger.wandb_per_chunk must be >= 0 (0: every record), got {cfg.logger.wandb_per_chunk}")
    if cfg.logger.wandb_mode not in (None, "online", "offline", "disabled"):
        raise ConfigError(f"logger.wandb_mode: {cfg.logger.wandb_mode!r} is not online, offline, disabled or null")
    if cfg.trainer.name not in TRAINERS:
        raise ConfigError(f"trainer: unknown trainer {cfg.trainer.name!r} (choose from: {', '.join(TRAINERS)})")
    check_trainer(cfg)
    if cfg.trainer.name != "fused":
        _check_rounds(cfg)
    if cfg.trainer.name == "async":
        _check_async(cfg)
    if cfg.serve.max_body_mb <= 0:
        raise ConfigError(f"serve.max_body_mb must be positive, got {cfg.serve.max_body_mb}")
    check_serve(cfg.serve)
    if cfg.algo.name != "ppo":
        raise ConfigError(f"algo.name: only 'ppo' is available, got {cfg.algo.name!r}")
    if cfg.algo.activation not in ("tanh", "relu"):
        raise ConfigError(f"algo.activation must be tanh or relu, got {cfg.algo.activation!r}")
    for key in ("gamma", "gae_lambda"):
        if not 0.0 <= getattr(cfg.algo, key) <= 1.0:
            raise ConfigError(f"algo.{key} must be in [0, 1], got {getattr(cfg.algo, key)}")
    batch = cfg.env.num_envs * cfg.algo.num_steps
    if cfg.trainer.name == "fused":
        _check_split(cfg.algo, batch, "the batch env.num_envs*algo.num_steps")
    if cfg.algo.total_timesteps < batch:
        raise ConfigError(
            f"algo.total_timesteps={cfg.algo.total_timesteps} is smaller than one batch ({batch})"
        )
    for key in ("normalize_obs", "normalize_reward"):
        _resolve_auto(getattr(cfg.env, key), f"env.{key}", False)
    return cfg


def requested_devices(t: TrainerConfig) -> Optional[int]:
    """`trainer.devices` as a count; None for `all`."""
    value = str(t.devices).strip().lower()
    if value == "all":
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"trainer.devices must be all or a positive integer, got {t.devices!r}")
    return int(value)


def check_distributed(d: DistributedConfig) -> None:
    """`trainer.distributed.*` by themselves."""
    if d.num_processes < 1 or not 0 <= d.process_id < d.num_processes:
        raise ConfigError(f"trainer.distributed.process_id={d.process_id} is outside 0.."
                          f"{d.num_processes - 1} (trainer.distributed.num_processes={d.num_processes})")
    if d.timeout_s <= 0:
        raise ConfigError(f"trainer.distributed.timeout_s must be positive, got {d.timeout_s}")
    if d.num_processes > 1 and not d.coordinator:
        raise ConfigError("trainer.distributed.coordinator: several processes need HOST:PORT of "
                          "process 0's coordinator")
    if d.coordinator and not re.fullmatch(r"[\w.\-]+:\d{1,5}", d.coordinator):
        raise ConfigError(f"trainer.distributed.coordinator must be HOST:PORT, got {d.coordinator!r}")


def distributed_config(data: Optional[dict]) -> DistributedConfig:
    """The checked `trainer.distributed` of a composed config's `trainer` mapping, read
    before the rest (the processes must join before anything starts JAX's backend)."""
    d = _build(DistributedConfig, dict((data or {}).get("distributed") or {}), "trainer.distributed.")
    check_distributed(d)
    return d


def check_trainer(cfg: Config) -> None:
    """`trainer.devices`, `trainer.seed_axis` and `trainer.distributed.*` by themselves (the
    counts against the devices present are checked where JAX is up, `core.mesh`)."""
    t, d = cfg.trainer, cfg.trainer.distributed
    count = requested_devices(t)
    if t.seed_axis < 1:
        raise ConfigError(f"trainer.seed_axis must be positive, got {t.seed_axis}")
    if cfg.num_seeds % t.seed_axis:
        raise ConfigError(f"trainer.seed_axis={t.seed_axis} does not divide num_seeds={cfg.num_seeds}")
    if count is not None and count % t.seed_axis:
        raise ConfigError(f"trainer.seed_axis={t.seed_axis} does not divide trainer.devices={count}")
    check_distributed(d)
    if d.num_processes > 1 and t.name != "fused":
        raise ConfigError(f"trainer.distributed.num_processes={d.num_processes}: several processes "
                          f"train with trainer=fused only (trainer={t.name})")


_PATH_WORDS = ("path", "file", "dir", "root", "url")  # env kwargs that name a place


def check_serve(serve: ServeConfig) -> None:
    """The serve limits are positive and `serve.allowed_env_kwargs` holds rules a request's
    values can be checked against; keys that name files or paths are never allowed."""
    for key in ("max_slot", "max_envs", "max_rollout_mb", "max_programs", "max_pools",
                "max_concurrent", "body_timeout_s", "header_timeout_s", "rollout_timeout_s"):
        if not getattr(serve, key) > 0:
            raise ConfigError(f"serve.{key} must be positive, got {getattr(serve, key)}")
    for env_id, rules in serve.allowed_env_kwargs.items():
        if not isinstance(rules, dict):
            raise ConfigError(f"serve.allowed_env_kwargs.{env_id}: expected a mapping of kwarg rules")
        for name, rule in rules.items():
            _check_kwarg_rule(f"serve.allowed_env_kwargs.{env_id}.{name}", str(name), rule)


def _check_kwarg_rule(key: str, name: str, rule: Any) -> None:
    if any(word in name.lower() for word in _PATH_WORDS):
        raise ConfigError(f"{key}: paths and file names are never taken from a request")
    if rule == "bool":
        return
    number = (int, float)
    if isinstance(rule, dict) and set(rule) == {"min", "max"}:
        low, high = rule["min"], rule["max"]
        if any(isinstance(x, bool) or not isinstance(x, number) or not math.isfinite(x)
               for x in (low, high)) or low > high:
            raise ConfigError(f"{key}: min and max must be finite numbers, min <= max")
        return
    if isinstance(rule, dict) and set(rule) == {"choices"} and isinstance(rule["choices"], (list, tuple)):
        for c in rule["choices"]:
            if not isinstance(c, (bool, int, float, str)) or isinstance(c, str) and ("/" in c or "\\" in c):
                raise ConfigError(f"{key}: choices must be plain scalars (no paths), got {c!r}")
        return
    raise ConfigError(f"{key}: expected \"bool\", {{min: A, max: B}} or {{choices: [...]}}, got {rule!r}")


def derive(cfg: Config, continuous: bool = False) -> Derived:
    """Derived sizes of a valid config; `continuous` resolves the `auto` options."""
    batch = cfg.env.num_envs * cfg.algo.num_steps
    return Derived(
        batch_size=batch,
        minibatch_size=batch // num_minibatches(cfg.algo, batch),
        num_updates=cfg.algo.total_timesteps // batch,
        normalize_obs=_resolve_auto(cfg.env.normalize_obs, "env.normalize_obs", continuous),
        normalize_reward=_resolve_auto(cfg.env.normalize_reward, "env.normalize_reward", continuous),
    )

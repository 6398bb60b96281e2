"""The config: dataclasses that are the library's typed config and Hydra's schema at once.

The CLI stores them in Hydra's ConfigStore (structured configs), so Hydra and OmegaConf
do the typed merge and the unknown-key error; `from_dict` runs the same merge for
library callers. Range and cross-field checks live with the dataclass they check
(`check`), and `validate` runs them. The built-in backends and schedulers declare
their own keys as subclasses (`RayBackendConfig`, `AdaptSchedulerConfig`, ...), which
their presets select; a plugin declares an `Options` dataclass read from `.options`.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple


class ConfigError(ValueError):
    """A bad config value; the message names the key."""


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def needs(module: str, extra: str, what: str, load: bool = True):
    """`module`, imported; if it cannot be, a `ConfigError` naming what needs it and the
    extra that installs it (an optional dependency is imported only where it is used).
    `load=False` only finds it: a check before a run writes anything, without its import."""
    try:
        if load:
            return importlib.import_module(module)
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}")
        return None
    except ImportError as err:
        raise ConfigError(f"{what} needs {module}, which does not import here ({err}): "
                          f"pip install 'jaxrl-dist[{extra}]'") from None


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _positive(prefix: str, obj, *keys: str, zero: Optional[str] = None) -> None:
    """Each key is a number above 0; with `zero` ("" or what 0 means) 0 is taken too. NaN never is."""
    for key in keys:
        value = getattr(obj, key)
        ok = _is_number(value) and (value > 0 if zero is None else value >= 0)
        what = "positive" if zero is None else f">= 0 ({zero})" if zero else ">= 0"
        require(ok, f"{prefix}.{key} must be {what}, got {value!r}")


def _optional(prefix: str, obj, key: str, ok, what: str) -> None:
    """`obj.key` is null or passes `ok`."""
    value = getattr(obj, key)
    require(value is None or (_is_number(value) and ok(value)), f"{prefix}.{key} must be {what} or null, got {value!r}")


def resolve_auto(value, key: str, continuous: bool) -> bool:
    if value == "auto":
        return continuous
    require(isinstance(value, bool), f"{key}: expected true, false or auto, got {value!r}")
    return value


@dataclass(slots=True)
class EnvConfig:
    id: str = "CartPole-v1"
    suite: str = "auto"  # gymnax | envpool | brax | a plugin's name | auto (the first suite with env.id)
    num_envs: int = 4
    normalize_obs: Any = "auto"  # true | false | auto: on for continuous actions
    normalize_reward: Any = "auto"
    clip_obs: float = 10.0
    clip_reward: float = 10.0
    num_threads: int = 0  # envpool worker threads; 0 lets envpool choose
    kwargs: Dict[str, Any] = field(default_factory=dict)  # extra arguments to the env maker
    wrapper: Optional[str] = None  # an env wrapper around the env (hide, or a plugin's name); null: none
    # the wrapper's options (hide: indices); unused without a wrapper
    wrapper_options: Dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        _positive("env", self, "num_envs", "clip_obs", "clip_reward")
        _positive("env", self, "num_threads", zero="0: envpool chooses")  # below 0 envpool aborts the process
        for key in ("normalize_obs", "normalize_reward"):
            resolve_auto(getattr(self, key), f"env.{key}", False)


@dataclass(slots=True)
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
    network_options: Dict[str, Any] = field(default_factory=dict)  # a plugin network's options
    loss: str = "ppo"  # ppo (clipped surrogate) | a plugin's name
    loss_options: Dict[str, Any] = field(default_factory=dict)  # a plugin loss's options
    hidden_sizes: Tuple[int, ...] = (64, 64)
    activation: str = "tanh"  # tanh | relu
    # sample only the legal actions of an env that gives them (`StepOut.action_mask`):
    # true | false (the policy ignores the mask: the control) | auto (on where the env masks)
    action_mask: Any = "auto"

    def check(self) -> None:
        _positive("algo", self, "total_timesteps", "num_steps", "update_epochs", "num_minibatches", "lr",
                  "clip_eps", "max_grad_norm", "adam_eps")
        for key in ("lr", "clip_eps", "max_grad_norm", "adam_eps", "ent_coef", "vf_coef"):
            value = getattr(self, key)  # a NaN or infinite coefficient trains to the end on NaN
            require(math.isfinite(value) and value >= 0, f"algo.{key} must be a finite number >= 0, got {value}")
        _optional("algo", self, "minibatch_size", lambda v: isinstance(v, int) and v > 0, "a positive integer")
        require(self.name == "ppo", f"algo.name: only 'ppo' is available, got {self.name!r}")
        require(self.activation in ("tanh", "relu"), f"algo.activation must be tanh or relu, got {self.activation!r}")
        for key in ("gamma", "gae_lambda"):
            require(0.0 <= getattr(self, key) <= 1.0, f"algo.{key} must be in [0, 1], got {getattr(self, key)}")
        require(bool(self.hidden_sizes) and all(h > 0 for h in self.hidden_sizes),
                f"algo.hidden_sizes must be positive sizes, got {list(self.hidden_sizes)}")
        resolve_auto(self.action_mask, "algo.action_mask", False)

    @property
    def recurrent(self) -> bool:
        """Whether `network` names a built-in recurrent network (a plugin's is known once built)."""
        return self.network in RECURRENT_NETWORKS

    def check_sequences(self, envs: int, what: str) -> None:
        """A recurrent update's minibatches are whole sequences of `algo.num_steps`, split
        by env: the size must be a whole number of them, the count must divide `envs`."""
        who = f"algo.network={self.network}" if self.recurrent else "a recurrent network"  # a plugin's
        if self.minibatch_size is not None:
            require(self.minibatch_size % self.num_steps == 0,
                    f"algo.minibatch_size={self.minibatch_size} is not a whole number of sequences of "
                    f"algo.num_steps={self.num_steps} ({who} splits minibatches by env)")
        else:
            require(envs % self.num_minibatches == 0,
                    f"algo.num_minibatches={self.num_minibatches} does not divide {what}={envs} "
                    f"({who} splits minibatches by env)")

    def check_split(self, batch: int, what: str) -> None:
        """The batch splits evenly into minibatches (by count, or by `minibatch_size`)."""
        if self.minibatch_size is not None:
            require(batch % self.minibatch_size == 0,
                    f"algo.minibatch_size={self.minibatch_size} does not divide {what}={batch}")
        else:
            require(batch % self.num_minibatches == 0,
                    f"algo.num_minibatches={self.num_minibatches} does not divide {what}={batch}")


@dataclass(slots=True)
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

    def check(self) -> None:
        _positive("run", self, "log_chunks", "target_episodes")
        _positive("run", self, "checkpoint_every", "checkpoint_every_s", zero="0: off")
        _optional("run", self, "target_return", math.isfinite, "a number")
        _optional("run", self, "budget_usd", lambda v: v > 0, "a positive number")
        _optional("run", self, "deadline_s", lambda v: v > 0, "a positive number of seconds")
        _optional("run", self, "max_rounds", lambda v: v > 0, "a positive integer")


@dataclass(slots=True)
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

    def check(self) -> None:
        _positive("logger", self, "wandb_per_chunk", zero="0: every record")
        require(self.wandb_mode in (None, "online", "offline", "disabled"),
                f"logger.wandb_mode: {self.wandb_mode!r} is not online, offline, disabled or null")


@dataclass(slots=True)
class EvalConfig:
    """`jaxrl-dist eval RUN_DIR eval.KEY=VALUE`: what `evaluation.evaluate` runs."""

    episodes: int = 10  # one episode per env, all side by side
    deterministic: bool = True  # the most likely action; false samples the policy
    seed: int = 0  # the eval envs' and (stochastic) actions' seed
    seed_index: int = 0  # which seed of a fused multi-seed run
    max_steps: int = 100_000  # an episode not ended by then counts as not ended
    video: bool = False  # an MP4 of episode 0 (RUN_DIR/eval.mp4): gymnax classic control, MinAtar, Atari
    video_fps: int = 30

    def check(self) -> None:
        _positive("eval", self, "episodes", "max_steps", "video_fps")


# --- where shards run, and how many -----------------------------------------------------------


@dataclass(slots=True)
class BackendConfig:
    """Where actor shards run (`trainer=sync` and `trainer=async`): the keys every backend
    has. A built-in's own keys are its subclass's (`backend=ray` -> `RayBackendConfig`);
    a plugin's are its `Options`, given under `backend.options`."""

    name: str = "local"  # local | ray | http | a plugin's name
    options: Dict[str, Any] = field(default_factory=dict)  # a plugin backend's options
    max_shards: int = 32  # slots: envs whose episodes continue across rounds
    envs_per_shard: int = 4
    shard_timeout: float = 60.0  # seconds before a shard is retried
    max_retries: int = 2  # extra tries of a failed shard, with the same keys
    retry_backoff_s: float = 0.05  # the first wait before a retry (jittered); it doubles each try ...
    retry_backoff_max_s: float = 2.0  # ... up to this (a 429/503 Retry-After can ask for longer)
    # injected stragglers on any backend (benchmarks): one shard in `slow_every` runs
    # `slowdown` times slower (see `trainers.sync.straggle`)
    slowdown: float = 1.0
    slow_every: int = 4

    def check(self) -> None:
        _positive("backend", self, "max_shards", "envs_per_shard", "shard_timeout", "slow_every")
        _positive("backend", self, "max_retries", "retry_backoff_s", "retry_backoff_max_s", zero="")
        require(self.slowdown >= 1.0, f"backend.slowdown must be >= 1 (a factor), got {self.slowdown}")


@dataclass(slots=True)
class RayBackendConfig(BackendConfig):
    name: str = "ray"
    address: Optional[str] = None  # cluster address ("auto", "ray://h:p"); null starts one on loopback
    num_cpus: float = 1.0  # CPUs reserved per actor (fractions allowed)
    memory_mb: Optional[float] = None  # memory reserved per actor (null: none reserved)
    # keep the runtime and the actors (JAX imported, programs compiled) for this process's
    # next run, which takes them over; null: in a multirun's jobs, not in a single run
    keep_actors: Optional[bool] = None

    def check(self) -> None:
        BackendConfig.check(self)  # slots make a new class: no zero-argument super()
        _positive("backend", self, "num_cpus", zero="fractions allowed")
        _optional("backend", self, "memory_mb", lambda v: 0 < v < math.inf, "a positive number of MB")


@dataclass(slots=True)
class HttpBackendConfig(BackendConfig):
    name: str = "http"
    urls: List[str] = field(default_factory=list)  # function endpoints
    # bearer token, for library callers (the CLI refuses it, and config.yaml never holds
    # it); null reads `token_file`, else $JAXRL_DIST_TOKEN
    token: Optional[str] = None
    token_file: Optional[str] = None  # a file whose contents are the bearer token
    compression: str = "deflate"  # deflate | none

    def check(self) -> None:
        BackendConfig.check(self)
        require(self.compression in ("deflate", "none"),
                f"backend.compression must be deflate or none, got {self.compression!r}")
        require(bool(self.urls), "backend.urls: the http backend needs at least one endpoint")
        for i, url in enumerate(self.urls):
            check_url(url, f"backend.urls[{i}]")


def not_a_run_dir(path, needed: str) -> str:
    """The one line every command says of a path that is no run directory: it does not
    exist, or lacks the file `needed` (`config.yaml`, `metrics.jsonl`)."""
    return f"{path}: not a run directory ({'does not exist' if not os.path.exists(path) else f'no {needed}'})"


def check_url(url, key: str) -> None:
    """An endpoint is `http(s)://host[:port][/path]`, checked here rather than at the
    first request, where the error would name the URL but not the key."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when not a number in 0..65535
        why = ("the scheme must be http or https" if parts.scheme not in ("http", "https")
               else "no host" if not parts.hostname else "port 0" if port == 0 else None)
    except (ValueError, TypeError, AttributeError) as err:
        why = str(err)
    require(why is None, f"{key}: {url!r} is not an http(s) URL like http://HOST:PORT ({why})")


@dataclass(slots=True)
class SchedulerConfig:
    """How many shards each round runs (`jaxrl_dist/scheduling/schedulers.py`): the keys
    every scheduler has; `fixed` and `max` take no others."""

    name: str = "fixed"  # fixed | max | adapt | ramp | learned | a plugin's name
    num_shards: int = 4  # fixed: shards per round (the async trainer: actors at the start)
    min_shards: int = 1  # adapt, ramp: fewest shards
    max_shards: Optional[int] = None  # max, adapt, ramp, learned: most shards; null: backend.max_shards
    # the task's return range (adapt, learned); null: the running min/max
    min_return: Optional[float] = None
    max_return: Optional[float] = None
    options: Dict[str, Any] = field(default_factory=dict)  # a plugin scheduler's options

    def check(self) -> None:
        _positive("scheduler", self, "num_shards", "min_shards")
        _optional("scheduler", self, "max_shards", lambda v: isinstance(v, int) and v > 0, "a positive integer")
        require(self.max_shards is None or self.min_shards <= self.max_shards,
                f"scheduler.min_shards={self.min_shards} exceeds scheduler.max_shards={self.max_shards}")
        for key in ("min_return", "max_return"):
            _optional("scheduler", self, key, math.isfinite, "a number")
        require(None in (self.min_return, self.max_return) or self.min_return < self.max_return,
                f"scheduler.min_return={self.min_return} must be below scheduler.max_return={self.max_return}")


@dataclass(slots=True)
class AdaptSchedulerConfig(SchedulerConfig):
    name: str = "adapt"
    window: int = 5  # rounds (with a return) averaged

    def check(self) -> None:
        SchedulerConfig.check(self)
        _positive("scheduler", self, "window")


@dataclass(slots=True)
class RampSchedulerConfig(SchedulerConfig):
    name: str = "ramp"
    step: int = 1  # shards added ...
    every: int = 2  # ... every this many rounds

    def check(self) -> None:
        SchedulerConfig.check(self)
        _positive("scheduler", self, "step", "every")


@dataclass(slots=True)
class LearnedSchedulerConfig(SchedulerConfig):
    name: str = "learned"
    path: Optional[str] = None  # a trained scheduler file; null: the shipped default
    init_from: Optional[str] = None  # `scheduler train`: a scheduler file to fine-tune from


# each group's schema by the name a preset selects; any other name is a plugin's
SCHEMAS = {
    "backend": {"local": BackendConfig, "ray": RayBackendConfig, "http": HttpBackendConfig},
    "scheduler": {"fixed": SchedulerConfig, "max": SchedulerConfig, "adapt": AdaptSchedulerConfig,
                  "ramp": RampSchedulerConfig, "learned": LearnedSchedulerConfig},
}


# each group's entry-point group, where plugins are found (`registry.Registry`)
ENTRY_POINTS = {"backend": "jaxrl_dist.backends", "scheduler": "jaxrl_dist.schedulers"}


def schema(group: str, name: str) -> type:
    """The dataclass of `group`'s option `name` (the group's base for a plugin)."""
    return SCHEMAS[group].get(name, SCHEMAS[group]["local" if group == "backend" else "fixed"])


def as_schema(group: str, part):
    """`part` as its name's own dataclass (a library caller may build the base class with
    a built-in's name, `SchedulerConfig(name="adapt")`): the keys it has, the rest defaults."""
    cls = schema(group, part.name)
    if isinstance(part, cls):
        return part
    return cls(**{f.name: getattr(part, f.name) for f in dataclasses.fields(part) if f.name in cls.__dataclass_fields__})


# --- pricing, trainers ---------------------------------------------------------------------------


@dataclass(slots=True)
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

    def check(self) -> None:
        require(self.kind in ("serverless", "cluster"), f"cost.kind must be serverless or cluster, got {self.kind!r}")
        _positive("cost", self, *(f.name for f in dataclasses.fields(self) if _is_number(getattr(self, f.name))), zero="")
        _positive("cost", self, "transfer_bytes_per_s")
        require(self.kind != "cluster" or self.cluster_nodes >= 1,
                f"cost.cluster_nodes: a cluster needs at least one node, got {self.cluster_nodes}")


@dataclass(slots=True)
class AsyncConfig:
    """The async trainer (`trainer=async`, `jaxrl_dist/trainers/asynchronous.py`); key `asynchronous`."""

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

    def check(self, max_shards: int) -> None:
        _positive("asynchronous", self, "max_staleness", zero="")
        _positive("asynchronous", self, "batch_chunks", "min_actors", "balance_every", "balance_tolerance",
                  "rho_bar", "c_bar")
        top = self.max_actors if self.max_actors is not None else max_shards
        require(top <= max_shards, f"asynchronous.max_actors={top} exceeds backend.max_shards={max_shards}")
        start = self.actors if self.actors is not None else self.batch_chunks
        require(self.min_actors <= start <= top, f"asynchronous.actors={start} is outside "
                f"asynchronous.min_actors..max_actors ({self.min_actors}..{top})")


TRAINERS = ("fused", "sync", "async")


@dataclass(slots=True)
class DistributedConfig:
    """One training run over several processes on JAX's own distributed runtime
    (`trainer.distributed.*`; `jaxrl-dist launch` sets them for each process it starts)."""

    coordinator: Optional[str] = None  # HOST:PORT of process 0's coordinator; null: one process
    num_processes: int = 1
    process_id: int = 0
    timeout_s: int = 60  # a coordinator not reached (or a peer missing) within this fails the run

    def check(self) -> None:
        require(self.num_processes >= 1 and 0 <= self.process_id < self.num_processes,
                f"trainer.distributed.process_id={self.process_id} is outside 0..{self.num_processes - 1} "
                f"(trainer.distributed.num_processes={self.num_processes})")
        _positive("trainer.distributed", self, "timeout_s")
        require(self.num_processes == 1 or bool(self.coordinator),
                "trainer.distributed.coordinator: several processes need HOST:PORT of process 0's coordinator")
        require(not self.coordinator or bool(re.fullmatch(r"[\w.\-]+:\d{1,5}", self.coordinator)),
                f"trainer.distributed.coordinator must be HOST:PORT, got {self.coordinator!r}")


@dataclass(slots=True)
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

    def check(self, num_seeds: int, resumed: bool = False) -> None:
        """`resumed`: the run continues a saved config, whose trainer and devices it takes
        with this config's `distributed` only (checked when they are joined, `rundir`)."""
        require(self.name in TRAINERS, f"trainer: unknown trainer {self.name!r} (choose from: {', '.join(TRAINERS)})")
        count = requested_devices(self)
        _positive("trainer", self, "seed_axis")
        require(num_seeds % self.seed_axis == 0,
                f"trainer.seed_axis={self.seed_axis} does not divide num_seeds={num_seeds}")
        require(count is None or count % self.seed_axis == 0,
                f"trainer.seed_axis={self.seed_axis} does not divide trainer.devices={count}")
        self.distributed.check()
        n = 1 if resumed else self.distributed.num_processes
        require(n == 1 or self.name == "fused", f"trainer.distributed.num_processes={n}: several processes "
                f"train with trainer=fused only (trainer={self.name})")
        require(n == 1 or count != 1, f"trainer.devices={self.devices}: a run over {n} processes spans "
                "every process's devices; set trainer.devices=all (jaxrl-dist launch sets it)")


def on_one_device(cfg: "Config") -> "Config":
    """`cfg` as one process on one device reads it (a checkpoint's template, `eval`): no
    data mesh, no seed axis, no other processes, whatever the run was trained on."""
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, devices="1", seed_axis=1,
                                                                distributed=DistributedConfig()))


def requested_devices(t: TrainerConfig) -> Optional[int]:
    """`trainer.devices` as a count; None for `all`."""
    value = str(t.devices).strip().lower()
    if value == "all":
        return None
    require(value.isdigit() and int(value) >= 1, f"trainer.devices must be all or a positive integer, got {t.devices!r}")
    return int(value)


# the one line for the old spelling of the fused trainer (the CLI's `backend=fused` too)
FUSED_IS_A_TRAINER = ("the fused trainer is chosen with trainer=fused now "
                      "(backend= only says where shards run: local, ray, http)")
# keys that moved: the old spelling -> the new one (`async` is a Python keyword)
MOVED = {"async": "asynchronous"}
# key prefixes each trainer never reads
_IGNORED = {
    "fused": ("backend", "scheduler", "asynchronous", "cost", "run.target_return", "run.stop_at_target",
              "run.budget_usd", "run.deadline_s", "run.max_rounds", "run.target_episodes"),
    "sync": ("asynchronous",),
    "async": ("scheduler",),
}


# The three kinds of key, for a program and for a sweep (`key_kind`):
# - traced: only ever numbers in the program (`core.ppo.Hyper`, a per-member array):
#   jobs that differ only in these share one program, and a new value never recompiles;
# - host: read by the process around the program (its run dir, logging, trackers), per job;
# - member: which members a job adds to a group (its seeds);
# - shaping: everything else sets the program itself (env, network, sizes, booleans,
#   the trainer, `run.log_chunks` and `run.checkpoint_every` through the chunk size).
TRACED = ("algo.lr", "algo.max_grad_norm", "algo.ent_coef", "algo.vf_coef", "algo.clip_eps",
          "algo.gamma", "algo.gae_lambda")
HOST = ("run.dir", "run.resume", "run.compile_cache", "run.progress", "run.objective", "run.tensorboard",
        "run.profile_dir", "run.checkpoint_every_s", "logger")
MEMBER = ("seed", "num_seeds")
# the `run` keys a resumed run takes from its caller (they cannot change results); every
# other key comes from the config saved in its directory
RESUMED = ("progress", "compile_cache")
# and the backend keys it takes when its backend is the saved one's: where the actors are
# and how to reach them (instances that came back at new addresses), not what they compute
RESUMED_BACKEND = ("urls", "token", "token_file", "address")
# the keys a resumed run reads from its caller (`trainer.distributed.*`: `launch` sets them)
RESUMED_KEYS = ("run.resume", "run.dir", "trainer.distributed", *(f"run.{key}" for key in RESUMED))


def check_resumed(cfg: "Config", keys: Sequence[str], saved_backend: str) -> None:
    """A resumed run trains the config saved in its directory: each of `keys` (set beside
    `run.resume`) must be one it reads from its caller (`RESUMED_KEYS`, and where its
    actors are when `cfg.backend` is the saved one, `saved_backend`), else one line naming
    it, not silently dropped; and `run.dir` is the resumed one's own."""
    taken = " and ".join(f"run.{key}" for key in RESUMED) + ", and where its actors are: " + ", ".join(
        f"backend.{key}" for key in RESUMED_BACKEND if key != "token")  # the command line takes no token
    actors = ("backend", *(f"backend.{k}" for k in RESUMED_BACKEND)) if cfg.backend.name == saved_backend else ()
    for key in keys:
        if key.startswith("hydra") or key in actors or any(key == k or key.startswith(k + ".") for k in RESUMED_KEYS):
            continue
        raise ConfigError(f"{key}: run.resume={cfg.run.resume} continues with the config saved in that "
                          f"directory; drop the key (a resumed run takes only {taken})")
    require(not cfg.run.dir or os.path.realpath(cfg.run.dir) == os.path.realpath(cfg.run.resume),
            f"run.dir={cfg.run.dir}: a resumed run stays in its own directory (run.resume={cfg.run.resume})")


def key_kind(key: str) -> str:
    """`traced`, `host`, `member` or `shaping`: what a dotted config key is to a program."""
    under = lambda prefixes: any(key == p or key.startswith(p + ".") for p in prefixes)  # noqa: E731
    return ("traced" if key in TRACED else "host" if under(HOST) else "member" if key in MEMBER
            else "shaping")


@dataclass(slots=True)
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    run: RunConfig = field(default_factory=RunConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    asynchronous: AsyncConfig = field(default_factory=AsyncConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0
    num_seeds: int = 1

    def __post_init__(self):
        """What a library caller may write for short: `trainer="sync"`, `backend="ray"`, a
        part as a mapping (`algo={"lr": 3e-4}`, typed as `from_dict` types it), lists for tuples."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, str) and f.name in ("trainer", *SCHEMAS):
                value = {"name": value}
            if isinstance(value, dict) and f.default_factory is not dataclasses.MISSING:
                cls = schema(f.name, value.get("name")) if f.name in SCHEMAS else f.default_factory
                setattr(self, f.name, typed(cls, value, f"{f.name}."))
        self.backend = as_schema("backend", self.backend)
        self.scheduler = as_schema("scheduler", self.scheduler)
        _tuples(self)

    def check(self) -> None:
        """Every part's own checks, then the ones across parts."""
        require(self.num_seeds > 0, f"num_seeds must be positive, got {self.num_seeds}")
        for part in (self.env, self.algo, self.run, self.cost, self.logger):
            part.check()
        require(self.backend.name != "fused", f"backend=fused: {FUSED_IS_A_TRAINER}")
        self.scheduler.check()  # a scheduler's own keys are checked whichever trainer runs
        self.trainer.check(self.num_seeds, resumed=bool(self.run.resume))
        batch = self.env.num_envs * self.algo.num_steps
        if self.trainer.name == "fused":
            if self.algo.recurrent:  # first: it says why a size that divides the batch is refused
                self.check_sequences()
            self.algo.check_split(batch, "the batch env.num_envs*algo.num_steps")
        else:
            self._check_rounds()
            if self.algo.recurrent:
                self.check_sequences()
        require(self.algo.total_timesteps >= batch,
                f"algo.total_timesteps={self.algo.total_timesteps} is smaller than one batch ({batch})")
        self._check_step_count()

    def check_sequences(self) -> None:
        """A recurrent network's split of a batch's envs into sequences: the fused run's
        envs, or one shard's (`AlgoConfig.check_sequences`)."""
        fused = self.trainer.name == "fused"
        self.algo.check_sequences(self.env.num_envs if fused else self.backend.envs_per_shard,
                                  "env.num_envs" if fused else "backend.envs_per_shard")

    def _check_step_count(self) -> None:
        """The optimiser counts its gradient steps in int32: the run's must fit (a run of
        that length would not end anyway; the error saves a deep overflow)."""
        a = self.algo
        batch = a.num_steps * (self.env.num_envs if self.trainer.name == "fused" else self.backend.envs_per_shard)
        steps = -(-a.total_timesteps // (a.minibatch_size or max(batch // a.num_minibatches, 1))) * a.update_epochs
        require(steps < 2 ** 31, f"algo.total_timesteps={a.total_timesteps:.3g} is too many: {steps:.3g} gradient "
                "steps, more than the optimiser's int32 step count holds (2**31)")

    def _check_rounds(self) -> None:
        """The round trainers' keys (checked only when a shard backend is chosen)."""
        b, s = self.backend, self.scheduler
        b.check()
        require(not (s.name == "fixed" and s.num_shards > b.max_shards and self.trainer.name == "sync"),
                f"scheduler.num_shards={s.num_shards} exceeds backend.max_shards={b.max_shards}")
        require(self.num_seeds == 1, f"num_seeds={self.num_seeds}: trainer={self.trainer.name} trains one seed; "
                "trainer=fused trains several seeds in one program")
        self.algo.check_split(b.envs_per_shard * self.algo.num_steps,
                              "one shard's batch backend.envs_per_shard*algo.num_steps")
        if self.trainer.name == "async":
            self.asynchronous.check(b.max_shards)

    def check_used(self, keys: Sequence[str]) -> None:
        """A key the user set that the chosen trainer ignores is an error naming it."""
        name = self.trainer.name
        for key in keys:
            if any(key == p or key.startswith(p + ".") for p in _IGNORED.get(name, ())):
                what = " (set trainer=sync or async, or drop the key)" if name == "fused" else "; drop the key"
                raise ConfigError(f"{key}: trainer={name} does not use it{what}")
        require(not ("algo.num_minibatches" in keys and self.algo.minibatch_size is not None),
                f"algo.num_minibatches: ignored while algo.minibatch_size={self.algo.minibatch_size} is set; "
                "set algo.minibatch_size=null to use it")
        if name == "sync" and self.scheduler.name in SCHEDULER_READS:
            self._check_scheduler_keys(keys)
        given = next((k for k in keys if k.startswith("env.wrapper_options")), None)
        require(given is None or bool(self.env.wrapper), f"{given}: no env.wrapper is set, so nothing reads it; "
                "set env.wrapper (hide, or a plugin wrapper's name) or drop the key")

    def _check_scheduler_keys(self, keys: Sequence[str]) -> None:
        """A base scheduler key the user set that the chosen built-in scheduler does not read."""
        name, reads = self.scheduler.name, SCHEDULER_READS[self.scheduler.name]
        base = {f.name for f in dataclasses.fields(SchedulerConfig)} - {"name", "options"}
        for key in keys:
            group, _, field = key.partition(".")
            require(group != "scheduler" or field not in base or field in reads,
                    f"{key}: scheduler={name} does not read it (it reads "
                    f"{', '.join(f'scheduler.{k}' for k in reads)}); drop the key")


# the base scheduler keys each built-in reads (its own schema's keys aside); a plugin may read any
SCHEDULER_READS = {"fixed": ("num_shards",), "max": ("max_shards",), "ramp": ("min_shards", "max_shards"),
                   "adapt": ("min_shards", "max_shards", "min_return", "max_return"),
                   "learned": ("max_shards", "min_return", "max_return")}
RECURRENT_NETWORKS = ("gru", "lstm")  # `core.networks.RECURRENT`, named here without importing JAX
# suites whose step resets an ended episode itself, which a recurrent policy's carry reset follows
RECURRENT_SUITES_REFUSED = {"envpool": "envpool resets on the step after an episode's end"}


def check_recurrent(cfg: Config, suite: str) -> None:
    """The support table's refusals of a recurrent network (one line naming the keys): on
    a suite whose envs step outside JAX, or over a trainer's data mesh."""
    a = cfg.algo
    why = RECURRENT_SUITES_REFUSED.get(suite)
    require(why is None, f"algo.network={a.network} with env.suite={suite} ({cfg.env.id}): recurrent "
            f"policies are not supported there ({why}); see the README's support table")
    require(requested_devices(cfg.trainer) == 1,
            f"algo.network={a.network} with trainer.devices={cfg.trainer.devices}: a recurrent update "
            "is not split over a data mesh; use trainer.devices=1 (seeds still spread over devices)")


def check_policy(cfg: Config, suite: str, recurrent: bool, env_masked: bool) -> bool:
    """The support table's checks of a built policy on its env (before any compile):
    a recurrent network where the suite or the trainer's mesh cannot carry it, or a mask
    the env does not give, is one line naming the keys. Returns whether to mask actions."""
    a = cfg.algo
    if recurrent:
        check_recurrent(cfg, suite)
        if not a.recurrent:  # a plugin's (or a module handed to `make_train`): its sizes, once known
            cfg.check_sequences()
    mask = resolve_auto(a.action_mask, "algo.action_mask", env_masked)
    require(not mask or env_masked, f"algo.action_mask=true with env.id={cfg.env.id} ({suite}): "
            "this env gives no legal actions to mask")
    return mask


def validate(cfg: Config) -> Config:
    """Check a config without touching JAX; raises `ConfigError` naming the key. A config
    a library caller built is type-checked first, as OmegaConf checks a composed one
    (`total_timesteps=2e4` is a float where an integer goes)."""
    _check_types(cfg)
    cfg.check()
    return cfg


def _check_types(cfg: Config) -> None:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for f in dataclasses.fields(cfg):
        part = getattr(cfg, f.name)
        if not dataclasses.is_dataclass(part):  # seed, num_seeds
            require(isinstance(part, int) and not isinstance(part, bool), f"{f.name} must be an integer, got {part!r}")
            continue
        try:
            OmegaConf.structured(part)  # validates each value against its field's type
        except OmegaConfBaseException as err:
            raise ConfigError(omegaconf_message(err, prefix=f"{f.name}.")) from None


# --- the typed merge, for library callers and saved runs ---------------------------------------


def did_you_mean(word: str, choices: Sequence[str], cutoff: float = 0.8) -> str:
    """` (did you mean 'x'?)` for the closest of `choices`, else ''; case aside
    (`env=CartPole` finds `cartpole`). Short names (presets, commands, plugins) take a
    lower `cutoff` (`backend=rya` finds `ray`); among long dotted keys it would find
    keys that merely share their group (`algo.foo` -> `algo.loss`)."""
    lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(lower), n=1, cutoff=cutoff)
    return f" (did you mean '{lower[close[0]]}'?)" if close else ""


def config_keys(tree: dict, prefix: str = "") -> list:
    """Every dotted key of a plain nested config, mappings too (not inside open mappings)."""
    out = []
    for key, value in tree.items():
        out.append(f"{prefix}{key}")
        if isinstance(value, dict) and key not in ("options", "kwargs", "allowed_env_kwargs"):
            out += config_keys(value, f"{prefix}{key}.")
    return out


def unknown_key(key: str, known: Sequence[str]) -> str:
    """The one line for a key the schema lacks: where it moved, or the closest key."""
    head, _, rest = key.partition(".")
    if head in MOVED:
        new = f"{MOVED[head]}.{rest}" if rest else MOVED[head]
        return f"'{key}': the {head} trainer's keys are {MOVED[head]}.* now (use {new})"
    owners = [name for name, cls in SCHEMAS.get(head, {}).items() if rest in {f.name for f in dataclasses.fields(cls)}]
    if owners:
        return f"'{key}': only {' and '.join(f'{head}={o}' for o in owners)} take{'s' * (len(owners) == 1)} this key"
    return f"unknown config key '{key}'{did_you_mean(key, known)}"


def omegaconf_message(err: Exception, known: Sequence[str] = (), prefix: str = "") -> str:
    """One line for OmegaConf's merge errors: the key, and what is wrong with it."""
    key = prefix + (getattr(err, "full_key", "") or "")
    text = str(err).split("\n")[0]
    if re.search(r"not in struct|not a field|Key '[^']*' not in '", text):
        return unknown_key(key, [prefix + k for k in known])
    return f"{key}: {text}" if key else text


def _tuples(obj):
    """Fields declared as tuples come back from OmegaConf as lists: make them tuples again
    (hashable, as the networks' static arguments need)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            _tuples(value)
        elif isinstance(value, list) and str(f.type).startswith(("Tuple", "tuple")):
            setattr(obj, f.name, tuple(value))
    return obj


def from_omegaconf(node) -> "Config":
    """The `Config` of a composed, typed OmegaConf config (its keys but `hydra`)."""
    from omegaconf import OmegaConf

    obj = OmegaConf.to_object(node)
    if isinstance(obj, dict):  # Hydra's root node is a plain mapping of typed parts
        obj = Config(**{f.name: obj[f.name] for f in dataclasses.fields(Config)})
    return obj  # `Config.__post_init__` made its lists tuples again


def from_job(node, used_keys: Sequence[str] = ()) -> "Config":
    """The checked `Config` of a composed Hydra job config (`from_omegaconf`, `check`, and
    `check_used` on the keys the job's overrides set): compose, then validate once."""
    cfg = from_omegaconf(node)
    cfg.check()
    cfg.check_used(used_keys)
    return cfg


def typed(schema_obj, data, prefix: str = ""):
    """A dataclass (the class, or an instance whose field types and defaults to start from)
    filled from a plain mapping by OmegaConf's typed merge; `ConfigError` names
    `prefix + key` of an unknown key or a value of the wrong type."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    node = OmegaConf.structured(schema_obj)
    try:
        return _tuples(OmegaConf.to_object(OmegaConf.merge(node, data or {})))
    except OmegaConfBaseException as err:
        raise ConfigError(omegaconf_message(err, config_keys(OmegaConf.to_container(node)), prefix)) from None


def from_dict(data: dict, user_keys: Optional[Sequence[str]] = None) -> Config:
    """A checked `Config` from nested plain dicts (OmegaConf's typed merge: unknown keys and
    wrong types are errors naming the key); a key the caller set (`user_keys`; None: each
    key whose value is not its default) that the chosen trainer ignores is an error too.
    `trainer`, `backend` and `scheduler` may be plain names."""
    data = dict(data or {})
    for old in MOVED:
        require(old not in data, unknown_key(old, ()))
    for group in ("trainer", *SCHEMAS):  # a plain name for short, as the command line's `backend=ray`
        if isinstance(data.get(group), str):
            data[group] = {"name": data[group]}
    start = Config()
    for group in SCHEMAS:  # a backend's or scheduler's name selects its schema
        name = (data.get(group) or {}).get("name") if isinstance(data.get(group), dict) else None
        if isinstance(name, str):
            setattr(start, group, schema(group, name)())
    cfg = typed(start, data)  # its types checked by the merge
    cfg.check()
    cfg.check_used(changed_keys(cfg) if user_keys is None else list(user_keys))
    return cfg


def flat(tree: dict, prefix: str = "") -> dict:
    """`{"a.b": leaf}` of a nested dict."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def changed_keys(cfg: Config, *others: Config) -> list:
    """The dotted keys whose values differ from their defaults (the chosen backend's and
    scheduler's schemas), and from their values in each of `others` (a resumed run's saved
    config): what a library caller set, for `check_used` and `check_resumed`."""
    base = Config(backend=schema("backend", cfg.backend.name)(), scheduler=schema("scheduler", cfg.scheduler.name)())
    bases = [flat(to_dict(c)) for c in (base, *others)]
    return [k for k, v in flat(to_dict(cfg)).items() if all(k not in b or b[k] != v for b in bases)]


def to_dict(cfg: Config) -> dict:
    """Plain nested dict of a config (tuples as lists), for YAML/JSON."""

    def plain(x):
        if isinstance(x, (tuple, list)):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    return plain(dataclasses.asdict(cfg))


def without_secrets(data: dict) -> dict:
    """A `to_dict` config with its secrets (`backend.token`) taken out: what is saved
    with a run or sent to a tracker."""
    if (data.get("backend") or {}).get("token") is None:
        return data
    return {**data, "backend": {**data["backend"], "token": None}}


# --- values derived from a checked config -----------------------------------------------------


class Derived(NamedTuple):
    """Values computed from a config, in one place."""

    batch_size: int  # per seed per update: num_envs * num_steps
    minibatch_size: int
    num_updates: int
    normalize_obs: bool
    normalize_reward: bool


def num_minibatches(a: AlgoConfig, batch: int) -> int:
    """Minibatches per epoch of a `batch`-sample update."""
    return batch // a.minibatch_size if a.minibatch_size else a.num_minibatches


def derive(cfg: Config, continuous: bool = False) -> Derived:
    """Derived sizes of a valid config; `continuous` resolves the `auto` options."""
    batch = cfg.env.num_envs * cfg.algo.num_steps
    return Derived(
        batch_size=batch,
        minibatch_size=batch // num_minibatches(cfg.algo, batch),
        num_updates=cfg.algo.total_timesteps // batch,
        normalize_obs=resolve_auto(cfg.env.normalize_obs, "env.normalize_obs", continuous),
        normalize_reward=resolve_auto(cfg.env.normalize_reward, "env.normalize_reward", continuous),
    )


def distributed_config(data: Optional[dict]) -> DistributedConfig:
    """The checked `trainer.distributed` of a composed config's `trainer` mapping, read
    before the rest (the processes must join before anything starts JAX's backend)."""
    d = typed(DistributedConfig, (data or {}).get("distributed"), "trainer.distributed.")
    d.check()
    return d


# --- the actor function's own config (`jaxrl-dist serve`) --------------------------------------

# env ids a serve instance runs unless `serve.allowed_envs` says otherwise: the presets'
DEFAULT_ALLOWED_ENVS = ["CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCar-v0",
                        "Breakout-MinAtar", "Pong-v5", "Breakout-v5", "Qbert-v5",
                        "SpaceInvaders-v5", "Gravitar-v5", "Hopper-v3", "HalfCheetah-v3",
                        "Humanoid-v3"]
_PATH_WORDS = ("path", "file", "dir", "root", "url")  # env kwargs that name a place


@dataclass(slots=True)
class ServeConfig:
    """The actor function (`jaxrl-dist serve serve.KEY=VALUE`); apart from the training config."""

    host: str = "127.0.0.1"
    port: int = 8000  # $PORT wins when set
    token: Optional[str] = None  # null reads $JAXRL_DIST_TOKEN; empty string: no auth
    max_body_mb: float = 64.0
    allowed_envs: List[str] = field(default_factory=lambda: list(DEFAULT_ALLOWED_ENVS))
    # env id -> {kwarg: "bool" | {min, max} | {choices: [...]}}: the env_kwargs a request may set
    allowed_env_kwargs: Dict[str, Any] = field(default_factory=dict)
    max_slot: int = 1024  # slots 0..max_slot-1
    max_envs: int = 256  # envs per shard (spec.num_envs)
    max_rollout_mb: float = 512.0  # one shard's trajectory, estimated from the env's observations
    max_programs: int = 16  # compiled specs kept (least recently used out)
    max_pools: int = 8  # envpool slot pools kept
    max_concurrent: int = 8  # requests running or queued for the worker; beyond it 503
    body_timeout_s: float = 10.0  # to read a request's body (408 past it)
    header_timeout_s: float = 10.0  # to read a request's headers (the connection is closed)
    rollout_timeout_s: float = 600.0  # one shard in the worker process, which is restarted past it

    def check(self) -> "ServeConfig":
        """The limits are positive and `allowed_env_kwargs` holds rules a request's values can
        be checked against; keys that name files or paths are never allowed."""
        _positive("serve", self, "max_body_mb", "max_slot", "max_envs", "max_rollout_mb", "max_programs",
                  "max_pools", "max_concurrent", "body_timeout_s", "header_timeout_s", "rollout_timeout_s")
        require(0 <= self.port <= 65535, f"serve.port must be in 0..65535 (0: any free port), got {self.port}")
        for key, ids in (("allowed_envs", self.allowed_envs), ("allowed_env_kwargs", self.allowed_env_kwargs)):
            for env_id in ids:  # a misspelt preset id would refuse every request for the real one
                near = "" if env_id in DEFAULT_ALLOWED_ENVS else did_you_mean(str(env_id), DEFAULT_ALLOWED_ENVS)
                require(not near, f"serve.{key}: {env_id!r} is not an env id{near}")
        for env_id, rules in self.allowed_env_kwargs.items():
            require(isinstance(rules, dict), f"serve.allowed_env_kwargs.{env_id}: expected a mapping of kwarg rules")
            for name, rule in rules.items():
                _check_kwarg_rule(f"serve.allowed_env_kwargs.{env_id}.{name}", str(name), rule)
        return self


def _check_kwarg_rule(key: str, name: str, rule: Any) -> None:
    require(not any(word in name.lower() for word in _PATH_WORDS),
            f"{key}: paths and file names are never taken from a request")
    if rule == "bool":
        return
    if isinstance(rule, dict) and set(rule) == {"min", "max"}:
        low, high = rule["min"], rule["max"]
        require(all(_is_number(x) and math.isfinite(x) for x in (low, high)) and low <= high,
                f"{key}: min and max must be finite numbers, min <= max")
        return
    if isinstance(rule, dict) and set(rule) == {"choices"} and isinstance(rule["choices"], (list, tuple)):
        for c in rule["choices"]:
            require(isinstance(c, (bool, int, float, str)) and not (isinstance(c, str) and ("/" in c or "\\" in c)),
                    f"{key}: choices must be plain scalars (no paths), got {c!r}")
        return
    raise ConfigError(f"{key}: expected \"bool\", {{min: A, max: B}} or {{choices: [...]}}, got {rule!r}")

"""Actor shards: the unit of work a backend runs.

A shard is `(policy params, slot state, key, shard spec) -> (trajectory
[T, B], new slot state, bootstrap value [B], timings)`. It runs the core's
rollout (`rollout.make_rollout`) with one seed and `B = envs_per_shard` envs,
so the round trainer gathers exactly the data the fused trainer would.

Slots `0..max_shards-1` each own `B` envs whose episodes continue across
rounds. A gymnax slot's state is a small pytree that the trainer keeps and
ships with every shard, so workers are stateless and any of them can run (or
rerun) any slot with the same result. An envpool slot's state lives in C++:
the worker that first runs a slot keeps it (`ShardWorker`), and a worker that
has never seen a slot resets its envs and says so (`reset=True`).

Keys come from `(seed, round, slot)` by `fold_in`, so a slot's data in a
round is the same on every backend and on every retry.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import threading
import time
from collections import OrderedDict
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.core import rng
from jaxrl_dist.config import Config, ConfigError, derive
from jaxrl_dist.core import networks
from jaxrl_dist.core.networks import BUILTIN, NETWORKS, is_frame_stack, make_network
from jaxrl_dist.core.rollout import RolloutOptions, init_actor, make_rollout
from jaxrl_dist.core.types import ActorState, Transition
from jaxrl_dist.envs import SUITES, make_env
from jaxrl_dist.envs.wrappers import WRAPPERS
from jaxrl_dist.registry import options as plugin_options

# fold_in streams under the run's seed key
_SHARD_STREAM, _LEARN_STREAM, _SLOT_INIT_STREAM = 0, 1, 2


class ShardError(ValueError):
    """A shard request that cannot run; the message names the field."""


class SpecError(ShardError, ConfigError):
    """A spec whose env (or env wrapper) this process cannot make: a config error as well,
    so the driver's own program of a bad config exits 2 with the line."""


# the config key an env error names -> the spec's field (the wrapper's before env.*)
_ENV_FIELDS = (("env.wrapper_options", "env_wrapper_options"), ("env.wrapper", "env_wrapper"),
               ("env.kwargs", "env_kwargs"))


def field_name(key) -> str:
    """A request's field name as an error shows it: on one line, at most 64 characters
    (a name with a newline or other unprintable characters is quoted)."""
    text = str(key)[:64]
    return text if text.isprintable() and text.strip() == text and text else repr(text)


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """What a worker needs to build a shard's env, network and rollout (plain data)."""

    env_id: str
    suite: str
    num_envs: int
    num_steps: int
    network: str
    hidden_sizes: tuple
    activation: str
    normalize_obs: bool
    normalize_reward: bool
    gamma: float
    clip_obs: float
    clip_reward: float
    env_kwargs: str = "{}"  # JSON, so the spec stays hashable
    num_threads: int = 0  # envpool worker threads per slot's pool; 0 lets envpool choose
    network_options: str = "{}"  # JSON: a plugin network's options
    env_wrapper: str = ""  # a registered env wrapper around the env (`envs.wrappers`); "": none
    env_wrapper_options: str = "{}"  # JSON: its options
    mask_actions: bool = False  # sample only the env's legal actions (`algo.action_mask`)

    def to_dict(self) -> dict:
        """Plain data; without the env wrapper's fields when there is none, so a request
        without one is what a worker from before them (same wire version) accepts."""
        d = dataclasses.asdict(self)
        d["hidden_sizes"] = list(self.hidden_sizes)
        if not self.env_wrapper and self.env_wrapper_options == "{}":
            del d["env_wrapper"], d["env_wrapper_options"]
        if not self.mask_actions:
            del d["mask_actions"]
        return d

    @classmethod
    def from_dict(cls, data: Any) -> "ShardSpec":
        """Build from untrusted plain data; `ShardError` names the bad field. Every field is
        typed and bounded, and names (suite, network, activation) must be registered here."""
        if not isinstance(data, dict):
            raise ShardError("spec: expected a mapping")
        kinds = {"env_id": str, "suite": str, "num_envs": int, "num_steps": int, "network": str,
                 "hidden_sizes": (list, tuple), "activation": str, "normalize_obs": bool,
                 "normalize_reward": bool, "gamma": float, "clip_obs": float,
                 "clip_reward": float, "env_kwargs": str, "num_threads": int, "network_options": str,
                 "env_wrapper": str, "env_wrapper_options": str, "mask_actions": bool}
        unknown = [k for k in data if k not in kinds]
        if unknown:
            raise ShardError(f"spec.{field_name(unknown[0])}: unknown field")
        values = {}
        for name, kind in kinds.items():
            if name not in data:
                if name in OPTIONAL:  # the defaults
                    continue
                raise ShardError(f"spec.{name}: missing")
            values[name] = _checked(data[name], kind, f"spec.{name}")
        if len(values["hidden_sizes"]) > MAX_LAYERS:
            raise ShardError(f"spec.hidden_sizes: at most {MAX_LAYERS} layers, "
                             f"got {len(values['hidden_sizes'])}")
        values["hidden_sizes"] = tuple(_checked(h, int, "spec.hidden_sizes") for h in values["hidden_sizes"])
        spec = cls(**values)
        spec.check_limits()
        spec.check_names()
        return spec

    def check_limits(self) -> None:
        if not 0 < self.num_envs <= 4096:
            raise ShardError(f"spec.num_envs must be in 1..4096, got {self.num_envs}")
        if not 0 < self.num_steps <= 4096:
            raise ShardError(f"spec.num_steps must be in 1..4096, got {self.num_steps}")
        if not 0 <= self.num_threads <= 64:
            raise ShardError(f"spec.num_threads must be in 0..64, got {self.num_threads}")
        if not self.hidden_sizes or any(not 0 < h <= 4096 for h in self.hidden_sizes):
            raise ShardError(f"spec.hidden_sizes must be sizes in 1..4096, got {list(self.hidden_sizes)}")
        if not (math.isfinite(self.gamma) and 0.0 <= self.gamma <= 1.0):
            raise ShardError(f"spec.gamma must be a finite number in [0, 1], got {self.gamma}")
        for name in ("clip_obs", "clip_reward"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 < value <= MAX_CLIP):
                raise ShardError(f"spec.{name} must be a finite number in (0, {MAX_CLIP:g}], got {value}")
        for name in ("env_id", "suite", "network", "activation"):
            if not 0 < len(getattr(self, name)) <= MAX_NAME:
                raise ShardError(f"spec.{name}: expected 1..{MAX_NAME} characters")
        if len(self.env_wrapper) > MAX_NAME:
            raise ShardError(f"spec.env_wrapper: expected 0..{MAX_NAME} characters")
        for name in ("env_kwargs", "network_options", "env_wrapper_options"):
            json_object(getattr(self, name), f"spec.{name}")

    def check_names(self) -> None:
        """Suite, network, activation and env wrapper are names registered in this process;
        a plugin network's and the wrapper's options are checked by their own `Options`."""
        _check_names(self.suite, self.network, self.activation, self.network_options)
        _check_wrapper(self.env_wrapper, self.env_wrapper_options)

    @property
    def sticky(self) -> bool:
        """Whether a slot's env state stays on the worker that runs it."""
        return self.suite == "envpool"


MAX_LAYERS = 8  # hidden layers a request may ask for
MAX_CLIP = 1e6
MAX_NAME = 128  # characters of an env id, suite, network or activation name
MAX_JSON = 4096  # characters of a JSON field (env_kwargs, network_options, env_wrapper_options)
MAX_LIST = 64  # items of a list in a JSON field (a wrapper's indices)
OPTIONAL = ("env_kwargs", "num_threads", "network_options", "env_wrapper", "env_wrapper_options",
            "mask_actions")
ACTIVATIONS = tuple(networks._ACTIVATIONS)  # what the built-in networks take (algo.activation)


def json_object(text: str, name: str) -> dict:
    """A spec's JSON field as a flat object of scalars and flat lists of at most `MAX_LIST`
    numbers or strings (anything deeper is refused: nothing a request sends needs it, and
    nesting is how a parser is made to recurse)."""
    if len(text) > MAX_JSON:
        raise ShardError(f"{name}: over {MAX_JSON} characters")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise ShardError(f"{name}: not valid JSON") from None
    if not isinstance(value, dict):
        raise ShardError(f"{name}: expected a JSON object, got {type(value).__name__}")
    for key, item in value.items():
        if isinstance(item, list):
            _flat_list(item, f"{name}.{field_name(key)}")
        elif isinstance(item, dict):
            raise ShardError(f"{name}.{field_name(key)}: expected a scalar or a list, got {type(item).__name__}")
    return value


def _flat_list(items: list, name: str) -> None:
    if len(items) > MAX_LIST:
        raise ShardError(f"{name}: over {MAX_LIST} items")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, float, str)):
            raise ShardError(f"{name}: expected a list of numbers or strings, got a {type(item).__name__} in it")


@functools.lru_cache(maxsize=256)  # plugins are found once per process: a registry scan is slow
def _check_names(suite: str, network: str, activation: str, network_options: str) -> None:
    if suite not in SUITES.names():
        raise ShardError(f"spec.suite: {suite[:64]!r} is not a registered env suite "
                         f"({', '.join(SUITES.names())})")
    if network not in NETWORKS.names():
        raise ShardError(f"spec.network: {network[:64]!r} is not a registered network "
                         f"({', '.join(NETWORKS.names())})")
    if activation not in ACTIVATIONS:
        raise ShardError(f"spec.activation: {activation[:64]!r} is not one of {', '.join(ACTIVATIONS)}")
    options = json_object(network_options, "spec.network_options")
    if network in BUILTIN:
        if options:
            raise ShardError(f"spec.network_options.{sorted(options)[0][:64]}: the built-in "
                             "networks take no options")
        return
    try:
        plugin_options(NETWORKS.get(network), options, "spec.network_options")
    except ConfigError as err:
        raise ShardError(str(err)) from err


@functools.lru_cache(maxsize=256)
def _check_wrapper(name: str, options: str) -> None:
    given = json_object(options, "spec.env_wrapper_options")
    if not name:
        if given:
            raise ShardError(f"spec.env_wrapper_options.{field_name(sorted(given)[0])}: "
                             "set without spec.env_wrapper")
        return
    if name not in WRAPPERS.names():
        raise ShardError(f"spec.env_wrapper: {name[:64]!r} is not a registered env wrapper "
                         f"({', '.join(WRAPPERS.names())})")
    try:
        plugin_options(WRAPPERS.get(name), given, "spec.env_wrapper_options")
    except ConfigError as err:
        raise ShardError(str(err)) from err


def _checked(value, kind, name: str):
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        want = kind.__name__ if isinstance(kind, type) else "list"
        raise ShardError(f"{name}: expected {want}, got {type(value).__name__}")
    return value


def spec_from_config(cfg: Config, suite: str, continuous: bool, mask_actions: bool = False) -> ShardSpec:
    d, a = derive(cfg, continuous), cfg.algo
    return ShardSpec(cfg.env.id, suite, cfg.backend.envs_per_shard, a.num_steps, a.network,
                     tuple(a.hidden_sizes), a.activation, d.normalize_obs, d.normalize_reward,
                     a.gamma, cfg.env.clip_obs, cfg.env.clip_reward,
                     json.dumps(cfg.env.kwargs, sort_keys=True), cfg.env.num_threads,
                     json.dumps(a.network_options, sort_keys=True), cfg.env.wrapper or "",
                     json.dumps(cfg.env.wrapper_options if cfg.env.wrapper else {}, sort_keys=True),
                     mask_actions)


def learn_key(seed, round_):
    """The learner's key of round `round_` (traceable: the async learner derives it
    inside its own program)."""
    return jax.random.fold_in(jax.random.fold_in(rng.key(seed), _LEARN_STREAM), round_)


@jax.jit
def _round_keys(seed, round_, slots):
    k = jax.random.fold_in(jax.random.fold_in(rng.key(seed), _SHARD_STREAM), round_)
    shard = jax.vmap(lambda s: rng.unwrap(jax.random.fold_in(k, s)))(slots)
    return shard, learn_key(seed, round_)


def round_keys(seed: int, round_: int, slots) -> tuple:
    """`(shard keys [n, 2] raw, learner key)` of a round: slot `s`'s key depends only on
    `(seed, round_, s)`, so it is the same on every backend and every retry."""
    shard, learn = _round_keys(seed, round_, np.asarray(slots, np.int32))
    return np.asarray(shard), learn


def shard_key(seed: int, round_: int, slot: int) -> np.ndarray:
    """Raw key data of slot `slot` in round `round_`."""
    return round_keys(seed, round_, [slot])[0][0]


def slot_init_key(seed: int, slot: int) -> jax.Array:
    return jax.random.fold_in(jax.random.fold_in(rng.key(seed), _SLOT_INIT_STREAM), slot)


class ShardOutput(NamedTuple):
    """What a shard returns: `[T, B]` trajectory, the slot's new state, `[B]` bootstrap."""

    traj: Transition
    actor: Optional[ActorState]  # None where the worker keeps the slot (sticky)
    bootstrap: jax.Array


class Timings(NamedTuple):
    """Wall-clock stamps of one shard (`time.time()` seconds) and its billed seconds."""

    received: float
    started: float
    finished: float
    billed: float


class ShardProgram:
    """One spec's env, network and jitted rollouts (single shard and `k` stacked)."""

    def __init__(self, spec: ShardSpec, env_seed: int = 0):
        self.spec = spec
        try:
            self.env = make_env(spec.env_id, spec.num_envs, spec.suite, env_seed, spec.num_threads,
                                json.loads(spec.env_kwargs), spec.env_wrapper or None,
                                json.loads(spec.env_wrapper_options))
        except ConfigError as err:  # name the spec's field, as for every other bad value
            text = str(err)
            field = next((f for k, f in _ENV_FIELDS if k in text), "env_id")
            raise SpecError(f"spec.{field}: {' '.join(text.split())}") from err
        if spec.network == "cnn" and not is_frame_stack(self.env.spec.obs_shape):
            raise ShardError(f"spec.network: 'cnn' needs [C, H, W] frames of at least 36x36; "
                             f"{spec.env_id} observes {list(self.env.spec.obs_shape)}")
        self.network = make_network(self.env.spec, spec.network, spec.hidden_sizes, spec.activation,
                                    json.loads(spec.network_options))
        self._stacked = {}
        self.run = self.stacked(1)
        self._one = jax.jit(self._run_one)
        self.lock = threading.Lock()

    def opts(self, k: int) -> RolloutOptions:
        s = self.spec
        return RolloutOptions(s.num_steps, k, s.normalize_obs, s.normalize_reward, s.gamma,
                              s.clip_obs, s.clip_reward, mask_actions=s.mask_actions)

    def stacked(self, k: int):
        """Jitted `run(params, actors[k], keys[k, 2]) -> (actors, traj[T, k, B], bootstrap[k, B])`.

        `k` slots are `k` seeds of the core rollout sharing one set of params;
        each seed draws from its own key stream, so a slot's data does not
        depend on the slots beside it.
        """
        if k not in self._stacked:
            rollout = make_rollout(self.env, self.network, self.opts(k))

            def run(params, actors, keys):
                tiled = jax.tree.map(lambda x: jnp.broadcast_to(x, (k,) + x.shape), params)
                return rollout(tiled, actors, rng.wrap(keys))

            self._stacked[k] = jax.jit(run)
        return self._stacked[k]

    def init_slot(self, key) -> ActorState:
        """Fresh envs for one slot (`key` is a typed key)."""
        return init_actor(self.env, key, 1, self.network, self.spec.mask_actions)

    def params_template(self):
        """Shapes and dtypes of the policy params (traced once, then cached)."""
        if not hasattr(self, "_params_template"):
            e = self.env.spec
            self._params_template = jax.eval_shape(
                lambda k: networks.init_params(self.network, e.obs_shape, e.obs_dtype, k), rng.key(0))
        return self._params_template

    def actor_template(self):
        """Shapes and dtypes of one slot's state (traced once, then cached).

        None for sticky specs: their state never travels, and tracing the
        init would reset (and so reseed) the live envpool envs.
        """
        if self.spec.sticky:
            return None
        if not hasattr(self, "_actor_template"):
            self._actor_template = jax.eval_shape(self.init_slot, rng.key(0))
        return self._actor_template

    def _run_one(self, params, actor: ActorState, key) -> ShardOutput:
        actor, traj, boot = self.run(params, actor, key[None])
        return ShardOutput(jax.tree.map(lambda x: x[:, 0], traj), actor, boot[0])

    def run_one(self, params, actor: ActorState, key) -> ShardOutput:
        """One shard, one jitted call: host-side slicing after it costs more than the
        rollout when several threads run shards at once (the async trainer)."""
        return self._one(params, actor, key)


class _Lru:
    """A dict that keeps its `limit` most recently used entries (None: all), counting evictions."""

    def __init__(self, limit: Optional[int] = None):
        self.limit, self.evicted = limit, 0
        self.items: OrderedDict = OrderedDict()

    def get(self, key):
        if key in self.items:
            self.items.move_to_end(key)
        return self.items.get(key)

    def put(self, key, value) -> list:
        """Store `value`; returns the keys evicted to make room."""
        self.items[key] = value
        self.items.move_to_end(key)
        gone = []
        while self.limit is not None and len(self.items) > self.limit:
            gone.append(self.items.popitem(last=False)[0])
        self.evicted += len(gone)
        return gone


def _shape_key(spec: ShardSpec) -> ShardSpec:
    """`spec` less what does not change the params' or a slot's shapes (rollout length,
    discount, clipping, normalisation flags, threads): specs that differ only there share
    their templates."""
    return dataclasses.replace(spec, num_steps=1, gamma=0.0, clip_obs=1.0, clip_reward=1.0,
                               normalize_obs=False, normalize_reward=False, num_threads=0)


class ShardWorker:
    """Runs shards of any spec: one compiled program per spec, and the slots it keeps.

    Every backend's worker side is this class: the local backend's envpool
    slots, each Ray actor, and each HTTP function instance. For a sticky
    (envpool) spec each slot needs its own C++ env pool, so programs are
    keyed by `(spec, slot)` there. `max_programs` and `max_pools` bound what a
    long-lived worker (the actor function) keeps: least recently used first out.
    """

    def __init__(self, name: str = "local", max_programs: Optional[int] = None,
                 max_pools: Optional[int] = None):
        self.name = name
        self._programs = _Lru(max_programs)  # stateless specs: spec -> program
        self._pools = _Lru(max_pools)  # sticky specs: (spec, slot) -> program with its env pool
        self._templates = _Lru(max_programs)  # spec -> (params, actor) templates
        self._slots: dict = {}  # (spec, slot) -> (run_id, the slot's state)
        self._lock = threading.Lock()

    def program(self, spec: ShardSpec, slot: int = 0, env_seed: int = 0) -> ShardProgram:
        cache, key = (self._pools, (spec, slot)) if spec.sticky else (self._programs, spec)
        with self._lock:
            prog = cache.get(key)
            if prog is None:
                prog = ShardProgram(spec, env_seed + (slot if spec.sticky else 0))
                for gone in cache.put(key, prog):
                    self._slots.pop(gone, None)  # its envs went with the pool
            return prog

    def templates(self, spec: ShardSpec, slot: int = 0, env_seed: int = 0) -> tuple:
        """`(params, actor)` templates of `spec`, kept per spec: a sticky spec builds
        one env pool for them once, not one per slot a request names."""
        shape = _shape_key(spec)
        with self._lock:
            found = self._templates.get(shape)
        if found is None:
            prog = self.program(spec, slot, env_seed)
            found = (prog.params_template(), prog.actor_template())
            with self._lock:
                self._templates.put(shape, found)
        return found

    def _all(self) -> list:
        with self._lock:
            return list(self._programs.items.values()) + list(self._pools.items.values())

    def compiled(self) -> int:
        """Compiled rollout executables held (one per spec and shapes)."""
        return sum(fn._cache_size() for p in self._all() for fn in [p._one, *p._stacked.values()])

    def stats(self) -> dict:
        """What the worker holds and what it evicted, for a health check."""
        return {"compiled": self.compiled(), "programs": len(self._programs.items),
                "pools": len(self._pools.items), "evicted_programs": self._programs.evicted,
                "evicted_pools": self._pools.evicted}

    def run(self, spec: ShardSpec, params, actor: Optional[ActorState], key, slot: int,
            run_id: str = "", seed: int = 0, received: Optional[float] = None):
        """Run one shard; returns `(ShardOutput, Timings, reset)`.

        `actor` is the slot's state for stateless specs; for sticky specs it
        is None and the worker uses (or, the first time, creates) its own.
        """
        received = time.time() if received is None else received
        prog = self.program(spec, slot, seed)
        reset = False
        # one env pool, one rollout at a time; a stateless slot's rollout is a pure function
        with prog.lock if spec.sticky else contextlib.nullcontext():
            started = time.time()
            if spec.sticky:
                owner, actor = self._slots.get((spec, slot), (None, None))
                if actor is None or owner != run_id:  # another run's envs are not this one's
                    actor, reset = prog.init_slot(slot_init_key(seed, slot)), True
            out = prog.run_one(params, actor, key)
            jax.block_until_ready(out)
            if spec.sticky:
                self._slots[(spec, slot)] = (run_id, out.actor)
                out = out._replace(actor=None)
        finished = time.time()
        return out, Timings(received, started, finished, finished - received), reset

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
import json
import threading
import time
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.core import rng
from jaxrl_dist.config import Config, derive
from jaxrl_dist.core.networks import make_network
from jaxrl_dist.core.rollout import RolloutOptions, init_actor, make_rollout
from jaxrl_dist.core.types import ActorState, Transition
from jaxrl_dist.envs import make_env

# fold_in streams under the run's seed key
_SHARD_STREAM, _LEARN_STREAM, _SLOT_INIT_STREAM = 0, 1, 2


class ShardError(ValueError):
    """A shard request that cannot run; the message names the field."""


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

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["hidden_sizes"] = list(self.hidden_sizes)
        return d

    @classmethod
    def from_dict(cls, data: Any) -> "ShardSpec":
        """Build from untrusted plain data; `ShardError` names the bad field."""
        if not isinstance(data, dict):
            raise ShardError("spec: expected a mapping")
        kinds = {"env_id": str, "suite": str, "num_envs": int, "num_steps": int, "network": str,
                 "hidden_sizes": (list, tuple), "activation": str, "normalize_obs": bool,
                 "normalize_reward": bool, "gamma": float, "clip_obs": float,
                 "clip_reward": float, "env_kwargs": str, "num_threads": int, "network_options": str}
        unknown = set(data) - set(kinds)
        if unknown:
            raise ShardError(f"spec.{sorted(unknown)[0]}: unknown field")
        values = {}
        for name, kind in kinds.items():
            if name not in data:
                if name in ("env_kwargs", "num_threads", "network_options"):  # optional: the defaults
                    continue
                raise ShardError(f"spec.{name}: missing")
            values[name] = _checked(data[name], kind, f"spec.{name}")
        values["hidden_sizes"] = tuple(_checked(h, int, "spec.hidden_sizes") for h in values["hidden_sizes"])
        spec = cls(**values)
        spec.check_limits()
        return spec

    def check_limits(self) -> None:
        if not 0 < self.num_envs <= 4096:
            raise ShardError(f"spec.num_envs must be in 1..4096, got {self.num_envs}")
        if not 0 < self.num_steps <= 4096:
            raise ShardError(f"spec.num_steps must be in 1..4096, got {self.num_steps}")
        if not 0 <= self.num_threads <= 64:
            raise ShardError(f"spec.num_threads must be in 0..64, got {self.num_threads}")
        if self.suite not in ("gymnax", "envpool"):
            raise ShardError(f"spec.suite must be gymnax or envpool, got {self.suite!r}")
        if not self.hidden_sizes or any(not 0 < h <= 4096 for h in self.hidden_sizes):
            raise ShardError(f"spec.hidden_sizes must be sizes in 1..4096, got {list(self.hidden_sizes)}")

    @property
    def sticky(self) -> bool:
        """Whether a slot's env state stays on the worker that runs it."""
        return self.suite == "envpool"


def _checked(value, kind, name: str):
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        want = kind.__name__ if isinstance(kind, type) else "list"
        raise ShardError(f"{name}: expected {want}, got {type(value).__name__}")
    return value


def spec_from_config(cfg: Config, suite: str, continuous: bool) -> ShardSpec:
    d, a = derive(cfg, continuous), cfg.algo
    return ShardSpec(cfg.env.id, suite, cfg.backend.envs_per_shard, a.num_steps, a.network,
                     tuple(a.hidden_sizes), a.activation, d.normalize_obs, d.normalize_reward,
                     a.gamma, cfg.env.clip_obs, cfg.env.clip_reward,
                     json.dumps(cfg.env.kwargs, sort_keys=True), cfg.env.num_threads,
                     json.dumps(a.network_options, sort_keys=True))


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
        self.env = make_env(spec.env_id, spec.num_envs, spec.suite, env_seed, spec.num_threads,
                            json.loads(spec.env_kwargs))
        self.network = make_network(self.env.spec, spec.network, spec.hidden_sizes, spec.activation,
                                    json.loads(spec.network_options))
        self._stacked = {}
        self.run = self.stacked(1)
        self._one = jax.jit(self._run_one)
        self.lock = threading.Lock()

    def opts(self, k: int) -> RolloutOptions:
        s = self.spec
        return RolloutOptions(s.num_steps, k, s.normalize_obs, s.normalize_reward, s.gamma,
                              s.clip_obs, s.clip_reward)

    def stacked(self, k: int):
        """Jitted `run(params, actors[k], keys[k, 2]) -> (actors, traj[T, k, B], bootstrap[k, B])`.

        `k` slots are `k` seeds of the core rollout sharing one set of params;
        each seed draws from its own key stream, so a slot's data does not
        depend on the slots beside it.
        """
        if k not in self._stacked:
            rollout = make_rollout(self.env, self.network.apply, self.opts(k))

            def run(params, actors, keys):
                tiled = jax.tree.map(lambda x: jnp.broadcast_to(x, (k,) + x.shape), params)
                return rollout(tiled, actors, rng.wrap(keys))

            self._stacked[k] = jax.jit(run)
        return self._stacked[k]

    def init_slot(self, key) -> ActorState:
        """Fresh envs for one slot (`key` is a typed key)."""
        return init_actor(self.env, key, 1)

    def params_template(self):
        """Shapes and dtypes of the policy params (traced once, then cached)."""
        if not hasattr(self, "_params_template"):
            dummy = jnp.zeros((1,) + tuple(self.env.spec.obs_shape), self.env.spec.obs_dtype)
            self._params_template = jax.eval_shape(self.network.init, rng.key(0), dummy)
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


class ShardWorker:
    """Runs shards of any spec: one compiled program per spec, and the slots it keeps.

    Every backend's worker side is this class: the local backend's envpool
    slots, each Ray actor, and each HTTP function instance. For a sticky
    (envpool) spec each slot needs its own C++ env pool, so programs are
    keyed by `(spec, slot)` there.
    """

    def __init__(self, name: str = "local"):
        self.name = name
        self._programs: dict = {}
        self._slots: dict = {}
        self._lock = threading.Lock()

    def program(self, spec: ShardSpec, slot: int = 0, env_seed: int = 0) -> ShardProgram:
        key = (spec, slot if spec.sticky else None)
        with self._lock:
            if key not in self._programs:
                self._programs[key] = ShardProgram(spec, env_seed + (slot if spec.sticky else 0))
            return self._programs[key]

    def compiled(self) -> int:
        """Compiled rollout executables held (one per spec and shapes)."""
        return sum(fn._cache_size() for p in list(self._programs.values())
                   for fn in [p._one, *p._stacked.values()])

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
                actor = self._slots.get((run_id, slot))
                if actor is None:
                    actor, reset = prog.init_slot(slot_init_key(seed, slot)), True
            out = prog.run_one(params, actor, key)
            jax.block_until_ready(out)
            if spec.sticky:
                self._slots[(run_id, slot)] = out.actor
                out = out._replace(actor=None)
        finished = time.time()
        return out, Timings(received, started, finished, finished - received), reset

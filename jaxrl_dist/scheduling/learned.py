"""The learned scheduler at run time: a trained policy file (params and what it was
trained for), its greedy shard count from a run's round features, and the presets
shipped per task. It is trained on the scheduling MDP (`scheduling.mdp`) by
`jaxrl_dist.scheduler_training`."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from jaxrl_dist.config import ConfigError
from jaxrl_dist.core.networks import make_network
from jaxrl_dist.core.types import EnvSpec
from jaxrl_dist.scheduling.cost import Left
from jaxrl_dist.scheduling.mdp import FEATURES, Scale, feature_columns, features, obs_from_records
from jaxrl_dist.scheduling.schedulers import return_bounds

PRESETS = Path(__file__).resolve().parents[1] / "presets" / "schedulers"

class Trained(NamedTuple):
    """A scheduler checkpoint: policy params and what they were trained for."""

    params: Any
    meta: dict  # env_id, cost, max_shards, scale, options, features, hidden_sizes

def save(trained: Trained, path) -> Path:
    """A small msgpack file (flax.serialization): params plus JSON metadata."""
    from flax import serialization

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(serialization.msgpack_serialize(
        {"params": serialization.to_state_dict(trained.params), "meta": json.dumps(trained.meta)}))
    return path

def load(path) -> Trained:
    """The scheduler file at `path`; `ConfigError` naming it when it cannot be read or is
    not one (a profile's JSON, say)."""
    from flax import serialization

    try:
        data = serialization.msgpack_restore(Path(path).read_bytes())
        return Trained(data["params"], json.loads(data["meta"]))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror or err})") from None
    except Exception as err:  # msgpack's own errors, or a msgpack file of something else
        raise ConfigError(f"{path}: not a scheduler file (`jaxrl-dist scheduler train` writes them; "
                          f"{type(err).__name__})") from None

def columns(trained: Trained) -> np.ndarray:
    """Where the features the scheduler was trained on sit in `FEATURES`, in its order."""
    return feature_columns(trained.meta["features"])

def widen(trained: Trained, to=FEATURES) -> Trained:
    """The same policy over the features `to` (names of `FEATURES`, a superset of the
    file's), to fine-tune a file trained on fewer: each input layer gets zero weights
    for the features it never saw, so every output stays what it was until training
    moves them."""
    names, to = trained.meta["features"], list(to)
    if list(names) == to:
        return trained
    missing = [f for f in names if f not in to]
    if missing:
        raise ConfigError(f"scheduler.init_from: that scheduler reads {', '.join(missing)}, which this "
                          f"training leaves out (--features)")
    cols = feature_columns(names, to)

    def grow(path, x):
        x = np.asarray(x)
        if not _is_input_kernel(path) or x.shape[0] != len(names):
            return x
        out = np.zeros((len(to),) + x.shape[1:], x.dtype)
        out[cols] = x
        return out

    params = jax.tree_util.tree_map_with_path(grow, trained.params)
    return Trained(params, {**trained.meta, "features": to})


def _is_input_kernel(path) -> bool:
    """Whether a params leaf's `path` is a first layer's kernel (actor or critic): its rows
    are the features the network reads."""
    return [getattr(k, "key", None) for k in path[-2:]] == ["Dense_0", "kernel"]


def _input_kernels(trained: Trained) -> list:
    """The first layers' kernels of a scheduler's params."""
    leaves = jax.tree_util.tree_flatten_with_path(trained.params)[0]
    return [np.asarray(x) for path, x in leaves if _is_input_kernel(path)]


def policy(trained: Trained):
    """`act(features[len(FEATURES)]) -> n`: the greedy shard count of a trained scheduler,
    from the features it was trained on (selected by name)."""
    m, cols = trained.meta, columns(trained)
    spec = EnvSpec("scheduler", "gymnax", (len(cols),), np.float32, True, m["max_shards"])
    net = make_network(spec, "mlp", tuple(m["hidden_sizes"]), m["activation"])
    apply = jax.jit(net.apply)

    def act(x) -> int:
        return int(np.argmax(np.asarray(apply(trained.params, x[None, cols]).logits[0]))) + 1

    return act

class LearnedScheduler:
    """`scheduler=learned`: the trained policy's greedy n from the last round's features.

    Loads `scheduler.path`, else the shipped default (`DEFAULT`: one scheduler
    trained over a set of tasks). A task of its set sees its returns on the scale
    it was trained with; any other task on its own range (`scale_for`), or, when
    nothing sets one, on the running range of its recent returns (`running_scale`).
    """

    name = "learned"

    def __init__(self, cfg, backend_cfg, full=None):
        path, trained = checked_file(cfg, backend_cfg)
        # no fixed scale (not among its tasks, no target or max_return): `running_scale` each round
        self.running = full is not None and not has_scale(trained, full)
        if full is not None:
            note_unseen_limits(trained, path, full.run)
            note_scale(trained, path, full, self.running)
        self.trained, self.act = trained, policy(trained)
        self.scale = Scale(**trained.meta["scale"]) if self.running else scale_for(trained, full)
        self.min_return = full.scheduler.min_return if self.running else None
        self.backend_max = backend_cfg.max_shards

    sees_limits = True  # the round trainer passes what is left of run.budget_usd / run.deadline_s

    def num_shards(self, round_: int, history: list, left: Left = Left()) -> int:
        scale = running_scale(self.scale, history, self.min_return) if self.running else self.scale
        obs = obs_from_records(history, scale, left)
        return self.act(np.asarray(features(obs, scale, np)))

    def expected_shards(self) -> float:
        return self.scale.max_shards / 2  # what the policy was trained with (SchedulingEnv)

    def most_shards(self) -> int:
        return self.backend_max

DEFAULT = "default"  # presets/schedulers/default.msgpack: the generalist

def checked_file(cfg, backend_cfg) -> tuple:
    """`(path, Trained)` of the file `scheduler.path` names (else the shipped default),
    refused in one line when it is missing or does not fit this run (`check_fits`): a
    run checks it before it writes anything."""
    path = Path(cfg.path) if cfg.path else preset_path(DEFAULT)
    if path.is_dir():
        raise ConfigError(f"scheduler.path: {path} is a directory; give a scheduler file's path")
    if not path.is_file():
        raise ConfigError(f"scheduler.path: no such file {path}; train one with `jaxrl-dist scheduler train`")
    try:
        trained = load(path)
    except ConfigError as err:
        raise ConfigError(f"scheduler.path: {err}") from None
    check_fits(trained, path, backend_cfg, cfg)
    return path, trained


def check_fits(trained: Trained, path, backend_cfg, cfg) -> None:
    """Refuse, in one line naming the file, a scheduler this run cannot use: one whose
    feature names are unknown here or not recorded (inputs that would mean other
    things), or trained for more shards than the backend has, or for another range than
    `scheduler.max_shards` asks for. A scheduler trained on fewer of `FEATURES` (before
    `time_left`) reads its own by name."""
    names = trained.meta.get("features")
    if names is None:
        raise ConfigError(f"scheduler.path: {path} records no feature names (an older feature set); "
                          f"retrain it with `jaxrl-dist scheduler train`")
    unknown = [f for f in names if f not in FEATURES]
    if unknown or len(set(names)) != len(names):
        raise ConfigError(f"scheduler.path: {path} was trained on another feature set "
                          f"({', '.join(unknown) or 'repeated names'} unknown to this version's "
                          f"{', '.join(FEATURES)}); retrain it with `jaxrl-dist scheduler train`")
    widths = {x.shape[0] for x in _input_kernels(trained)}
    if widths != {len(names)}:
        raise ConfigError(f"scheduler.path: {path} names {len(names)} features but its network reads "
                          f"{', '.join(map(str, sorted(widths))) or 'none'} (a damaged or edited file); "
                          "retrain it with `jaxrl-dist scheduler train`")
    M = trained.meta["max_shards"]
    if M > backend_cfg.max_shards:
        raise ConfigError(f"backend.max_shards={backend_cfg.max_shards} is below the "
                          f"{M} shards the scheduler in {path} chooses from")
    if cfg.max_shards is not None and cfg.max_shards != M:
        raise ConfigError(f"scheduler.max_shards={cfg.max_shards}: the scheduler in {path} "
                          f"was trained to choose from 1..{M} shards")

def note_unseen_limits(trained: Trained, path, run_cfg) -> None:
    """Say when the run sets a limit the scheduler was not trained to see."""
    names, limited = trained.meta["features"], "budgets" in trained.meta  # trained under limits
    unseen = [key for key, f in (("run.budget_usd", "budget_left"), ("run.deadline_s", "time_left"))
              if getattr(run_cfg, key.split(".")[1]) is not None and not (limited and f in names)]
    if unseen:
        print(f"note: the scheduler in {path} was trained without seeing {', '.join(unseen)}; "
              f"the run still stops at it", file=sys.stderr)

def task_entry(trained: Trained, env_id: str) -> Optional[dict]:
    """What the scheduler was trained with on task `env_id` (its `scale`, `profile`,
    `target_return`, `max_rounds`), or None when that task was not among its tasks."""
    return next((t for t in trained.meta.get("tasks") or [trained.meta] if t["env_id"] == env_id), None)


def trained_on(trained: Trained) -> str:
    return ", ".join(t["env_id"] for t in trained.meta.get("tasks") or [trained.meta])


def upper_return(full) -> Optional[float]:
    """The top of a task's return range as configured: `run.target_return`, else
    `scheduler.max_return` (None: neither is set)."""
    return full.run.target_return if full.run.target_return is not None else full.scheduler.max_return


def has_scale(trained: Trained, full) -> bool:
    """Whether the task has a fixed return scale: one of the scheduler's tasks, or a
    configured top of its range."""
    return task_entry(trained, full.env.id) is not None or upper_return(full) is not None


def note_scale(trained: Trained, path, full, running: bool) -> None:
    """One line when the task is outside the scheduler's set: zero-shot on its own
    range, or, with no range configured, on the running range of its returns."""
    env_id, lo = full.env.id, full.scheduler.min_return
    if running:
        how = ("by their running range" if lo is None
               else f"from scheduler.min_return={lo:g} up to their running max")
        print(f"note: no return scale for {env_id} (scheduler.min_return/max_return, run.target_return); "
              f"the learned scheduler (trained on {trained_on(trained)}) scales returns {how}", file=sys.stderr)
    elif task_entry(trained, env_id) is None:
        print(f"note: the scheduler in {path} was trained on {trained_on(trained)}; it schedules "
              f"{env_id} zero-shot, on its own return range", file=sys.stderr)


def scale_for(trained: Trained, full=None) -> Scale:
    """The scale of the task it now schedules: the trained one for a task of its set;
    for another task, the first task's with this task's return range:
    `scheduler.min_return` (or 0) up to `run.target_return` (or `scheduler.max_return`).
    A fixed scale is needed here (the scheduling MDP, a benchmark); the live scheduler
    without one uses `running_scale`."""
    s = Scale(**trained.meta["scale"])
    if full is None:
        return s
    own = task_entry(trained, full.env.id)
    if own is not None:
        return Scale(**own["scale"])
    hi = upper_return(full)
    if hi is None:
        raise ConfigError(f"run.target_return: the scheduler was trained on {trained_on(trained)}; "
                          f"set {full.env.id}'s target (or scheduler.max_return) to scale its returns")
    key = "run.target_return" if full.run.target_return is not None else "scheduler.max_return"
    lo, hi = return_range(full, hi, key)
    return s._replace(return_lo=lo, return_hi=hi)


def return_range(full, hi: float, key: str) -> tuple:
    """`(lo, hi)`: `scheduler.min_return` (or 0) up to `hi` (`key`'s value), the returns a
    fixed scale spans; `ConfigError` when it is empty or inverted, which would read every
    return as the same feature (the scheduler would be blind)."""
    lo = full.scheduler.min_return if full.scheduler.min_return is not None else 0.0
    if lo >= hi:
        given = "" if full.scheduler.min_return is not None else " (its default)"
        raise ConfigError(f"{key}={hi:g} is not above scheduler.min_return={lo:g}{given}: the learned scheduler "
                          f"scales {full.env.id}'s returns from min_return up to it; set scheduler.min_return "
                          "to the task's lowest return")
    return float(lo), float(hi)


def running_scale(s: Scale, history: list, min_return: Optional[float] = None) -> Scale:
    """`s` with the return range of the recent returns seen so far (`return_recent`, what
    the `return` feature reads): their running min (or `min_return`) up to their
    running max, as `scheduler=adapt` does with null bounds. Without `min_return` the
    latest return then reads within [0, 1]; before any return, or with one, it reads 0."""
    seen = [r.return_recent for r in history if r.return_recent is not None and math.isfinite(r.return_recent)]
    if not seen:
        lo = 0.0 if min_return is None else float(min_return)
        return s._replace(return_lo=lo, return_hi=lo)
    lo, hi = return_bounds(seen, min_return, None)
    return s._replace(return_lo=lo, return_hi=hi)


def preset_path(env_id: str) -> Path:
    return PRESETS / f"{env_id}.msgpack"

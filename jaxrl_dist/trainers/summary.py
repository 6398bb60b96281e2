"""The one run summary every trainer returns: `RunSummary`.

The fused, sync, async and grouped (`hydra/launcher=vmap`) runs all build it by
keyword from the same fields; what only some trainers have sits in typed parts
(`FusedFigures`, `RoundFigures`, `accounting.CostFigures`, `accounting.PhaseFigures`,
`AsyncFigures`).
`summary.json`, the terminal table and W&B are all written from `to_json()`, one
flat mapping, and the summary also reads as that mapping (`summary["sps"]`), so
code written against `summary.json` keys works on the returned value too.

Step counts: `env_steps` counts steps per seed (like `algo.total_timesteps`);
`total_env_steps` and `sps` count all seeds' envs together (throughput). Times
and `sps` describe this process; for a resumed run, the resumed part. `train_seconds`
is training after compiles and start-up: the fused trainer compiles ahead of time,
and a shard trainer's start-up (backend, first shards, learner compile) is its
`startup_seconds`.
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

from jaxrl_dist.config import ConfigError, did_you_mean
from jaxrl_dist.scheduling.cost import TIME_KEYS, USD_KEYS
from jaxrl_dist.trainers.accounting import CostFigures, PhaseFigures


class FusedFigures(NamedTuple):
    """The fused trainer's own figures."""

    checkpoint_seconds: float  # the checkpoint writes (the end-of-run one too)


class RoundFigures(NamedTuple):
    """A shard trainer's (sync or async) own figures."""

    backend: str
    scheduler: str  # the scheduler's name; async: "balance" or "none"
    rounds: int  # rounds (sync) or updates (async) done in all
    retries: int
    slot_resets: int
    shards_mean: Optional[float]  # shards a round ran (sync) or chunks an update took (async), averaged


class AsyncFigures(NamedTuple):
    """The async trainer's staleness and balance figures."""

    max_staleness: int
    staleness_histogram: dict  # lag -> chunks learned with it
    staleness_mean: Optional[float]
    dropped_chunks: int
    actors_active_final: Optional[int]
    learned_rate_by_actors: dict  # env steps/s learned while n actors ran


class Group(NamedTuple):
    """Where a job ran in a `hydra/launcher=vmap` group."""

    jobs: int
    members: int
    first_member: int


# the fields every trainer has, in `summary.json`'s order (after trainer, env id and a
# shard trainer's `RoundFigures`)
_EVERY_TRAINER = ("final_return", "returns_per_seed", "env_steps", "total_env_steps", "num_updates", "num_seeds",
                  "wall_seconds", "compile_seconds", "train_seconds", "sps", "params_sha256", "peak_rss_mb",
                  "resumed_at_update", "run_dir", "mesh", "processes")


@dataclass(frozen=True, eq=False)
class RunSummary(Mapping):
    """What a run did, for `summary.json`, the table and W&B (see the module doc)."""

    trainer: str
    env_id: str
    final_return: Optional[float]
    returns_per_seed: list
    env_steps: int
    total_env_steps: int
    num_updates: int
    num_seeds: int
    wall_seconds: float
    compile_seconds: float  # this process's compiles (ray and http workers compile in their shards)
    train_seconds: float
    sps: Optional[float]
    params_sha256: str
    peak_rss_mb: float
    resumed_at_update: Optional[int]
    run_dir: str
    mesh: Optional[dict]  # the learner's {seeds, data} devices (`trainer.devices`); None on one device
    processes: int  # JAX processes the run spans (`jaxrl-dist launch`)
    metadata: dict  # `rundir.run_metadata()`: versions, commit, devices
    fused: Optional[FusedFigures] = None
    rounds: Optional[RoundFigures] = None
    cost: Optional[CostFigures] = None
    phases: Optional[PhaseFigures] = None
    staleness: Optional[AsyncFigures] = None
    stop_note: Optional[str] = None  # a limit that stopped the run before any round: why
    group: Optional[Group] = None

    def replace(self, **changes) -> "RunSummary":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return dict(self._json)

    @functools.cached_property
    def _json(self) -> dict:
        out: dict = {"trainer": self.trainer, "env_id": self.env_id}
        if self.rounds is not None:
            out.update(self.rounds._asdict())
        out.update({k: getattr(self, k) for k in _EVERY_TRAINER})
        if self.fused is not None:
            out.update(self.fused._asdict())
        out.update(self.metadata)
        if self.cost is not None:
            out.update(self.cost.to_json())
        if self.phases is not None:
            out.update(self.phases._asdict())
        if self.staleness is not None:
            out.update(self.staleness._asdict())
        if self.stop_note is not None:
            out["stop_note"] = self.stop_note
        if self.group is not None:
            out["group"] = self.group._asdict()
        return out

    def __getitem__(self, key: str) -> Any:
        return self._json[key]

    def __iter__(self):
        return iter(self._json)

    def __len__(self) -> int:
        return len(self._json)


# each trainer's typed parts of the summary, beside the fields every trainer has
_PARTS = {"fused": (FusedFigures,), "sync": (RoundFigures, CostFigures, PhaseFigures),
          "async": (RoundFigures, CostFigures, PhaseFigures, AsyncFigures)}
_NUMBER = (int, float, Optional[int], Optional[float])


def number_keys(trainer: str) -> list:
    """The summary keys a `trainer` run writes as numbers (what `run.objective` may name),
    read from the summary's typed parts."""
    keys = [k for k, t in typing.get_type_hints(RunSummary).items() if t in _NUMBER and k in _EVERY_TRAINER]
    for part in _PARTS[trainer]:
        keys += [k for k, t in typing.get_type_hints(part).items() if t in _NUMBER]
    if CostFigures in _PARTS[trainer]:  # its components, by name
        keys += [f"modeled_{k}" for k in TIME_KEYS] + list(USD_KEYS)
    return keys + ["device_count"]


def check_objective(key: str, trainer: str) -> None:
    """`run.objective` names a number the run's summary will have: a misspelt one is an
    error before training, not after it."""
    keys = number_keys(trainer)
    if key not in keys:
        raise ConfigError(f"run.objective: a trainer={trainer} summary has no number '{key}'"
                          f"{did_you_mean(key, keys)} (numbers: {', '.join(sorted(keys))})")

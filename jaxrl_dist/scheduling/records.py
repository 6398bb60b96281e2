"""Typed records of a run: what each update (a round, for the sync trainer) produced.

The trainers make them; the schedulers, the learned scheduler's features, the
target rule and the cost summary read their fields; only the logger turns them
into JSON (`to_json`), and a resumed run reads its history back (`from_json`).
`metrics.jsonl` keeps one flat JSON object per record, as `jaxrl-dist report`
and other readers expect.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from jaxrl_dist.scheduling.cost import TIME_KEYS, USD_KEYS

# the built-in loss's metrics; a plugin loss may return others (they land in `detail`
# when a record is read back)
LOSS_KEYS = ("loss", "pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac")
PHASE_PREFIX = "phase_"
# where a round's wall goes, in order: the phases of a round record (`Record.phases`, JSON
# `phase_<name>_s`). A round runs from the end of the previous round's record to the end
# of its own, so `log` and `checkpoint` are the previous round's, done before this one
# starts; the backend's part is `dispatch` to `stack` (`backend_phases`)
ROUND_PHASES = ("log", "checkpoint", "schedule", "dispatch", "rollout", "wait", "decode", "stack",
                "learn", "record")
# before the first round (`train_rounds`' summary): the process before `train()` (the
# CLI's start, imports and config; 0 for a library call and a multirun's later jobs),
# building the trainer (spec, learner, state), starting the backend (a Ray runtime), its
# first shards' start (actors importing JAX, compiling) and the learner's compile left
# after them; `finish`: after the last round
STARTUP_PHASES = ("launch", "build", "backend", "actors", "learner")
# the async trainer's learner loop, per update: waiting for its chunks, handing it to XLA
ASYNC_PHASES = ("collect", "dispatch")
STARTUP_PREFIX = "startup_"  # how a summary's `phase_seconds` names the start-up's parts (`startup_build`, ...)


def fold_startup(phase_seconds: Mapping[str, float]) -> dict:
    """A summary's `phase_seconds` with its `startup_<name>` parts summed into one
    `startup` (first, where there are any), the other phases as they are."""
    startup = sum(v for k, v in phase_seconds.items() if k.startswith(STARTUP_PREFIX))
    out = {"startup": startup} if startup else {}
    out.update({k: v for k, v in phase_seconds.items() if not k.startswith(STARTUP_PREFIX)})
    return out


@dataclass(frozen=True, kw_only=True)
class Cost:
    """A round's (or async update's) modeled cost and both clocks' running totals."""

    modeled_s: float
    usd: float
    cum_modeled_s: float
    cum_usd: float
    cum_wall_s: float
    cold_shards: int = 0
    # `modeled_<TIME_KEYS>` seconds and `USD_KEYS` dollars, under their JSON names
    components: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"modeled_s": self.modeled_s, "cost_usd": self.usd, "cum_modeled_s": self.cum_modeled_s,
                "cum_cost_usd": self.cum_usd, "cum_wall_s": self.cum_wall_s,
                "cold_shards": self.cold_shards, **self.components}


_COST_KEYS = ("modeled_s", "cost_usd", "cum_modeled_s", "cum_cost_usd", "cum_wall_s", "cold_shards")


def cost_from_json(d: Mapping) -> Optional[Cost]:
    if "cum_modeled_s" not in d:
        return None
    parts = {k: d[k] for k in d if (k.startswith("modeled_") and k != "modeled_s") or k in USD_KEYS}
    return Cost(modeled_s=d["modeled_s"], usd=d["cost_usd"], cum_modeled_s=d["cum_modeled_s"],
                cum_usd=d["cum_cost_usd"], cum_wall_s=d["cum_wall_s"], cold_shards=d.get("cold_shards", 0),
                components=parts)


@dataclass(frozen=True, kw_only=True)
class Record:
    """One update. Episode sums are per seed (one entry for the shard trainers);
    `num_shards` counts the shards (sync) or chunks (async) learned from, 0 for the
    fused trainer, whose records carry no round fields."""

    update: int
    env_steps: int
    ret: Optional[float]  # mean return of the episodes that ended (JSON "return")
    losses: Mapping[str, Optional[float]]  # the loss's metrics by name
    sps: Optional[float]
    episode_return_sum: tuple
    episodes: tuple
    num_shards: int = 0
    time: Optional[float] = None
    learn_s: float = 0.0
    round_s: float = 0.0
    busy_s: Optional[float] = None  # the busiest worker's compute (sync)
    retries: int = 0
    slot_resets: int = 0
    cost: Optional[Cost] = None
    return_recent: Optional[float] = None  # the target rule's recent return (shard trainers)
    detail: Mapping[str, Any] = field(default_factory=dict)  # the trainer's own figures
    # seconds of `round_s` by phase (`ROUND_PHASES`, async `ASYNC_PHASES`; JSON `phase_<name>_s`)
    phases: Mapping[str, float] = field(default_factory=dict)

    @property
    def rounds(self) -> bool:
        """Whether this is a shard trainer's record (round fields present)."""
        return self.num_shards > 0

    def replace(self, **changes) -> "Record":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        out = {"update": self.update}
        if self.rounds:
            out.update({"round": self.update, "time": self.time})
        out.update({"env_steps": self.env_steps})
        if self.rounds:
            out["num_shards"] = self.num_shards
        out.update({"return": self.ret, **self.losses})
        if self.rounds:
            out.update({"learn_s": self.learn_s, "round_s": self.round_s, "retries": self.retries,
                        "slot_resets": self.slot_resets})
            if self.busy_s is not None:
                out["busy_s"] = self.busy_s
        out.update(self.detail)
        out.update({f"{PHASE_PREFIX}{k}_s": v for k, v in self.phases.items()})
        out.update({"sps": self.sps, "episode_return_sum": list(self.episode_return_sum),
                    "episodes": list(self.episodes)})
        if self.cost is not None:
            out.update(self.cost.to_json())
        if self.rounds:
            out["return_recent"] = self.return_recent
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> "Record":
        """A record as `to_json` wrote it (a plugin loss's metrics come back in `detail`)."""
        known = {"update", "round", "time", "env_steps", "num_shards", "return", "learn_s", "round_s",
                 "retries", "slot_resets", "busy_s", "sps", "episode_return_sum", "episodes",
                 "return_recent", *LOSS_KEYS, *_COST_KEYS}
        cost = cost_from_json(d)
        parts = set(cost.components) if cost is not None else set()
        phases = {k: d[k] for k in d if k.startswith(PHASE_PREFIX) and k.endswith("_s")}
        parts |= set(phases)
        return cls(update=d["update"], env_steps=d["env_steps"], ret=d.get("return"),
                   losses={k: d[k] for k in LOSS_KEYS if k in d}, sps=d.get("sps"),
                   episode_return_sum=tuple(d["episode_return_sum"]), episodes=tuple(d["episodes"]),
                   num_shards=d.get("num_shards", 0), time=d.get("time"), learn_s=d.get("learn_s", 0.0),
                   round_s=d.get("round_s", 0.0), busy_s=d.get("busy_s"), retries=d.get("retries", 0),
                   slot_resets=d.get("slot_resets", 0), cost=cost, return_recent=d.get("return_recent"),
                   detail={k: v for k, v in d.items() if k not in known | parts},
                   phases={k[len(PHASE_PREFIX):-2]: v for k, v in phases.items()})


def steps_done(records, steps_per_shard: int) -> int:
    """Env steps the shard trainers' `records` learned from (or took)."""
    return sum(r.num_shards for r in records) * steps_per_shard


__all__ = ["Cost", "Record", "LOSS_KEYS", "PHASE_PREFIX", "ROUND_PHASES", "STARTUP_PHASES", "ASYNC_PHASES",
           "STARTUP_PREFIX", "fold_startup", "TIME_KEYS", "cost_from_json", "steps_done"]

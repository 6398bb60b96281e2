"""The round trainer: schedule, dispatch shards to a backend, gather, update, log.

Each round the scheduler picks `n` shards; slots `0..n-1` run on the backend
with keys from `(seed, round, slot)`; their `[T, B]` trajectories are stacked
to `[T, K, B]` (`K` = `n` padded to a power of two, the padding masked out of
the loss) and the core's PPO update (`ppo.make_update`) runs once. The same
seed and config give the same parameters on every backend.

The run directory holds what the fused trainer writes (`config.yaml`,
`metrics.jsonl` with one record per round, `tensorboard/`, `checkpoints/`,
`summary.json`). A round's record adds `num_shards`, shard duration
min/median/max, `dispatch_s`, `transfer_s`, `wait_s`, `learn_s`, `round_s`,
bytes sent and received, retries and slot resets, and the cost model's
modeled seconds and dollars with both clocks' running totals (`jaxrl_dist.scheduling.cost`).
The run stops at `algo.total_timesteps` or a `run.*` stop condition: target
reached (with `run.stop_at_target`), `run.budget_usd` or `run.deadline_s` (before
a round estimated to pass them), or `run.max_rounds`.
"""
from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.backends import Job, ShardTask, SlotTable, bucket, capabilities, prepare, warm as warm_backend
from jaxrl_dist.backends.shard import round_keys
from jaxrl_dist.config import Config, require
from jaxrl_dist.core import rng
from jaxrl_dist.scheduling.cost import CostAccount, run_left
from jaxrl_dist.scheduling.records import steps_done
from jaxrl_dist.scheduling.schedulers import make_scheduler
from jaxrl_dist.trainers import interrupt
from jaxrl_dist.trainers.accounting import (Clocks, backend_phases, busy_seconds, moved_bytes, shard_seconds,
                                            straggle, tree_bytes)
from jaxrl_dist.trainers.rounds import (ShardState, ShardTrainer, limit_reason, recent_return_of, target_reason,
                                        update_record, zero_outputs)


def over_limit(run_cfg, account: CostAccount, n: int) -> Optional[str]:
    """The `run.*` limit a round of `n` shards would take the modeled dollars
    (`budget_usd`) or the modeled clock (`deadline_s`) past, as `account` estimates
    it before the round, or None."""
    if run_cfg.budget_usd is None and run_cfg.deadline_s is None:  # nothing to estimate against
        return None
    seconds, usd = account.estimate(n)
    if run_cfg.budget_usd is not None and account.usd + usd > run_cfg.budget_usd:
        return "budget_usd"
    if run_cfg.deadline_s is not None and float(account.clock.now) + seconds > run_cfg.deadline_s:
        return "deadline_s"
    return None


def unaffordable_note(run_cfg, cost_cfg, reason: str, n: int, estimate: tuple) -> str:
    """One line for a run whose limit stops it before its first round: the key, its value
    and what one round was estimated to need."""
    seconds, usd = estimate
    need = f"${usd:.3g}" if reason == "budget_usd" else f"{seconds:.3g} modeled s"
    verb = "pay for" if reason == "budget_usd" else "leave time for"
    return (f"run.{reason}={getattr(run_cfg, reason)} does not {verb} one round: {n} shards under "
            f"cost={cost_cfg.name} are estimated at {need}; nothing was trained")


def round_record(r: int, n: int, env_steps: int, result, metrics, learn_s: float, seen: set):
    """One round's record (its cost, wall and phases come after). `seen`: slots that ran
    in earlier rounds of this process; a worker resetting one of those lost its envs (a
    first run is no loss)."""
    durations = [s.timings.finished - s.timings.started for s in result.shards]
    st = result.stats
    detail = {"shard_s_min": min(durations), "shard_s_median": float(np.median(durations)),
              "shard_s_max": max(durations), "billed_s": float(sum(shard_seconds(result.shards, billed=True))),
              "dispatch_s": float(st.dispatch_s), "transfer_s": float(st.transfer_s),
              "wait_s": float(st.wait_s), "bytes_sent": int(st.bytes_sent),
              "bytes_received": int(st.bytes_received), "shard_compute_s": durations}
    if all(s.roundtrip_s is not None for s in result.shards):  # a remote backend's, per shard
        detail["shard_roundtrip_s"] = [s.roundtrip_s for s in result.shards]
    return update_record(metrics, update=r, env_steps=env_steps, sps=None, num_shards=n, learn_s=learn_s,
                         busy_s=busy_seconds(result.shards), retries=sum(s.retries for s in result.shards),
                         slot_resets=sum(bool(s.reset) and s.slot in seen for s in result.shards), detail=detail)


class RoundTrainer(ShardTrainer):
    """The sync run: a scheduler picks each round's shard count; `run()` trains to the end."""

    def __init__(self, cfg: Config, run_dir: Path, resuming: bool):
        self.scheduler = make_scheduler(cfg.scheduler, cfg.backend, cfg)
        super().__init__(cfg, run_dir, resuming)
        self.account, self._param_bytes = None, 0
        self.stop_note = None  # a limit that stopped the run before any round: why, in one line

    def expected_shards(self) -> float:
        return self.scheduler.expected_shards()  # it sizes the LR schedule

    def _warm_learner(self, train):
        """Compile the learner for the expected shard count on zeros."""
        k = bucket(max(1, round(self.expected)), self.cfg.backend.max_shards)
        traj, boot = zero_outputs(self.program)
        traj = jax.tree.map(lambda x: np.stack([x] * k, axis=1), traj)
        copy = jax.tree.map(jnp.copy, train)  # the update donates its state (a copy keeps its placement)
        traj, boot = self.placed((traj, np.stack([boot] * k)))
        return self.warm(self.learner.update, copy, traj, boot, 0, rng.key(0))

    def _stop_reason(self, r: int, env_steps: int, records: list) -> Optional[str]:
        """Why the run stops before round `r` (0-based), or None to go on."""
        return limit_reason(self.cfg, r, env_steps) or target_reason(self.cfg, records)

    def _ask(self, r: int, records: list) -> int:
        """The scheduler's `n`; one that reads the run's limits (`sees_limits`) gets what is left.
        An answer that is not a whole number of shards the backend has is one line naming
        the scheduler (a plugin's `num_shards` is not clipped), not an error deep in a round."""
        if self.scheduler.sees_limits:
            left = run_left(self.cfg.run, self.account.modeled_now(), self.account.usd)
            n = self.scheduler.num_shards(r, records, left)
        else:
            n = self.scheduler.num_shards(r, records)
        top = self.cfg.backend.max_shards
        require(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 1 <= n <= top,
                f"scheduler.name={self.cfg.scheduler.name}: num_shards returned {n!r} for round {r + 1}; a "
                f"scheduler gives a whole number of shards in 1..{top} (backend.max_shards)")
        return int(n)

    def _next_round(self, r: int, env_steps: int, records: list) -> Optional[int]:
        """Round `r`'s shard count, or None with `self.stop_reason` saying why the run stops."""
        self.stop_reason = self._stop_reason(r, env_steps, records)
        if self.stop_reason:
            return None
        n = self._ask(r, records)
        self.stop_reason = over_limit(self.cfg.run, self.account, n)
        if self.stop_reason and r == int(self.state.round):  # before this process's first round
            self.stop_note = unaffordable_note(self.cfg.run, self.cfg.cost, self.stop_reason, n,
                                               self.account.estimate(n))
            print(f"warning: {self.stop_note}", file=sys.stderr, flush=True)
        return None if self.stop_reason else n

    def _shard_bound(self) -> tuple:
        """`(most shards a round may run, the keys that set it)`, for the backend's checks."""
        fixed = self.cfg.scheduler.name == "fixed"
        return (self.scheduler.most_shards(),
                "scheduler.num_shards" if fixed else "scheduler.max_shards/backend.max_shards")

    def _start_clocks(self, t_start: Optional[float]) -> None:
        """The modeled clock and dollars, and the measured clock, continuing the checkpoint's."""
        modeled, usd, wall = (float(x) for x in self.state.clock)
        self.account = CostAccount(self.cfg.cost, self.cfg.backend.max_shards, modeled, usd)
        self.clocks = Clocks(self.account, wall, self.process_start(t_start))
        self._param_bytes = tree_bytes(self.state.train.params)

    def run(self, logger, history: list, t_start: Optional[float] = None) -> list:
        cfg = self.cfg
        self._start_clocks(t_start)
        train, r = self.state.train, int(self.state.round)
        table = None if self.state.table is None else SlotTable(self.state.table)
        env_steps = steps_done(history, self.learner.steps_per_shard)
        records, seen = [], set()
        so_far = list(history)  # the resumed run's records, then this run's
        try:
            self._start_up(train, table, t_start)
            self.ckpt.restart_clock()  # `run.checkpoint_every_s` counts training time
            laps = self.laps
            while (n := self._next_round(r, env_steps, so_far)) is not None:
                # in the helper thread: a Ctrl-C during a long round is answered at once
                train, rec = interrupt.wait_for(self._round, r, n, env_steps, train, table, seen, laps)
                so_far.append(rec)
                recent = recent_return_of(so_far, cfg.run.target_episodes)
                rec = so_far[-1] = self.stamp(rec.replace(return_recent=recent))
                r, env_steps = r + 1, rec.env_steps
                logger.log([rec])
                laps.lap("log")
                records.append(rec)
                if self.ckpt.due(r) or interrupt.requested():
                    self._save(train, table, r)
                laps.lap("checkpoint")
                if interrupt.requested():  # Ctrl-C: what is done is saved; stop
                    raise interrupt.Interrupted(cfg.run.dir, r, "round")
        finally:
            self.settle()
            self.backend.close()
        self._save(train, table, r)
        self.finish()
        return records

    def _start_up(self, train, table, t_start: Optional[float]) -> None:
        """Start the backend and the first round's shards (as many as the scheduler
        expects) while the learner's compile warms in a thread: the start-up phases."""
        laps = self.start_laps(t_start)
        self.backend.start(Job(self.spec, self.cfg.seed, uuid.uuid4().hex, self.program, *self._shard_bound()))
        laps.lap("backend")
        warm = self._warm_learner(train)
        n = min(max(1, round(self.expected)), self.scheduler.most_shards())
        tasks = [ShardTask(s, np.zeros(2, np.uint32)) for s in range(n)]
        warm_backend(self.backend, tasks, train.params, table)
        laps.lap("actors")
        warm.join()
        laps.lap("learner")
        self.started(laps)

    def _round(self, r: int, n: int, env_steps: int, train, table, seen: set, laps):
        """Round `r` (0-based) with `n` shards after `env_steps` steps: dispatch,
        gather, update; returns `(train, record)`, its phases lapped on `laps`."""
        cfg, learner = self.cfg, self.learner
        keys, learn_key = round_keys(cfg.seed, r, np.arange(bucket(n, cfg.backend.max_shards)))
        laps.lap("schedule")
        compiled = [self.compiles.seconds]  # this process's compiles so far: a new shard bucket compiles
        result = self.backend.run_round(r, train.params, [ShardTask(s, keys[s]) for s in range(n)], table)
        compiled.append(self.compiles.seconds)
        t = time.perf_counter()
        slow = straggle(result.shards, cfg.backend, seen, r)
        laps.split(backend_phases(result, time.perf_counter() - t), rest="wait")
        train, metrics = learner.update(train, *self.placed((result.traj, result.bootstrap)), n, learn_key)
        prepare(self.backend, list(range(n)), table)  # the next round's requests, beside the update
        metrics = jax.device_get(metrics)
        laps.lap("learn")
        compiled.append(self.compiles.seconds)
        learn_s = laps.phases["learn"]
        env_steps += n * learner.steps_per_shard
        rec = round_record(r + 1, n, env_steps, result, metrics, learn_s, seen)
        # the modeled compute leaves this process's compiles out: it does not hang on the compile cache
        in_rollout, in_learn = np.diff(compiled)
        in_rollout = in_rollout if capabilities(self.backend).in_process else 0.0  # remote shards compile apart
        rc, cold = self.account.charge(n, shard_seconds(result.shards, less=in_rollout) * slow,
                                       moved_bytes(result, n, self._param_bytes), max(0.0, learn_s - in_learn))
        seen.update(s.slot for s in result.shards)
        return train, rec.replace(detail={**rec.detail, "compile_s": float(compiled[-1] - compiled[0])},
                                  cost=self.clocks.cost(rc, cold))

    def figures(self) -> dict:
        return {"scheduler": self.cfg.scheduler.name, "stop_note": self.stop_note}

    def _save(self, train, table, r: int) -> None:
        self.save(ShardState(train=train, table=None if table is None else table.data, round=np.int32(r)))

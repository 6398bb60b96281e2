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
import threading
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.trainers import checkpoint, interrupt, status
from jaxrl_dist.core import rng
from jaxrl_dist.backends import BackendError, RoundStats, Job, ShardTask, SlotTable, bucket, make_backend
from jaxrl_dist.config import Config, to_dict
from jaxrl_dist.scheduling.cost import TIME_KEYS, USD_KEYS, CostAccount, run_left
from jaxrl_dist.trainers.compile_clock import CompileClock
from jaxrl_dist.trainers.rundir import (METRICS_FILE, finish_run, open_logs, params_digest, peak_rss_mb,
                                        run_metadata)
from jaxrl_dist.trainers.logger import loss_keys, final_returns, nan_to_none, truncate_records
from jaxrl_dist.trainers.progress import RoundBudget
from jaxrl_dist.scheduling.schedulers import make_scheduler
from jaxrl_dist.backends.shard import ShardProgram, round_keys, slot_init_key, spec_from_config
from jaxrl_dist.core.learner import init_train, make_learner
from jaxrl_dist.core.types import TrainState
from jaxrl_dist.scheduling.records import Cost, Record, steps_done
from jaxrl_dist.scheduling.target import TARGET_ROUNDS, reached, recent_return
from jaxrl_dist.backends import wire
from jaxrl_dist.envs import resolve_suite


def init_table(program: ShardProgram, seed: int, max_shards: int) -> Optional[SlotTable]:
    """Every stateless slot's fresh envs, stacked `[M, ...]` (None for sticky specs)."""
    if program.spec.sticky:
        return None
    init = jax.vmap(lambda s: program.init_slot(slot_init_key(seed, s)))
    return SlotTable(jax.jit(init)(jnp.arange(max_shards)))


class RoundState(NamedTuple):
    """What a checkpoint holds: learner state, stateless slot states, round counter."""

    train: TrainState
    table: Any
    round: Any
    # the clocks and dollars at the checkpoint (`CLOCK_FIELDS`), so a resumed run's cost
    # continues from the checkpoint, not from whatever the metrics file last says
    clock: Any = None


CLOCK_FIELDS = ("cum_modeled_s", "cum_usd", "cum_wall_s")


def fresh_clock() -> np.ndarray:
    return np.zeros((len(CLOCK_FIELDS),), np.float64)


def busy_seconds(shards) -> float:
    """The busiest worker's compute time in a round: per worker, the length of
    the union of its shards' [started, finished] intervals (shards a worker ran
    together count once), then the max over workers."""
    by_worker: dict = {}
    for s in shards:
        by_worker.setdefault(s.worker, []).append((s.timings.started, s.timings.finished))
    best = 0.0
    for spans in by_worker.values():
        total, end = 0.0, float("-inf")
        for a, b in sorted(spans):
            total += max(0.0, b - max(a, end))
            end = max(end, b)
        best = max(best, total)
    return best


def shard_seconds(shards) -> list:
    """Each shard's compute seconds for the cost model. Shards a worker ran as one
    batch (the local backend's single jitted call: same worker, start and end)
    share the batch's time, as if each had run alone on its own instance."""
    span = lambda s: (s.worker, s.timings.started, s.timings.finished)  # noqa: E731
    count: dict = {}
    for s in shards:
        count[span(s)] = count.get(span(s), 0) + 1
    return [(s.timings.finished - s.timings.started) / count[span(s)] for s in shards]


def straggle(shards, b, seen, index: int) -> np.ndarray:
    """Injected stragglers (`backend.slowdown`, benchmarks): one shard in every
    `backend.slow_every` takes `slowdown` times as long, the one of slot `s` and
    index `index` (the round, or the async actor's chunk) with
    `(s + index) % slow_every == slow_every - 1`: a round of `slow_every` shards
    has one, on a slot that moves round by round, and any number of async
    actors meets them at the same rate, so none can keep clear of them by its
    choice of slots. Waits until the slowest such shard would have finished;
    returns each shard's factor, which stretches its billed compute too. A slot's
    first shard in this process (`seen`: the slots that ran before) is not slowed:
    its time is mostly the rollout's compile, which would make the straggler a
    start-up effect."""
    k = b.slow_every
    factors = np.array([b.slowdown if (s.slot + index) % k == k - 1 and s.slot in seen else 1.0
                        for s in shards])
    ends = [s.timings.finished + (f - 1.0) * (s.timings.finished - s.timings.started)
            for s, f in zip(shards, factors) if f > 1.0]
    if ends:
        time.sleep(max(0.0, max(ends) - time.time()))
    return factors


def charged_bytes(stats: RoundStats, n: int, param_bytes: int, payload_bytes: int) -> int:
    """Bytes `n` shards moved. A backend that moves none (local) is charged what a
    remote one would move uncompressed: the params to each shard, and each
    shard's payload (trajectory and bootstrap values) back."""
    return int(stats.bytes_sent) + int(stats.bytes_received) or n * (param_bytes + payload_bytes)


def moved_bytes(result, n: int, param_bytes: int) -> int:
    """`charged_bytes` of a round (its `[T, K, B]` outputs hold `K` shards' payloads)."""
    back = sum(x.nbytes for x in jax.tree.leaves((result.traj, result.bootstrap)))
    return charged_bytes(result.stats, n, param_bytes, back // result.bootstrap.shape[0])


def cost_fields(rc, cold: int, modeled_now: float, usd: float, wall_s: float, **extra) -> Cost:
    """A round's (or async update's) modeled cost and the running totals of both clocks;
    `extra`: more modeled components under their JSON names."""
    parts = {f"modeled_{k}": rc.components[k] for k in TIME_KEYS}
    parts.update({k: rc.components[k] for k in USD_KEYS}, **extra)
    return Cost(float(rc.modeled_s), float(rc.usd), float(modeled_now), float(usd), wall_s, cold, parts)


def recent_return_of(records: list, min_episodes: int):
    """`recent_return` over round records (their first seed); None without episodes."""
    last = records[-TARGET_ROUNDS:][::-1]
    sums = np.array([r.episode_return_sum[0] for r in last], np.float64)
    counts = np.array([r.episodes[0] for r in last], np.float64)
    return nan_to_none(recent_return(sums, counts, min_episodes)) if last else None


def _round_record(r: int, n: int, env_steps: int, result, metrics, times: dict, seen: set) -> Record:
    """One round's record. `seen`: slots that ran in earlier rounds of this process;
    a worker resetting one of those lost its envs (a first run is no loss)."""
    durations = [s.timings.finished - s.timings.started for s in result.shards]
    st = result.stats
    detail = {"shard_s_min": min(durations), "shard_s_median": float(np.median(durations)),
              "shard_s_max": max(durations), "billed_s": float(sum(s.timings.billed for s in result.shards)),
              "dispatch_s": float(st.dispatch_s), "transfer_s": float(st.transfer_s),
              "wait_s": float(st.wait_s), "bytes_sent": int(st.bytes_sent),
              "bytes_received": int(st.bytes_received), "shard_compute_s": durations}
    if all(s.roundtrip_s is not None for s in result.shards):  # a remote backend's, per shard
        detail["shard_roundtrip_s"] = [s.roundtrip_s for s in result.shards]
    return Record(r, env_steps, nan_to_none(metrics["return_mean"]),
                  {k: nan_to_none(metrics[k]) for k in loss_keys(metrics)},
                  n * times["steps_per_shard"] / times["round"], (float(metrics["episode_return_sum"]),),
                  (float(metrics["episodes"]),), n, time.time(), times["learn"], times["round"],
                  busy_seconds(result.shards), sum(s.retries for s in result.shards),
                  sum(bool(s.reset) and s.slot in seen for s in result.shards), detail=detail)


class ShardParts(NamedTuple):
    """What the sync and async trainers are built from."""

    spec: Any  # shard.ShardSpec: what a worker builds a shard from
    program: ShardProgram  # the env, network and rollout of one shard, on this process
    learner: Any  # core.learner.Learner
    backend: Any  # where shards run
    ckpt: checkpoint.Checkpointer


def shard_parts(cfg: Config, run_dir: Path, expected_shards: float) -> ShardParts:
    """The shards' spec and program, the learner (its LR schedule sized for rounds of
    `expected_shards`), the backend and the run's checkpointer."""
    suite = resolve_suite(cfg.env.id, cfg.env.suite)
    probe = ShardProgram(spec_from_config(cfg, suite, False))
    spec = spec_from_config(cfg, suite, not probe.env.spec.discrete)
    program = probe if spec == probe.spec else ShardProgram(spec)
    learner = make_learner(cfg, program.network, program.env.spec, expected_shards)
    ckpt = checkpoint.Checkpointer(run_dir, cfg.run.checkpoint_every, cfg.run.checkpoint_every_s)
    return ShardParts(spec, program, learner, make_backend(cfg.backend), ckpt)


def limit_reason(cfg: Config, r: int, env_steps: int) -> Optional[str]:
    """The step or round budget spent before round (or update) `r`, or None."""
    if env_steps >= cfg.algo.total_timesteps:
        return "total_timesteps"
    if cfg.run.max_rounds is not None and r >= cfg.run.max_rounds:
        return "max_rounds"
    return None


def over_limit(run_cfg, account: CostAccount, n: int) -> Optional[str]:
    """The `run.*` limit a round of `n` shards would take the modeled dollars
    (`budget_usd`) or the modeled clock (`deadline_s`) past, as `account` estimates
    it before the round, or None."""
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
    return (f"run.{reason}={getattr(run_cfg, reason)} does not pay for one round: {n} shards under "
            f"cost={cost_cfg.name} are estimated at {need}; nothing was trained")


def target_reason(cfg: Config, records: list) -> Optional[str]:
    """"target" when the last record reached it and `run.stop_at_target`, else None."""
    run = cfg.run
    if run.stop_at_target and records and reached(records[-1], run.target_return):
        return "target"
    return None


def clock_start(clock, t_start: Optional[float]) -> tuple:
    """`(modeled seconds, dollars, wall origin)` a run continues from a checkpoint's `clock`
    (`CLOCK_FIELDS`); the wall origin is in `time.perf_counter()` time (`t_start`, else now)."""
    modeled, usd, wall = (float(x) for x in clock)
    return modeled, usd, (time.perf_counter() if t_start is None else t_start) - wall


def clock_now(modeled_now: float, usd: float, wall0: float) -> np.ndarray:
    """`CLOCK_FIELDS` now, for a checkpoint."""
    return np.array([modeled_now, usd, time.perf_counter() - wall0], np.float64)


def param_bytes(params) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(params))


class RoundTrainer:
    """Owns a run's learner, backend, scheduler and state; `run()` trains to the end."""

    def __init__(self, cfg: Config, run_dir: Path, resuming: bool):
        self.cfg, self.run_dir = cfg, run_dir
        self.scheduler = make_scheduler(cfg.scheduler, cfg.backend, cfg)
        self.expected = self.scheduler.expected_shards()  # it sizes the LR schedule
        self.spec, self.program, self.learner, self.backend, self.ckpt = shard_parts(cfg, run_dir, self.expected)
        self.state = self._start(resuming)
        self.account, self.stop_reason, self._wall0, self._param_bytes = None, None, 0.0, 0
        self.stop_note = None  # a limit that stopped the run before any round: why, in one line

    def _start(self, resuming: bool) -> RoundState:
        train = init_train(self.learner, self.cfg.seed)
        table = init_table(self.program, self.cfg.seed, self.cfg.backend.max_shards)
        state = RoundState(train, None if table is None else table.data, np.zeros((), np.int32), fresh_clock())
        return self.ckpt.restore_latest(state) if resuming else state

    def _warm_learner(self, train) -> threading.Thread:
        """Compile the learner for the expected shard count on zeros, in a thread, so
        the compile overlaps the first round (actor start-up, the shards' compile)."""
        k = bucket(max(1, round(self.expected)), self.cfg.backend.max_shards)
        out = wire.output_templates(self.program)
        zeros = lambda s: np.zeros((s.shape[0], k) + tuple(s.shape[1:]), s.dtype)  # noqa: E731
        traj = jax.tree.map(zeros, out.traj)
        boot = np.zeros((k,) + tuple(out.bootstrap.shape), out.bootstrap.dtype)
        copy = jax.tree.map(jnp.copy, train)  # the update donates its state
        thread = threading.Thread(target=self.learner.update, daemon=True,
                                  args=(copy, traj, boot, 0, rng.key(0)))
        thread.start()
        return thread

    def _stop_reason(self, r: int, env_steps: int, records: list) -> Optional[str]:
        """Why the run stops before round `r` (0-based), or None to go on."""
        return limit_reason(self.cfg, r, env_steps) or target_reason(self.cfg, records)

    def _ask(self, r: int, records: list) -> int:
        """The scheduler's `n`; one that reads the run's limits (`sees_limits`) gets what is left."""
        if getattr(self.scheduler, "sees_limits", False):
            left = run_left(self.cfg.run, float(self.account.clock.now), self.account.usd)
            return self.scheduler.num_shards(r, records, left)
        return self.scheduler.num_shards(r, records)

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
        most = getattr(self.scheduler, "most_shards", None)
        if most is None:  # a plugin scheduler without it: every slot
            return self.cfg.backend.max_shards, "backend.max_shards"
        fixed = self.cfg.scheduler.name == "fixed"
        return most(), "scheduler.num_shards" if fixed else "scheduler.max_shards/backend.max_shards"

    def _start_clocks(self, t_start: Optional[float]) -> None:
        """The modeled clock and dollars, and the measured clock, continuing the checkpoint's."""
        modeled, usd, self._wall0 = clock_start(self.state.clock, t_start)
        self.account = CostAccount(self.cfg.cost, self.cfg.backend.max_shards, modeled, usd)
        self._param_bytes = param_bytes(self.state.train.params)

    def run(self, logger, history: list, t_start: Optional[float] = None) -> list:
        """Train round after round until `algo.total_timesteps` or a `run.*` stop
        condition (`self.stop_reason` says which); returns this run's records.
        `t_start`: when the measured clock started (`time.perf_counter()`; default now)."""
        cfg = self.cfg
        self._start_clocks(t_start)
        self.backend.start(Job(self.spec, cfg.seed, uuid.uuid4().hex, self.program, *self._shard_bound()))
        train, r = self.state.train, int(self.state.round)
        table = None if self.state.table is None else SlotTable(self.state.table)
        env_steps = steps_done(history, self.learner.steps_per_shard)
        records, seen = [], set()
        so_far = list(history)  # the resumed run's records, then this run's
        warm = self._warm_learner(train)
        self.ckpt.restart_clock()  # `run.checkpoint_every_s` counts training time
        try:
            while (n := self._next_round(r, env_steps, so_far)) is not None:
                # in the helper thread: a Ctrl-C during a long round is answered at once
                train, rec = interrupt.wait_for(self._round, r, n, env_steps, train, table, warm, seen)
                so_far.append(rec)
                rec = so_far[-1] = rec.replace(return_recent=recent_return_of(so_far, cfg.run.target_episodes))
                r, env_steps = r + 1, rec.env_steps
                logger.log([rec])
                records.append(rec)
                if self.ckpt.due(r):
                    self._save(train, table, r)
                if interrupt.requested():  # Ctrl-C: save what is done and stop
                    self._save(train, table, r)
                    raise interrupt.Interrupted(cfg.run.dir, r, "round")
        finally:
            self.backend.close()
        self._save(train, table, r)
        self.state = RoundState(train, None if table is None else table.data, np.int32(r), self._clock())
        return records

    def _round(self, r: int, n: int, env_steps: int, train, table, warm, seen: set):
        """Round `r` (0-based) with `n` shards after `env_steps` steps: dispatch,
        gather, update; returns `(train, record)`."""
        cfg, learner = self.cfg, self.learner
        t0 = time.perf_counter()
        keys, learn_key = round_keys(cfg.seed, r, np.arange(bucket(n, cfg.backend.max_shards)))
        result = self.backend.run_round(r, train.params, [ShardTask(s, keys[s]) for s in range(n)], table)
        slow = straggle(result.shards, cfg.backend, seen, r)
        warm.join()
        t1 = time.perf_counter()
        train, metrics = learner.update(train, result.traj, result.bootstrap, n, learn_key)
        metrics = jax.device_get(metrics)
        t2 = time.perf_counter()
        env_steps += n * learner.steps_per_shard
        times = {"learn": t2 - t1, "round": t2 - t0, "steps_per_shard": learner.steps_per_shard}
        rec = _round_record(r + 1, n, env_steps, result, metrics, times, seen)
        rc, cold = self.account.charge(n, shard_seconds(result.shards) * slow,
                                       moved_bytes(result, n, self._param_bytes), times["learn"])
        rec = rec.replace(cost=cost_fields(rc, cold, self.account.clock.now, self.account.usd,
                                           time.perf_counter() - self._wall0))
        seen.update(s.slot for s in result.shards)
        return train, rec

    def summary(self) -> dict:
        """This trainer's own figures for summary.json."""
        return {"trainer": "sync", **({"stop_note": self.stop_note} if self.stop_note else {})}

    def _save(self, train, table, r: int) -> None:
        data = None if table is None else jax.tree.map(np.asarray, table.data)
        self.ckpt.save(RoundState(train, data, np.int32(r), self._clock()), step=r)

    def _clock(self) -> np.ndarray:
        return clock_now(self.account.clock.now, self.account.usd, self._wall0)


def cost_summary(cfg: Config, records: list, stop_reason: Optional[str]) -> dict:
    """Both clocks and the dollars for summary.json: totals, each modeled component
    summed, and where the first round reaching `run.target_return` put each clock
    (null when no round did)."""
    costs = [rec.cost for rec in records if rec.cost is not None]
    last = costs[-1] if costs else None
    hit = next((rec.cost for rec in records if reached(rec, cfg.run.target_return)), None)
    out = {"stop_reason": stop_reason, "cost_preset": cfg.cost.name,
           "cost_usd": last.cum_usd if last else 0.0, "modeled_seconds": last.cum_modeled_s if last else 0.0,
           "target_return": cfg.run.target_return}
    for name, attr in (("time_to_target_s", "cum_modeled_s"), ("wall_to_target_s", "cum_wall_s"),
                       ("cost_to_target_usd", "cum_usd")):
        out[name] = None if hit is None else getattr(hit, attr)
    for key in [f"modeled_{k}" for k in TIME_KEYS] + list(USD_KEYS):
        out[key] = sum(c.components.get(key, 0.0) for c in costs)
    return out


class _Trained(NamedTuple):
    """What `train_rounds` summarises: the trainer after its run, and the records."""

    trainer: Any
    tracker: Any  # trainers.tracking's, or None
    start: int  # the round the run started (or resumed) from
    history: list  # the resumed run's records
    records: list  # this run's
    done_steps: int  # env steps done before this run
    train_seconds: float
    compile_seconds: float


def round_budget(cfg: Config, expected_shards: float, steps_per_shard: int) -> RoundBudget:
    """What the progress display estimates the run's total steps from: the step and round
    limits, and rounds of `expected_shards` until the first one has run."""
    return RoundBudget(cfg.algo.total_timesteps, cfg.run.max_rounds,
                       max(1, round(expected_shards)) * steps_per_shard)


def _train(cfg: Config, run_dir: Path, resuming: bool, t_start: float, trainer_cls) -> _Trained:
    """Build the trainer and run it, timing this process's compiles (`CompileClock`)."""
    with CompileClock() as compiles:
        with status.showing(f"starting the {cfg.backend.name} backend", cfg.run.progress):
            trainer = (trainer_cls or RoundTrainer)(cfg, run_dir, resuming)
        start = int(trainer.state.round)
        history = truncate_records(run_dir / METRICS_FILE, start)
        done = steps_done(history, trainer.learner.steps_per_shard)
        logger, tracker = open_logs(cfg, run_dir, cfg.algo.total_timesteps, done, history,
                                    round_budget(cfg, trainer.expected, trainer.learner.steps_per_shard))
        t1 = time.perf_counter()
        try:
            records = trainer.run(logger, history, t_start)
            logger.finish()
        except BackendError as err:
            last = trainer.ckpt.latest_step()
            where = f"round {last}" if last is not None else "none yet"
            raise BackendError(f"{err}; last checkpoint: {where}; continue with run.resume={run_dir}") from err
        finally:
            logger.close()
            trainer.ckpt.close()
        train_s = time.perf_counter() - t1
    return _Trained(trainer, tracker, start, history, records, done, train_s, compiles.seconds)


def train_rounds(cfg: Config, run_dir: Path, resuming: bool, t_start: float,
                 trainer_cls=None) -> dict:
    """Train with the round trainer (or `trainer_cls`, the async one); called by
    `runner.train` for shard backends."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resuming:
        checkpoint.save_run_config(run_dir, to_dict(cfg))
    t = _train(cfg, run_dir, resuming, t_start, trainer_cls)
    trainer, all_records = t.trainer, t.history + t.records
    rounds = int(trainer.state.round)
    env_steps = steps_done(all_records, trainer.learner.steps_per_shard)
    final, per_seed = final_returns(all_records, rounds)
    new_steps = env_steps - t.done_steps
    summary = {
        "env_id": cfg.env.id, "backend": cfg.backend.name, "scheduler": cfg.scheduler.name,
        "final_return": final, "returns_per_seed": per_seed, "env_steps": env_steps,
        "total_env_steps": env_steps, "num_updates": rounds, "rounds": rounds, "num_seeds": 1,
        "wall_seconds": time.perf_counter() - t_start,
        # this process's compiles (the learner, local shards), summed over the threads that
        # compiled; ray and http workers compile inside their first shards
        "compile_seconds": t.compile_seconds,
        "train_seconds": t.train_seconds, "sps": new_steps / t.train_seconds if t.train_seconds > 0 else None,
        "retries": sum(rec.retries for rec in all_records),
        "slot_resets": sum(rec.slot_resets for rec in all_records),
        "params_sha256": params_digest(trainer.state.train.params),
        "peak_rss_mb": peak_rss_mb(),
        "resumed_at_update": t.start if cfg.run.resume else None,
        "run_dir": str(Path(cfg.run.dir).resolve()),
        **run_metadata(),
    }
    summary.update(cost_summary(cfg, all_records, trainer.stop_reason))
    summary.update(trainer.summary())
    finish_run(run_dir, summary, t.tracker)
    return summary

"""The skeleton every round-based trainer (sync, async) is built on, and the run around it.

A `ShardTrainer` owns a run's shard program, learner, backend, checkpointer and
state (`ShardState`, what its checkpoint holds). The skeleton does what both
trainers do the same way: start fresh or restore the newest checkpoint, warm
the learner's compile in a thread, save, and build an update's record; each
trainer implements `run` (its loop) and `figures` (its own part of the summary).
`train_rounds` runs any `ShardTrainer` subclass: logs, the run's `RunSummary`,
the terminal table.
"""
from __future__ import annotations

import abc
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_dist.backends import BackendError, SlotTable, make_backend, wire
from jaxrl_dist.backends.shard import ShardProgram, slot_init_key, spec_from_config
from jaxrl_dist.config import Config, check_policy
from jaxrl_dist.core import mesh as meshes
from jaxrl_dist.core.learner import init_train, make_learner, update_sharding
from jaxrl_dist.core.networks import is_recurrent
from jaxrl_dist.core.types import TrainState
from jaxrl_dist.envs import resolve_suite
from jaxrl_dist.scheduling.records import Record, steps_done
from jaxrl_dist.scheduling.target import TARGET_ROUNDS, reached, recent_return
from jaxrl_dist.trainers import checkpoint, status
from jaxrl_dist.trainers.accounting import Clocks, Laps, cost_figures, fresh_clock, phase_figures
from jaxrl_dist.trainers.compile_clock import CompileClock
from jaxrl_dist.trainers.interrupt import step_unit
from jaxrl_dist.trainers.logger import check_legal, final_returns, loss_keys, nan_to_none, truncate_records
from jaxrl_dist.trainers.progress import RoundBudget
from jaxrl_dist.trainers.rundir import METRICS_FILE, finish_run, open_logs, params_digest, peak_rss_mb, run_metadata
from jaxrl_dist.trainers.summary import RoundFigures, RunSummary


class ShardState(NamedTuple):
    """What a shard trainer's checkpoint holds."""

    train: TrainState
    table: Any  # `[M, ...]` stateless slots' env states (None: sticky slots keep theirs)
    round: Any  # rounds (sync) or params versions (async) done
    counts: Any = None  # async: `[M]` chunks taken per slot (None for sync)
    clock: Any = None  # `accounting.CLOCK_FIELDS` at the checkpoint


class ShardParts(NamedTuple):
    """What the sync and async trainers are built from."""

    spec: Any  # shard.ShardSpec: what a worker builds a shard from
    program: ShardProgram  # the env, network and rollout of one shard, on this process
    learner: Any  # core.learner.Learner
    backend: Any  # where shards run
    ckpt: checkpoint.Checkpointer


def init_table(program: ShardProgram, seed: int, max_shards: int) -> Optional[SlotTable]:
    """Every stateless slot's fresh envs, stacked `[M, ...]` (None for sticky specs)."""
    if program.spec.sticky:
        return None
    init = jax.vmap(lambda s: program.init_slot(slot_init_key(seed, s)))
    return SlotTable(jax.jit(init)(jnp.arange(max_shards)))


def shard_program(cfg: Config) -> ShardProgram:
    """The program of one shard of `cfg` on this process (a continuous env's spec
    learns it is continuous from a first probe of the env)."""
    suite = resolve_suite(cfg.env.id, cfg.env.suite)
    probe = ShardProgram(spec_from_config(cfg, suite, False))
    env = probe.env.spec
    mask = check_policy(cfg, suite, is_recurrent(probe.network), env.masked)
    spec = spec_from_config(cfg, suite, not env.discrete, mask)
    return probe if spec == probe.spec else ShardProgram(spec)


def shard_learner(cfg: Config, program: ShardProgram, expected_shards: float):
    """The learner of a shard trainer of `cfg` (`core.learner.make_learner`), its LR
    schedule sized for rounds of `expected_shards`."""
    b = cfg.backend.envs_per_shard
    return make_learner(cfg.algo, program.network, program.env.spec, expected_shards, envs_per_shard=b,
                        rho_bar=cfg.asynchronous.rho_bar, c_bar=cfg.asynchronous.c_bar,
                        sharding=update_sharding(cfg.trainer, b))


def shard_parts(cfg: Config, run_dir: Path, expected_shards: float) -> ShardParts:
    """The shards' spec and program, the learner (its LR schedule sized for rounds of
    `expected_shards`), the backend and the run's checkpointer."""
    program = shard_program(cfg)
    learner = shard_learner(cfg, program, expected_shards)
    ckpt = checkpoint.Checkpointer(run_dir, cfg.run.checkpoint_every, cfg.run.checkpoint_every_s)
    return ShardParts(program.spec, program, learner, make_backend(cfg.backend), ckpt)


def learner_placement(cfg: Config):
    """Where the round learner's update leaves its state: replicated over the mesh its
    samples are split over (`update_sharding`), None on one device."""
    samples = update_sharding(cfg.trainer, cfg.backend.envs_per_shard)
    return None if samples is None else meshes.replicated(samples.mesh)


def fresh_state(cfg: Config, program: ShardProgram, learner, counts: bool) -> ShardState:
    """A run's first state: initial params, every slot's fresh envs (as host arrays),
    nothing done; with `counts`, a zero chunk count per slot (async)."""
    M = cfg.backend.max_shards
    table = init_table(program, cfg.seed, M)
    data = None if table is None else jax.tree.map(np.asarray, table.data)
    return ShardState(train=init_train(learner, cfg.seed), table=data, round=np.zeros((), np.int32),
                      counts=np.zeros((M,), np.int32) if counts else None, clock=fresh_clock())


def state_template(cfg: Config) -> ShardState:
    """What a sync or async run of `cfg` checkpoints, as shapes and dtypes (nothing is
    initialised): the template `Checkpointer.restore` reads it into."""
    program = shard_program(cfg)
    learner = shard_learner(cfg, program, 1.0)  # the schedule sets no shape
    table = None if program.spec.sticky else jax.eval_shape(
        lambda: init_table(program, cfg.seed, cfg.backend.max_shards).data)
    M = cfg.backend.max_shards
    counts = jax.ShapeDtypeStruct((M,), np.int32) if cfg.trainer.name == "async" else None
    return ShardState(train=jax.eval_shape(lambda: init_train(learner, cfg.seed)), table=table,
                      round=jax.ShapeDtypeStruct((), np.int32), counts=counts,
                      clock=jax.ShapeDtypeStruct(fresh_clock().shape, np.float64))


def limit_reason(cfg: Config, r: int, env_steps: int) -> Optional[str]:
    """The step or round budget spent before round (or update) `r`, or None."""
    if env_steps >= cfg.algo.total_timesteps:
        return "total_timesteps"
    if cfg.run.max_rounds is not None and r >= cfg.run.max_rounds:
        return "max_rounds"
    return None


def target_reason(cfg: Config, records: list) -> Optional[str]:
    """"target" when the last record reached it and `run.stop_at_target`, else None."""
    run = cfg.run
    if run.stop_at_target and records and reached(records[-1], run.target_return):
        return "target"
    return None


def recent_return_of(records: list, min_episodes: int):
    """`recent_return` over round records (their first seed); None without episodes."""
    last = records[-TARGET_ROUNDS:][::-1]
    sums = np.array([r.episode_return_sum[0] for r in last], np.float64)
    counts = np.array([r.episodes[0] for r in last], np.float64)
    return nan_to_none(recent_return(sums, counts, min_episodes)) if last else None


def update_record(metrics, **fields) -> Record:
    """A round's (or async update's) record: the update's metrics (return, losses,
    episode sums of its one seed) and the trainer's `fields`, by keyword."""
    check_legal(metrics, fields["update"])
    return Record(ret=nan_to_none(metrics["return_mean"]),
                  losses={k: nan_to_none(metrics[k]) for k in loss_keys(metrics)},
                  episode_return_sum=(float(metrics["episode_return_sum"]),),
                  episodes=(float(metrics["episodes"]),), time=time.time(), **fields)


def zero_outputs(program: ShardProgram) -> tuple:
    """`(traj [T, B], bootstrap [B])` of zeros shaped as one shard's output: what a
    learner's compile is warmed on."""
    out = wire.output_templates(program)
    zeros = lambda s: np.zeros(s.shape, s.dtype)  # noqa: E731
    return jax.tree.map(zeros, out.traj), zeros(out.bootstrap)


class ShardTrainer(abc.ABC):
    """A round-based trainer: its parts and state, and the steps both trainers share.

    `cfg`, `learner`, `ckpt`, `state` and `expected` (shards an update learns from,
    which sizes the LR schedule) are what `train_rounds` reads; after `run`,
    `stop_reason` says why the run stopped."""

    keeps_counts = False  # whether the state carries per-slot chunk counts (async)

    def __init__(self, cfg: Config, run_dir: Path, resuming: bool):
        self.cfg, self.run_dir = cfg, run_dir
        self.expected = self.expected_shards()
        self.spec, self.program, self.learner, self.backend, self.ckpt = shard_parts(cfg, run_dir, self.expected)
        self.placement = learner_placement(cfg)
        self.state = self.start(resuming)
        self.stop_reason: Optional[str] = None
        self.clocks: Optional[Clocks] = None
        self._warming: list = []  # the learner's warm-up compiles (threads)
        # seconds by phase: before the first round (`STARTUP_PHASES`) and after the last
        self.startup: dict = {}
        self.tail: dict = {}
        self.laps = Laps()  # the current round's stopwatch (restarted when start-up ends)
        self.rounds_t0 = self.laps.t0  # when the first round started (`perf_counter`)
        self.launch_s = 0.0  # the process's seconds before `train()` (`train_rounds` sets it)
        self.compiles = CompileClock()  # this process's compile seconds (`train_rounds` gives its own)

    def process_start(self, t_start: Optional[float]) -> Optional[float]:
        """The measured clock's origin: the process's start, `launch_s` before `train()`'s."""
        return None if t_start is None else t_start - self.launch_s

    @abc.abstractmethod
    def expected_shards(self) -> float:
        """Shards (or chunks) an update is expected to learn from."""

    @abc.abstractmethod
    def run(self, logger, history: list, t_start: Optional[float] = None) -> list:
        """Train until `algo.total_timesteps` or a `run.*` stop condition (`stop_reason`
        says which); returns this run's records. `t_start`: when the measured clock
        started (`time.perf_counter()`; default now)."""

    @abc.abstractmethod
    def figures(self) -> dict:
        """This trainer's own `RunSummary` fields (by name), and `scheduler` for its
        `RoundFigures`."""

    def start(self, resuming: bool) -> ShardState:
        """A fresh state, or the newest intact checkpoint of a resumed run."""
        state = fresh_state(self.cfg, self.program, self.learner, self.keeps_counts)
        state = self.ckpt.restore_latest(state) if resuming else state
        return state._replace(train=self.placed(state.train), table=self.placed(state.table))

    def placed(self, tree):
        """`tree` where the update leaves the learner's state (`learner_placement`). The
        first round and the warm-up compiles see what every later round sees: fed arrays
        placed anywhere else, the round and the update would compile again in rounds 2-3."""
        return tree if self.placement is None else jax.device_put(tree, self.placement)

    def warm(self, fn, *args) -> threading.Thread:
        """Run `fn(*args)` (a compile of the learner's update on zeros) in a thread, so
        that it overlaps the backend's start-up and the shards' compiles. `settle` waits
        for it: a process must not exit while XLA compiles in a thread of its own (the
        runtime aborts natively, whatever exit code the run chose)."""
        thread = threading.Thread(target=fn, args=args, daemon=True, name="jaxrl-dist-warm")
        thread.start()
        self._warming.append(thread)
        return thread

    def settle(self) -> None:
        """Wait for the warm-up compiles still running (on every way out of `run`)."""
        for thread in self._warming:
            thread.join()
        self._warming.clear()

    def start_laps(self, t_start: Optional[float]) -> Laps:
        """The start-up's stopwatch; `build` (making the trainer) is what passed since
        `t_start`, `launch` what the process spent before it."""
        laps = Laps()
        self.startup = {"launch": self.launch_s, "build": 0.0 if t_start is None else laps.t0 - t_start}
        return laps

    def started(self, laps: Laps) -> None:
        """End of the start-up: its phases are kept, the first round's stopwatch starts
        (its `t0` is where `train_seconds` count from)."""
        self.startup.update(laps.take()[0])
        self.laps = Laps()
        self.rounds_t0 = self.laps.t0

    def stamp(self, rec: Record) -> Record:
        """Close a round's (or update's) record: its phases, its wall (`round_s`: since the
        previous record was stamped) and the env steps/s over that wall."""
        self.laps.lap("record")
        phases, wall = self.laps.take()
        return rec.replace(phases=phases, round_s=wall, sps=rec.num_shards * self.learner.steps_per_shard / wall)

    def finish(self) -> None:
        """After the last round: what its logging, checkpoint and the final save took."""
        self.laps.lap("finish")
        self.tail = self.laps.take()[0]

    def save(self, state: ShardState) -> None:
        """Checkpoint `state` (host arrays) at its round, with the clocks as they are now."""
        state = state._replace(table=None if state.table is None else jax.tree.map(np.asarray, state.table),
                               clock=self.clocks.now())
        self.ckpt.save(state, step=int(state.round))
        self.state = state


class _Trained(NamedTuple):
    """What `train_rounds` summarises: the trainer after its run, and the records."""

    trainer: ShardTrainer
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


def _train(cfg: Config, run_dir: Path, resuming: bool, t_start: float, trainer_cls: type,
           launch_s: float) -> _Trained:
    """Build the trainer and run it, timing this process's compiles (`CompileClock`)."""
    with CompileClock() as compiles:
        with status.showing(f"starting the {cfg.backend.name} backend", cfg.run.progress):
            trainer = trainer_cls(cfg, run_dir, resuming)
        trainer.launch_s, trainer.compiles = launch_s, compiles
        start = int(trainer.state.round)
        history = truncate_records(run_dir / METRICS_FILE, start)
        done = steps_done(history, trainer.learner.steps_per_shard)
        logger, tracker = open_logs(cfg, run_dir, cfg.algo.total_timesteps, done, history,
                                    round_budget(cfg, trainer.expected, trainer.learner.steps_per_shard))
        try:
            first = f"compiling and running the first {step_unit(cfg.trainer.name)}"  # until the bar shows
            with status.showing(first, cfg.run.progress):
                records = trainer.run(logger, history, t_start)
            train_s = time.perf_counter() - trainer.rounds_t0  # start-up apart
            logger.finish()
        except BackendError as err:
            last = trainer.ckpt.latest_step()
            where = (f"{step_unit(cfg.trainer.name)} {last}; continue with" if last is not None
                     else "none yet; start it again with")
            raise BackendError(f"{err}; last checkpoint: {where} run.resume={run_dir}") from err
        finally:
            logger.close()
            trainer.ckpt.close()
    return _Trained(trainer, tracker, start, history, records, done, train_s, compiles.seconds)


def _summary(cfg: Config, t: _Trained, t_start: float) -> RunSummary:
    trainer, records = t.trainer, t.history + t.records
    rounds = int(trainer.state.round)
    env_steps = steps_done(records, trainer.learner.steps_per_shard)
    final, per_seed = final_returns(records, rounds)
    own = trainer.figures()
    return RunSummary(
        trainer=cfg.trainer.name, env_id=cfg.env.id, final_return=final, returns_per_seed=per_seed,
        env_steps=env_steps, total_env_steps=env_steps, num_updates=rounds, num_seeds=1,
        # from the process's start (`launch_s`, the start-up's first phase), so the start-up
        # and the rounds add up within it
        wall_seconds=trainer.launch_s + time.perf_counter() - t_start, compile_seconds=t.compile_seconds,
        train_seconds=t.train_seconds,
        sps=_sps(env_steps - t.done_steps, t),
        params_sha256=params_digest(trainer.state.train.params), peak_rss_mb=peak_rss_mb(),
        resumed_at_update=t.start if cfg.run.resume else None, run_dir=str(Path(cfg.run.dir).resolve()),
        mesh=_mesh(cfg), processes=jax.process_count(), metadata=run_metadata(),
        rounds=RoundFigures(backend=cfg.backend.name, scheduler=own.pop("scheduler"), rounds=rounds,
                            retries=sum(rec.retries for rec in records),
                            slot_resets=sum(rec.slot_resets for rec in records),
                            shards_mean=float(np.mean([r.num_shards for r in records])) if records else None),
        cost=cost_figures(records, trainer.stop_reason, cfg.cost.name, cfg.run.target_return),
        phases=phase_figures(trainer.startup, t.records, trainer.tail, cfg.run.target_return), **own)


def _sps(steps: int, t: _Trained) -> Optional[float]:
    """Env steps a second of this run's rounds, the compiles inside them left out (the sync
    trainer's records say each round's, `compile_s`: a new shard bucket compiles in its
    round), as the fused trainer's `sps` leaves its compile out."""
    busy = t.train_seconds - sum(rec.detail.get("compile_s", 0.0) for rec in t.records)
    return steps / busy if busy > 0 else None


def _mesh(cfg: Config) -> Optional[dict]:
    """The learner's `{seeds, data}` devices (its update's samples split over `data`)."""
    shape = meshes.mesh_shape(cfg.trainer, jax.device_count())
    return None if shape is None else shape._asdict()


def train_rounds(cfg: Config, run_dir: Path, resuming: bool, t_start: float, trainer_cls: type,
                 launch_s: float = 0.0) -> RunSummary:
    """Train with a round-based trainer (`trainer_cls`, a `ShardTrainer` subclass);
    called by `runner.train` for `trainer=sync` and `trainer=async`. `launch_s`: the
    process's seconds before `t_start` (the start-up's `launch`)."""
    t = _train(cfg, run_dir, resuming, t_start, trainer_cls, launch_s)
    summary = _summary(cfg, t, t_start)
    finish_run(run_dir, summary, t.tracker)
    return summary

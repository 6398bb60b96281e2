"""A single-process training run: fused chunks, logging, checkpoints, summary.

`train(cfg)` makes the env and the fused trainer, compiles one chunk of `K`
updates ahead of time (so compile time is measured apart and the loop never
recompiles), then calls that executable until the run is done, logging and
checkpointing between chunks. The run directory gets `config.yaml`,
`metrics.jsonl` (one record per update), `tensorboard/`, `checkpoints/` and
`summary.json`.

Step counts: `env_steps` counts steps per seed (like `algo.total_timesteps`);
`total_env_steps` and `sps` count all seeds' envs together (throughput).
Times and `sps` describe this process; for a resumed run, the resumed part:
`compile_seconds` the chunk's compile, `checkpoint_seconds` the checkpoint
writes (the end-of-run one too: ~0.1 s of orbax however small the state),
`train_seconds` the chunk loop with its logging less those writes, and
`sps` is per `train_seconds`; `wall_seconds` covers the whole call.
"""
from __future__ import annotations

import contextlib
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import jax

from jaxrl_dist.config import Config, on_one_device, validate
from jaxrl_dist.envs import env_of
from jaxrl_dist.trainers import checkpoint, distributed, fused, interrupt, status
from jaxrl_dist.trainers.asynchronous import AsyncTrainer
from jaxrl_dist.trainers.parts import check_parts
from jaxrl_dist.trainers.logger import NoLegalAction, chunk_records, final_returns, read_records, truncate_records
from jaxrl_dist.trainers.rundir import (METRICS_FILE, compile_cache_dir, default_run_dir,
                                        enable_compile_cache, finish_run, open_logs, params_digest,
                                        peak_rss_mb, prepare_run, run_metadata)
from jaxrl_dist.trainers.rounds import train_rounds
from jaxrl_dist.trainers.summary import FusedFigures, RunSummary
from jaxrl_dist.trainers.sync import RoundTrainer


def _init_runner(setup, env, seed: int):
    """`fused.init_runner`, as one jitted call where the env is pure JAX.

    Run eagerly it dispatches (and compiles) op by op, seconds on a small CPU;
    one jit is faster and lands in the compilation cache. envpool resets on
    the host, so it stays eager there.
    """
    if checkpoint.host_env_state(env.spec):
        return fused.init_runner(setup, env, seed)
    where = None if setup.mesh is None else fused.runner_shardings(setup, env)
    # the coefficients are an argument, so a new value is not a new program
    return jax.jit(functools.partial(fused.init_runner, setup, env, seed), out_shardings=where)(hyper=setup.hyper)


def state_template(cfg: Config, env):
    """What a fused run of `cfg` on `env` (`env.num_envs` = every seed's envs) checkpoints,
    as shapes and dtypes on one device: the template `Checkpointer.restore` reads it into.
    envpool resets on the host, so its template is a real fresh state."""
    setup = fused.make_setup(on_one_device(cfg), env.spec)
    if checkpoint.host_env_state(env.spec):
        return fused.init_runner(setup, env, cfg.seed)
    return jax.eval_shape(functools.partial(fused.init_runner, setup, env, cfg.seed))


def _start_runner(setup, env, ckpt, cfg: Config, resuming: bool):
    """A fresh runner, or the newest intact checkpoint of a resumed run (fresh if it has none)."""
    runner = _init_runner(setup, env, cfg.seed)
    if resuming:
        runner = checkpoint.resume_runner(ckpt.restore_latest(runner), runner, env.spec)
    return runner


def compile_chunk(setup, env, K: int, runner_like):
    """AOT-compile the chunk for `runner_like`'s shapes; returns `(executable, seconds)`.

    Lowered from shapes alone: a restored runner's arrays are committed to one device,
    which a chunk whose seeds are split over several (`fused.seed_devices`) refuses to
    lower from, though it takes them as inputs."""
    t0 = time.perf_counter()
    if setup.mesh is None:
        runner_like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), runner_like)
    compiled = fused.make_train_chunk(setup, env, K).lower(runner_like).compile()
    return compiled, time.perf_counter() - t0


def placed(compiled, runner):
    """`runner` where the compiled chunk takes it (a restored runner sits on one device)."""
    return jax.device_put(runner, compiled.input_shardings[0][0])


def _start_and_compile(setup, env, ckpt, cfg: Config, resuming: bool, K: int):
    """The starting runner and the compiled chunk: `(runner, executable or None, seconds)`.

    A fresh run on a pure-JAX env compiles the chunk from the runner's shapes
    in a second thread while the runner itself is initialised (a compile of
    its own), so the two compiles overlap on a multi-core host.
    """
    if resuming or checkpoint.host_env_state(env.spec):
        runner = _start_runner(setup, env, ckpt, cfg, resuming)
        if int(runner.update) >= setup.derived.num_updates:
            return runner, None, 0.0  # a finished run, resumed again: nothing to do
        compiled, seconds = compile_chunk(setup, env, K, runner)
        return placed(compiled, runner), compiled, seconds
    return compile_beside(setup, env, K, lambda: _start_runner(setup, env, ckpt, cfg, resuming))


def compile_beside(setup, env, K: int, start: Callable):
    """`(start(), compiled chunk, its compile seconds)`: the chunk compiled from the shapes
    of a fresh runner (`setup.cfg`'s seeds) in a second thread while `start` builds the
    runner (a compile of its own), so the two compiles overlap on a multi-core host."""
    shapes = jax.eval_shape(functools.partial(fused.init_runner, setup, env, setup.cfg.seed))
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(compile_chunk, setup, env, K, shapes)
        runner = start()
        compiled, seconds = future.result()
    return runner, compiled, seconds


def chunk_logger(logger, derived):
    """`log(metrics[K, S], first_update, sps) -> records`: a chunk's records, written."""

    def log(metrics, first_update: int, sps: float) -> list:
        chunk = chunk_records(metrics, first_update, derived.batch_size, sps)
        logger.log(chunk)
        return chunk

    return log


def run_chunks(compiled, runner, ckpt, log, setup, K: int, start: int):
    """Call the compiled chunk until the last update; returns `(runner, records)`.
    `log` (`chunk_logger`'s) writes each chunk's records; `ckpt` saves the runner.

    Chunks are pipelined: chunk `c + 1` is dispatched before chunk `c`'s
    metrics are fetched and logged, so host-side logging overlaps device work.
    A checkpoint waits for its chunk (the next call donates the state). Calls
    and fetches block in `interrupt.wait_for`'s helper thread, so a Ctrl-C is
    acknowledged while a chunk runs. Before each chunk the processes of a
    multi-process run agree whether to stop or save (`distributed.agreed`).
    """
    cfg, derived = setup.cfg, setup.derived
    steps_per_chunk = K * derived.batch_size * cfg.num_seeds
    records, pending, t_ready, due = [], None, time.perf_counter(), False
    ckpt.restart_clock()  # `run.checkpoint_every_s` counts training time

    def drain(item):
        nonlocal t_ready
        c, metrics = item
        metrics = interrupt.wait_for(jax.device_get, metrics)  # blocks until chunk c is done
        now = time.perf_counter()
        records.extend(log(metrics, c * K + 1, steps_per_chunk / (now - t_ready)))
        t_ready = now

    for c in range(start // K, derived.num_updates // K):
        stop, due = distributed.agreed(interrupt.requested(), due)
        if stop or due:  # a checkpoint due, or a stop asked (Ctrl-C, SIGTERM): save what is done
            if pending is not None:
                drain(pending)
                pending = None
            ckpt.save(runner)
            if stop:
                raise interrupt.Interrupted(cfg.run.dir, c * K)
        runner, metrics = interrupt.wait_for(compiled, runner)
        if pending is not None:
            drain(pending)
        pending = (c, metrics)
        due = ckpt.due((c + 1) * K)
    if pending is not None:
        drain(pending)
    ckpt.save(runner)  # the end of the run (no-op if just saved)
    return runner, records


def summary_of(cfg, setup, runner, records, times: dict, start: int) -> RunSummary:
    """A fused run's summary; `times`: its compile, checkpoint, train and wall seconds."""
    d = setup.derived
    final, per_seed = final_returns(records, d.num_updates)
    done = (d.num_updates - start) * d.batch_size * cfg.num_seeds
    return RunSummary(
        trainer="fused", env_id=cfg.env.id, final_return=final, returns_per_seed=per_seed,
        env_steps=d.num_updates * d.batch_size, total_env_steps=d.num_updates * d.batch_size * cfg.num_seeds,
        num_updates=d.num_updates, num_seeds=cfg.num_seeds, wall_seconds=times["wall"],
        compile_seconds=times["compile"], train_seconds=times["train"],
        sps=done / times["train"] if times["train"] > 0 else None,
        params_sha256=params_digest(runner.train.params), peak_rss_mb=peak_rss_mb(),
        resumed_at_update=start if cfg.run.resume else None, run_dir=str(Path(cfg.run.dir).resolve()),
        mesh=None if setup.mesh is None else dict(setup.mesh.shape), processes=jax.process_count(),
        metadata=run_metadata(), fused=FusedFigures(checkpoint_seconds=times["checkpoint"]))


def train(cfg: Config, run_dir=None, *, launch_s: float = 0.0, checked: bool = False) -> RunSummary:
    """Train `cfg` (or continue `cfg.run.resume`) and return the run summary.

    The run directory is `run_dir`, else `cfg.run.dir`, else a dated one
    under `outputs/`. Raises `ConfigError`/`EnvMakeError` before the run dir is
    written: the config's checks and its parts' (as `jaxrl-dist train` runs them;
    `checked`: the caller ran them). `launch_s`: the seconds the process spent before
    this call (the CLI passes its start, imports and config), the start-up's `launch`
    phase in a shard trainer's summary.
    """
    t_start = time.perf_counter()
    if not isinstance(cfg, Config):
        raise TypeError(f"train takes a Config, got a {type(cfg).__name__} (from_dict builds one from mappings)")
    if not checked:
        validate(cfg)
        if not cfg.run.resume:  # a resumed run trains the config saved with it, checked then
            check_parts(cfg)
    distributed.initialize(cfg.trainer.distributed)  # before anything asks JAX for devices
    cfg, run_dir, resuming = prepare_run(cfg, run_dir, check_keys=not checked)  # the compile cache on, if asked
    # Ctrl-C: a checkpoint, then `interrupt.Interrupted`
    unit = interrupt.step_unit(cfg.trainer.name)
    with interrupt.stop_on_sigint(unit), interrupt.one_line_when_stopped_at_once(
            cfg.run.dir, lambda: bool(checkpoint.saved_steps(cfg.run.dir))):
        if cfg.trainer.name not in ("async", "sync"):  # fused traces its chunk loop, past the compile
            return _train_fused(cfg, run_dir, resuming, t_start)
        with _profiling(cfg.run.profile_dir):  # the round trainers compile as they go
            trainer_cls = AsyncTrainer if cfg.trainer.name == "async" else RoundTrainer
            return train_rounds(cfg, run_dir, resuming, t_start, trainer_cls, launch_s)


@contextlib.contextmanager
def _profiling(trace_dir):
    """A JAX profiler trace under `trace_dir` (`run.profile_dir`): of the fused trainer's
    chunk loop, its compile left out (timed apart; its host events made a quick
    CartPole trace 70 MiB); of the round trainers' whole run."""
    if not trace_dir:
        yield
        return
    with jax.profiler.trace(str(trace_dir)):
        yield


def _fused_parts(cfg: Config, run_dir, resuming: bool) -> tuple:
    """The env, setup, checkpointer and chunk size of a fused run (its config saved)."""
    env = env_of(cfg.env, cfg.env.num_envs * cfg.num_seeds, cfg.seed)
    setup = fused.make_setup(cfg, env.spec)
    K = fused.chunk_size(setup.derived.num_updates, cfg.run.log_chunks, cfg.run.checkpoint_every,
                         setup.loop_free)
    ckpt = checkpoint.Checkpointer(run_dir, cfg.run.checkpoint_every, cfg.run.checkpoint_every_s)
    return env, setup, ckpt, K


def _rounding_note(cfg: Config) -> None:
    """Say once, before the compile, when the step budget is not a whole number of updates
    (after the setup's checks: a bad plugin option stays the run's only line)."""
    batch = cfg.env.num_envs * cfg.algo.num_steps
    updates = cfg.algo.total_timesteps // batch
    if updates * batch != cfg.algo.total_timesteps and not cfg.run.resume:
        status.say(f"note: algo.total_timesteps={cfg.algo.total_timesteps:,} is {updates} updates of {batch} "
                   f"steps (env.num_envs x algo.num_steps): training {updates * batch:,} steps")


def _train_fused(cfg: Config, run_dir, resuming: bool, t_start: float) -> RunSummary:
    with status.showing(f"making {cfg.env.id} and compiling its training program", cfg.run.progress):
        env, setup, ckpt, K = _fused_parts(cfg, run_dir, resuming)
        _rounding_note(cfg)
        # in the helper thread: a Ctrl-C during a long compile is answered at once
        runner, compiled, compile_s = interrupt.wait_for(_start_and_compile, setup, env, ckpt, cfg, resuming, K)
    start = int(runner.update)
    log_dir = distributed.own_dir(run_dir)
    log_dir.mkdir(exist_ok=True)
    history = truncate_records(log_dir / METRICS_FILE, start)
    # opening the logs (and importing their writers) is set-up, kept off the train clock
    logger, tracker = open_logs(cfg, log_dir, setup.derived.num_updates * setup.derived.batch_size,
                                start * setup.derived.batch_size, history)
    t1, saving = time.perf_counter(), ckpt.seconds
    try:
        with _profiling(cfg.run.profile_dir):
            runner, records = run_chunks(compiled, runner, ckpt, chunk_logger(logger, setup.derived), setup, K, start)
        logger.finish()
    finally:
        logger.close()
        ckpt.close()
    t2 = time.perf_counter()
    saving = ckpt.seconds - saving
    times = {"compile": compile_s, "checkpoint": saving, "train": t2 - t1 - saving,
             "wall": time.perf_counter() - t_start}
    summary = summary_of(cfg, setup, runner, history + records, times, start)
    finish_run(log_dir, summary, tracker)
    return summary


__all__ = ["train", "prepare_run", "enable_compile_cache", "compile_cache_dir", "params_digest",
           "peak_rss_mb", "default_run_dir", "read_records", "NoLegalAction"]  # the CLI takes the error from here

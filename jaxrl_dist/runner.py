"""A single-process training run: fused chunks, logging, checkpoints, summary.

`train(cfg)` makes the env and the fused trainer, compiles one chunk of `K`
updates ahead of time (so compile time is measured apart and the loop never
recompiles), then calls that executable until the run is done, logging and
checkpointing between chunks. The run directory gets `config.yaml`,
`metrics.jsonl` (one record per update), `tensorboard/`, `checkpoints/` and
`summary.json`.

Step counts: `env_steps` counts steps per seed (like `algo.total_timesteps`);
`total_env_steps` and `sps` count all seeds' envs together (throughput).
Times and `sps` describe this process; for a resumed run, the resumed part.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import jax
import numpy as np

from jaxrl_dist import checkpoint, fused
from jaxrl_dist.config import Config, ConfigError, to_dict
from jaxrl_dist.envs import make_env
from jaxrl_dist.logger import (MetricsLogger, chunk_records, final_returns, read_records,
                               summary_table, truncate_records)

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
# low enough that a small train chunk is cached too; tiny eager ops stay out
CACHE_MIN_COMPILE_SECS = 0.1


def default_run_dir(now: Optional[datetime.datetime] = None) -> Path:
    """`outputs/YYYY-MM-DD/HH-MM-SS` like Hydra's, with a suffix if taken."""
    now = now or datetime.datetime.now()
    base = Path("outputs") / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


def compile_cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "jaxrl-dist" / "xla"


def enable_compile_cache(path: Optional[Path] = None) -> Path:
    """Turn on JAX's persistent compilation cache so later runs skip most of the compile."""
    from jax.experimental.compilation_cache import compilation_cache

    path = Path(path or compile_cache_dir())
    path.mkdir(parents=True, exist_ok=True)
    if jax.config.jax_compilation_cache_dir != str(path):
        jax.config.update("jax_compilation_cache_dir", str(path))
        # the cache binds its directory on first use; rebind if it was used before
        compilation_cache.reset_cache()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_SECS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # -1: no size floor
    return path


def params_digest(params) -> str:
    """sha256 of the msgpack bytes of numpy params: equal digests, equal weights."""
    from flax import serialization

    host = jax.tree.map(np.asarray, jax.device_get(params))
    return hashlib.sha256(serialization.to_bytes(host)).hexdigest()


def peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def _has_checkpoints(run_dir: Path) -> bool:
    ckpt = run_dir / checkpoint.CHECKPOINT_SUBDIR
    return ckpt.is_dir() and any(ckpt.iterdir())


def prepare_run(cfg: Config, run_dir=None) -> tuple:
    """Resolve the run directory and, for `run.resume`, the saved config.

    A resumed run takes its directory's `config.yaml`; only `run.progress` and
    `run.compile_cache` (which cannot change results) come from `cfg`.
    Returns `(cfg, run_dir, resuming)`.
    """
    if cfg.run.resume:
        run_dir = Path(cfg.run.resume)
        saved = checkpoint.load_run_config(run_dir)
        run = dataclasses.replace(saved.run, dir=str(run_dir), resume=str(run_dir),
                                  progress=cfg.run.progress, compile_cache=cfg.run.compile_cache)
        return dataclasses.replace(saved, run=run), run_dir, True
    run_dir = Path(run_dir or cfg.run.dir or default_run_dir())
    if _has_checkpoints(run_dir):
        raise ConfigError(f"run.dir: {run_dir} already holds a run; continue it with "
                          f"run.resume={run_dir} or pick another run.dir")
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=str(run_dir))), run_dir, False


def _init_runner(setup, env, seed: int):
    """`fused.init_runner`, as one jitted call where the env is pure JAX.

    Run eagerly it dispatches (and compiles) op by op, seconds on a small CPU;
    one jit is faster and lands in the compilation cache. envpool resets on
    the host, so it stays eager there.
    """
    if checkpoint.host_env_state(env.spec):
        return fused.init_runner(setup, env, seed)
    return jax.jit(functools.partial(fused.init_runner, setup, env, seed))()


def _start_runner(setup, env, ckpt, cfg: Config, resuming: bool):
    """A fresh runner, or the latest checkpoint of a resumed run (fresh if it has none)."""
    runner = _init_runner(setup, env, cfg.seed)
    if resuming and ckpt.latest_step() is not None:
        runner = checkpoint.resume_runner(ckpt.restore(runner), runner, env.spec)
    return runner


def _compile_chunk(setup, env, K: int, runner_like):
    """AOT-compile the chunk for `runner_like`'s shapes; returns `(executable, seconds)`."""
    t0 = time.perf_counter()
    compiled = fused.make_train_chunk(setup, env, K).lower(runner_like).compile()
    return compiled, time.perf_counter() - t0


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
        return (runner, *_compile_chunk(setup, env, K, runner))
    shapes = jax.eval_shape(functools.partial(fused.init_runner, setup, env, cfg.seed))
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(_compile_chunk, setup, env, K, shapes)
        runner = _start_runner(setup, env, ckpt, cfg, resuming)
        compiled, seconds = future.result()
    return runner, compiled, seconds


def _run_chunks(compiled, runner, ckpt, logger, setup, K: int, start: int):
    """Call the compiled chunk until the last update; returns `(runner, records)`.

    Chunks are pipelined: chunk `c + 1` is dispatched before chunk `c`'s
    metrics are fetched and logged, so host-side logging overlaps device work.
    A checkpoint waits for its chunk (the next call donates the state).
    """
    cfg, derived = setup.cfg, setup.derived
    steps_per_chunk = K * derived.batch_size * cfg.num_seeds
    every = cfg.run.checkpoint_every
    records, pending, t_ready = [], None, time.perf_counter()

    def drain(item):
        nonlocal t_ready
        c, metrics = item
        metrics = jax.device_get(metrics)  # blocks until chunk c is done
        now = time.perf_counter()
        chunk = chunk_records(metrics, c * K + 1, derived.batch_size, steps_per_chunk / (now - t_ready))
        t_ready = now
        logger.log(chunk)
        records.extend(chunk)

    for c in range(start // K, derived.num_updates // K):
        runner, metrics = compiled(runner)
        if pending is not None:
            drain(pending)
        pending = (c, metrics)
        if every and ((c + 1) * K) % every == 0:
            drain(pending)
            pending = None
            ckpt.save(runner)
    if pending is not None:
        drain(pending)
    ckpt.save(runner)  # the end of the run (no-op if just saved)
    return runner, records


def _summary(cfg, setup, runner, records, times: dict, start: int) -> dict:
    d = setup.derived
    final, per_seed = final_returns(records, d.num_updates)
    done = (d.num_updates - start) * d.batch_size * cfg.num_seeds
    return {
        "env_id": cfg.env.id,
        "final_return": final,
        "returns_per_seed": per_seed,
        "env_steps": d.num_updates * d.batch_size,
        "total_env_steps": d.num_updates * d.batch_size * cfg.num_seeds,
        "num_updates": d.num_updates,
        "num_seeds": cfg.num_seeds,
        "wall_seconds": times["wall"],
        "compile_seconds": times["compile"],
        "train_seconds": times["train"],
        "sps": done / times["train"] if times["train"] > 0 else None,
        "params_sha256": params_digest(runner.train.params),
        "peak_rss_mb": peak_rss_mb(),
        "resumed_at_update": start if cfg.run.resume else None,
        "run_dir": str(cfg.run.dir),
    }


def train(cfg: Config, run_dir=None) -> dict:
    """Train `cfg` (or continue `cfg.run.resume`) and return the run summary.

    The run directory is `run_dir`, else `cfg.run.dir`, else a dated one
    under `outputs/`. Raises `ConfigError`/`EnvMakeError` before compiling.
    """
    t_start = time.perf_counter()
    cfg, run_dir, resuming = prepare_run(cfg, run_dir)
    if cfg.run.compile_cache:
        enable_compile_cache()
    if cfg.trainer == "async":
        from jaxrl_dist.asynchronous import train_async

        return train_async(cfg, run_dir, resuming, t_start)
    if cfg.backend.name != "fused":
        from jaxrl_dist.rounds import train_rounds

        return train_rounds(cfg, run_dir, resuming, t_start)
    env = make_env(cfg.env.id, cfg.env.num_envs * cfg.num_seeds, cfg.env.suite, cfg.seed,
                   cfg.env.num_threads, cfg.env.kwargs)
    setup = fused.make_setup(cfg, env.spec)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resuming:
        checkpoint.save_run_config(run_dir, to_dict(cfg))
    ckpt = checkpoint.Checkpointer(run_dir)
    K = fused.chunk_size(setup.derived.num_updates, cfg.run.log_chunks, cfg.run.checkpoint_every,
                         setup.loop_free)
    runner, compiled, compile_s = _start_and_compile(setup, env, ckpt, cfg, resuming, K)
    start = int(runner.update)
    history = truncate_records(run_dir / METRICS_FILE, start)
    t1 = time.perf_counter()
    logger = MetricsLogger(run_dir, setup.derived.num_updates * setup.derived.batch_size,
                           start * setup.derived.batch_size, cfg.run.tensorboard, cfg.run.progress)
    try:
        runner, records = _run_chunks(compiled, runner, ckpt, logger, setup, K, start)
    finally:
        logger.close()
        ckpt.close()
    t2 = time.perf_counter()
    times = {"compile": compile_s, "train": t2 - t1, "wall": time.perf_counter() - t_start}
    summary = _summary(cfg, setup, runner, history + records, times, start)
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    _print_summary(summary)
    return summary


def _print_summary(summary: dict) -> None:
    from rich.console import Console

    Console().print(summary_table(summary))


__all__ = ["train", "prepare_run", "enable_compile_cache", "compile_cache_dir", "params_digest",
           "peak_rss_mb", "default_run_dir", "read_records"]

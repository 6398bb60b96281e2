"""`jaxrl-dist calibrate`: a latency profile (`profile.Profile`) measured on a real backend.

A few rounds of the round trainer (`trainers.sync.RoundTrainer`: the configured
backend, a fixed shard count) run while `Recorder` keeps each round's
`RoundResult`, whose per-shard timings the round records only summarise.
Every round but the first (which compiles) is a warm round. From them:

- `step_s`: a shard's compute seconds (`trainers.accounting.shard_seconds`) / `algo.num_steps`,
  median over the warm rounds' shards. The local backend runs a round's gymnax
  shards as one jitted batch, so there each round runs one shard: a shard alone,
  as it would run on an instance of its own.
- `bytes_per_shard`: request and response bytes per shard (`trainers.accounting.moved_bytes`: the
  local backend, which moves none, counts what a remote one would move
  uncompressed). `transfer_s_per_byte`: the backend's `transfer_s` over those
  bytes, median; 0 for the local backend.
- `learn_s_fixed`, `learn_s_per_sample`: least squares over the jitted learner's
  warm median seconds at K = 1, 2, 4, ... shards (the last round's trajectory
  tiled to K), samples = K * envs_per_shard * num_steps.
- `jitter_cv`: lognormal stragglers, the std of log(shard seconds / its round's
  median) over the warm rounds whose shards ran apart; where none did (one
  shard, or one batch, per round) each round's shard against the rounds' median.
- `cold_start_s`: a fresh worker to its first finished shard: the local backend's
  first round (its compile), a `jaxrl-dist serve` spawned on a loopback port for
  http without `backend.urls` (process start, imports, compile), Ray actor
  creation on a runtime of this host. Workers already running (`backend.urls`)
  or stamping another host's clock (`backend.address`) leave it None. This
  machine's start-up, not a cloud platform's: the cost presets keep their own
  `cold_start_s`.

Nothing here uses the persistent compile cache, so first rounds compile in full.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from jaxrl_dist.core import rng
from jaxrl_dist.config import Config, ConfigError, RunConfig, SchedulerConfig
from jaxrl_dist.scheduling.profile import Profile
from jaxrl_dist.envs import resolve_suite
from jaxrl_dist.platform import cpu_model
from jaxrl_dist.serve.local import LocalServer, free_port
from jaxrl_dist.trainers.logger import MetricsLogger
from jaxrl_dist.trainers.sync import RoundTrainer
from jaxrl_dist.trainers.accounting import moved_bytes, tree_bytes
from jaxrl_dist.trainers.accounting import shard_seconds
from jaxrl_dist.backends import BACKENDS, capabilities


class Options(NamedTuple):
    """How much to measure (the `jaxrl-dist calibrate` flags)."""

    rounds: int = 5  # rounds of the round trainer; the first compiles
    shards: int = 4  # shards per round (1 on the local backend's gymnax batches)
    learner_shards: int = 8  # the learner is timed at K = 1, 2, 4, ... up to this
    repeats: int = 3  # warm learner calls per K; their median counts


def check(cfg: Config, opts: Options) -> None:
    """`ConfigError` naming the flag or key calibrate cannot work with."""
    if cfg.trainer.name != "sync":
        raise ConfigError("trainer: calibrate measures rounds of shards; pass trainer=sync with "
                          "backend=local, backend=ray or backend=http")
    least = {"--rounds": (opts.rounds, 2, " (the first round compiles)"), "--shards": (opts.shards, 1, ""),
             "--learner-shards": (opts.learner_shards, 2, " (a line needs two batch sizes)"),
             "--repeats": (opts.repeats, 1, "")}
    for flag, (value, low, why) in least.items():
        if value < low:
            raise ConfigError(f"{flag} must be at least {low}{why}, got {value}")


class LoopbackServe:
    """The http backend's function when `backend.urls` names none: a port and a fresh
    token chosen now (they go into the config), `jaxrl-dist serve` started by `start()`,
    so that what its cold start measures is the worker's start-up alone."""

    def __init__(self):
        self.port, self.token, self.server = free_port(), secrets.token_hex(16), None
        self.url = f"http://127.0.0.1:{self.port}"

    def overrides(self) -> list:
        return [f"backend.urls=['{self.url}']", f"backend.token='{self.token}'"]  # quoted: a string

    def start(self, env_id: str) -> float:
        """Start the process; returns when it was started (`time.time()`)."""
        started = time.time()
        self.server = LocalServer(f"serve.allowed_envs=['{env_id}']", token=self.token, port=self.port)
        return started

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


class Measured(NamedTuple):
    """One round as the backend answered it."""

    called: float  # time.time() when the trainer handed the round to the backend
    result: Any  # backends.RoundResult


class Recorder:
    """The trainer's backend, keeping every round's result and when it was asked for."""

    def __init__(self, inner):
        self.inner, self.name, self.rounds = inner, inner.name, []

    def start(self, job) -> None:
        self.inner.start(job)

    def run_round(self, round_: int, params, tasks, table):
        called = time.time()
        result = self.inner.run_round(round_, params, tasks, table)
        self.rounds.append(Measured(called, result))
        return result

    def close(self) -> None:
        self.inner.close()


def batched(cfg: Config) -> bool:
    """Whether the backend runs a round's shards as one batch (local, gymnax)."""
    batched = capabilities(BACKENDS.get(cfg.backend.name)).batched
    return batched and resolve_suite(cfg.env.id, cfg.env.suite) != "envpool"


def calibration_config(cfg: Config, opts: Options, run_dir: Path) -> Config:
    """`cfg` for `opts.rounds` rounds of a fixed shard count, writing no logs but `run_dir`'s."""
    n = 1 if batched(cfg) else opts.shards
    steps = opts.rounds * n * cfg.backend.envs_per_shard * cfg.algo.num_steps
    return dataclasses.replace(
        cfg, backend=dataclasses.replace(cfg.backend, max_shards=max(n, opts.learner_shards)),
        scheduler=SchedulerConfig(name="fixed", num_shards=n),
        algo=dataclasses.replace(cfg.algo, total_timesteps=steps),
        run=RunConfig(dir=str(run_dir), compile_cache=False, progress=False, tensorboard=False,
                      max_rounds=opts.rounds))


def run_rounds(cfg: Config, run_dir: Path, serve: Optional[LoopbackServe]):
    """The round trainer's run under `Recorder`; `(trainer, rounds, when the worker started)`
    (None: the first round's call, the worker being the backend's own)."""

    trainer = RoundTrainer(cfg, run_dir, False)
    recorder = trainer.backend = Recorder(trainer.backend)
    logger = MetricsLogger(run_dir, cfg.algo.total_timesteps, 0, False, False)
    try:
        origin = serve.start(cfg.env.id) if serve else None
        trainer.run(logger, [])
    finally:
        logger.close()
        trainer.ckpt.close()
        if serve:
            serve.stop()
    return trainer, recorder.rounds, origin


def shard_steps(rounds: list, num_steps: int) -> list:
    """Seconds per env step of each warm shard."""
    return [s / num_steps for m in rounds[1:] for s in shard_seconds(m.result.shards)]


def _ran_apart(shards) -> bool:
    spans = {(s.worker, s.timings.started, s.timings.finished) for s in shards}
    return len(shards) > 1 and len(spans) == len(shards)


def jitter(rounds: list) -> tuple:
    """`(jitter_cv, samples, method)` over the warm rounds (see the module docstring)."""
    apart = [np.asarray(shard_seconds(m.result.shards)) for m in rounds[1:] if _ran_apart(m.result.shards)]
    if apart:
        logs = np.concatenate([np.log(d / np.median(d)) for d in apart])
        return float(np.std(logs)), int(logs.size), "within rounds"
    d = np.asarray([np.median(shard_seconds(m.result.shards)) for m in rounds[1:]])
    return float(np.std(np.log(d / np.median(d)))), int(d.size), "across rounds"


def transfer(rounds: list, param_bytes: int) -> tuple:
    """`(bytes per shard, seconds per byte, rounds)` over the warm rounds."""
    warm = [m.result for m in rounds[1:]]
    moved = [moved_bytes(r, len(r.shards), param_bytes) for r in warm]
    per_shard = statistics.median(b / len(r.shards) for b, r in zip(moved, warm))
    per_byte = statistics.median(r.stats.transfer_s / b for b, r in zip(moved, warm))
    return per_shard, per_byte, len(warm)


def cold_start(rounds: list, origin: Optional[float]) -> float:
    """Seconds from `origin` (default: the first round's call) to the first finished shard."""
    first = rounds[0]
    start = first.called if origin is None else origin
    return min(s.timings.finished for s in first.result.shards) - start


def batch_sizes(most: int) -> list:
    """K = 1, 2, 4, ... and `most`: the shapes the round trainer pads rounds to (`bucket`)."""
    ks, k = [], 1
    while k < most:
        ks.append(k)
        k *= 2
    return ks + [most]


def learner_times(learner, train, result, ks: list, repeats: int) -> list:
    """Median warm seconds of the jitted learner update at each K, on `result`'s first
    shard tiled to K shards (real data: the same work per sample as a round's)."""
    times = []
    for k in ks:
        traj = jax.tree.map(lambda x: np.repeat(np.asarray(x)[:, :1], k, axis=1), result.traj)
        boot = np.repeat(np.asarray(result.bootstrap)[:1], k, axis=0)
        seconds = []
        for i in range(repeats + 1):  # call 0 compiles
            t0 = time.perf_counter()
            train, metrics = learner.update(train, traj, boot, k, rng.key(i))
            jax.block_until_ready((train, metrics))
            seconds.append(time.perf_counter() - t0)
        times.append(statistics.median(seconds[1:]))
    return times


def fit_line(x, y) -> tuple:
    """Least squares `y = a + b x` with `a, b >= 0` (no timing has a negative part):
    where the free fit gives a negative term, that term is 0 and the other refit."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    b, a = np.polyfit(x, y, 1)
    if a < 0:
        return 0.0, float(x @ y / (x @ x))
    if b < 0:
        return float(y.mean()), 0.0
    return float(a), float(b)


def machine() -> dict:
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "jax_backend": jax.default_backend(),
            "load_avg_1m": os.getloadavg()[0]}


def same_clock(cfg: Config, serve: Optional[LoopbackServe]) -> bool:
    """Whether the workers stamp their shards with this machine's clock, so a cold start
    can be read off against it (other hosts' clocks are not this one's)."""
    b = cfg.backend
    in_process = capabilities(BACKENDS.get(b.name)).in_process
    return in_process or serve is not None or (b.name == "ray" and not b.address)


def calibrate(cfg: Config, opts: Options = Options(), serve: Optional[LoopbackServe] = None,
              log=print) -> tuple:
    """Measure `cfg`'s env on `cfg`'s backend; returns `(Profile, meta)`. `serve`: the
    loopback function `cfg.backend.urls` points at, started here (http only)."""
    check(cfg, opts)
    before = machine()
    with tempfile.TemporaryDirectory(prefix="jaxrl-dist-calibrate-") as tmp:
        run_cfg = calibration_config(cfg, opts, Path(tmp))
        log(f"calibrating {cfg.env.id} on {cfg.backend.name}: {opts.rounds} rounds of "
            f"{run_cfg.scheduler.num_shards} shard(s)")
        trainer, rounds, origin = run_rounds(run_cfg, Path(tmp), serve)
    ks = batch_sizes(opts.learner_shards)
    log(f"timing the learner at K = {', '.join(map(str, ks))} shards")
    learn = learner_times(trainer.learner, trainer.state.train, rounds[-1].result, ks, opts.repeats)
    samples = [k * trainer.learner.steps_per_shard for k in ks]
    fixed, per_sample = fit_line(samples, learn)
    param_bytes = tree_bytes(trainer.state.train.params)
    per_shard, per_byte, moves = transfer(rounds, param_bytes)
    steps = shard_steps(rounds, cfg.algo.num_steps)
    cv, jitter_n, method = jitter(rounds)
    start = cold_start(rounds, origin) if same_clock(cfg, serve) else None
    profile = Profile(statistics.median(steps), fixed, per_sample, per_shard, cv, per_byte, start)
    meta = describe(cfg, trainer, before, rounds)
    meta["samples"] = {"step_s": len(steps), "bytes_per_shard": moves, "learn": len(ks) * opts.repeats,
                       "jitter_cv": jitter_n, "cold_start_s": int(start is not None)}
    meta["fits"] = {"learn": {"shards": ks, "samples": samples, "measured_s": learn,
                              "fit_s": [fixed + per_sample * s for s in samples]},
                    "jitter": {"distribution": "lognormal", "method": method}}
    meta["notes"] = notes(cfg, start is not None, method)
    return profile, meta


def describe(cfg: Config, trainer, before: dict, rounds: list) -> dict:
    """What was measured, where and when (the profile's `meta`, less the fits)."""
    return {"env_id": cfg.env.id, "suite": trainer.spec.suite, "backend": cfg.backend.name,
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": {**before, "load_avg_1m_after": os.getloadavg()[0]},
            "jax_version": jax.__version__,
            "task": {"envs_per_shard": cfg.backend.envs_per_shard,  # a plugin network has no `torso`
                     "network": getattr(trainer.program.network, "torso", cfg.algo.network),
                     "algo": dataclasses.asdict(cfg.algo)},
            "rounds": len(rounds), "shards_per_round": len(rounds[0].result.shards)}


def notes(cfg: Config, start_measured: bool, method: str) -> list:
    """What the numbers mean where a reader could take them for something else."""
    out = ["cold_start_s is this machine's worker start-up (no compile cache), not a cloud "
           "platform's: the cost presets keep their own cold_start_s",
           "transfer_s_per_byte is informational; the modeled clock prices bytes with the cost "
           "preset's transfer_bytes_per_s"]
    if cfg.backend.name == "local":
        out.append("local backend: nothing moves; bytes_per_shard is the uncompressed wire payload "
                   "(params out, trajectory back) and transfer was measured as 0")
    if not start_measured:
        out.append("workers already running or on other hosts: cold start not measured")
    if method == "across rounds":
        out.append("one shard (or one batch) per round: jitter_cv is the spread across rounds")
    return out


def summary(profile: Profile, meta: dict) -> list:
    """A few lines for the terminal."""
    m, learn, s = meta["machine"], meta["fits"]["learn"], meta["samples"]
    worst = max(abs(f - t) / t for f, t in zip(learn["fit_s"], learn["measured_s"]))
    start = "not measured" if profile.cold_start_s is None else f"{profile.cold_start_s:.2f} s (this machine)"
    return [f"{meta['env_id']} on {meta['backend']}: {m['cpu_model']}, {m['cpu_count']} cores, "
            f"load {m['load_avg_1m']:.1f}; {meta['rounds']} rounds x {meta['shards_per_round']} shard(s)",
            f"  step_s              {profile.step_s:.3g} s per step ({s['step_s']} warm shards)",
            f"  bytes_per_shard     {profile.bytes_per_shard:.4g}, transfer {profile.transfer_s_per_byte:.3g} s/byte",
            f"  learner             {profile.learn_s_fixed:.3g} s + {profile.learn_s_per_sample:.3g} s x samples "
            f"(K = {learn['shards']}, fit within {100 * worst:.0f}%)",
            f"  jitter_cv           {profile.jitter_cv:.3g} (lognormal, {s['jitter_cv']} samples, "
            f"{meta['fits']['jitter']['method']})",
            f"  cold_start_s        {start}"] + _weak(worst, s["jitter_cv"])


WEAK_FIT = 0.2  # the learner line's worst miss above which a profile is said to be rough


def _weak(worst: float, jitter_samples: int) -> list:
    """Notes for a profile whose figures rest on too little: the file is written all
    the same (a rough profile still models a run better than the defaults)."""
    out = []
    if worst > WEAK_FIT:
        out.append(f"note: the learner line misses a measured time by {100 * worst:.0f}%: more --repeats or "
                   "an idle machine tightens it")
    if jitter_samples < 4:
        out.append(f"note: jitter_cv rests on {jitter_samples} sample(s): more --rounds measure it")
    return out

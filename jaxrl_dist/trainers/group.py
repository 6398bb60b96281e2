"""Several fused runs as one program: the jobs of a sweep that differ only in traced
coefficients (`config.TRACED`) and seeds.

Each job's seeds become members of one fused runner: its state is built exactly as the
job alone builds it (its seed, its `num_seeds`, its coefficients in `TrainState.hyper`),
and the members' states are joined along the seed axis, so member `j` trains as its
job would alone (the rollout draws each seed's randomness from that seed's key; the
update is vmapped per seed). Each job still gets its own run directory: `config.yaml`,
`metrics.jsonl`, TensorBoard, W&B if on, checkpoints of its own slice of the state
(which `run.resume` continues alone) and `summary.json`.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, List, NamedTuple, Optional, Sequence

import jax
import numpy as np

from jaxrl_dist.config import Config, flat, key_kind, to_dict
from jaxrl_dist.core import ppo
from jaxrl_dist.envs import env_of, resolve_suite
from jaxrl_dist.trainers import checkpoint, fused, interrupt
from jaxrl_dist.trainers.logger import chunk_records
from jaxrl_dist.trainers.progress import RecentReturn, make_display
from jaxrl_dist.trainers.rundir import finish_run, open_logs, prepare_run
from jaxrl_dist.trainers.runner import compile_beside, placed, run_chunks, summary_of
from jaxrl_dist.trainers.summary import Group, RunSummary


def shaping(cfg: Config) -> tuple:
    """What sets `cfg`'s program: its shaping keys and their values (jobs with equal
    ones can share a program)."""
    return tuple(sorted((k, repr(v)) for k, v in flat(to_dict(cfg)).items() if key_kind(k) == "shaping"))


def alone_because(cfg: Config) -> Optional[str]:
    """Why `cfg` runs as a job of its own rather than in a group (None: it can join one)."""
    if cfg.run.resume:  # first: the config composed beside run.resume is not the run's own
        return "run.resume continues one run"
    if cfg.trainer.name != "fused":
        return f"trainer={cfg.trainer.name} trains in rounds"
    if str(cfg.trainer.devices) != "1" or cfg.trainer.distributed.num_processes > 1:
        return "a run over a device mesh or several processes"
    if resolve_suite(cfg.env.id, cfg.env.suite) == "envpool":
        return "envpool steps its envs on the host"
    return None


def differing(cfgs: Sequence[Config]) -> List[str]:
    """The shaping keys whose values differ between `cfgs`."""
    tables = [dict(shaping(c)) for c in cfgs]
    keys = sorted(set().union(*tables))
    return [k for k in keys if len({t.get(k) for t in tables}) > 1]


def plan(cfgs: Sequence[Config], max_members: int) -> tuple:
    """`(groups, alone)`: lists of job indices run as one program each (whole jobs, at
    most `max_members` seeds a program unless one job has more), and `{index: why}` of
    the jobs that run one after another on their own."""
    alone, by_shape = {}, {}
    for i, cfg in enumerate(cfgs):
        why = alone_because(cfg)
        if why is None:
            by_shape.setdefault(shaping(cfg), []).append(i)
        else:
            alone[i] = why
    groups = []
    for members in by_shape.values():
        if len(members) == 1:
            alone[members[0]] = "alone in its group"
            continue
        part, size = [], 0
        for i in members:
            if part and size + cfgs[i].num_seeds > max_members:
                groups.append(part)
                part, size = [], 0
            part.append(i)
            size += cfgs[i].num_seeds
        groups.append(part)
    return groups, alone


class Member(NamedTuple):
    """One job inside a group: its config and where its seeds sit in the group's axis."""

    cfg: Config
    run_dir: Path
    lo: int  # first seed
    hi: int  # past its last seed


def member_slice(runner, m: Member, envs_per_seed: int):
    """`m`'s part of the group's runner state: the state its job alone would have. The
    flat env batch (`[N]`, seed-major) is cut by env, every other leaf by seed."""
    by_seed = lambda x: x[m.lo:m.hi] if x.ndim else x  # noqa: E731
    by_env = lambda x: x[m.lo * envs_per_seed:m.hi * envs_per_seed]  # noqa: E731
    actor = runner.actor
    env_leaves = ("env_state", "obs", "episodes", "carry", "reset", "mask")  # `[N, ...]` (see ActorState)
    actor = actor._replace(norm=jax.tree.map(by_seed, actor.norm),
                           **{k: jax.tree.map(by_env, getattr(actor, k)) for k in env_leaves})
    return runner._replace(train=jax.tree.map(by_seed, runner.train), actor=actor, key=by_seed(runner.key))


def _join(parts: list):
    """The members' runner states joined along the seed (and flat env) axis, on the host
    (a device concatenate of 64 parts is a compile per leaf shape)."""
    return jax.tree.map(lambda *xs: np.concatenate(xs) if xs[0].ndim else xs[0], *jax.device_get(parts))


def _member_setup(setup: fused.Setup, cfg: Config) -> fused.Setup:
    return setup._replace(cfg=cfg, rollout_opts=setup.rollout_opts._replace(num_seeds=cfg.num_seeds))


def _init_members(setup: fused.Setup, members: Sequence[Member]):
    """Each member's fresh state, built as its job alone builds it, joined. One jitted
    init per distinct seed count, its seed and coefficients arguments."""
    inits, parts = {}, []
    for m in members:
        n = m.cfg.num_seeds
        if n not in inits:
            c = setup.cfg
            env = env_of(c.env, c.env.num_envs * n, c.seed)
            mine = _member_setup(setup, dataclasses.replace(c, num_seeds=n))
            inits[n] = jax.jit(lambda seed, hyper, mine=mine, env=env: fused.init_runner(mine, env, seed, hyper))
        parts.append(inits[n](m.cfg.seed, ppo.hyper(m.cfg.algo)))
    return _join(parts)


class _Checkpoints:
    """Each member's checkpointer, saving its own slice (the `Checkpointer` interface
    `run_chunks` uses). The state is copied to the host at once (the next chunk reuses
    its buffers); the members' writes (~0.1 s of orbax each) go on in a thread, beside
    the next chunk or the jobs' finishing, and `close` waits for them."""

    def __init__(self, members: Sequence[Member], envs_per_seed: int):
        self._members, self._envs = members, envs_per_seed
        c = members[0].cfg.run
        self._all = [checkpoint.Checkpointer(m.run_dir, c.checkpoint_every, c.checkpoint_every_s) for m in members]
        self._writer, self._pending = ThreadPoolExecutor(max_workers=1), []
        self.seconds = 0.0  # what the training waited for: the copies to the host

    def restart_clock(self) -> None:
        for c in self._all:
            c.restart_clock()

    def due(self, count: int) -> bool:
        return self._all[0].due(count)

    def save(self, runner) -> None:
        t0 = time.perf_counter()
        host = jax.device_get(runner)  # one transfer; a slice of a device array is a dispatch per leaf
        self._pending.append(self._writer.submit(self._write, host))
        self.seconds += time.perf_counter() - t0

    def _write(self, host) -> None:
        for m, c in zip(self._members, self._all):
            c.save(member_slice(host, m, self._envs))

    def close(self) -> None:
        try:
            for done in self._pending:
                done.result()
        finally:
            self._writer.shutdown()
            for c in self._all:
                c.close()


class _Logs:
    """Each member's logs (`metrics.jsonl`, TensorBoard, W&B) and the group's one bar:
    steps, members, the best and the median recent return of its jobs."""

    def __init__(self, members: Sequence[Member], derived, label: str, progress: bool):
        self.members, self._derived = members, derived
        total = derived.num_updates * derived.batch_size
        self.opened = [open_logs(m.cfg, m.run_dir, total, 0) for m in members]
        self.records: List[list] = [[] for _ in members]
        self._recent = [RecentReturn() for _ in members]
        self._display = make_display(total, 0, label) if progress else None
        self._total = total

    def __call__(self, metrics, first_update: int, sps: float) -> list:
        S = self.members[-1].hi
        for i, (m, (logger, _)) in enumerate(zip(self.members, self.opened)):
            part = jax.tree.map(lambda x: x[:, m.lo:m.hi], metrics)
            chunk = chunk_records(part, first_update, self._derived.batch_size, sps * (m.hi - m.lo) / S)
            logger.log(chunk)
            self.records[i].extend(chunk)
            self._recent[i].add(chunk)
        if self._display is not None:
            returns = [x for x in (r.mean() for r in self._recent) if x is not None]
            best = f"(median of {len(returns)}), best {max(returns):.1f}" if returns else ""
            self._display.show(self.records[0][-1].env_steps, self._total,
                               statistics.median(returns) if returns else None, sps, best)
        return []

    def finish(self) -> None:
        for logger, _ in self.opened:
            logger.finish()

    def close(self) -> None:
        for logger, _ in self.opened:
            logger.close()
        if self._display is not None:
            self._display.close()


def train_group(cfgs: Sequence[Config], run_dirs: Sequence, label: str = "group",
                say: Callable[[str], None] = print, then: Optional[Callable[[List[dict]], None]] = None) -> List[dict]:
    """Train the jobs `cfgs` (equal shaping keys; fused) as one program, each writing its
    own `run_dirs[i]`; their summaries, in order (`then(summaries)` runs first, while the
    last checkpoints are written). Ctrl-C checkpoints every member and raises
    `interrupt.Interrupted` naming the first run dir."""
    t_start = time.perf_counter()
    members, lo = [], 0
    for cfg, run_dir in zip(cfgs, run_dirs):
        cfg, run_dir, _ = prepare_run(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, progress=False)),
                                      run_dir)
        members.append(Member(cfg, run_dir, lo, lo + cfg.num_seeds))
        lo += cfg.num_seeds
    first = members[0].cfg
    base = dataclasses.replace(first, num_seeds=lo, run=dataclasses.replace(first.run, dir=str(members[0].run_dir)))
    env = env_of(base.env, base.env.num_envs * lo, base.seed)
    setup = fused.make_setup(base, env.spec)
    K = fused.chunk_size(setup.derived.num_updates, base.run.log_chunks, base.run.checkpoint_every, setup.loop_free)
    with interrupt.stop_on_sigint("chunk"):
        # the chunk compiles from the group's shapes while the members are initialised
        runner, compiled, compile_s = interrupt.wait_for(compile_beside, setup, env, K,
                                                         lambda: _init_members(setup, members))
        runner = placed(compiled, runner)
        say(f"{label}: {len(members)} jobs, {lo} members, one program (compiled in {compile_s:.1f} s)")
        logs = _Logs(members, setup.derived, label, any(c.run.progress for c in cfgs))
        ckpt = _Checkpoints(members, base.env.num_envs)
        t1 = time.perf_counter()
        try:
            try:
                runner, _ = run_chunks(compiled, runner, ckpt, logs, setup, K, 0)
                logs.finish()
            finally:
                logs.close()
            times = {"compile": compile_s, "checkpoint": ckpt.seconds, "train": time.perf_counter() - t1 - ckpt.seconds,
                     "wall": time.perf_counter() - t_start}
            summaries = _summaries(members, logs, setup, jax.device_get(runner), times)
            if then is not None:
                then(summaries)  # the caller's work for each job, while the last checkpoints are written
        finally:
            ckpt.close()
    return summaries


def _summaries(members: Sequence[Member], logs: _Logs, setup: fused.Setup, host, times: dict) -> List[RunSummary]:
    """Each member's `summary.json` (written) and summary; `host` is the group's final state."""
    out = []
    for m, records, (_, tracker) in zip(members, logs.records, logs.opened):
        summary = summary_of(m.cfg, _member_setup(setup, m.cfg), member_slice(host, m, m.cfg.env.num_envs),
                             records, times, 0)
        summary = summary.replace(group=Group(jobs=len(members), members=members[-1].hi, first_member=m.lo))
        finish_run(m.run_dir, summary, tracker, show=False)
        out.append(summary)
    return out

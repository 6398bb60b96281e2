"""Per-update metric records and where they go: JSONL, TensorBoard, the terminal.

The record helpers are pure functions over numpy arrays so the summary can be
recomputed from `metrics.jsonl` alone (which is what makes a resumed run's
summary identical to an uninterrupted one's). TensorBoard and rich are
imported only when switched on; what the terminal shows is `progress`'s.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Optional

import numpy as np

from jaxrl_dist.platform import imports_deferred
from jaxrl_dist.scheduling.records import LOSS_KEYS, Record, fold_startup
from jaxrl_dist.trainers.progress import Progress, RoundBudget

# the learner's episode bookkeeping (`learner.episode_metrics`), logged apart
EPISODE_KEYS = ("episode_return_sum", "episodes", "return_mean")


class NoLegalAction(RuntimeError):
    """The policy had to act where its env allowed no action (`learner.mask_metrics`)."""


def check_legal(metrics: dict, first_update: int, steps_per_update: int = 0) -> None:
    """`NoLegalAction` naming the first update (and its env steps, where given) in which
    a policy acted on an observation with no legal action; `metrics` are `[K, ...]`
    arrays from update `first_update` on, or one update's scalars."""
    stuck = metrics.get("no_legal_actions")
    if stuck is None:
        return
    stuck = np.asarray(stuck, np.float64)
    per_update = stuck.reshape(stuck.shape[0], -1).sum(axis=1) if stuck.ndim else stuck.reshape(1)
    bad = np.flatnonzero(per_update > 0)
    if bad.size:
        u = first_update + int(bad[0])
        steps = f" (env steps {(u - 1) * steps_per_update:,}-{u * steps_per_update:,})" if steps_per_update else ""
        raise NoLegalAction(f"no legal action at {int(per_update[bad[0]])} step(s) the policy acted on in "
                            f"update {u}{steps}: the env's action mask was all false on a live step")


def loss_keys(metrics: dict) -> list:
    """The update's loss metrics, whatever the loss named them (order kept)."""
    return [k for k in metrics if k not in EPISODE_KEYS]


def nan_to_none(x: float) -> Optional[float]:
    """JSON has no NaN; a missing value is `null`."""
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else x


def seed_mean(values) -> Optional[float]:
    """Mean over seeds ignoring NaN (seeds that finished no episode); None if all NaN."""
    values = np.asarray(values, np.float64)
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None


def chunk_records(metrics: dict, first_update: int, steps_per_update: int, sps: float) -> list:
    """One `Record` per update from a (fused) chunk's `[K, S]` metric arrays.

    `first_update` is the 1-based number of the chunk's first update;
    `env_steps` counts steps per seed, like `algo.total_timesteps`. Episode
    sums stay per seed, so final returns can be recomputed from the file. The
    arrays are reduced and turned into Python floats once per chunk, not per
    update (the same numbers: a row's mean is the same reduction either way).
    """
    check_legal(metrics, first_update, steps_per_update)
    returns = _seed_means(metrics["return_mean"])
    losses = {name: np.mean(metrics[name], axis=1).tolist() for name in loss_keys(metrics)}
    # per-seed sums, so final returns can be recomputed from the file
    sums = np.asarray(metrics["episode_return_sum"], np.float64).tolist()
    episodes = np.asarray(metrics["episodes"], np.float64).tolist()
    records = []
    for k, ret in enumerate(returns):
        update = first_update + k
        records.append(Record(update=update, env_steps=update * steps_per_update, ret=ret,
                              losses={name: nan_to_none(losses[name][k]) for name in losses},
                              sps=nan_to_none(sps), episode_return_sum=tuple(sums[k]), episodes=tuple(episodes[k])))
    return records


def _seed_means(values) -> list:
    """`seed_mean` of each row of `[K, S]` values; rows with no NaN in one reduction."""
    values = np.asarray(values, np.float64)
    full = np.isfinite(values).all(axis=1).tolist()
    means = values.mean(axis=1).tolist()
    return [mean if ok else seed_mean(row) for mean, ok, row in zip(means, full, values)]


def final_returns(records: list, num_updates: int, fraction: float = 0.1):
    """Mean return of the episodes completed in the last `fraction` of updates.

    Per seed: sum of episode returns over those updates / number of episodes; a seed
    that ended no episode there (long episodes in a short run) takes the episodes of
    the latest update that ended one, so only a seed that never ended one has none.
    Then averaged over seeds. Returns `(mean or None, [per seed or None])`.
    """
    window = max(1, math.ceil(fraction * num_updates))
    if not records or records[-1].update <= num_updates - window:
        return None, []
    sums = np.asarray([r.episode_return_sum for r in records], np.float64)
    eps = np.asarray([r.episodes for r in records], np.float64)
    last = np.asarray([r.update > num_updates - window for r in records])
    ret, count = sums[last].sum(axis=0), eps[last].sum(axis=0)
    for s in np.flatnonzero(count == 0):
        ended = np.flatnonzero(eps[:, s] > 0)
        if ended.size:
            ret[s], count[s] = sums[ended[-1], s], eps[ended[-1], s]
    per_seed = np.where(count > 0, ret / np.maximum(count, 1.0), np.nan)
    return seed_mean(per_seed), [nan_to_none(x) for x in per_seed]


def read_jsonl(path) -> list:
    """The values of a JSONL file, one a line, blank lines skipped.

    A last line that does not parse is skipped: a run that was killed or crashed while
    writing (or is writing now) leaves one, cut off. A line before the last that does
    not parse is damage, not a cut: `ValueError` naming the file and the line."""
    lines = [(i, line) for i, line in enumerate(Path(path).read_text().splitlines(), 1) if line.strip()]
    out = []
    for n, (i, line) in enumerate(lines, 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):
                break
            raise ValueError(f"{path}:{i}: not a JSON line") from None
    return out


def read_records(path: Path, upto: Optional[int] = None) -> list:
    """Records of `metrics.jsonl` (those with `update <= upto` if given)."""
    if not path.exists():
        return []
    return [r for r in read_jsonl(path) if upto is None or r["update"] <= upto]


def truncate_records(path: Path, upto: int) -> list:
    """Drop records past update `upto` (written after the checkpoint a resume starts
    from); returns the rest as `Record`s."""
    records = read_records(path, upto)
    if records or path.exists():  # a fresh run's file comes with its first records
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return [Record.from_json(r) for r in records]


class MetricsLogger:
    """Appends records to `metrics.jsonl`, TensorBoard and the terminal (`progress`).

    Everything is written in the calling thread, a chunk of records at a time;
    the fused runner calls it while the device runs the next chunk.
    """

    def __init__(self, run_dir: Path, total_steps: int, done_steps: int = 0,
                 tensorboard: bool = True, progress: bool = True, tracker=None, hparams=None, *,
                 history=(), budget: Optional[RoundBudget] = None):
        """`tracker`: a `tracking.WandbTracker` (or None); `hparams`: the flat config that
        TensorBoard's hyperparameter table shows for this run; `history`: a resumed run's
        records (the shown return starts from their episodes); `budget`: a round-based
        run's, whose total steps are known only as its rounds come (`total_steps` ignored)."""
        # opened with the first records: a run refused at its start (a backend's resource
        # check) leaves no empty file behind
        self._path, self._file = run_dir / "metrics.jsonl", None
        self._tracker = tracker
        # purge_step hides events a killed run wrote past its last checkpoint
        self._tb = EventFile(run_dir / "tensorboard", purge_step=done_steps + 1) if tensorboard else None
        if self._tb is not None and hparams:
            self._tb.hparams(hparams)
        self._progress = Progress(total_steps, done_steps, history, budget) if progress else None

    def log(self, records: list) -> None:
        """Write `Record`s: JSON is made here, and only here."""
        if not records:
            return
        lines = [rec.to_json() for rec in records]
        if self._file is None:
            self._file = open(self._path, "a", buffering=1)
        self._file.write("".join(json.dumps(line) + "\n" for line in lines))  # one flush a chunk
        if self._tb is not None:
            self._tb.write(lines)
        if self._tracker is not None:
            self._tracker.log(lines)
        if self._progress is not None:
            self._progress.update(records)

    def finish(self) -> None:
        """The run ended on its own, not on Ctrl-C or an error: the bar's total becomes the
        steps it trained (a round-based run stopped at its target trains fewer)."""
        if self._progress is not None:
            self._progress.finish()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._progress is not None:
            self._progress.close()


# record fields that are bookkeeping, not a quantity over training
_NOT_SCALARS = ("env_steps", "time", "update", "round", "return")


def tb_scalars(rec: dict) -> list:
    """`(tag, value)` of every numeric field of a record's JSON line (a missing value is
    left out): return and throughput under `charts/`, the built-in loss's metrics under
    `losses/`, the rest (a plugin loss's metrics, times, bytes, cost, shards) under `metrics/`."""
    scalars = [("charts/episodic_return", rec["return"])] if rec.get("return") is not None else []
    for name, value in rec.items():
        if name in _NOT_SCALARS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        group = "charts" if name == "sps" else "losses" if name in LOSS_KEYS else "metrics"
        scalars.append((f"{group}/{name}", value))
    return scalars


class EventFile:
    """A TensorBoard event file, written in the calling thread: one event per record,
    holding all of its scalars at the record's `env_steps`.

    tensorboardX's `SummaryWriter.add_scalar` makes an event per scalar and hands
    each to a writer thread through a multiprocessing queue ten events deep, and
    that thread checksums it in pure Python: on a small CartPole run the run
    loop blocked on that queue for a fifth of its time (bench/RESULTS.md). The
    file is tensorboardX's own format and name, with its purge marker; the OS
    sees the buffered bytes every few KiB, and `close` flushes and syncs.
    """

    def __init__(self, logdir: Path, purge_step: int):
        with imports_deferred("boto3"):  # tensorboardX's S3 writer's, never used here: ~0.3 s a process
            from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog

        Path(logdir).mkdir(parents=True, exist_ok=True)
        self._writer = EventsWriter(str(Path(logdir) / "events"))  # starts with the version event
        # what SummaryWriter(purge_step=...) writes: TensorBoard drops later steps written before
        self._writer.write_event(Event(step=purge_step, file_version="brain.Event:2"))
        self._writer.write_event(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def write(self, records: list) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        now = time.time()
        for rec in records:
            values = [Summary.Value(tag=tag, simple_value=value) for tag, value in tb_scalars(rec)]
            self._writer.write_event(Event(wall_time=now, step=rec["env_steps"],
                                           summary=Summary(value=values)))

    def hparams(self, config: dict) -> None:
        """TensorBoard's hyperparameter table: the run's config (lists as text) against
        its episodic return."""
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import hparams

        values = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in config.items()}
        for summary in hparams(values, {"charts/episodic_return": None}):
            self._writer.write_event(Event(wall_time=time.time(), summary=summary))

    def close(self) -> None:
        self._writer.close()


# (summary key, label with its unit): every trainer's summary table shows the rows its
# summary has, in this order; summary.json holds everything
SUMMARY_ROWS = (
    ("trainer", "trainer"), ("env_id", "env"), ("final_return", "final return"),
    ("total_env_steps", "env steps (all seeds)"), ("num_updates", "updates"), ("rounds", "rounds"),
    ("shards_mean", "shards a round (mean)"),
    ("num_seeds", "seeds"), ("wall_seconds", "wall time (s)"), ("compile_seconds", "compile (s)"),
    ("startup_seconds", "start-up (s)"), ("train_seconds", "training (s)"),
    ("phase_seconds", "time by phase (s)"), ("checkpoint_seconds", "checkpoint writes (s)"),
    ("sps", "env steps/s (training)"), ("modeled_seconds", "modeled cloud time (s)"),
    ("cost_usd", "dollars (cost preset)"), ("cost_preset", "cost preset"),
    ("stop_reason", "stopped by"), ("target_return", "target return"), ("time_to_target_s", "modeled time to target (s)"),
    ("wall_to_target_s", "measured time to target (s)"),
    ("train_to_target_s", "training time to target (s)"), ("cost_to_target_usd", "dollars to target"),
    ("params_sha256", "params sha256"), ("peak_rss_mb", "peak memory (MB)"),
    ("resumed_at_update", "resumed at"), ("run_dir", "run directory"))
DIGEST_SHOWN = 12  # hex digits of params_sha256 in the table
# rows counted over the whole run, across resumes (a resumed run's wall and training
# seconds are its own process's)
WHOLE_RUN = ("wall_to_target_s",)
# the async trainer's own words: an update is its round, and it takes chunks, not shards
ASYNC_LABELS = {"rounds": None, "shards_mean": "chunks an update (mean)"}


PHASES_SHOWN = 6  # the largest phases in the table's `time by phase` cell


def _phases_cell(phases: dict) -> str:
    """The largest phases, start-up parts folded into one: `learn 4.9, startup 4.9, ...`."""
    top = sorted(fold_startup(phases).items(), key=lambda kv: -kv[1])[:PHASES_SHOWN]
    return ", ".join(f"{k} {v:.3g}" for k, v in top)


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):
        return _phases_cell(value)
    if key == "params_sha256":
        return value[:DIGEST_SHOWN]
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e3 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def summary_table(summary: dict):
    """The same rich table for every trainer: labelled rows with units, a short digest."""
    from rich.table import Table

    table = Table(title="run summary (all of it in summary.json)", show_header=False)
    resumed = summary.get("resumed_at_update") is not None
    labels = ASYNC_LABELS if summary.get("trainer") == "async" else {}
    for key, label in SUMMARY_ROWS:
        label = labels.get(key, label)
        if key in summary and label:
            if resumed and key in WHOLE_RUN:  # the times above are this process's
                label = label.replace(" (s)", " (s, whole run)")
            table.add_row(label, _cell(key, summary[key]))
    return table

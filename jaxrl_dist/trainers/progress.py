"""What a run shows while it trains: a rich progress bar on a terminal, plain periodic
lines where stdout is not one (`jaxrl-dist train > log 2>&1`).

Both show the steps done against the steps the run will really train, the env steps
per second, and the mean return of the latest finished episodes: most updates of a
long-episode env end none, and their own return is missing, not zero.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from typing import NamedTuple, Optional, Protocol

from jaxrl_dist.trainers import status

RETURN_WINDOW = 100  # finished episodes (at least, in whole records) the shown return averages
LINE_EVERY_S = 30.0  # a plain line at least this often while the run advances
LINE_FRACTION = 0.05  # and one each time this share of the total is done


class RecentReturn:
    """The mean return of the latest `window` finished episodes (or more: records are
    taken whole), pooled over seeds; None until one has finished."""

    def __init__(self, window: int = RETURN_WINDOW):
        self.window = window
        self._parts: deque = deque()  # (sum of returns, episodes) of records that ended episodes
        self._episodes = 0.0

    def add(self, records) -> None:
        """Take in `records` (oldest first); only the newest that hold `window` episodes are read."""
        fresh, count = [], 0.0
        for rec in reversed(records):
            episodes = sum(rec.episodes)
            if episodes > 0:
                fresh.append((sum(rec.episode_return_sum), episodes))
                count += episodes
                if count >= self.window:
                    break
        self._parts.extend(reversed(fresh))
        self._episodes += count
        while self._parts and self._episodes - self._parts[0][1] >= self.window:
            self._episodes -= self._parts.popleft()[1]

    def mean(self) -> Optional[float]:
        if not self._parts:
            return None
        return sum(s for s, _ in self._parts) / sum(n for _, n in self._parts)


class RoundBudget(NamedTuple):
    """What ends a round-based run (the sync trainer's rounds, the async one's updates)."""

    timesteps: int  # `algo.total_timesteps`: no round starts once it is reached
    max_rounds: Optional[int]  # `run.max_rounds`
    round_steps: int  # the steps a round is expected to move, until one has


def expected_total(budget: RoundBudget, steps: int, rounds: int, round_steps: int) -> int:
    """The steps a run at `steps` after `rounds` rounds will have trained when its budget
    stops it, if every round left moves `round_steps`: the last round may pass
    `timesteps` (a run of 2,048-step rounds to 500,000 trains 501,760)."""
    left = -(-max(0, budget.timesteps - steps) // max(1, round_steps))
    if budget.max_rounds is not None:
        left = min(left, max(0, budget.max_rounds - rounds))
    return steps + left * round_steps


class Display(Protocol):
    def show(self, steps: int, total: int, ret: Optional[float], sps: Optional[float], note: str = "") -> None: ...

    def close(self) -> None: ...


def si(x: float) -> str:
    """`12.1k` for 12,100: a rate at a glance."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= size:
            return f"{x / size:.1f}{unit}"
    return f"{x:.0f}"


def _return(ret: Optional[float]) -> str:
    return "-" if ret is None else f"{ret:.1f}"


BAR_MIN = 10  # cells of bar the note leaves on a narrow terminal


class Bar:
    """rich's progress bar, redrawn twice a second (at rich's default 10 Hz it took ~2% of a
    core); a line `status.say` prints goes above it."""

    def __init__(self, console, total: int, done: int, label: str = "train", ret: Optional[float] = None,
                 deferred: bool = False):
        """`deferred`: drawn from the first `show` on (a status line shows until then)."""
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)
        from rich.table import Column

        def whole():  # on a narrow terminal the bar shrinks; numbers are never cut
            return Column(no_wrap=True)

        self._progress = Progress(
            TextColumn(f"[bold]{label}", table_column=whole()), BarColumn(bar_width=None),
            MofNCompleteColumn(table_column=whole()),
            TextColumn("steps  {task.fields[sps]} steps/s  return {task.fields[ret]}{task.fields[note]}",
                       table_column=whole()),
            TimeElapsedColumn(table_column=whole()), TimeRemainingColumn(table_column=whole()),
            console=console, transient=False, refresh_per_second=2)
        self._task = self._progress.add_task("train", total=total, completed=done, sps="-", ret=_return(ret), note="")
        self._label, self._started = label, False
        if not deferred:
            self._start()

    def _start(self) -> None:
        status.stop()  # the bar takes over from the status line
        self._progress.start()
        status.attach(self._progress.console)
        self._started = True

    def show(self, steps: int, total: int, ret: Optional[float], sps: Optional[float], note: str = "") -> None:
        rate, shown = f"{sps or 0:,.0f}", _return(ret)
        # the note goes where the line has room for it beside a bar of BAR_MIN cells: rich
        # would otherwise cut every column short ("gro… 26624… best… 0…")
        line = f"{self._label} {total}/{total} steps  {rate} steps/s  return {shown} 0:00:00 -:--:--"
        fits = len(line) + 1 + BAR_MIN + len(note) + 1 <= self._progress.console.width
        self._progress.update(self._task, completed=steps, total=total, sps=rate, ret=shown,
                              note=f" {note}" if note and fits else "")
        if not self._started:  # its first figures (elapsed counts from the bar's making)
            self._start()

    def close(self) -> None:
        if self._started:
            status.detach(self._progress.console)
            self._progress.stop()


class Lines:
    """Plain lines for a log file: one at the start, one each `LINE_FRACTION` of the total
    or `LINE_EVERY_S` seconds (whichever comes first), and the last at close; the full
    numbers, no control codes, each line flushed."""

    def __init__(self, stream, total: int, done: int, label: str = "", ret: Optional[float] = None):
        self._stream, self._t0, self._label = stream, time.monotonic(), label and f"{label}  "
        self._last_t, self._mark = self._t0, self._mark_of(done, total)
        self._pending: Optional[tuple] = None  # what `show` got and no line has shown yet
        self._print(done, total, ret, None)

    @staticmethod
    def _mark_of(steps: int, total: int) -> int:
        return int(steps / max(total, 1) / LINE_FRACTION)

    def show(self, steps: int, total: int, ret: Optional[float], sps: Optional[float], note: str = "") -> None:
        now, mark = time.monotonic(), self._mark_of(steps, total)
        if mark > self._mark or now - self._last_t >= LINE_EVERY_S:
            self._mark, self._last_t = mark, now
            self._print(steps, total, ret, sps, note)
        else:
            self._pending = (steps, total, ret, sps, note)

    def _print(self, steps: int, total: int, ret: Optional[float], sps: Optional[float], note: str = "") -> None:
        self._pending = None
        elapsed = int(time.monotonic() - self._t0)
        rate = "-" if sps is None else si(sps)
        shown = f"return {_return(ret)}" + (f" {note}" if note else "")
        self._stream.write(f"{self._label}steps {steps}/{total} ({steps / max(total, 1):.0%})  {shown}  "
                           f"{rate} steps/s  elapsed {elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}\n")
        self._stream.flush()

    def close(self) -> None:
        if self._pending is not None:
            self._print(*self._pending)


def make_display(total: int, done: int, label: str = "", ret: Optional[float] = None,
                 deferred: bool = False) -> Display:
    """The bar where stdout is a terminal (as rich tells it: `TTY_COMPATIBLE`, `FORCE_COLOR`
    and Jupyter count), plain lines elsewhere; `ret`: the return to show from the start (a
    resumed run's); `deferred`: the bar is drawn from its first figures on, so that a status
    line can say what comes before them (a round run's first round, which compiles)."""
    from rich.console import Console

    console = Console()
    if console.is_terminal or console.is_jupyter:
        return Bar(console, total, done, label or "train", ret, deferred)
    status.stop()  # the lines take over from the status line
    return Lines(sys.stdout, total, done, label, ret)


class Progress:
    """Turns a run's records into what its display shows: the steps against the total (fixed,
    or re-estimated each record from a `RoundBudget`) and the recent return."""

    def __init__(self, total: int, done: int = 0, history=(), budget: Optional[RoundBudget] = None,
                 display: Optional[Display] = None):
        self._budget, self._steps = budget, done
        self._rounds = history[-1].update if history else 0
        self._returns = RecentReturn()
        self._returns.add(history)
        self._total = total if budget is None else expected_total(budget, done, self._rounds, budget.round_steps)
        self._sps: Optional[float] = None
        # a round run's bar waits for its first round, which compiles under a status line
        self._display = display if display is not None else make_display(self._total, done, ret=self._returns.mean(),
                                                                          deferred=budget is not None)

    def update(self, records: list) -> None:
        last = records[-1]
        step = last.env_steps - (records[-2].env_steps if len(records) > 1 else self._steps)
        self._steps, self._rounds, self._sps = last.env_steps, last.update, last.sps
        self._returns.add(records)
        if self._budget is not None:
            self._total = expected_total(self._budget, self._steps, self._rounds, step)
        self._show()

    def finish(self) -> None:
        """The run ended on its own (target, budget, limits): what it trained is the total."""
        if self._total != self._steps:
            self._total = self._steps
            self._show()

    def _show(self) -> None:
        self._display.show(self._steps, self._total, self._returns.mean(), self._sps)

    @property
    def total(self) -> int:
        return self._total

    def close(self) -> None:
        self._display.close()

"""Shared pieces of the benchmarks: machine description, timing, tables, JSON, a terminal to run the CLI on.

`measure` is the one place that compiles, warms up and times anything.
"""
from __future__ import annotations

import fcntl
import math
import os
import pty
import resource
import statistics
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from jaxrl_dist.platform import configure_cpu, use_unrolled_threefry

configure_cpu()  # the CLI's XLA settings; must precede JAX's first backend use
import jax  # noqa: E402

use_unrolled_threefry()  # as the CLI does, before anything is traced

# the package's machine description, which `jaxrl-dist bench` records as well, and the
# file helpers the tools share (JSON out, a markdown table, JSONL records in)
from jaxrl_dist.tools.files import markdown_table, read_jsonl, write_json  # noqa: E402,F401
from jaxrl_dist.trainers.rundir import machine_info  # noqa: E402,F401

REPO = Path(__file__).resolve().parents[1]


def cli_command() -> list:
    """The installed `jaxrl-dist` script beside this Python, which users run (`python -m
    jaxrl_dist` where the environment has none)."""
    script = Path(sys.executable).with_name("jaxrl-dist")
    return [str(script)] if script.exists() else [sys.executable, "-m", "jaxrl_dist"]


class _CpuSample:
    """Host-wide busy CPU time (/proc/stat) and this process's own CPU time, now."""

    def __init__(self):
        self.wall = time.perf_counter()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.own = usage.ru_utime + usage.ru_stime
        try:
            ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
            self.busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError):
            self.busy = None


def other_cpu(start: _CpuSample, end: _CpuSample) -> float | None:
    """Share of all cores that other processes kept busy between two samples: a timing
    taken while something else ran is visible as a non-zero value."""
    if start.busy is None or end.busy is None:
        return None
    others = (end.busy - start.busy) - (end.own - start.own)
    return max(0.0, others) / ((end.wall - start.wall) * (os.cpu_count() or 1))


def measure(fn, make_state, steps_per_call: int, runs: int = 3, min_run_s: float = 0.0,
            fresh: bool = False):
    """Compile, warm up and time `fn(state) -> (state, aux)`; returns `(stats, auxes)`.

    A jitted `fn` is compiled ahead of time (`lower(...).compile()`, timed apart);
    a plain Python callable has no compile step. One untimed warm-up call follows.
    With `fresh=True` every timed run is one call on a new `make_state(i)` (built
    outside the clock: donated inputs, independent seeds). Otherwise each run
    chains calls on the returned state, repeated until a run lasts `min_run_s`.
    `auxes` holds the last `aux` of every timed run. `other_cpu` in the stats is
    the share of the cores other processes used meanwhile (see `other_cpu`).
    """
    state = make_state(0)
    compile_s = None
    if hasattr(fn, "lower"):
        start = time.perf_counter()
        fn = fn.lower(state).compile()
        compile_s = time.perf_counter() - start
    start = time.perf_counter()
    state, aux = jax.block_until_ready(fn(state))
    warmup_s = time.perf_counter() - start
    reps = 1 if fresh else max(1, math.ceil(min_run_s / max(warmup_s, 1e-6)))
    times, auxes, sample = [], [], _CpuSample()
    for i in range(runs):
        if fresh:
            state = make_state(i + 1)
        start = time.perf_counter()
        for _ in range(reps):
            state, aux = fn(state)
        jax.block_until_ready((state, aux))
        times.append(time.perf_counter() - start)
        auxes.append(aux)
    median = statistics.median(times)
    stats = {"other_cpu": other_cpu(sample, _CpuSample()),"compile_s": compile_s, "warmup_s": warmup_s, "calls_per_run": reps,
             "steps_per_run": steps_per_call * reps, "times_s": times, "median_s": median,
             "steps_per_s": steps_per_call * reps / median}
    return stats, auxes


def in_terminal(cmd: list, env: dict, cwd: Path) -> tuple:
    """Run `cmd` with a pseudo-terminal (120 x 40) as stdout and stderr, so a progress bar
    draws as for a user; `(exit code, output)`."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=cwd)
    os.close(slave)
    out = bytearray()
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
    code = proc.wait()
    os.close(master)
    return code, out.decode(errors="replace")


def run_in_terminal(cmd: list, tree: Path, cache: Path) -> tuple:
    """`cmd` from `tree` (first on PYTHONPATH) on a terminal, with the CLI's own XLA flags and
    `cache` as XDG_CACHE_HOME (its compile cache); `(output, others' CPU share over its life)`."""
    env = dict(os.environ, PYTHONPATH=str(tree), XDG_CACHE_HOME=str(cache), TERM="xterm-256color")
    env.pop("XLA_FLAGS", None)  # configure_cpu sets them, as for a user
    start, child_start = _CpuSample(), resource.getrusage(resource.RUSAGE_CHILDREN)
    code, output = in_terminal(cmd, env, tree)
    end, child_end = _CpuSample(), resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({code}):\n{output[-3000:]}")
    if start.busy is None or end.busy is None:
        return output, None
    child = (child_end.ru_utime + child_end.ru_stime) - (child_start.ru_utime + child_start.ru_stime)
    others = (end.busy - start.busy) - child - (end.own - start.own)
    return output, max(0.0, others) / ((end.wall - start.wall) * (os.cpu_count() or 1))


def print_table(title: str, headers, rows) -> None:
    """A rich table when rich is importable, plain aligned text otherwise."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
        print(f"\n{title}")
        for row in [headers, *rows]:
            print("  ".join(str(c).rjust(w) for c, w in zip(row, widths)))
        return
    console = Console()
    if not console.is_terminal:  # rich assumes 80 columns when piped; keep rows whole
        console = Console(width=160)
    table = Table(title=title)
    for h in headers:
        table.add_column(h, justify="right")
    for row in rows:
        table.add_row(*(str(c) for c in row))
    console.print(table)


def fmt(x, digits: int = 3) -> str:
    """Compact number: 3 significant digits, thousands separators for big ones."""
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"

"""Process-level settings for CPU hosts: XLA flags, and JAX's threefry lowering.

XLA reads `XLA_FLAGS` once, when its first backend starts, so entry points
(the CLI, the benchmarks) call `configure_cpu()` before anything touches
JAX; a library user may do the same. Flags already in `XLA_FLAGS` win.

`use_unrolled_threefry()` is a separate opt-in, made by the same entry points
once JAX may load: it reaches into JAX's private `jax._src`, so no module of
this package does it as a side effect of being imported.

Logging: `TerminalHandler` and `logs_through_logging` keep libraries' lines off a
progress bar (see their docstrings). `defer_import` and `imports_deferred` keep a
library's optional imports that training never uses off every process's start.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import platform
import sys
import types
from pathlib import Path

# Measured on a 2-core host (bench/RESULTS.md):
# - each core a CPU device: `fused` splits seeds over devices, and 64 vmapped
#   CartPole seeds train 1.6x faster than on one device that leaves a core idle;
# - XLA's concurrency-optimised scheduler spreads tiny kernels over threads
#   and costs ~8% on a 4-env CartPole run.
_FLAGS = {
    "xla_force_host_platform_device_count": lambda: str(os.cpu_count() or 1),
    "xla_cpu_enable_concurrency_optimized_scheduler": lambda: "false",
}
_unrolled = False  # set by use_unrolled_threefry


def configure_cpu() -> str:
    """Add this project's CPU flags to `XLA_FLAGS` (those not already set); returns them."""
    flags = os.environ.get("XLA_FLAGS", "")
    extra = [f"--{name}={value()}" for name, value in _FLAGS.items() if name not in flags]
    os.environ["XLA_FLAGS"] = " ".join([flags, *extra]).strip()
    return os.environ["XLA_FLAGS"]


def cpu_model() -> str:
    """The host's CPU model name (Linux's /proc/cpuinfo, else what Python reports)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def use_unrolled_threefry() -> bool:
    """Lower JAX's threefry hash unrolled on CPU too, as on other platforms.

    On CPU, JAX lowers threefry to a rolled 5-round loop to keep compiles
    small; inside a rollout step that loop costs more than the hash itself.
    The random bits are the same, but XLA compiles the code around them
    differently, and a float op there may round differently: a Pendulum run's
    rewards (hence its params) differ in the last bits, CartPole's do not. The
    CLI opts in, and so do tests (tests/test_golden.py's digests need it).

    Lowerings are cached per traced function, so call this before the first
    jit that draws random numbers. Imports JAX. Returns False where this JAX
    has no such hook (nothing is changed then).
    """
    global _unrolled
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as threefry
    except ImportError:
        return False
    rule = getattr(threefry, "_threefry2x32_lowering_rule", None)
    primitive = getattr(threefry, "threefry2x32_p", None)
    if rule is None or primitive is None:
        return False
    mlir.register_lowering(primitive, rule, platform="cpu")
    _unrolled = True
    return True


def unrolled_threefry() -> bool:
    """Whether this process opted in (`use_unrolled_threefry`), for workers that mirror it."""
    return _unrolled


class TerminalHandler(logging.StreamHandler):
    """A console handler on whatever `sys.stderr` is when a record is written, not
    when the handler was made. While a progress bar or status line shows, rich puts a
    proxy there that prints above the bar; a handler holding the stream it was made
    with writes into the bar's line instead."""

    def __init__(self, level=logging.NOTSET):
        logging.Handler.__init__(self, level)

    @property
    def stream(self):
        return sys.stderr


def logs_through_logging(name: str) -> None:
    """Send logger `name`'s records to the root logger's handlers in place of the
    console handlers its library installed. Ray's handler keeps the stderr of the
    moment Ray was imported, so its start-up warnings printed through the progress
    bar; through the root, the job log keeps every line and the terminal gets the
    warnings above the bar (`TerminalHandler`, or Python's last-resort handler,
    which also writes to the current `sys.stderr`)."""
    log = logging.getLogger(name)
    for handler in list(log.handlers):
        if type(handler) is not logging.FileHandler and isinstance(handler, logging.StreamHandler):
            log.removeHandler(handler)
    log.propagate = True


def process_age_s() -> float:
    """Seconds since this process started (Linux: its start time in `/proc/self/stat`
    against the boot clock); 0.0 where that cannot be read."""
    import time

    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the command's name
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


class Deferred(types.ModuleType):
    """Stands in for a module until one of its attributes is used.

    (`importlib.util.LazyLoader` does not help here: the next `import` of the
    name reads `__spec__`, which loads the module.)
    """

    def __getattr__(self, attr):
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


def quiet_ray_start() -> None:
    """Before this process starts a Ray runtime on loopback: no usage stats leave the
    host, and Ray (>= 2.5x), which turns token authentication on for each new runtime
    (its default) and warns on every start that it did, keeps the default without the
    line (an error there still shows). No Ray import: the logger is Ray's, by name."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)


def defer_import(name: str) -> None:
    """From now on `import name` gives a stand-in that loads the module at its first use."""
    if name not in sys.modules:
        sys.modules[name] = Deferred(name)


@contextlib.contextmanager
def imports_deferred(*names: str):
    """Within the block, `import NAME` gives a stand-in that loads NAME at its first use;
    after it NAME imports as usual, its submodules too (`import NAME.sub` needs the real
    package, which a stand-in left in `sys.modules` would hide)."""
    added = [name for name in names if name not in sys.modules]
    for name in added:
        defer_import(name)
    try:
        yield
    finally:
        for name in added:
            if isinstance(sys.modules.get(name), Deferred):
                del sys.modules[name]

"""Process-level XLA settings for CPU hosts, applied before JAX starts.

XLA reads `XLA_FLAGS` once, when its first backend starts, so entry points
(the CLI, the benchmarks) call `configure_cpu()` before anything touches
JAX; a library user may do the same. Flags already in `XLA_FLAGS` win.
"""
from __future__ import annotations

import os
import platform
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

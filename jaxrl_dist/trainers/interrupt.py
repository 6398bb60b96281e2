"""Ctrl-C as a request: the run stops at its next safe point, saves a checkpoint and
raises `Interrupted`, so an interrupted run (even one with `run.checkpoint_every=0`)
can be resumed. A second Ctrl-C stops at once (`KeyboardInterrupt`)."""
from __future__ import annotations

import contextlib
import signal
import threading

_requested = threading.Event()


class Interrupted(KeyboardInterrupt):
    """The run stopped on request after saving a checkpoint at `step`."""

    def __init__(self, run_dir, step: int, unit: str = "update"):
        super().__init__(f"interrupted at {unit} {step}; checkpoint saved; continue with "
                         f"jaxrl-dist train run.resume={run_dir}")
        self.run_dir, self.step = run_dir, step


def requested() -> bool:
    """Whether Ctrl-C (SIGINT) asked the run to stop."""
    return _requested.is_set()


@contextlib.contextmanager
def stop_on_sigint():
    """While the block runs, the first SIGINT sets `requested()`; the second raises.

    Signal handlers belong to the main thread: elsewhere (a library user's thread)
    the block runs with SIGINT as it was.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def ask(signum, frame):
        if _requested.is_set():
            raise KeyboardInterrupt
        _requested.set()

    previous = signal.signal(signal.SIGINT, ask)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _requested.clear()

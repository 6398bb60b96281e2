"""Ctrl-C as a request: the run stops at its next safe point, saves a checkpoint and
raises `Interrupted`, so an interrupted run (even one with `run.checkpoint_every=0`)
can be resumed. A second Ctrl-C stops at once (`KeyboardInterrupt`).

The first Ctrl-C is acknowledged with a line at once, though the stop waits for the
work in flight (a fused chunk can take minutes). Python runs a signal handler only
when the main thread is back in the interpreter, never while it blocks in a compiled
call or a device transfer; `wait_for` runs such calls in a helper thread while the
main thread waits in short, interruptible steps.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import sys
import signal
import threading
from typing import Callable, Optional

from jaxrl_dist.trainers import status

_requested = threading.Event()
_twice = threading.Event()  # the second Ctrl-C came
_asked_by = [signal.SIGINT]  # the signal that asked the run to stop
POLL_S = 0.1  # the main thread's longest sleep in `wait_for`
# what the first Ctrl-C prints, by what the trainer stops after
_NEXT_STOP = {"chunk": "the chunks in flight", "round": "this round", "update": "this update"}
# the command that continues this process's run (`jaxrl-dist launch` names itself, with its flags)
_resume_with = ["jaxrl-dist train"]


def resume_with(command: str) -> None:
    """Name the command that continues the run in the stop lines (a multi-process run's
    processes are started again by `jaxrl-dist launch`, not one `train`)."""
    _resume_with[0] = command


class Interrupted(KeyboardInterrupt):
    """The run stopped on request after saving a checkpoint at `step`."""

    def __init__(self, run_dir, step: int, unit: str = "update"):
        super().__init__(f"interrupted at {unit} {step}; checkpoint saved; continue with "
                         f"{_resume_with[0]} run.resume={run_dir}")
        self.run_dir, self.step = run_dir, step


class StoppedAtOnce(Interrupted):
    """A second Ctrl-C stopped the run where it was: nothing saved since its last
    checkpoint (`saved`: whether it has one)."""

    def __init__(self, run_dir, saved: bool = True):
        then = ("nothing saved since the last checkpoint; continue from it" if saved
                else "no checkpoint written yet; start it again")
        KeyboardInterrupt.__init__(self, f"stopped at once ({signal_name()} twice): {then} with "
                                   f"{_resume_with[0]} run.resume={run_dir}")
        self.run_dir, self.step = run_dir, None


def requested() -> bool:
    """Whether Ctrl-C (SIGINT) or SIGTERM asked the run to stop."""
    return _requested.is_set()


def signal_name(signum: Optional[int] = None) -> str:
    """`Ctrl-C` or `SIGTERM`: `signum`'s name in the lines (None: what asked the run to stop)."""
    return "SIGTERM" if (_asked_by[0] if signum is None else signum) == signal.SIGTERM else "Ctrl-C"


def exit_code() -> int:
    """The exit code of a run that stopped on request: 130 for Ctrl-C, 143 for SIGTERM
    (the shell's codes for a process those signals ended)."""
    return 128 + _asked_by[0]


def step_unit(trainer: str) -> str:
    """What a trainer's steps are called in its lines: what it stops after and checkpoints."""
    return {"sync": "round", "async": "update"}.get(trainer, "chunk")


def acknowledgement(unit: str, signum: int = signal.SIGINT) -> str:
    """The line the first Ctrl-C (or SIGTERM) prints; `unit`: what the trainer stops after
    (`_NEXT_STOP`)."""
    by = signal_name(signum)
    return (f"{by}: stopping after {_NEXT_STOP.get(unit, 'this ' + unit)}; a checkpoint follows "
            f"({by} again to stop at once)")


@contextlib.contextmanager
def stop_on_sigint(unit: str = "chunk"):
    """While the block runs, the first SIGINT or SIGTERM sets `requested()` and prints
    `acknowledgement(unit)`; the second raises `KeyboardInterrupt`. SIGTERM is what a
    cluster's scheduler sends before it takes the machine back: the run saves and stops.

    Signal handlers belong to the main thread: elsewhere (a library user's thread)
    the block runs with the signals as they were. The line is printed by a thread of its
    own: the handler interrupts the main thread anywhere, maybe inside a write to the
    same stream or inside the progress bar's drawing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _twice.clear()  # left set after a run stopped at once, for `_exit_if_busy`
    _asked_by[0] = signal.SIGINT
    wake = threading.Event()
    announcer = threading.Thread(target=_announce, args=(wake, unit), daemon=True, name="jaxrl-dist-ctrl-c")
    announcer.start()

    def ask(signum, frame):
        if _requested.is_set():
            _twice.set()
            raise KeyboardInterrupt
        _asked_by[0] = signum
        _requested.set()
        wake.set()

    previous = {sig: signal.signal(sig, ask) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        wake.set()
        announcer.join(timeout=1.0)  # its line before whatever the caller prints next
        _requested.clear()


def _announce(wake: threading.Event, unit: str) -> None:
    wake.wait()
    if _requested.is_set():  # else the block ended without a Ctrl-C
        status.say(acknowledgement(unit, _asked_by[0]))


@contextlib.contextmanager
def one_line_when_stopped_at_once(run_dir, saved: Callable[[], bool] = lambda: True):
    """A second Ctrl-C's `KeyboardInterrupt`, raised wherever the run was, as
    `StoppedAtOnce`: one line where it would have been a traceback. `saved()`: whether
    the run has a checkpoint to continue from."""
    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt:
        if not _twice.is_set():
            raise
        raise StoppedAtOnce(run_dir, saved()) from None


def exit_now(code: int) -> None:
    """End the process at once, its output flushed: after a second Ctrl-C a checkpoint
    write may still be going on in orbax's threads, which an orderly exit would cut
    off mid-write with a traceback each (the write is a temporary directory, dropped
    when the run continues)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class _Job:
    def __init__(self, fn: Callable, args: tuple):
        self.fn, self.args, self.done = fn, args, threading.Event()
        self.value, self.error = None, None

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args)
        except BaseException as err:  # handed to the caller, whatever it is
            self.error = err
        finally:
            self.done.set()


_jobs: Optional[queue.SimpleQueue] = None
_jobs_lock = threading.Lock()
_busy = threading.Event()  # the helper thread is in a call


def _queue() -> queue.SimpleQueue:
    """The helper thread's job queue, the thread started on first use. A daemon: after a
    second Ctrl-C the process exits without waiting for the call it is still in."""
    global _jobs
    with _jobs_lock:
        if _jobs is None:
            _jobs = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(_jobs,), daemon=True, name="jaxrl-dist-wait").start()
            atexit.register(_exit_if_busy)
        return _jobs


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        _busy.set()
        job.run()
        _busy.clear()


def _exit_if_busy() -> None:
    """At exit with the helper thread still in a compiled call (the main thread left
    `wait_for` on a second Ctrl-C): end the process here. The interpreter would stop
    that thread inside XLA's C++ code, and the C++ runtime aborts on that."""
    if _busy.is_set():
        exit_now(exit_code() if _twice.is_set() else 1)


def wait_for(fn: Callable, *args):
    """`fn(*args)`; on the main thread, run in the helper thread while the main thread
    wakes every `POLL_S`, so a Ctrl-C during a long blocking call is seen (and
    acknowledged) at once. The same call, so the same results; elsewhere a plain call."""
    if threading.current_thread() is not threading.main_thread():
        return fn(*args)
    job = _Job(fn, args)
    _queue().put(job)
    while not job.done.wait(POLL_S):
        pass
    if job.error is not None:
        raise job.error
    return job.value

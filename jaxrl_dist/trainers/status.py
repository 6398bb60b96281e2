"""One status line with its elapsed time, on a terminal, while a run has nothing else
to show: checking the config, making the env, compiling, starting a backend. The
progress bar replaces it (`stop`)."""
from __future__ import annotations

import contextlib
import sys
import time

_live: list = []  # the status shown now, if any


def _console():
    from rich.console import Console

    return Console(stderr=True)


@contextlib.contextmanager
def showing(text: str, enabled: bool = True):
    """Show `text (elapsed s)` on stderr while the block runs (a terminal only)."""
    if not enabled or not sys.stderr.isatty() or _live:
        yield
        return
    from rich.live import Live
    from rich.spinner import Spinner

    start = time.perf_counter()

    class Line:
        def __rich__(self):
            return Spinner("dots", f"{text} ({time.perf_counter() - start:.1f} s)")

    live = Live(Line(), console=_console(), refresh_per_second=4, transient=True)
    live.start()
    _live.append(live)
    try:
        yield
    finally:
        stop()


def stop() -> None:
    """Take the status line down (the progress bar or a message comes next)."""
    while _live:
        _live.pop().stop()

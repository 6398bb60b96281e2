"""One status line with its elapsed time, on a terminal, while a run has nothing else
to show: checking the config, making the env, compiling, starting a backend. The
progress bar replaces it (`stop`). `say` prints a line above whichever of them shows."""
from __future__ import annotations

import contextlib
import sys
import time

_live: list = []  # the status shown now, if any
_bars: list = []  # the consoles of the progress bars shown now (`attach`)


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


def attach(console) -> None:
    """A progress bar now shows on `console`: `say` prints through it, above the bar."""
    _bars.append(console)


def detach(console) -> None:
    if console in _bars:
        _bars.remove(console)


def say(text: str) -> None:
    """`text` as one line: above the status line or progress bar showing now (a plain print
    would land inside the bar's line), else on stderr."""
    shown = [live.console for live in _live] + _bars
    if shown:
        shown[-1].print(text, markup=False, highlight=False, soft_wrap=True)
    else:
        print(text, file=sys.stderr, flush=True)

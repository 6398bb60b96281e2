"""What `jaxrl-dist train` shows on a terminal: a status line with its elapsed time
before the bar, the rounding of the step budget said once, the bar's real total."""
from __future__ import annotations

import os
import pty
import re
import subprocess

from test_cli import CACHE_HOME, command

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def raw_terminal_output(argv: list, env: dict, timeout: float = 300) -> tuple:
    """`(exit code, bytes)` of `argv` with a pseudo-terminal as stdout and stderr."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = bytearray()
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        out += data
    code = proc.wait(timeout=timeout)
    os.close(master)
    return code, bytes(out)


def on_a_terminal(args: list, timeout: float = 300) -> tuple:
    """`(exit code, text)` of `jaxrl-dist ARGS` with a pseudo-terminal as stdout and stderr."""
    env = dict(os.environ, XDG_CACHE_HOME=str(CACHE_HOME), TERM="xterm-256color", COLUMNS="160")
    code, out = raw_terminal_output(command() + args, env, timeout)
    return code, ANSI.sub("", out.decode(errors="replace"))


def test_a_status_line_then_the_bar_with_the_real_total(tmp_path):
    code, text = on_a_terminal(["train", "trainer=fused", "algo.total_timesteps=10000",
                                f"run.dir={tmp_path / 'run'}", "run.tensorboard=false"])
    assert code == 0, text[-2000:]
    for status in ("checking the config", "loading JAX", "compiling its training program"):
        assert re.search(rf"{status} \(\d+\.\d s\)", text), status
    assert text.count("note: algo.total_timesteps=10,000 is 19 updates of 512 steps") == 1
    assert "9728/9728" in text and "10000" not in text.replace("10,000", "")


# A library whose console handler holds the stderr of the moment it was made (Ray's
# does), then warns while the progress bar shows; `logs_through_logging` is what the
# Ray backend does before Ray starts.
_LIBRARY_WARNS = """
import logging, sys, time
from rich.progress import Progress
from jaxrl_dist.platform import TerminalHandler, logs_through_logging
lib = logging.getLogger("somelib")
lib.addHandler(logging.StreamHandler())
lib.propagate = False
logging.getLogger().addHandler(TerminalHandler())
with Progress(refresh_per_second=20) as bar:
    bar.add_task("train", total=10)
    time.sleep(0.2)
    if sys.argv[1] == "routed":
        logs_through_logging("somelib")
    lib.warning("the library warns")
    time.sleep(0.2)
"""


def test_a_library_warning_prints_above_the_bar_not_inside_it():
    import sys

    env = dict(os.environ, TERM="xterm-256color", COLUMNS="100")
    outs = {}
    for how in ("routed", "as_is"):
        code, outs[how] = raw_terminal_output([sys.executable, "-c", _LIBRARY_WARNS, how], env, 60)
        assert code == 0, outs[how][-1000:]
    # rich erases the bar's line, prints the warning, then draws the bar again below it
    assert re.search(rb"\r\x1b\[2K(\x1b\[[0-9;]*m)*the library warns\r\n", outs["routed"])
    # the handler as the library made it writes into the middle of the bar's line
    assert not re.search(rb"\x1b\[2K(\x1b\[[0-9;]*m)*the library warns", outs["as_is"])

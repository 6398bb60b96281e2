"""What `jaxrl-dist train` shows on a terminal: a status line with its elapsed time
before the bar, the rounding of the step budget said once, the bar's real total."""
from __future__ import annotations

import os
import pty
import re
import subprocess

from test_cli import CACHE_HOME, command

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def on_a_terminal(args: list, timeout: float = 300) -> tuple:
    """`(exit code, text)` of `jaxrl-dist ARGS` with a pseudo-terminal as stdout and stderr."""
    master, slave = pty.openpty()
    env = dict(os.environ, XDG_CACHE_HOME=str(CACHE_HOME), TERM="xterm-256color", COLUMNS="160")
    proc = subprocess.Popen(command() + args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
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
    return code, ANSI.sub("", out.decode(errors="replace"))


def test_a_status_line_then_the_bar_with_the_real_total(tmp_path):
    code, text = on_a_terminal(["train", "trainer=fused", "algo.total_timesteps=10000",
                                f"run.dir={tmp_path / 'run'}", "run.tensorboard=false"])
    assert code == 0, text[-2000:]
    for status in ("checking the config", "loading JAX", "compiling its training program"):
        assert re.search(rf"{status} \(\d+\.\d s\)", text), status
    assert text.count("note: algo.total_timesteps=10,000 is 19 updates of 512 steps") == 1
    assert "9728/9728" in text and "10000" not in text.replace("10,000", "")

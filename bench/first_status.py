"""From launch to the first visible text of `jaxrl-dist train` on a terminal.

Each launch is a fresh process on a pseudo-terminal; the clock stops at the first
output that holds a visible character (escape sequences aside). One warm-up launch
first (the OS page cache), then `--launches` timed ones; the median is the figure.
The run itself is short (10,240 steps) and every launch runs it to the end.
`--errors` times, instead, launches whose config is wrong (a misspelt key, a value of
the wrong type, a value out of range, a misspelt preset): from launch to the one-line
error, each a median over `--launches`.

    python bench/first_status.py [--launches 5] [--errors | --ctrl-c [--env pong]] [--out F.json]
"""
from __future__ import annotations

import argparse
import os
import pty
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
VISIBLE = re.compile(rb"\x1b\[[0-9;?]*[a-zA-Z]")


def first_text(cmd: list, until: bytes = b"") -> tuple:
    """`(seconds to the first visible text, that text)` of one launch of `cmd`; with
    `until`, to the first output that holds those bytes."""
    master, slave = pty.openpty()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    first, shown = None, b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.02)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            text = VISIBLE.sub(b"", data).strip()
            if first is None and text and until in text:
                first, shown = time.perf_counter() - t0, text[text.index(until):]
        elif proc.poll() is not None:
            break
    proc.wait()
    os.close(master)
    return first, shown.decode(errors="replace")[:60]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=5)
    p.add_argument("--errors", action="store_true", help="time the one-line errors of bad configs instead")
    p.add_argument("--ctrl-c", action="store_true", help="time Ctrl-C's acknowledgement during a long chunk instead")
    p.add_argument("--env", default="breakout_minatar", help="--ctrl-c: the env preset of the long run")
    p.add_argument("--out", default="bench/results/first_status.json")
    opts = p.parse_args()
    if opts.errors:
        return errors(opts)
    if opts.ctrl_c:
        return ctrl_c(opts)
    from common import cli_command, machine_info, write_json

    times = []
    with tempfile.TemporaryDirectory(prefix="first_status-") as tmp:
        for i in range(opts.launches + 1):
            cmd = [*cli_command(), "train", "trainer=fused", "algo.total_timesteps=10240", f"run.dir={tmp}/{i}"]
            seconds, shown = first_text(cmd)
            print(f"[{'warm-up' if i == 0 else i}] {seconds:.2f} s: {shown!r}", flush=True)
            times += [seconds] if i else []
    med = statistics.median(times)
    write_json(opts.out, {"meta": machine_info(), "seconds": times, "median": med})
    print(f"median {med:.2f} s over {len(times)} launches")


# "env id": a misspelt id is told from every installed suite's ids, so JAX, gymnax, envpool and
# brax load first; the 1 s bound is for the other four, which need no env
ERRORS = {"key": "algo.lrr=1e-3", "type": "algo.lr=fast", "range": "env.num_envs=0", "preset": "env=cartpol",
          "env id": "env.id=CartPol-v1"}


def errors(opts) -> None:
    """Launch to the one-line error of each kind of bad config; medians."""
    from common import cli_command, machine_info, write_json

    out = {}
    with tempfile.TemporaryDirectory(prefix="first_error-") as tmp:
        for kind, override in ERRORS.items():
            cmd = [*cli_command(), "train", override, f"run.dir={tmp}/{kind}"]
            first_text(cmd, b"error:")  # warm-up
            times = []
            for _ in range(opts.launches):
                seconds, shown = first_text(cmd, b"error:")
                times.append(seconds)
            out[kind] = {"override": override, "seconds": times, "median": statistics.median(times), "line": shown}
            print(f"{kind:7s} {override:18s} median {out[kind]['median']:.2f} s  {shown!r}", flush=True)
    write_json(opts.out, {"meta": machine_info(), "errors": out})


def acknowledged(cmd: list) -> float:
    """Seconds from SIGINT to Ctrl-C's acknowledgement, sent once the run has shown its
    bar (inside its one long chunk, `run.log_chunks=1`); the run is then stopped at once."""
    import signal

    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    seen, sent = b"", None
    while proc.poll() is None:
        ready, _, _ = select.select([master], [], [], 0.02)
        data = os.read(master, 65536) if ready else b""
        seen += VISIBLE.sub(b"", data)
        if sent is None and re.search(rb"\d/\S+ steps", seen):  # the bar's count: the chunk runs
            time.sleep(1.0)
            sent, seen = time.perf_counter(), b""
            proc.send_signal(signal.SIGINT)
        elif sent is not None and b"Ctrl-C: stopping" in seen:
            took = time.perf_counter() - sent
            proc.send_signal(signal.SIGINT)  # the second: stop at once
            proc.wait()
            os.close(master)
            return took
    os.close(master)
    return float("nan")


def ctrl_c(opts) -> None:
    from common import cli_command, machine_info, write_json

    times = []
    with tempfile.TemporaryDirectory(prefix="ctrl_c-") as tmp:
        for i in range(opts.launches):
            cmd = [*cli_command(), "train", "trainer=fused", f"env={opts.env}", "algo.total_timesteps=2000000",
                   "run.log_chunks=1", f"run.dir={tmp}/{i}"]
            times.append(acknowledged(cmd))
            print(f"[{i + 1}] Ctrl-C acknowledged after {times[-1]:.3f} s", flush=True)
    write_json(opts.out, {"meta": machine_info(), "env": opts.env, "ctrl_c_s": times,
                          "median": statistics.median(times)})
    print(f"median {statistics.median(times):.3f} s over {len(times)} launches")


if __name__ == "__main__":
    main()

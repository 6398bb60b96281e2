"""What `jaxrl-dist train` shows on a terminal: a status line with its elapsed time
before the bar, the rounding of the step budget said once, the bar's real total and
the return of recent episodes; in a log (no terminal), plain lines with the same."""
from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess

from test_cli import cli_env, command

from jaxrl_dist.scheduling.records import Record
from jaxrl_dist.trainers import progress

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
    env = cli_env(TERM="xterm-256color", COLUMNS="160")
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
    steps, total, ret = re.findall(r"(\d+)/(\d+) steps .*? return (\S+)", text)[-1]  # the bar's last look
    assert steps == total == "9728" and ret != "-"


def test_a_config_error_on_a_terminal_is_the_last_text(tmp_path):
    """A value out of range, found by the check Hydra calls back: the status line is
    taken down before the error, so nothing is drawn below it."""
    code, text = on_a_terminal(["train", "env.num_envs=0", f"run.dir={tmp_path / 'run'}"], timeout=120)
    assert code == 2, text
    assert text.rstrip().endswith("error: env.num_envs must be positive, got 0"), repr(text)
    assert "checking the config" not in text.split("error:")[-1]


# a plain progress line: steps, total, share, return, rate
PLAIN = re.compile(r"^steps (\d+)/(\d+) \((\d+)%\)  return (\S+)  (\S+) steps/s  elapsed \d+:\d\d:\d\d$", re.M)


def test_a_log_gets_plain_lines_with_the_trained_total_and_a_recent_return(tmp_path):
    """`jaxrl-dist train > log 2>&1` of the sync trainer: rounds of 16 steps to 1,000 train
    1,008, and half the rounds end no episode (a random CartPole episode is ~20 steps)."""
    run = tmp_path / "run"
    env = {k: v for k, v in cli_env().items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    out = subprocess.run(command() + ["train", "trainer=sync", "scheduler=fixed", "scheduler.num_shards=1",
                                      "backend.envs_per_shard=1", "algo.num_steps=16", "algo.minibatch_size=8",
                                      "algo.total_timesteps=1000", f"run.dir={run}", "run.tensorboard=false"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:]
    assert "\x1b" not in out.stdout and "\r" not in out.stdout
    lines = PLAIN.findall(out.stdout)
    assert len(lines) >= 10 and {total for _, total, *_ in lines} == {"1008"}
    assert lines[0][0] == "0" and lines[-1][0] == "1008" and lines[-1][2] == "100"
    assert json.loads((run / "summary.json").read_text())["env_steps"] == 1008
    shown = [ret for _, _, _, ret, _ in lines]
    first = next(i for i, ret in enumerate(shown) if ret != "-")
    assert "-" not in shown[first:]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    ended = next(i for i, r in enumerate(records) if r["episodes"][0] > 0)
    assert any(r["return"] is None for r in records[ended:])  # rounds the shown return bridges


def record(update: int, ret_sum: float, episodes: float, steps: int = 512) -> Record:
    ret = ret_sum / episodes if episodes else None
    return Record(update=update, env_steps=update * steps, ret=ret, losses={}, sps=1000.0, episode_return_sum=(ret_sum,),
                  episodes=(episodes,))


class Shown:
    """A display that keeps what it was asked to show."""

    def __init__(self):
        self.seen = []

    def show(self, steps, total, ret, sps):
        self.seen.append((steps, total, ret))

    def close(self):
        pass


def test_the_shown_return_is_the_mean_of_the_latest_finished_episodes():
    shown = Shown()
    bar = progress.Progress(512 * 8, display=shown)
    bar.update([record(1, 0.0, 0), record(2, 30.0, 2)])
    bar.update([record(3, 0.0, 0)])  # no episode ended: the last ones still count
    bar.update([record(4, 40.0, 1), record(5, 0.0, 0)])
    assert [ret for *_, ret in shown.seen] == [15.0, 15.0, 70.0 / 3]
    window = progress.RecentReturn(window=100)
    window.add([record(u, 100.0 * u, 50) for u in range(1, 6)])  # the two newest records hold 100
    assert window.mean() == (400.0 + 500.0) / 100
    shown = Shown()
    resumed = progress.Progress(512 * 8, 512 * 5, [record(5, 20.0, 1)], display=shown)
    resumed.update([record(6, 0.0, 0)])  # a resumed run starts from its history's episodes
    assert shown.seen == [(512 * 6, 512 * 8, 20.0)]


def test_a_round_run_total_is_the_steps_its_rounds_come_to():
    budget = progress.RoundBudget(500_000, None, 2048)
    assert progress.expected_total(budget, 0, 0, 2048) == 501_760  # 245 rounds
    assert progress.expected_total(budget._replace(max_rounds=10), 0, 0, 2048) == 20_480
    assert progress.expected_total(budget, 499_712, 200, 4096) == 503_808  # rounds grew to 4,096
    assert progress.expected_total(budget, 501_760, 245, 2048) == 501_760
    shown = Shown()
    bar = progress.Progress(0, budget=progress.RoundBudget(5000, None, 1024), display=shown)
    assert bar.total == 5120
    bar.update([Record(update=1, env_steps=1536, ret=None, losses={}, sps=None, episode_return_sum=(0.0,), episodes=(0.0,))])  # a round of 1,536 steps
    bar.finish()  # stopped early (a target): the steps done are the total
    assert shown.seen == [(1536, 1536 + 3 * 1536, None), (1536, 1536, None)]


def test_plain_lines_come_each_twentieth_of_the_run_and_at_the_end():
    out = io.StringIO()
    lines = progress.Lines(out, 999_424, 0)
    for k in range(1, 100):
        lines.show(k * 9_984, 999_424, 201.3, 12_100.0)
    lines.close()
    text = out.getvalue().splitlines()
    assert text[0].startswith("steps 0/999424 (0%)  return -")
    assert text[1].startswith("steps 59904/999424 (6%)  return 201.3  12.1k steps/s  elapsed 0:00:0")
    assert len(text) == 21 and text[-1].startswith("steps 988416/999424 (99%)")
    resumed = io.StringIO()  # a resumed run's first line shows its history's return
    progress.Lines(resumed, 999_424, 59_904, ret=201.3)
    assert resumed.getvalue().startswith("steps 59904/999424 (6%)  return 201.3  - steps/s")


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


def test_a_narrow_terminal_drops_the_bars_note_not_its_numbers():
    """A vmap group's note (median of its jobs, best) is shown where the line has room;
    on 80 or 100 columns the steps, rate, return and times stay whole instead."""
    from rich.console import Console

    for width, noted in ((80, False), (100, False), (140, True)):
        out = io.StringIO()
        bar = progress.Bar(Console(file=out, force_terminal=True, width=width), 3200000, 0, "group 1/1")
        bar.show(26624, 3200000, 109.9, 364107.0, "(median of 4), best 177.0")
        bar.close()
        line = ANSI.sub("", out.getvalue()).replace("\r", "\n").strip().splitlines()[-1]
        assert "…" not in line and len(line) <= width, line
        assert "26624/3200000 steps  364,107 steps/s  return 109.9" in line and "0:00:00" in line, line
        assert ("best 177.0" in line) == noted, line


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


def test_a_basic_multiruns_jobs_show_their_lines_one_after_another(tmp_path):
    """Hydra's basic launcher runs the jobs one by one in this process: each shows its
    plain progress lines where stdout is not a terminal (side-by-side launchers show none)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "jaxrl_dist", "train", "-m", "seed=0,1", "trainer=fused",
                          "algo.total_timesteps=10240", f"run.dir={tmp_path / 'sweep'}"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = (out.stdout + out.stderr).splitlines()
    assert sum(line.startswith("steps 10240/10240 (100%)") for line in lines) == 2

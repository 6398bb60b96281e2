"""Ctrl-C: the run saves a checkpoint, prints one line with the `run.resume=` command,
exits 130, and resumes from where it stopped."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from test_cli import CACHE_HOME, command


def interrupt_after_first_records(args: list, metrics, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=str(CACHE_HOME))
    proc = subprocess.Popen(command() + ["train", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    deadline = time.time() + timeout
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("trainer, extra, unit", [
    ("fused", ["algo.total_timesteps=307200"], "update"),
    pytest.param("sync", ["scheduler=fixed", "scheduler.num_shards=2", "algo.total_timesteps=400000"], "round",
                 marks=pytest.mark.slow),  # the same flag check as the fused loop's
])
def test_ctrl_c_checkpoints_says_how_to_resume_and_exits_130(tmp_path, trainer, extra, unit):
    interrupted(tmp_path, trainer, extra, unit)


def interrupted(tmp_path, trainer: str, extra: list, unit: str) -> tuple:
    """Interrupt a run after its first records and check what it left: `(run dir, step)`."""
    run = tmp_path / "run"
    args = [f"trainer={trainer}", f"run.dir={run}", "run.progress=false", "run.tensorboard=false", *extra]
    out = interrupt_after_first_records(args, run / "metrics.jsonl")
    assert out.returncode == 130, out.stderr[-2000:]
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"interrupted at {unit} ")
    assert lines[0].endswith(f"continue with jaxrl-dist train run.resume={run}")
    step = int(lines[0].split()[3].rstrip(";"))
    saved = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and saved[-1] == step > 0
    assert not (run / "summary.json").exists()
    return run, step


@pytest.mark.slow  # the resume itself is checked for killed runs in test_checkpoint
def test_an_interrupted_run_resumes_from_its_checkpoint(tmp_path):
    run, step = interrupted(tmp_path, "fused", ["algo.total_timesteps=307200"], "update")
    env = dict(os.environ, XDG_CACHE_HOME=str(CACHE_HOME))
    done = subprocess.run(command() + ["train", f"run.resume={run}", "run.progress=false"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "summary.json").read_text())["resumed_at_update"] == step

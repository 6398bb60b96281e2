"""Ctrl-C: the run says at once that it will stop, saves a checkpoint, prints one line
with the `run.resume=` command, exits 130, and resumes from where it stopped; a second
Ctrl-C stops it where it is."""
from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time

import pytest

from test_cli import cli_env, command

from jaxrl_dist.trainers.checkpoint import saved_steps
from jaxrl_dist.trainers.interrupt import acknowledgement


def interrupt_after_first_records(args: list, metrics, timeout: float = 120,
                                  sig: int = signal.SIGINT) -> subprocess.CompletedProcess:
    env = cli_env()
    proc = subprocess.Popen(command() + ["train", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    deadline = time.time() + timeout
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("trainer, extra, unit", [
    ("fused", ["algo.total_timesteps=307200"], "update"),
    pytest.param("sync", ["scheduler=fixed", "scheduler.num_shards=2", "algo.total_timesteps=400000"], "round",
                 marks=pytest.mark.slow),  # the same flag check as the fused loop's
])
def test_ctrl_c_checkpoints_says_how_to_resume_and_exits_130(tmp_path, trainer, extra, unit):
    interrupted(tmp_path, trainer, extra, unit)


def test_sigterm_checkpoints_and_exits_143(tmp_path):
    """What a cluster's scheduler sends before it takes the machine back: the run saves
    and stops as on Ctrl-C, and says which signal it was."""
    interrupted(tmp_path, "fused", ["algo.total_timesteps=307200"], "update", signal.SIGTERM)


def interrupted(tmp_path, trainer: str, extra: list, unit: str, sig: int = signal.SIGINT) -> tuple:
    """Interrupt a run after its first records and check what it left: `(run dir, step)`."""
    run = tmp_path / "run"
    args = [f"trainer={trainer}", f"run.dir={run}", "run.progress=false", "run.tensorboard=false", *extra]
    out = interrupt_after_first_records(args, run / "metrics.jsonl", sig=sig)
    assert out.returncode == 128 + sig, out.stderr[-2000:]
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) == 2 and lines[0] == acknowledgement({"fused": "chunk"}.get(trainer, unit), sig)
    assert lines[1].startswith(f"interrupted at {unit} ")
    assert lines[1].endswith(f"continue with jaxrl-dist train run.resume={run}")
    step = int(lines[1].split()[3].rstrip(";"))
    saved = saved_steps(run)
    assert saved and saved[-1] == step > 0
    assert not (run / "summary.json").exists()
    return run, step


@pytest.mark.slow  # the resume itself is checked for killed runs in test_checkpoint
def test_an_interrupted_run_resumes_from_its_checkpoint(tmp_path):
    run, step = interrupted(tmp_path, "fused", ["algo.total_timesteps=307200"], "update")
    env = cli_env()
    done = subprocess.run(command() + ["train", f"run.resume={run}", "run.progress=false"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "summary.json").read_text())["resumed_at_update"] == step


def output_lines(proc) -> queue.Queue:
    """`proc`'s output lines as they come (None at its end), read by a thread."""
    lines: queue.Queue = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def next_line(lines: queue.Queue, starts: str, seen: list) -> str:
    """The next line starting with `starts` (every line read kept in `seen`)."""
    while (line := lines.get(timeout=300)) is not None:
        seen.append(line)
        if line.startswith(starts):
            return line
    raise AssertionError(f"no line starting {starts!r} in:\n" + "\n".join(seen[-30:]))


def test_ctrl_c_mid_chunk_is_acknowledged_at_once_and_twice_stops_there(tmp_path):
    """One chunk for the whole run (`run.log_chunks=1`, seconds of device work): the first
    Ctrl-C is answered while the chunk runs, and the second stops the run inside it,
    before it has written a record."""
    run = tmp_path / "run"
    env = cli_env()
    args = ["train", "trainer=fused", "algo.total_timesteps=307200", "run.log_chunks=1", f"run.dir={run}",
            "run.tensorboard=false"]
    proc = subprocess.Popen(command() + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    seen: list = []
    try:
        lines = output_lines(proc)
        next_line(lines, "steps 0/307200 ", seen)  # the logs are open: the chunk is next
        time.sleep(0.5)  # into the chunk's call, past the check before it
        proc.send_signal(signal.SIGINT)
        next_line(lines, "Ctrl-C: ", seen)
        assert seen[-1] == acknowledgement("chunk")
        proc.send_signal(signal.SIGINT)
        last = next_line(lines, "stopped at once", seen)
        assert proc.wait(timeout=60) == 130, "\n".join(seen)
    finally:
        proc.kill()
        proc.wait()
    # killed inside the first chunk: no checkpoint yet, and the line says so
    assert last.endswith(f"no checkpoint written yet; start it again with jaxrl-dist train run.resume={run}")
    assert not [x for x in seen if x.startswith("steps ") and not x.startswith("steps 0/")]
    assert not (run / "metrics.jsonl").exists()  # the chunk never ended: no record, no file
    assert not (run / "summary.json").exists()


def test_ctrl_c_on_a_vmap_sweep_leaves_each_job_what_a_job_writes(tmp_path):
    """A group interrupted after its first records: each job keeps its checkpoint and
    still gets its `.hydra/` and job log (Hydra's job, run for it), and the sweep exits 130."""
    sweep = tmp_path / "sweep"
    args = ["-m", "hydra/launcher=vmap", "trainer=fused", "seed=0,1", "algo.total_timesteps=307200",
            f"run.dir={sweep}", "run.progress=false", "run.tensorboard=false"]
    out = interrupt_after_first_records(args, sweep / "0" / "metrics.jsonl")
    assert out.returncode == 130, out.stderr[-2000:]
    assert "interrupted: each job of group 1/1 saved a checkpoint" in out.stderr
    for job in (sweep / "0", sweep / "1"):
        assert saved_steps(job)
        assert (job / ".hydra" / "config.yaml").is_file() and (job / "train.log").is_file()
        assert "interrupted in a group; continue with run.resume=" in (job / "train.log").read_text()


def test_a_vmap_group_stopped_at_once_leaves_each_job_its_overrides(tmp_path, monkeypatch):
    """A second Ctrl-C exits where the group is, before Hydra's `run_job` writes `.hydra/`:
    each job's overrides are written before the group trains, so `report` can tell the
    jobs apart (without them every job read as the same config)."""
    from omegaconf import OmegaConf

    from jaxrl_dist.cli import vmap

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    def exits(code):
        raise SystemExit(code)

    monkeypatch.setattr(vmap, "train_group", stopped)
    monkeypatch.setattr(vmap, "exit_now", exits)
    jobs = [([f"algo.lr={lr}"], OmegaConf.create({"hydra": {
        "sweep": {"dir": str(tmp_path), "subdir": str(i)}, "output_subdir": ".hydra",
        "overrides": {"task": [f"algo.lr={lr}", "seed=0"]}}})) for i, lr in enumerate((0.1, 0.2))]
    with pytest.raises(SystemExit):
        vmap._run_group(None, jobs, [None, None], [0, 1], "group 1/1", {}, {})
    for i, lr in enumerate((0.1, 0.2)):
        assert OmegaConf.load(tmp_path / str(i) / ".hydra" / "overrides.yaml") == [f"algo.lr={lr}", "seed=0"]


def test_ctrl_c_on_a_basic_multirun_says_its_later_jobs_did_not_run(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "trainer=fused", "seed=0,1", "algo.total_timesteps=307200", f"run.dir={sweep}",
            "run.progress=false", "run.tensorboard=false"]
    out = interrupt_after_first_records(args, sweep / "0" / "metrics.jsonl")
    assert out.returncode == 130, out.stderr[-2000:]
    assert "; the multirun stops here: no later job of it runs" in out.stderr
    assert saved_steps(sweep / "0") and not (sweep / "1").exists()

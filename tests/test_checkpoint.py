"""Checkpoints: round trip, and a killed run resumed to the same final params."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_dist.trainers import checkpoint, fused
from jaxrl_dist.config import ConfigError, from_dict
from jaxrl_dist.envs import make_env
from test_cli import cli_env, command

# 1000 updates of 4 envs x 32 steps; a checkpoint every 100 (chunks of 50)
KILL_ARGS = ["trainer=fused", "algo.num_steps=32", "algo.total_timesteps=128000", "run.checkpoint_every=100",
             "run.progress=false", "run.tensorboard=false"]


finished_steps = checkpoint.saved_steps  # committed steps (orbax renames a step's tmp dir when done)


def start_and_kill(run_dir: Path, timeout: float = 240) -> int:
    """Start a run, SIGKILL it right after its first checkpoint; returns that step."""
    proc = subprocess.Popen(command() + ["train", f"run.dir={run_dir}"] + KILL_ARGS,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=cli_env())
    deadline = time.monotonic() + timeout
    try:
        while not finished_steps(run_dir):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return finished_steps(run_dir)[-1]


def read_metrics(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_cli(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run(command() + ["train"] + list(args), capture_output=True, text=True,
                         timeout=300, env=cli_env())
    assert out.returncode == 0, out.stderr
    return out


def test_killed_run_resumes_to_identical_params(tmp_path):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    step = start_and_kill(killed)
    assert 0 < step < 1000 and not (killed / "summary.json").exists()

    train_cli(f"run.resume={killed}", "run.progress=false")
    train_cli(f"run.dir={whole}", *KILL_ARGS)
    resumed = json.loads((killed / "summary.json").read_text())
    reference = json.loads((whole / "summary.json").read_text())
    assert resumed["resumed_at_update"] == step
    assert resumed["params_sha256"] == reference["params_sha256"]
    assert resumed["final_return"] == reference["final_return"]

    # metrics past the checkpoint were rewritten, not duplicated
    records = read_metrics(killed)
    assert [r["update"] for r in records] == list(range(1, 1001))
    assert [r["loss"] for r in records] == [r["loss"] for r in read_metrics(whole)]


def small_cfg(run_dir, **env):
    return from_dict({"env": {"num_envs": 4, **env},
                      "algo": {"num_steps": 16, "total_timesteps": 64 * 40},
                      "run": {"dir": str(run_dir), "checkpoint_every": 10, "progress": False,
                              "tensorboard": False, "compile_cache": False}})


def test_checkpoint_round_trip(tmp_path):
    cfg = small_cfg(tmp_path)
    env = make_env("CartPole-v1", 4)
    setup = fused.make_setup(cfg, env.spec)
    runner = fused.init_runner(setup, env, 0)
    runner = runner._replace(update=runner.update + 7)
    ckpt = checkpoint.Checkpointer(tmp_path)
    assert ckpt.save(runner) == 7 and ckpt.latest_step() == 7
    template = fused.init_runner(setup, env, 1)
    restored = ckpt.restore(template)
    ckpt.close()
    assert jax.tree.structure(restored) == jax.tree.structure(runner)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(runner)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_new_run_refuses_a_dir_with_checkpoints(tmp_path):
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.trainers.rundir import prepare_run

    (tmp_path / "checkpoints" / "10").mkdir(parents=True)
    with pytest.raises(ConfigError, match="run.resume"):
        prepare_run(small_cfg(tmp_path))


def test_envpool_resume_resets_envs_and_finishes(tmp_path):
    """envpool state cannot be saved: the resumed run resets envs and completes."""
    pytest.importorskip("envpool")
    from jaxrl_dist.trainers.runner import train

    cfg = small_cfg(tmp_path, id="CartPole-v1", suite="envpool")
    first = train(cfg)
    assert finished_steps(tmp_path)[-1] == first["num_updates"] == 40
    for step in finished_steps(tmp_path)[-2:]:  # as if killed after update 20
        shutil.rmtree(tmp_path / "checkpoints" / str(step))
    from jaxrl_dist.config import ConfigError

    for given, key in (({"algo": {"lr": 0.5}}, "algo.lr"), ({"algo": {"total_timesteps": 64 * 80}}, "algo.total_timesteps"),
                       ({"run": {"dir": str(tmp_path / "other")}}, "run.dir")):  # not silently the saved run's
        with pytest.raises(ConfigError, match=f"^{key}"):
            train(from_dict({**given, "run": {"resume": str(tmp_path), **given.get("run", {})}}))
    resumed = train(from_dict({"algo": {"num_steps": 16},  # the saved value: taken
                               "run": {"resume": str(tmp_path), "progress": False,
                                       "compile_cache": False}}))
    assert resumed["resumed_at_update"] == 20
    assert [r["update"] for r in read_metrics(tmp_path)] == list(range(1, 41))
    assert finished_steps(tmp_path)[-1] == 40


def test_a_run_dir_without_a_checkpoint_yet_resumes_from_the_start_saying_so(tmp_path):
    """Stopped before its first checkpoint (an unfinished write is a temporary directory):
    `restore_latest` gives the fresh state back with one line; `eval` refuses the dir
    without starting orbax."""
    from jaxrl_dist.evaluation import saved_state

    (tmp_path / checkpoint.CHECKPOINT_SUBDIR / "4.orbax-checkpoint-tmp").mkdir(parents=True)
    assert checkpoint.saved_steps(tmp_path) == []
    said, fresh = [], {"x": np.zeros(2)}
    ckpt = checkpoint.Checkpointer(tmp_path)
    try:
        assert ckpt.restore_latest(fresh, said.append) is fresh
    finally:
        ckpt.close()
    assert said == [f"run.resume: no checkpoint in {tmp_path.resolve() / 'checkpoints'} yet (the run stopped "
                    "before its first): training from the start"]
    with pytest.raises(ConfigError, match="no checkpoint in"):
        saved_state(from_dict({"trainer": "fused"}), tmp_path)

"""The data-parallel learner (`trainer.devices`, `core.mesh`) and multi-process runs
(`trainer.distributed.*`, `jaxrl-dist launch`), on CPU devices forced with
`--xla_force_host_platform_device_count` in fresh processes.

Tolerance: after 10 updates a mesh run's params equal one device's to 1e-5
(measured: 1.2e-7, one float32 ulp at the params' scale); the arithmetic is the
same, only the order of the all-reduced sums differs.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxrl_dist.config import DistributedConfig
from jaxrl_dist.trainers import distributed

TOLERANCE = 1e-5

MESH_SCRIPT = """
import contextlib
import json
import jax, numpy as np
from jax.flatten_util import ravel_pytree
from jaxrl_dist.config import AlgoConfig, Config, ConfigError, EnvConfig, TrainerConfig
from jaxrl_dist.envs import make_env
from jaxrl_dist.trainers import fused

def params(devices, seed_axis=1, seeds=1, envs=16):
    cfg = Config(env=EnvConfig(num_envs=envs), algo=AlgoConfig(total_timesteps=envs * 32 * 10, num_steps=32),
                 num_seeds=seeds, trainer=TrainerConfig(devices=str(devices), seed_axis=seed_axis))
    env = make_env(cfg.env.id, envs * seeds)
    setup = fused.make_setup(cfg, env.spec)
    where = None if setup.mesh is None else fused.runner_shardings(setup, env)
    runner = jax.jit(lambda: fused.init_runner(setup, env, 0), out_shardings=where)()
    runner, _ = fused.make_train_chunk(setup, env, 10)(runner)
    return np.asarray(ravel_pytree(runner.train.params)[0]).tolist(), setup.mesh and dict(setup.mesh.shape)

def error(**kw):
    try:
        params(**kw)
    except ConfigError as err:
        return str(err)

import sys
cases = {"one": lambda: params(1), "two": lambda: params(2), "all": lambda: params("all"),
         "seeds_one": lambda: params(1, seeds=2), "seeds_x_data": lambda: params(4, seed_axis=2, seeds=2),
         "too_many": lambda: error(devices=8), "indivisible": lambda: error(devices=4, envs=6)}
print(json.dumps({name: cases[name]() for name in sys.argv[1:]}))
"""


def forced(devices: int) -> dict:
    flags = os.environ.get("XLA_FLAGS", "")
    return dict(os.environ, XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={devices}")


def mesh_runs(*names: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", MESH_SCRIPT, *names], env=forced(4), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_follows(out: dict, name: str, reference: str, shape: dict) -> None:
    assert out[name][1] == shape
    assert np.abs(np.array(out[name][0]) - np.array(out[reference][0])).max() <= TOLERANCE


def test_mesh_params_follow_one_device_and_bad_counts_are_one_line():
    """fused, in this process (conftest makes each core a device): both devices on the
    data axis against one device; counts that do not fit."""
    import jax

    if jax.device_count() < 2:
        pytest.skip("one device: the slow tests below force four")
    namespace: dict = {}
    exec(MESH_SCRIPT.split("import sys\n")[0], namespace)
    one, two = namespace["params"](1), namespace["params"](2)
    assert two[1] == {"seeds": 1, "data": 2}
    assert np.abs(np.array(two[0]) - np.array(one[0])).max() <= TOLERANCE
    count = jax.device_count()
    assert namespace["error"](devices=count + 1) == (
        f"trainer.devices={count + 1}: only {count} device(s) present (cpu); on CPU, "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={count + 1} makes {count + 1}")
    assert namespace["error"](devices=2, envs=3).startswith(
        "env.num_envs=3 is not divisible by the data axis: 2 device(s)")


@pytest.mark.slow  # four compiles in a fresh process: about 60 s here
def test_four_data_devices_and_a_seeds_x_data_mesh_follow_one_device():
    out = mesh_runs("one", "all", "seeds_one", "seeds_x_data", "too_many", "indivisible")
    assert_follows(out, "all", "one", {"seeds": 1, "data": 4})
    assert_follows(out, "seeds_x_data", "seeds_one", {"seeds": 2, "data": 2})
    assert out["too_many"].startswith("trainer.devices=8: only 4 device(s) present (cpu); on CPU, XLA_FLAGS=")
    assert out["indivisible"].startswith("env.num_envs=6 is not divisible by the data axis: 4 device(s)")


def lowerings(caplog, run) -> tuple:
    """`(summary, the names of the programs lowered)` of `run()`, a training run: JAX logs
    each lowering (a compile or a compile-cache load) at DEBUG, from whichever thread."""
    import logging

    with caplog.at_level(logging.DEBUG, logger="jax._src.interpreters.pxla"):
        summary = json.loads(Path(run().run_dir, "summary.json").read_text())
    return summary, [r.getMessage().split()[1] for r in caplog.records if r.getMessage().startswith("Compiling jit(")]


def test_a_round_run_records_its_learner_mesh_and_processes(tmp_path, caplog):
    """`summary.json` has `mesh` and `processes` whichever trainer ran (here sync, both
    devices), and its round and update are each lowered once: the first round starts from
    the state's placement on the mesh, as every later one does. A run over several
    processes is refused unless it spans every device."""
    import jax

    from jaxrl_dist.config import ConfigError, from_dict
    from jaxrl_dist.trainers.runner import train

    if jax.device_count() < 2:
        pytest.skip("one device")
    cfg = from_dict({"trainer": {"name": "sync", "devices": 2}, "algo": {"total_timesteps": 2 * 2 * 8 * 32,
                     "num_steps": 32}, "backend": {"envs_per_shard": 8}, "run": {"progress": False},
                     "scheduler": {"name": "fixed", "num_shards": 2}})
    summary, lowered = lowerings(caplog, lambda: train(cfg, tmp_path / "run"))
    assert summary["mesh"] == {"seeds": 1, "data": 2} and summary["processes"] == 1
    assert (lowered.count("jit(round_fn)"), lowered.count("jit(learn)")) == (1, 1), lowered
    # read on one device, as `eval` and `load_policy` read any run (a plain process has one)
    read = subprocess.run([sys.executable, "-c", "from jaxrl_dist.evaluation import latest_state; "
                           f"print(latest_state({str(tmp_path / 'run')!r})[0])"], capture_output=True, text=True,
                          env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}, timeout=120)
    assert read.returncode == 0 and read.stdout.split()[-1] == "2", read.stderr[-2000:]
    from jaxrl_dist.envs import make_env
    from jaxrl_dist.trainers.runner import state_template

    seeds = from_dict({"num_seeds": 2, "trainer": {"devices": 2, "seed_axis": 2}})
    assert state_template(seeds, make_env("CartPole-v1", 8)).train.params  # a seed axis, read on one device
    with pytest.raises(ConfigError, match=r"^trainer.devices=1: a run over 2 processes spans every process's "
                       r"devices; set trainer.devices=all \(jaxrl-dist launch sets it\)$"):
        from_dict({"trainer": {"distributed": {"coordinator": "127.0.0.1:1", "num_processes": 2}}})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)  # a guard against a hang (the message says which timeout fired), not a speed check
def test_an_unreachable_coordinator_is_one_line_within_the_timeout():
    d = DistributedConfig(coordinator=f"127.0.0.1:{_free_port()}", num_processes=2, process_id=1,
                          timeout_s=1)
    with pytest.raises(distributed.DistributedError, match=r"not reachable within trainer.distributed.timeout_s=1 s"):
        distributed.initialize(d)


def _children(pid: int) -> list:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_launch_checks_the_config_once_before_it_starts_a_process(tmp_path):
    out = subprocess.run([sys.executable, "-m", "jaxrl_dist", "launch", "--processes", "2", "trainer=fused",
                          "algo.network=nope", f"run.dir={tmp_path / 'run'}"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: algo.network: unknown network 'nope' (registered: auto, cnn, gru, lstm, mlp)"]
    assert not (tmp_path / "run").exists()


LAUNCH_TWO = [sys.executable, "-m", "jaxrl_dist", "launch", "--processes", "2", "--devices-per-process", "1",
              "trainer=fused", "trainer.devices=2", "run.progress=false"]


def _launched(run: Path, *overrides: str) -> tuple:
    """`(launcher, its two processes' PIDs)`: a 2-process run of `overrides`, once both
    processes exist (the launcher's stdout and stderr are pipes)."""
    launcher = subprocess.Popen([*LAUNCH_TWO, *overrides, f"run.dir={run}"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=run.parent)
    deadline = time.monotonic() + 120
    while len(_children(launcher.pid)) < 2 and time.monotonic() < deadline and launcher.poll() is None:
        time.sleep(0.2)
    return launcher, _children(launcher.pid)


def _ended(launcher, timeout: float) -> str:
    """The launcher's stderr once it exits; killed if it has not within `timeout`."""
    try:
        return launcher.communicate(timeout=timeout)[1]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()


LONG = ("algo.total_timesteps=5000000", "env.num_envs=8")


def test_launch_stops_the_others_when_a_process_dies(tmp_path):
    """A killed process ends the run with one line; no process is left waiting for it."""
    launcher, workers = _launched(tmp_path / "run", *LONG)
    try:
        assert len(workers) == 2, "the launcher did not start two processes"
        time.sleep(3)  # both are importing or joining
        os.kill(workers[1], signal.SIGKILL)
    finally:
        err = _ended(launcher, 60)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines == [f"error: jaxrl-dist launch: process 1 (pid {workers[1]}) exited with code -9; its log: "
                     f"{tmp_path / 'run' / 'process_1' / 'output.log'}; stopped the other 1 running process(es)"]
    assert launcher.returncode == 1
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)


def test_the_processes_die_with_a_killed_launcher(tmp_path):
    """The processes run in their own session (the launcher hands them Ctrl-C), so a
    launcher killed outright takes them with it rather than leaving them training."""
    launcher, workers = _launched(tmp_path / "run", *LONG)
    try:
        assert len(workers) == 2, "the launcher did not start two processes"
        time.sleep(3)  # both are importing or joining
        launcher.kill()
        launcher.wait()  # its pipes stay open while process 0 lives
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
    finally:
        for pid in workers:  # whatever the outcome, nothing left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _ended(launcher, 30)


def _stopped_while_training(run: Path, who: str, sig: int) -> tuple:
    """A 2-process CartPole run sent `sig` once training has begun, to `who` (`launcher`,
    or `process 1` alone): `(launcher's exit code, its stderr, the processes' PIDs)`."""
    # 25 chunks of one update, ~0.4 s each
    launcher, workers = _launched(run, "algo.total_timesteps=25600", "env.num_envs=8", "run.log_chunks=2000")
    try:
        deadline = time.monotonic() + 180
        while not (run / "metrics.jsonl").is_file() and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.2)
        started = len(workers) == 2 and (run / "metrics.jsonl").is_file()
        if started:
            os.kill(launcher.pid if who == "launcher" else workers[1], sig)
    finally:
        err = _ended(launcher, 120)
    assert started, f"the run did not start training (launcher exit {launcher.returncode}): {err[-3000:]}"
    return launcher.returncode, err, workers


@pytest.mark.parametrize("who, sig", [("process 1", signal.SIGINT),  # the launcher's with a resume: ~75 s
                                      pytest.param("launcher", signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_stop_request_stops_every_process_at_one_checkpoint(tmp_path, who, sig):
    """The processes agree before each chunk whether to stop or save: a Ctrl-C (SIGINT)
    that reached process 1 alone, or a SIGTERM to the launcher alone (handed to each
    process), stops both after the same chunk with one checkpoint that every process
    wrote its part of; the launcher exits as one `train` would (no collective left
    waiting for a process that went on to the next chunk, no process left running)."""
    code, err, workers = _stopped_while_training(tmp_path / "run", who, sig)
    assert code == 128 + sig, err[-3000:]  # 130 for Ctrl-C, 143 for SIGTERM
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
    assert "error:" not in err and "Traceback" not in err, err[-3000:]
    again = f"jaxrl-dist launch --processes 2 --devices-per-process 1 run.resume={tmp_path / 'run'}"
    assert err.rstrip().endswith(f"checkpoint saved; continue with {again}"), err[-3000:]
    assert _params(tmp_path / "run").size  # the checkpoint is whole: both processes' parts and the manifest
    if who == "launcher":  # the printed command continues it, with the saved config and a new coordinator
        resumed = subprocess.run([sys.executable, "-m", "jaxrl_dist", *again.split()[1:]], capture_output=True,
                                 text=True, timeout=300, cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["resumed_at_update"] > 0 and summary["num_updates"] == 25 and summary["processes"] == 2


def _params(run_dir: Path) -> np.ndarray:
    from jax.flatten_util import ravel_pytree

    from jaxrl_dist.evaluation import latest_state

    return np.asarray(ravel_pytree(latest_state(run_dir)[1].train.params)[0])


TEN_UPDATES = ["trainer=fused", "algo.total_timesteps=10240", "env.num_envs=32", "algo.num_steps=32",
               "run.checkpoint_every_s=0", "run.progress=false", "trainer.devices=all"]


@pytest.mark.slow  # three processes compile in turn: about 80 s here
def test_two_processes_of_two_devices_match_one_process_of_four(tmp_path):
    cli = [sys.executable, "-m", "jaxrl_dist"]
    two = subprocess.run([*cli, "launch", "--processes", "2", "--devices-per-process", "2", *TEN_UPDATES,
                          f"run.dir={tmp_path / 'two'}"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run([*cli, "train", *TEN_UPDATES, f"run.dir={tmp_path / 'one'}"], env=forced(4),
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["mesh"] == {"seeds": 1, "data": 4}
    assert json.loads((tmp_path / "two" / "process_1" / "summary.json").read_text())["processes"] == 2
    assert np.abs(_params(tmp_path / "two") - _params(tmp_path / "one")).max() <= TOLERANCE


@pytest.mark.slow  # a whole CartPole run on two devices: about 2 minutes here
def test_a_data_parallel_run_learns_cartpole(tmp_path):
    run = subprocess.run([sys.executable, "-m", "jaxrl_dist", "train", "trainer=fused", "env=cartpole",
                          "trainer.devices=2", "env.num_envs=64", f"run.dir={tmp_path / 'run'}",
                          "run.progress=false"], env=forced(2), capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["mesh"] == {"seeds": 1, "data": 2}
    assert summary["final_return"] >= 475


@pytest.mark.slow  # two round-trainer runs: about 60 s here
def test_the_round_learner_on_two_devices_follows_one(tmp_path):
    script = """
import json, sys
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxrl_dist.config import from_dict
from jaxrl_dist.evaluation import latest_state
from jaxrl_dist.trainers.runner import train
out = {}
for d in (1, 2):
    cfg = from_dict({"trainer": {"name": "sync", "devices": d}, "algo": {"total_timesteps": 4 * 8 * 32 * 10,
                     "num_steps": 32}, "backend": {"name": "local", "envs_per_shard": 8},
                     "scheduler": {"name": "fixed", "num_shards": 4}, "run": {"progress": False}})
    train(cfg, f"{sys.argv[1]}/{d}")
    out[d] = np.asarray(ravel_pytree(latest_state(f"{sys.argv[1]}/{d}")[1].train.params)[0]).tolist()
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=forced(2), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert np.abs(np.array(out["1"]) - np.array(out["2"])).max() <= TOLERANCE


@pytest.mark.slow  # the round test above counts the sync trainer's lowerings; this, async's (~12 s)
def test_an_async_run_on_two_devices_lowers_its_programs_once(tmp_path, caplog):
    import jax

    from jaxrl_dist.config import from_dict
    from jaxrl_dist.trainers.runner import train

    if jax.device_count() < 2:
        pytest.skip("one device")
    cfg = from_dict({"trainer": {"name": "async", "devices": 2}, "algo": {"total_timesteps": 4 * 8 * 32 * 4,
                     "num_steps": 32}, "backend": {"envs_per_shard": 8}, "run": {"progress": False}})
    summary, lowered = lowerings(caplog, lambda: train(cfg, tmp_path / "run"))
    assert summary["mesh"] == {"seeds": 1, "data": 2}
    assert (lowered.count("jit(_run_one)"), lowered.count("jit(learn_chunks)")) == (1, 1), lowered

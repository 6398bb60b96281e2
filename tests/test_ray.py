"""The Ray backend on a real Ray runtime, bound to loopback addresses only.

Small CartPole runs: the same seed and config train the same parameters as
the local backend, a killed actor is replaced (its shard retried; an envpool
slot restarts its envs), failures and timeouts end the round with
`BackendError` naming the slot, and a two-node cluster (two `ray start`
processes on 127.0.0.2 and 127.0.0.3) runs shards on both.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_phases import assert_phases_add_up

ray = pytest.importorskip("ray")
# Ray starts its processes by fork + exec, which JAX's fork warning cannot tell apart
pytestmark = pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")

from jaxrl_dist.trainers import runner  # noqa: E402
from jaxrl_dist.backends import BackendError, Job, ShardTask, make_backend  # noqa: E402
from jaxrl_dist.backends.ray_backend import LOOPBACK_IP, RayBackend  # noqa: E402
from jaxrl_dist.config import from_dict  # noqa: E402

NUM_STEPS, SHARDS, ENVS = 16, 2, 4
TIMESTEPS = SHARDS * ENVS * NUM_STEPS * 3  # three rounds


@pytest.fixture(autouse=True)
def _quiet_ray(monkeypatch):
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the host


def config(backend: dict, **algo):
    return from_dict({
        "trainer": "sync", "backend": {"max_shards": 4, "envs_per_shard": ENVS, **backend},
        "scheduler": {"num_shards": SHARDS},
        "algo": {"total_timesteps": TIMESTEPS, "num_steps": NUM_STEPS, **algo},
        "run": {"progress": False, "tensorboard": False, "compile_cache": False},
    })


def train(cfg, tmp_path: Path, name: str) -> dict:
    return runner.train(cfg, tmp_path / name)


@pytest.fixture(scope="module")
def local_summary(tmp_path_factory):
    return train(config({"name": "local"}), tmp_path_factory.mktemp("local"), "run")


@pytest.fixture
def shard_workers(monkeypatch):
    """The `ShardInfo.worker` names (node ip/node id/actor id) of every round run."""
    workers = set()
    run_round = RayBackend.run_round

    def recording(self, *args):
        result = run_round(self, *args)
        workers.update(s.worker for s in result.shards)
        return result

    monkeypatch.setattr(RayBackend, "run_round", recording)
    return workers


def test_ray_trains_like_local_on_a_runtime_it_starts(local_summary, tmp_path, shard_workers, monkeypatch, caplog):
    assert not ray.is_initialized()
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)  # Ray's own default, which it warns of when it picks it
    summary = train(config({"name": "ray"}), tmp_path, "ray")
    assert not ray.is_initialized()  # the backend shut down the runtime it started
    assert "Token authentication" not in caplog.text  # Ray's notice of its default, on every start
    assert len(shard_workers) == SHARDS  # one actor per slot, kept across rounds
    assert all(w.startswith(LOOPBACK_IP + "/") for w in shard_workers), shard_workers
    assert summary["params_sha256"] == local_summary["params_sha256"]
    assert summary["rounds"] == local_summary["rounds"] == 3
    assert summary["retries"] == 0 and summary["slot_resets"] == 0
    records = [json.loads(line) for line in (tmp_path / "ray" / "metrics.jsonl").open()]
    for rec in records:
        assert rec["bytes_sent"] > 0 and rec["bytes_received"] > 0
        assert rec["dispatch_s"] >= 0 and rec["wait_s"] > 0 and rec["transfer_s"] > 0
    assert_phases_add_up(records)  # dispatch, the actors' rollouts, the wait, decoding, stacking: the wall
    assert summary["phase_seconds"]["startup_actors"] > 0  # the actors started before the first round


@pytest.mark.slow  # two runs on a Ray runtime; the phases' test above stays in the default suite
def test_a_kept_actor_pool_starts_the_next_run_warm(local_summary, tmp_path, shard_workers):
    """`backend.keep_actors` (a multirun's jobs): the second run of the process takes the
    first one's actors over, slot by slot, and ends with the same parameters."""
    try:
        first = train(config({"name": "ray", "keep_actors": True}), tmp_path, "first")
        assert ray.is_initialized()  # kept up for the next run
        actors = set(shard_workers)
        shard_workers.clear()
        second = train(config({"name": "ray", "keep_actors": True}), tmp_path, "second")
    finally:
        ray.shutdown()
    assert set(shard_workers) == actors  # the same actor processes
    assert first["params_sha256"] == second["params_sha256"] == local_summary["params_sha256"]


# -- one loopback runtime for the backend-driven tests ------------------------


def _parts(cfg, suite: str = "gymnax"):
    """A job and its first rounds' inputs, built as the round trainer builds them."""
    from jaxrl_dist.core.learner import init_train
    from jaxrl_dist.trainers.rounds import init_table, shard_learner
    from jaxrl_dist.backends.shard import ShardProgram, spec_from_config

    spec = spec_from_config(cfg, suite, False)
    program = ShardProgram(spec)
    params = init_train(shard_learner(cfg, program, SHARDS), cfg.seed).params
    return Job(spec, cfg.seed, "test", program), params, lambda: init_table(program, cfg.seed, 4)


def _tasks(cfg, round_: int, n: int = SHARDS):
    from jaxrl_dist.backends.shard import round_keys

    keys, _ = round_keys(cfg.seed, round_, np.arange(n))
    return [ShardTask(s, keys[s]) for s in range(n)]


def _same(a, b):
    import jax

    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class TestOnARuntime:
    """Rounds driven through `RayBackend` on a runtime this class starts (and the
    backend must leave running)."""

    @pytest.fixture(scope="class", autouse=True)
    def runtime(self):
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        ray.init(address="local", _node_ip_address=LOOPBACK_IP, include_dashboard=False,
                 num_cpus=4, logging_level="warning")
        yield
        ray.shutdown()

    @pytest.mark.slow  # ~24 s: a shard retried on Ray is the timeout test's below; killed actors are test_chaos.py's too
    def test_a_killed_actor_is_replaced_and_its_shard_retried(self):
        cfg = config({"name": "ray"})
        job, params, new_table = _parts(cfg)
        local, remote = make_backend(config({"name": "local"}).backend), RayBackend(cfg.backend)
        local.start(job)
        remote.start(job)
        local_table, remote_table = new_table(), new_table()
        try:
            for round_ in range(2):
                if round_ == 1:
                    ray.kill(remote.actors()[1], no_restart=True)
                tasks = _tasks(cfg, round_)
                want = local.run_round(round_, params, tasks, local_table)
                got = remote.run_round(round_, params, tasks, remote_table)
                _same((want.traj, want.bootstrap), (got.traj, got.bootstrap))
                _same(local_table.data, remote_table.data)
                assert [s.slot for s in got.shards] == [0, 1]
            assert [s.retries for s in got.shards] == [0, 1]
            assert got.shards[0].worker != got.shards[1].worker
            assert all(s.worker.startswith(LOOPBACK_IP + "/") for s in got.shards)
        finally:
            remote.close()
            local.close()
        assert ray.is_initialized()  # not the backend's runtime: left running

    @pytest.mark.slow  # envpool's reset on a new worker: test_http.py's sticky-slot test covers it by default
    def test_a_replaced_envpool_actor_resets_its_slot(self):
        """envpool slots live on their actor: its replacement starts that slot's envs afresh."""
        pytest.importorskip("envpool")
        cfg = config({"name": "ray"})
        job, params, _ = _parts(cfg, "envpool")
        backend = RayBackend(cfg.backend)
        backend.start(job)
        try:
            first = backend.run_round(0, params, _tasks(cfg, 0), None)
            assert [s.reset for s in first.shards] == [True, True]  # first sight of each slot
            ray.kill(backend.actors()[0], no_restart=True)
            again = backend.run_round(1, params, _tasks(cfg, 1), None)
        finally:
            backend.close()
        assert [(s.slot, s.reset, s.retries) for s in again.shards] == [(0, True, 1), (1, False, 0)]
        assert again.traj.obs.shape[:2] == (NUM_STEPS, SHARDS)

    def test_a_failing_shard_ends_the_round_naming_its_slot(self):
        cfg = config({"name": "ray", "max_retries": 0})
        job, params, new_table = _parts(cfg)
        other = config({"name": "ray"}, hidden_sizes=[8])  # the workers build another network
        from jaxrl_dist.backends.shard import spec_from_config

        backend = RayBackend(cfg.backend)
        backend.start(job._replace(spec=spec_from_config(other, "gymnax", False)))
        try:
            with pytest.raises(BackendError, match=r"slot 1 failed after 1 try") as err:
                backend.run_round(0, params, _tasks(cfg, 0)[1:], new_table())
        finally:
            backend.close()
        message = str(err.value)
        assert "\n" not in message and "params" in message, message

    def test_a_shard_past_its_timeout_is_retried_then_fails(self):
        cfg = config({"name": "ray", "max_retries": 1, "shard_timeout": 0.001})
        job, params, new_table = _parts(cfg)
        backend = RayBackend(cfg.backend)
        backend.start(job)
        try:
            with pytest.raises(BackendError,
                               match=r"slot 0 failed after 2 tries: no answer after 0.001 s"):
                backend.run_round(0, params, _tasks(cfg, 0, 1), new_table())
        finally:
            backend.close()


# -- a two-node cluster ----------------------------------------------------------


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _stop(procs) -> None:
    """Stop the `ray start` processes this test started, with their process groups."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + 1
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:  # SIGTERM drains for up to 30 s; the group's processes go now
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def _reset_ray_auth() -> None:
    """Make this process's Ray read the auth mode and token from the environment again."""
    try:  # Ray >= 2.5x caches both at first use
        from ray._private.authentication_test_utils import reset_auth_token_state
    except ImportError:  # a Ray without token auth
        return
    reset_auth_token_state()


@contextlib.contextmanager
def _token_auth(token: str):
    """This driver joins with `token`; after, it is as before: a later local runtime in the
    same worker must not start its head on ~/.ray/auth_token while the driver still holds
    the cached `token` (InvalidAuthToken)."""
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("RAY_AUTH_MODE", "token")
            env.setenv("RAY_AUTH_TOKEN", token)
            _reset_ray_auth()
            yield
    finally:  # the environment is as before here: Ray reads it again
        _reset_ray_auth()


@pytest.fixture
def two_nodes(tmp_path, request):
    """`127.0.0.2:PORT`: a head node and a worker node, 2 CPUs each (or the CPUs an
    indirect parameter gives), token auth on."""
    port = _free_port(LOOPBACK_IP)
    ray_cli = str(Path(sys.executable).with_name("ray"))
    # a token of the cluster's own: a fresh machine has no ~/.ray/auth_token, and `ray start` makes none
    token = secrets.token_hex(32)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    common = [f"--num-cpus={getattr(request, 'param', 2)}", "--disable-usage-stats", "--block"]
    procs = []
    with _token_auth(token):
        try:
            procs.append(subprocess.Popen(
                [ray_cli, "start", "--head", f"--node-ip-address={LOOPBACK_IP}", f"--port={port}",
                 "--include-dashboard=false", *common],
                env=env, start_new_session=True, stdout=(tmp_path / "head.log").open("w"),
                stderr=subprocess.STDOUT))
            procs.append(subprocess.Popen(
                [ray_cli, "start", f"--address={LOOPBACK_IP}:{port}", "--node-ip-address=127.0.0.3",
                 *common],
                env=env, start_new_session=True, stdout=(tmp_path / "worker.log").open("w"),
                stderr=subprocess.STDOUT))
            address = f"{LOOPBACK_IP}:{port}"
            _wait_for_nodes(address, 2, procs, tmp_path)
            yield address
        finally:
            _stop(procs)
            current = Path("/tmp/ray/ray_current_cluster")  # ours only if it names our port
            if current.exists() and current.read_text().strip().endswith(f":{port}"):
                current.unlink(missing_ok=True)


def _wait_for_nodes(address: str, n: int, procs, tmp_path, timeout: float = 90.0) -> None:
    """Block until `n` nodes are alive, checking from a short-lived driver."""
    code = ("import sys, time, ray\n"
            f"ray.init(address={address!r}, logging_level='error')\n"
            f"end = time.time() + {timeout}\n"
            f"while sum(x['Alive'] for x in ray.nodes()) < {n} and time.time() < end:\n"
            "    time.sleep(0.2)\n"
            f"sys.exit(0 if sum(x['Alive'] for x in ray.nodes()) >= {n} else 1)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=timeout + 30, env=dict(os.environ))
    if out.returncode != 0 or any(p.poll() is not None for p in procs):
        logs = "".join((tmp_path / f).read_text()[-2000:] for f in ("head.log", "worker.log"))
        pytest.fail(f"the two-node cluster did not come up:\n{out.stderr[-2000:]}\n{logs}")


def test_ray_cluster_on_two_loopback_nodes(two_nodes, local_summary, tmp_path, shard_workers):
    assert not ray.is_initialized()
    cfg = config({"name": "ray", "address": two_nodes, "num_cpus": 2.0})  # one actor per node
    summary = train(cfg, tmp_path, "ray")
    assert not ray.is_initialized()
    assert summary["params_sha256"] == local_summary["params_sha256"]
    records = [json.loads(line) for line in (tmp_path / "ray" / "metrics.jsonl").open()]
    assert len(records) == 3
    assert {w.split("/")[0] for w in shard_workers} == {"127.0.0.2", "127.0.0.3"}, shard_workers


# -- resources checked before the first round -----------------------------------


def test_a_cluster_address_nothing_answers_at_is_one_line_at_once():
    """`ray.init` would retry such an address for minutes; the probe names it in one line."""
    from jaxrl_dist.backends.ray_backend import check_reachable

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        check_reachable(f"127.0.0.1:{port}")
        check_reachable(f"ray://127.0.0.1:{port}")
    check_reachable("auto")  # Ray looks it up
    with pytest.raises(BackendError) as err:
        check_reachable(f"127.0.0.1:{port}")  # closed now
    line = str(err.value)
    assert line.startswith(f"ray: cannot join the cluster at 127.0.0.1:{port}: nothing answers") and "\n" not in line
    assert "ray start --head" in line


def test_a_cluster_too_small_is_one_line_naming_the_keys():
    """Node by node: an actor lives on one node, so 1.5 CPUs fit once on each 2-CPU node."""
    from jaxrl_dist.backends.ray_backend import ActorSize, resource_error

    two = [{"CPU": 1.0, "memory": 4e9}, {"CPU": 1.0, "memory": 4e9}]
    line = resource_error(two, ActorSize(1.0), 4, "scheduler.num_shards")
    assert line == ("backend.num_cpus=1 x 4 shards needs 4 CPUs; the Ray cluster has 2 (its 2 node(s) "
                    "hold 2 such actors at once): lower backend.num_cpus (fractions are allowed) "
                    "or scheduler.num_shards")
    assert resource_error(two, ActorSize(0.5), 4, "k") is None  # fractions fit
    assert resource_error(two, ActorSize(0.0), 64, "k") is None  # nothing reserved
    wide = [{"CPU": 2.0}, {"CPU": 2.0}]
    assert "hold 2 such actors" in resource_error(wide, ActorSize(1.5), 3, "k")
    line = resource_error(two, ActorSize(0.25, 3e9), 4, "k")
    assert "backend.memory_mb=2861.02 x 4 shards needs" in line and "or backend.memory_mb or k" in line


def test_a_state_packed_ahead_is_used_only_while_the_table_is_the_same():
    """`prepare` packs the slots' states in the learner's shadow; once the table has
    changed (a round wrote it) the round packs the current state instead."""
    import jax

    from jaxrl_dist.backends import OneSlot, SlotTable, capabilities, shard, wire

    assert capabilities(RayBackend).prepares
    spec = shard.spec_from_config(config({"name": "ray"}), "gymnax", False)
    program = shard.ShardProgram(spec)
    states = [program.init_slot(shard.slot_init_key(0, s)) for s in range(2)]
    table = SlotTable(jax.tree.map(lambda *x: np.stack(x), *states))
    backend = RayBackend(config({"name": "ray"}).backend)
    backend.prepare([0, 1], table)
    packed = backend._actor_state(1, table)
    assert isinstance(packed, wire.Packed) and packed == wire.pack_actor(table.get(1))
    backend.prepare([0, 1], table)
    table.put([0], [states[1]])  # the table the packing read is gone
    fresh = backend._actor_state(0, table)
    assert not isinstance(fresh, wire.Packed) and wire.pack_actor(fresh) == wire.pack_actor(states[1])
    assert backend._actor_state(0, None) is None  # sticky specs send no state
    one = OneSlot(states[1])  # the async trainer's one-shard table: nothing packed ahead
    assert backend._actor_state(1, one) is states[1]


@pytest.mark.parametrize("key, value", [("num_cpus", -1.0), ("memory_mb", 0), ("memory_mb", "abc")])
def test_bad_actor_sizes_are_named(key, value):
    from jaxrl_dist.config import ConfigError

    with pytest.raises(ConfigError, match=f"backend.{key}"):  # its range, or OmegaConf naming its type
        from_dict({"trainer": "sync", "backend": {"name": "ray", key: value}})


def sync_config(backend: dict, shards: int) -> object:
    return from_dict({
        "trainer": "sync", "backend": {"name": "ray", "max_shards": shards, "envs_per_shard": ENVS, **backend},
        "scheduler": {"num_shards": shards},
        "algo": {"total_timesteps": shards * ENVS * NUM_STEPS * 2, "num_steps": NUM_STEPS},
        "run": {"progress": False, "tensorboard": False, "compile_cache": False},
    })


@pytest.mark.slow
@pytest.mark.parametrize("two_nodes", [1], indirect=True)
def test_ray_resources_are_checked_before_the_first_round(two_nodes, tmp_path):
    """Two nodes of 1 CPU: 4 shards x 1 CPU is one line and exit 2 at once; 4 x 0.5 CPU
    trains; an actor that cannot be placed (its CPUs held) is reported pending."""
    from test_cli import run_cli

    out = run_cli("train", "backend=ray", f"backend.address={two_nodes}", "scheduler=fixed", "scheduler.num_shards=4",
                  "backend.max_shards=4", f"run.dir={tmp_path / 'big'}", "run.progress=false", timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "backend.num_cpus=1 x 4 shards needs 4 CPUs; the Ray cluster has 2" in lines[0]
    assert "scheduler.num_shards" in lines[0], lines
    assert not (tmp_path / "big" / "metrics.jsonl").exists()  # refused before the first round

    summary = runner.train(sync_config({"address": two_nodes, "num_cpus": 0.5}, 4), tmp_path / "half")
    assert summary["rounds"] == 2 and not ray.is_initialized()

    ray.init(address=two_nodes, logging_level="warning")
    try:
        @ray.remote(num_cpus=1)
        class Holder:  # holds one node's CPU; the other node's is held by the next one
            def ping(self):
                return 1

        holders = [Holder.options(scheduling_strategy="SPREAD").remote() for _ in range(2)]
        ray.get([h.ping.remote() for h in holders])
        cfg = sync_config({"address": two_nodes, "shard_timeout": 1.0}, 1)
        job, params, new_table = _parts(cfg)
        backend = RayBackend(cfg.backend)
        backend.start_timeout_s = 2.0
        backend.start(job._replace(max_shards=1))
        with pytest.raises(BackendError, match=r"slot 0 failed after 1 try: the actor for slot 0 is pending: "
                                               r"not started after 2 s .*has 0 of 2 CPUs free"):
            backend.run_round(0, params, _tasks(cfg, 0, 1), new_table())
        backend.close()
    finally:
        ray.shutdown()

"""Chaos: whole short CartPole runs with faults on every backend end with the
fault-free run's parameters, no chunk lost or learned twice.

Faults hit first attempts only (a retry always has a healthy path), chosen by
`faultproxy.fault_for(seed, round, slot)` for 10% of them: on HTTP, a loopback
fault proxy in front of a real `jaxrl-dist serve` delays past the 2 s shard
timeout, drops the connection or answers 500; on Ray, the actor sleeps past the
timeout, raises or exits; locally, a registered plugin backend fails the first
try. Besides: HTTP instances killed (SIGKILL) and frozen (SIGSTOP) mid-run, Ray
actors killed mid-run, and `trainer=async` at staleness 0 (bit-identical) and 2
(the bound holds, every chunk learned or dropped once). The default suite runs
the short local async case (and the proxy's own tests); the rest are `slow`.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import runs_once
from test_async import assert_every_chunk_once, config as async_config, records
from tools import chaos
from tools.faultproxy import FAULTS, FaultProxy, fault_for

from jaxrl_dist.config import from_dict
from jaxrl_dist.trainers.runner import train

STEPS, ENVS, SHARDS, SHARE = 16, 4, 4, 0.1
TIMEOUT = 2.0  # backend.shard_timeout: a delayed first attempt waits this long
TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True, scope="module")
def _plugins():
    chaos.register()


def sync_config(run_dir: Path, backend: dict, rounds: int, shards: int = SHARDS, cache: bool = False,
                trainer: str = "sync", **async_):
    """`rounds` rounds of `shards` shards (`trainer=async`: updates of `shards` chunks)."""
    return from_dict({
        "trainer": trainer,
        "backend": {"max_shards": shards, "envs_per_shard": ENVS, "shard_timeout": TIMEOUT, **backend},
        # the other trainer's keys would be an error (each reads only its own)
        **({"scheduler": {"name": "fixed", "num_shards": shards}} if trainer == "sync" else
           {"asynchronous": {"batch_chunks": shards, "actors": shards, "balance": False, **async_}}),
        "algo": {"total_timesteps": rounds * shards * ENVS * STEPS, "num_steps": STEPS},
        "run": {"dir": str(run_dir), "progress": False, "tensorboard": False, "compile_cache": cache},
    })


def expected_faults(seed: int, rounds: int, slots: int, kinds: tuple) -> dict:
    """`{(round, slot): fault}`: the first attempts `fault_for` picks in a run."""
    hits = {(r, s): fault_for(seed, str(r), str(s), SHARE, kinds) for r in range(rounds) for s in range(slots)}
    return {k: v for k, v in hits.items() if v is not None}


def at_rounds(monkeypatch, cls, actions: dict) -> list:
    """Patch `cls.run_round` to call `actions[round](backend)` just before that round's
    shards go out (for the async trainer: before a slot-0 chunk of that index); returns
    the rounds acted on."""
    done, run_round = [], cls.run_round

    def run(self, round_, params, tasks, table):
        if round_ in actions and round_ not in done and tasks[0].slot == 0:
            done.append(round_)
            actions[round_](self)
        return run_round(self, round_, params, tasks, table)

    monkeypatch.setattr(cls, "run_round", run)
    return done


def assert_rounds_whole(run_dir: Path, rounds: int, shards: int = SHARDS) -> None:
    """Every round learned from all its shards, each once: the env steps add up."""
    recs = records(run_dir)
    assert len(recs) == rounds
    assert [r["env_steps"] for r in recs] == [(i + 1) * shards * ENVS * STEPS for i in range(rounds)]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Fault-free local runs, by rounds: the parameters every faulted run must end with."""
    return runs_once(tmp_path_factory, "clean", lambda rounds, root: train(
        sync_config(root / "run", {"name": "local"}, rounds)))


# -- local: a registered plugin that wraps the local backend -------------------------


@pytest.mark.slow
@pytest.mark.parametrize("rounds, seed", [(4, 5)] + [(20, s) for s in range(4)])
def test_local_with_faulted_first_tries_ends_with_the_clean_params(tmp_path, clean, rounds, seed):
    want = expected_faults(seed, rounds, SHARDS, ("error",))
    faulted_rounds = {r for r, _ in want}
    assert faulted_rounds, "the seed must fault something"
    run = train(sync_config(tmp_path, {"name": "faulty_local", "options": {"share": SHARE, "seed": seed}},
                            rounds))
    assert run["params_sha256"] == clean(rounds)["params_sha256"]
    assert run["retries"] == SHARDS * len(faulted_rounds)  # a round's shards retry together
    assert_rounds_whole(tmp_path, rounds)
    print(json.dumps({"local_seed": seed, "faults": len(want), "faulted_rounds": len(faulted_rounds)}))


def test_async_staleness_zero_with_faults_is_the_clean_sync_run(tmp_path, clean):
    """`trainer=async` at staleness 0 on the faulty local plugin: 10% of the chunks'
    first tries fail; the parameters are the fault-free run's (the sync trainer's,
    test_async shows), bit for bit."""
    rounds, seed = 2, 4
    want = expected_faults(seed, rounds, SHARDS, ("error",))
    assert want
    run = train(sync_config(tmp_path, {"name": "faulty_local", "options": {"share": SHARE, "seed": seed}},
                            rounds, trainer="async", max_staleness=0))
    assert run["params_sha256"] == clean(rounds)["params_sha256"]
    assert run["retries"] == len(want)  # one chunk per try here
    assert run["dropped_chunks"] == 0
    assert_every_chunk_once(records(tmp_path))


@pytest.mark.slow
def test_async_above_staleness_zero_with_faults_holds_the_bound(tmp_path):
    """Staleness 2, stragglers and 10% faulted first tries: no chunk learned is older
    than the bound, and every chunk is learned or dropped exactly once."""
    bound = 2
    cfg = async_config(tmp_path, updates=16, max_staleness=bound, actors=6, balance=True, balance_every=2,
                       backend={"name": "faulty_local", "slowdown": 3.0, "slow_every": 2,
                                "options": {"share": SHARE, "seed": 0}})
    summary = train(cfg)
    recs = records(tmp_path)
    assert summary["retries"] > 0
    assert all(0 <= r["staleness_max"] <= bound for r in recs)
    assert max(int(k) for k in summary["staleness_histogram"]) <= bound
    assert_every_chunk_once(recs)


# -- HTTP: real serve instances, the fault proxy, SIGKILL and SIGSTOP ----------------


def _servers(n: int) -> list:
    from serving import Server

    servers = []
    try:
        for _ in range(n):
            servers.append(Server())
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def http_backend(urls: list, **kw) -> dict:
    from serving import TOKEN

    return {"name": "http", "urls": urls, "token": TOKEN, **kw}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 10])
def test_http_through_the_fault_proxy_ends_with_the_clean_params(tmp_path, clean, seed):
    """10% of first attempts delayed past the timeout, dropped or answered 500 by the
    proxy; every retry relayed. The faults the proxy logged are the ones chosen."""
    rounds = 12
    want = expected_faults(seed, rounds, SHARDS, FAULTS)
    assert set(want.values()) == set(FAULTS), want  # every kind of fault happens
    (server,) = _servers(1)
    proxy = None
    try:  # warm: the server compiles its program in a fault-free run with a long timeout
        warm = train(sync_config(tmp_path / "warm", http_backend([server.url], shard_timeout=60.0), 1))
        proxy = FaultProxy(server.url, tmp_path / "faults.json", share=SHARE, seed=seed,
                           fault_delay_s=TIMEOUT + 1.0)
        run = train(sync_config(tmp_path / "run", http_backend([proxy.url]), rounds))
    finally:
        log = proxy.stop() if proxy else None
        server.stop()
    assert warm["params_sha256"] == clean(1)["params_sha256"]
    assert run["params_sha256"] == clean(rounds)["params_sha256"]
    got = {(int(f["shard"].split("/")[1]), int(f["shard"].split("/")[2])): f["fault"] for f in log["injected"]}
    assert got == want
    assert log["first_attempts"] == rounds * SHARDS and log["retries"] == len(want)
    # each fault costs one retry; on a loaded machine a slow healthy try may add one
    assert run["retries"] >= len(want)
    assert_rounds_whole(tmp_path / "run", rounds)
    print(json.dumps({"http_seed": seed, "faults": len(want), "first_attempts": log["first_attempts"],
                      "retries": run["retries"], "match": True}))


@pytest.mark.slow
def test_http_instances_killed_and_frozen_mid_run(tmp_path, clean, monkeypatch):
    """Three instances: one SIGKILLed at round 3, one frozen with SIGSTOP at round 5
    (resumed with SIGCONT at the end); shards move to the one left."""
    from jaxrl_dist.backends.http import HttpBackend

    rounds = 10
    healthy, killed, frozen = servers = _servers(3)
    urls = [s.url for s in servers]
    actions = {3: lambda _: killed.stop(),
               5: lambda _: os.kill(frozen.proc.pid, signal.SIGSTOP)}
    try:
        train(sync_config(tmp_path / "warm", http_backend(urls, shard_timeout=60.0), 1, shards=3))
        done = at_rounds(monkeypatch, HttpBackend, actions)
        run = train(sync_config(tmp_path / "run", http_backend(urls), rounds))
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
        assert frozen.healthy(10.0)  # it was frozen, not broken
        for s in servers:
            s.stop()
    assert done == [3, 5]
    assert run["params_sha256"] == clean(rounds)["params_sha256"]
    assert run["retries"] > 0
    assert_rounds_whole(tmp_path / "run", rounds)
    print(json.dumps({"http_kill_freeze_retries": run["retries"]}))


@pytest.mark.slow
@pytest.mark.parametrize("bound", [0, 2])
def test_async_over_http_through_the_fault_proxy(tmp_path, bound):
    """`trainer=async` through the proxy: staleness 0 ends with the fault-free sync
    run's parameters; staleness 2 keeps its bound; every chunk learned or dropped once."""
    (server,) = _servers(1)
    proxy = None
    kw = {"updates": 8, "max_staleness": bound, "batch_chunks": 2, "actors": 2 if bound == 0 else 3}
    try:
        clean_run = train(async_config(tmp_path / "warm", backend=http_backend(
            [server.url], max_shards=3, shard_timeout=60.0), balance=False, **kw))
        proxy = FaultProxy(server.url, tmp_path / "faults.json", share=SHARE, seed=4,
                           fault_delay_s=TIMEOUT + 1.0)
        run = train(async_config(tmp_path / "run", backend=http_backend(
            [proxy.url], max_shards=3, shard_timeout=TIMEOUT), balance=False, **kw))
    finally:
        log = proxy.stop() if proxy else None
        server.stop()
    recs = records(tmp_path / "run")
    assert sum(log["faults"].values()) > 0 and run["retries"] == sum(log["faults"].values())
    if bound == 0:
        assert run["params_sha256"] == clean_run["params_sha256"]
    assert all(r["staleness_max"] <= bound for r in recs)
    assert_every_chunk_once(recs)
    print(json.dumps({"async_http_bound": bound, "faults": log["faults"], "retries": run["retries"],
                      "dropped": run["dropped_chunks"]}))


# -- Ray: actors that fault their first attempts, and actors killed ------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
@pytest.mark.parametrize("seed", [5, 10])
def test_ray_with_faults_and_killed_actors_ends_with_the_clean_params(tmp_path, clean, monkeypatch, seed):
    ray = pytest.importorskip("ray")
    from jaxrl_dist.backends.ray_backend import LOOPBACK_IP, RayBackend

    rounds = 12
    kinds = ("delay", "error", "exit")
    want = expected_faults(seed, rounds, SHARDS, kinds)
    assert set(want.values()) == set(kinds), want
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    # the actors import the fault plugin from the tests' tools
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    kills = {4: lambda b: ray.kill(b.actors()[1], no_restart=True),
             8: lambda b: [ray.kill(b.actors()[s], no_restart=True) for s in (2, 3)]}
    assert not {(4, 1), (8, 2), (8, 3)} & set(want)  # a killed actor's shard is not faulted too
    # a replaced actor loads its program from the persistent compile cache the warm run fills
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    markers = tmp_path / "markers"
    markers.mkdir()
    ray.init(address="local", _node_ip_address=LOOPBACK_IP, include_dashboard=False, num_cpus=SHARDS,
             logging_level="warning")
    try:  # one runtime for both runs (the backend leaves a runtime it did not start)
        train(sync_config(tmp_path / "warm", {"name": "ray", "shard_timeout": 60.0}, 1, cache=True))
        done = at_rounds(monkeypatch, RayBackend, kills)
        cfg = sync_config(tmp_path / "run", {"name": "faulty_ray", "options": {
            "share": SHARE, "seed": seed, "dir": str(markers), "delay_s": TIMEOUT + 1.0}}, rounds, cache=True)
        run = train(cfg)
    finally:
        ray.shutdown()
    assert done == [4, 8]
    assert chaos.injected_markers(markers) == want
    assert run["params_sha256"] == clean(rounds)["params_sha256"]
    assert run["retries"] == len(want) + 3  # one per fault, one per killed actor
    assert_rounds_whole(tmp_path / "run", rounds)
    print(json.dumps({"ray_seed": seed, "faults": len(want), "kills": 3, "retries": run["retries"]}))

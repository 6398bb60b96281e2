"""The async trainer (`trainer=async`): staleness 0 is the sync trainer, the
staleness bound holds with stragglers, no chunk is lost or learned twice (a
killed Ray actor, a dead HTTP instance, a resumed run), V-trace by hand, the
balancer, the async modeled clock, and its config errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from jaxrl_dist.trainers import asynchronous
from jaxrl_dist.scheduling import cost
from jaxrl_dist.scheduling.balance import balance
from jaxrl_dist.core import ppo
from jaxrl_dist.config import ConfigError, CostConfig, from_dict
from jaxrl_dist.trainers.checkpoint import saved_steps
from jaxrl_dist.trainers.runner import train

ENVS, STEPS, K = 4, 32, 4
PER_UPDATE = K * ENVS * STEPS


def config(run_dir: Path, trainer: str = "async", updates: int = 8, backend: dict = None,
           **async_) -> object:
    return from_dict({
        "trainer": trainer,
        "algo": {"total_timesteps": updates * PER_UPDATE, "num_steps": STEPS, "num_minibatches": 4,
                 "update_epochs": 2},
        "backend": {"name": "local", "max_shards": 8, "envs_per_shard": ENVS, **(backend or {})},
        # the other trainer's keys would be an error (each reads only its own)
        **({"scheduler": {"name": "fixed", "num_shards": K}} if trainer == "sync" else
           {"asynchronous": {"batch_chunks": K, "actors": K, "balance": False, **async_}}),
        "run": {"dir": str(run_dir), "progress": False, "tensorboard": False},
    })


def records(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_every_chunk_once(recs: list) -> None:
    """Each slot's chunks, learned or dropped, are 0, 1, 2, ... with none missing
    or repeated: none was lost and none learned twice. (A record lists its learned
    chunks, then its dropped ones, which may be older.)"""
    seen = {}
    for rec in recs:
        for slot, index, _ in rec["chunks"]:
            seen.setdefault(slot, []).append(index)
    assert seen
    for slot, indices in seen.items():
        assert sorted(indices) == list(range(len(indices))), (slot, indices)


def test_staleness_zero_is_the_sync_trainer(tmp_path):
    sync = train(config(tmp_path / "sync", trainer="sync"))
    run = train(config(tmp_path / "async", max_staleness=0, balance=True, balance_every=1))  # the default balancer
    assert run["params_sha256"] == sync["params_sha256"] and run["scheduler"] == "none"
    assert run["rounds"] == sync["rounds"] == 8 and run["env_steps"] == sync["env_steps"]
    assert run["staleness_histogram"] == {"0": 8 * K} and run["dropped_chunks"] == 0
    recs = records(tmp_path / "async")
    assert [sorted(s for s, _, _ in r["chunks"]) for r in recs] == [list(range(K))] * 8
    assert_every_chunk_once(recs)


@pytest.mark.parametrize("bound", [1, 2])
def test_staleness_never_exceeds_the_bound_with_stragglers(tmp_path, bound):
    """Every other slot 4x slower, more actors than a batch and the balancer on:
    chunks lag, some may be dropped, none learned from is older than the bound."""
    cfg = config(tmp_path, updates=24, max_staleness=bound, actors=6, balance=True, balance_every=2,
                 backend={"slowdown": 4.0, "slow_every": 2})
    summary = train(cfg)
    recs = records(tmp_path)
    assert len(recs) == summary["rounds"] and summary["env_steps"] >= 24 * PER_UPDATE  # drops count
    assert all(0 <= r["staleness_max"] <= bound for r in recs)
    assert max(int(k) for k in summary["staleness_histogram"]) <= bound
    assert sum(summary["staleness_histogram"].values()) == K * len(recs)
    assert summary["staleness_mean"] > 0  # it did run ahead of the learner
    for r in recs:  # a record's chunks: the K learned ones within the bound, then any dropped
        lags = [r["update"] - 1 - v for _, _, v in r["chunks"]]
        assert sum(lag <= bound for lag in lags) == K and len(lags) == K + r["dropped"]
    assert_every_chunk_once(recs)
    assert {"production_rate", "consumption_rate", "actors_active", "staleness_mean"} <= set(recs[-1])
    # production: what the active actors make, each a chunk in its mean time (not the chunks taken)
    for r in recs:
        assert r["production_rate"] == pytest.approx(r["actors_active"] * ENVS * STEPS / np.mean(r["shard_roundtrip_s"]))
    assert summary["cost_usd"] > 0 and summary["modeled_seconds"] > 0


# under slow: tests/test_resume.py kills async runs at 10 random points each (slow), and
# tests/test_checkpoint.py keeps one killed-run resume in the default suite
@pytest.mark.slow
def test_a_killed_run_resumes_to_the_uninterrupted_parameters(tmp_path):
    """SIGKILL mid-run, then `run.resume`: the chunks that were queued or running
    are made again from the checkpointed slot states, none lost or learned twice."""
    import signal
    import subprocess
    import time

    from test_cli import command

    from jaxrl_dist.cli.compose import load_config

    over = ["trainer=async", "asynchronous.max_staleness=0", "asynchronous.balance=false", "asynchronous.batch_chunks=4",
            "asynchronous.actors=4", "algo.total_timesteps=40960", "run.checkpoint_every=2",
            "run.progress=false", "run.tensorboard=false"]
    whole = train(load_config(over + [f"run.dir={tmp_path / 'whole'}"]))
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(command() + ["train", f"run.dir={run_dir}"] + over,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + 120
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 5):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    steps = saved_steps(run_dir)
    assert steps and steps[-1] < 20, steps  # killed before the end
    out = subprocess.run(command() + ["train", f"run.resume={run_dir}", "run.progress=false"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["resumed_at_update"] == steps[-1] and resumed["rounds"] == whole["rounds"] == 20
    assert resumed["params_sha256"] == whole["params_sha256"]
    # the summary counts the whole run's chunks, not only the resumed process's
    assert resumed["staleness_histogram"] == whole["staleness_histogram"] == {"0": 80}
    assert resumed["dropped_chunks"] == whole["dropped_chunks"] == 0
    assert_every_chunk_once(records(run_dir))


def test_vtrace_by_hand_and_on_policy_it_is_gae():
    col = lambda *x: np.array(x, np.float32)[:, None]  # noqa: E731
    reward, value, nxt = col(1.0, 2.0, 3.0), col(0.5, 1.0, 1.5), col(1.0, 1.5, 2.0)
    zeros, ones = col(0, 0, 0), col(1, 1, 1)
    gae = [np.asarray(x) for x in ppo.gae(reward, value, nxt, zeros, zeros, 0.5, 0.5)]
    same = [np.asarray(x) for x in ppo.gae(reward, value, nxt, zeros, zeros, 0.5, 0.5, ones, ones)]
    np.testing.assert_array_equal(gae[0], same[0])
    # deltas: 1 + .5*1 - .5 = 1; 2 + .75 - 1 = 1.75; 3 + 1 - 1.5 = 2.5
    # rho = (0.5, 1, 0.25), trace = (1, 0.5, 0.25), gamma*lam = 0.25:
    # A2 = .25*2.5 = .625; A1 = 1*1.75 + .25*.5*.625 = 1.828125; A0 = .5*1 + .25*1*1.828125
    rho, trace = col(0.5, 1.0, 0.25), col(1.0, 0.5, 0.25)
    adv, target = ppo.gae(reward, value, nxt, zeros, zeros, 0.5, 0.5, rho, trace)
    np.testing.assert_allclose(np.asarray(adv), col(0.95703125, 1.828125, 0.625), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(target), col(0.95703125, 1.828125, 0.625) + value, rtol=1e-6)


def test_balance_starts_and_stops_one_actor_at_a_time():
    b = balance
    assert b(4, 10.0, 5.0, 0.2, 1, 8) == 3  # producing twice what is consumed: one fewer
    assert b(4, 5.0, 10.0, 0.2, 1, 8) == 5  # half: one more
    assert b(4, 11.0, 10.0, 0.2, 1, 8) == 4  # within tolerance
    assert b(1, 10.0, 1.0, 0.2, 1, 8) == 1 and b(8, 1.0, 10.0, 0.2, 1, 8) == 8  # clipped
    assert b(4, 0.0, 10.0, 0.2, 1, 8) == 4  # nothing measured yet


def test_actors_at_the_start_default_to_one_a_core_on_the_local_backend():
    """The rule follows the backend's declared capability (shards on this process's
    cores), not its name."""
    import os

    from jaxrl_dist.backends import BACKENDS

    def start(backend="local", **async_):
        urls = {"urls": ["http://127.0.0.1:1"]} if backend == "http" else {}
        cfg = from_dict({"trainer": "async", "backend": {"name": backend, **urls},
                         "asynchronous": {"batch_chunks": 8, **async_}})
        return asynchronous.actor_range(cfg, BACKENDS.get(backend))

    assert start(max_staleness=1) == (min(8, os.cpu_count() or 1), 32)  # threads share the cores
    assert start(max_staleness=0) == (8, 32)  # staleness 0: K actors, the sync trainer's slots
    assert start("http", max_staleness=1) == (8, 32)  # actors elsewhere
    assert start(max_staleness=1, actors=3, max_actors=6) == (3, 6)  # as set


def test_balance_does_not_step_to_a_level_measured_slower():
    """Actors sharing CPUs: more of them can make less. Learned chunks/s measured
    per actor count steer the step the capacities ask for."""
    b = balance
    short = (5.0, 10.0, 0.2, 1, 8)  # production short of consumption: the capacities ask for one more
    assert b(4, *short, {4: 100.0}) == 5  # 5 not measured yet: try it
    assert b(5, *short, {4: 100.0, 5: 80.0}) == 4  # 5 was slower than 4: back, not on to 6
    assert b(4, *short, {4: 100.0, 5: 80.0}) == 3  # the way up is closed: try the other way
    assert b(3, *short, {3: 120.0, 4: 100.0, 5: 80.0}) == 2  # and on down while it is faster
    assert b(2, *short, {1: 90.0, 2: 130.0, 3: 120.0}) == 2  # both neighbours slower: stay
    assert b(5, *short, {4: 100.0, 5: 110.0}) == 6  # faster than the level behind: go on
    assert b(4, 10.0, 10.0, 0.2, 1, 8, {4: 1.0, 5: 9.0}) == 4  # balanced: no step at all
    assert b(8, *short[:-1], 8, {8: 100.0, 7: 120.0}) == 7  # at the top, the way back


def test_a_dropped_chunk_is_billed_but_does_not_hold_the_update_up():
    """The replay bills a dropped straggler's compute, but the learner discards a late
    chunk whenever it comes: the update waits only for the chunks it learned from."""
    import time
    from types import SimpleNamespace

    from jaxrl_dist.backends import RoundStats, ShardInfo
    from jaxrl_dist.backends.shard import ShardOutput, Timings

    cfg = CostConfig(name="t", kind="serverless", vcpu_second_usd=1.0, gb_second_usd=0.0,
                     vcpus_per_shard=1.0, billing_granularity_s=0.0, cold_start_s=0.0,
                     warm_start_s=0.0, invoke_s=0.0, keep_warm_s=1e9, transfer_bytes_per_s=1e12,
                     learner_hour_usd=0.0)
    out = ShardOutput(np.zeros((2,), np.float32), None, np.zeros((1,), np.float32))
    stats = RoundStats(bytes_sent=1, bytes_received=1)

    def chunk(slot, seconds):
        info = ShardInfo(slot, Timings(0.0, 0.0, seconds, seconds), False, 0, "local")
        return asynchronous.Chunk(slot, 0, 0, out, info, stats, 1.0, seconds)

    from jaxrl_dist.trainers.accounting import Clocks

    account = cost.AsyncAccount(cfg, 4, version=0)
    me = SimpleNamespace(account=account, _param_bytes=0, clocks=Clocks(account, 0.0, time.perf_counter()))
    me._bill = lambda c: asynchronous.AsyncTrainer._bill(me, c)
    rec = asynchronous.AsyncTrainer._charge(me, 1, [chunk(0, 1.0)], [chunk(1, 30.0)], 0.5)
    assert rec.cum_modeled_s == pytest.approx(1.5)  # the 1 s chunk, then the update
    assert rec.components["shard_usd"] == pytest.approx(31.0)  # both chunks' compute


def test_stragglers_are_one_shard_in_k_whatever_the_slots():
    """`backend.slowdown`: one shard in `slow_every`, on a slot that moves round by
    round, so a sync round of K has one and any set of async actors meets them
    at the same rate; a slot's first shard in the process is not slowed."""
    import time

    from jaxrl_dist.trainers import accounting
    from jaxrl_dist.backends import ShardInfo
    from jaxrl_dist.config import BackendConfig
    from jaxrl_dist.backends.shard import Timings

    b, now = BackendConfig(slowdown=3.0, slow_every=4), time.time()
    shards = [ShardInfo(s, Timings(now, now, now, 0.0), False, 0, "local") for s in range(4)]
    seen = {0, 1, 2, 3}
    for r in range(8):  # a round of 4: one slowed, slot 3, then 2, 1, 0, 3, ...
        f = accounting.straggle(shards, b, seen, r)
        assert list(f).count(3.0) == 1 and f[(3 - r) % 4] == 3.0
    assert (accounting.straggle(shards, b, set(), 1) == 1.0).all()  # first shards: compile, not slowed
    for slots in ([0], [0, 1], [2, 3, 5]):  # async: chunks 0..7 of each slot
        f = [accounting.straggle([shards[0]._replace(slot=s)], b, {s}, c)[0] for s in slots for c in range(8)]
        assert f.count(3.0) == 2 * len(slots)


def test_async_modeled_clock_by_hand():
    """Two actors, one update of two chunks, warm instances: the update starts when
    the later chunk arrives, and the next version is published when it ends."""
    cfg = CostConfig(name="t", kind="serverless", vcpu_second_usd=1.0, gb_second_usd=0.0,
                     vcpus_per_shard=1.0, billing_granularity_s=0.0, cold_start_s=5.0,
                     warm_start_s=0.0, invoke_s=0.5, keep_warm_s=1e9, transfer_bytes_per_s=100.0,
                     learner_hour_usd=3600.0)
    acct = cost.AsyncAccount(cfg, 4, version=0)
    # cold: invoke .5 + start 5 + compute 1 + 100 B at 100 B/s = 7.5; slot 1: 2 s compute -> 8.5
    assert acct.chunk(0, 0, 1.0, 100) == pytest.approx(7.5)
    assert acct.chunk(1, 0, 2.0, 100) == pytest.approx(8.5)
    rc = acct.update([7.5, 8.5], 0.5, 1)
    assert acct.cold_billed == 2  # the update's record says both chunks started cold
    assert acct.now == pytest.approx(9.0) and rc.modeled_s == pytest.approx(9.0)
    # shards billed compute + start: (1 + 5) + (2 + 5) at $1/s; learner $1/s for 9 s
    assert rc.components["shard_usd"] == pytest.approx(13.0)
    assert rc.usd == pytest.approx(22.0) and acct.usd == pytest.approx(22.0)
    # slot 0 again, warm, with version 1 (published at 9): starts at 9, arrives at 9 + .5 + 1 + 1
    assert acct.chunk(0, 1, 1.0, 100) == pytest.approx(11.5)
    acct.update([11.5], 0.5, 2)
    assert acct.cold_billed == 0


def test_async_clock_prewarms_the_instances_the_balancer_may_start():
    """A slot in `prewarm` had its instance started by an empty invocation at the
    run's start (billed: its start), so its first chunk runs warm once that is up."""
    cfg = CostConfig(name="t", kind="serverless", vcpu_second_usd=1.0, gb_second_usd=0.0,
                     vcpus_per_shard=1.0, billing_granularity_s=0.0, cold_start_s=5.0,
                     warm_start_s=0.0, invoke_s=0.5, keep_warm_s=1e9, transfer_bytes_per_s=100.0,
                     learner_hour_usd=0.0)
    acct = cost.AsyncAccount(cfg, 4, version=0, prewarm=[2])
    # up at .5 + 5 = 5.5; the chunk: invoke .5, warm, compute 1, 100 B at 100 B/s -> 8.0
    assert acct.chunk(2, 0, 1.0, 100) == pytest.approx(8.0)
    rc = acct.update([8.0], 0.5, 1)
    assert rc.components["shard_usd"] == pytest.approx(5.0 + 1.0)  # the warming's start, the compute
    cluster = CostConfig(name="c", kind="cluster", cluster_nodes=1, cluster_node_hour_usd=3600.0)
    assert cost.AsyncAccount(cluster, 4, version=0, prewarm=[2]).chunk_usd == 0.0  # nothing to warm


@pytest.mark.parametrize("override, word", [
    ({"backend": {"name": "fused"}}, "trainer=fused"),
    ({"asynchronous": {"max_staleness": -1}}, "asynchronous.max_staleness"),
    ({"asynchronous": {"actors": 9}}, "asynchronous.actors=9"),
    ({"asynchronous": {"stale": 1}}, "unknown config key 'asynchronous.stale'"),
    ({"async": {"max_staleness": 1}}, "the async trainer's keys are asynchronous.* now"),
    ({"backend": {"name": "local", "slowdown": 0.5}}, "backend.slowdown"),
])
def test_bad_async_keys_are_named(override, word):
    base = {"trainer": "async", "backend": {"name": "local", "max_shards": 8}}
    for k, v in override.items():
        base[k] = {**base.get(k, {}), **v}
    with pytest.raises(ConfigError, match=word.replace("*", r"\*")):
        from_dict(base)


def test_async_through_the_cli_writes_its_metrics(tmp_path):
    from test_cli import run_cli

    out = run_cli("train", "trainer=async", "asynchronous.max_staleness=2", "algo.total_timesteps=16384",
                  f"run.dir={tmp_path}", "run.progress=false")
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["trainer"] == "async" and summary["rounds"] >= 8
    # a fresh process traces and compiles (or loads from the cache) the learner and the shards
    assert 0 < summary["compile_seconds"] and summary["train_seconds"] < summary["wall_seconds"]
    assert summary["wall_to_target_s"] is None or summary["wall_to_target_s"] > 0
    rec = records(tmp_path)[-1]
    assert rec["staleness_max"] <= 2 and rec["actors_active"] >= 1


def _killing(monkeypatch, cls, slot: int, index: int, kill) -> list:
    """Patch what the actors call (`cls.run_shard` on a one-shard backend, else
    `cls.run_round`) to call `kill(backend)` once, just before slot `slot`'s
    `index`-th chunk goes out; returns the list that records the kill."""
    from jaxrl_dist.backends import capabilities

    done = []
    name = "run_shard" if capabilities(cls).one_shard else "run_round"
    call = getattr(cls, name)

    def run(self, round_, params, tasks, state):
        task = tasks if name == "run_shard" else tasks[0]
        if not done and task.slot == slot and round_ == index:
            kill(self)
            done.append(round_)
        return call(self, round_, params, tasks, state)

    monkeypatch.setattr(cls, name, run)
    return done


# under slow: test_ray.py keeps a killed actor replaced and its shard retried in the default suite
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_a_killed_ray_actor_is_replaced_without_losing_or_doubling_a_chunk(tmp_path, monkeypatch):
    """Staleness 0 on a Ray runtime: slot 1's actor is killed before its third chunk;
    the backend replaces it and reruns the chunk with the same keys, and the run
    ends with the local backend's parameters."""
    ray = pytest.importorskip("ray")
    from jaxrl_dist.backends.ray_backend import RayBackend

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    kw = {"updates": 5, "max_staleness": 0, "batch_chunks": 2, "actors": 2}
    local = train(config(tmp_path / "local", **kw))
    killed = _killing(monkeypatch, RayBackend, 1, 2,
                      lambda b: ray.kill(b.actors()[1], no_restart=True))
    run = train(config(tmp_path / "ray", backend={"name": "ray", "max_shards": 2}, **kw))
    assert killed == [2] and run["retries"] == 1
    assert run["params_sha256"] == local["params_sha256"]
    assert_every_chunk_once(records(tmp_path / "ray"))


@pytest.mark.slow  # ~11 s: a dead endpoint retried elsewhere is test_http.py's; async retries are test_chaos.py's
def test_a_dead_http_instance_is_replaced_by_the_other(tmp_path, monkeypatch):
    """Two real function instances; the one slot 1 uses dies before its third
    chunk: the chunk goes to the other instance and the run ends with the local
    backend's parameters."""
    from serving import TOKEN, Server

    from jaxrl_dist.backends.http import HttpBackend

    kw = {"updates": 5, "max_staleness": 0, "batch_chunks": 2, "actors": 2}
    local = train(config(tmp_path / "local", **kw))
    a, b = Server(), Server()
    try:
        killed = _killing(monkeypatch, HttpBackend, 1, 2, lambda _: b.stop())
        run = train(config(tmp_path / "http", backend={
            "name": "http", "max_shards": 2, "urls": [a.url, b.url], "token": TOKEN}, **kw))
    finally:
        a.stop()
        b.stop()
    assert killed == [2] and run["retries"] >= 1
    assert run["params_sha256"] == local["params_sha256"]
    assert_every_chunk_once(records(tmp_path / "http"))


def test_a_straggler_of_any_age_is_billed():
    """A chunk made with version 0 that arrives after 100 updates (a straggler whose
    first chunk included its compile) is dropped, and still billed from version 0."""
    acct = cost.AsyncAccount(CostConfig(), 2, version=0)
    for v in range(100):
        acct.update([acct.chunk(0, v, 0.01, 10)], 0.01, v + 1)
    assert acct.chunk(1, 0, 5.0, 10) > 5.0


def test_the_async_trainer_s_checks_leave_the_scheduler_alone():
    """The async trainer runs no scheduler: the default learned scheduler's file (16 shards)
    must not refuse an async run over fewer slots."""
    from jaxrl_dist.trainers.parts import check_parts

    check_parts(from_dict({"trainer": "async", "backend": {"max_shards": 3}, "asynchronous": {"actors": 3}}))
    with pytest.raises(ConfigError, match="below the 16 shards"):  # the sync trainer's does
        check_parts(from_dict({"trainer": "sync", "backend": {"max_shards": 3}, "scheduler": "learned"}))

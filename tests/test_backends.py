"""One contract for every backend: the same seed and config give the same
parameters on local, Ray and HTTP, and every round is logged the same way.

Real parts only: the Ray backend starts its own runtime on loopback, the HTTP
backend talks to `jaxrl-dist serve` subprocesses on loopback ports.
"""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxrl_dist.config import ConfigError, from_dict
from serving import TOKEN, Server

ROUND_KEYS = {"round", "num_shards", "shard_s_min", "shard_s_median", "shard_s_max", "dispatch_s",
              "transfer_s", "wait_s", "learn_s", "round_s", "bytes_sent", "bytes_received",
              "retries", "env_steps", "return", "loss"}


@pytest.fixture(scope="module")
def servers():
    started = [Server(), Server()]
    yield [s.url for s in started]
    for s in started:
        s.stop()


def config(name: str, run_dir, urls=(), **over):
    """3 shards of 4 envs x 16 steps (padded to 4 slots and masked), 5 rounds."""
    http = {"urls": list(urls), "token": TOKEN} if name == "http" else {}  # the http backend's own keys
    backend = {"name": name, "envs_per_shard": 4, "max_shards": 4, **http, **over.pop("backend", {})}
    return from_dict({
        "env": over.pop("env", {"id": "CartPole-v1"}),
        "algo": {"total_timesteps": 3 * 4 * 16 * 5, "num_steps": 16, "num_minibatches": 2,
                 "update_epochs": 2, **over.pop("algo", {})},
        "trainer": "sync", "backend": backend, "scheduler": {"num_shards": 3},
        "run": {"dir": str(run_dir), "progress": False, "tensorboard": False, "compile_cache": False},
        **over,
    })


def run(name, tmp_path, servers, **over):
    from jaxrl_dist.trainers.runner import train

    return train(config(name, tmp_path / name, servers if name == "http" else (), **over))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    from jaxrl_dist.trainers.runner import train

    return train(config("local", tmp_path_factory.mktemp("ref")))


# Ray's case is `-m slow`: test_ray's `test_ray_trains_like_local_on_a_runtime_it_starts`
# checks the same digest against local in the default suite, on a runtime of its own
@pytest.mark.parametrize("name", ["local", pytest.param("ray", marks=pytest.mark.slow), "http"])
def test_same_seed_same_params_on_every_backend(name, tmp_path, servers, reference):
    summary = run(name, tmp_path, servers)
    assert summary["backend"] == name and summary["rounds"] == 5
    assert summary["env_steps"] == reference["env_steps"] == 3 * 4 * 16 * 5
    assert summary["params_sha256"] == reference["params_sha256"]
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2, 3, 4, 5]
    for r in records:
        assert ROUND_KEYS <= set(r) and r["num_shards"] == 3 and r["retries"] == 0
        assert 0 <= r["shard_s_min"] <= r["shard_s_median"] <= r["shard_s_max"] <= r["round_s"]
        if name != "local":
            assert r["bytes_sent"] > 0 and r["bytes_received"] > 0


# Ray ships slot state as the local backend does (test_same_seed_same_params_on_every_backend):
# its continuous run is `-m slow`, to keep the default suite in its time
@pytest.mark.parametrize("name", [pytest.param("ray", marks=pytest.mark.slow), "http"])
def test_continuous_actions_and_normalisers_match_too(name, tmp_path, servers):
    """Pendulum ships observation and reward normaliser state with every slot."""
    from jaxrl_dist.trainers.runner import train

    over = {"env": {"id": "Pendulum-v1"}}
    ref = train(config("local", tmp_path / "ref", **over))
    assert run(name, tmp_path, servers, **over)["params_sha256"] == ref["params_sha256"]


def test_seed_changes_the_result(tmp_path, servers, reference):
    assert run("local", tmp_path, servers, seed=1)["params_sha256"] != reference["params_sha256"]


def test_unknown_backend_names_the_key():
    from jaxrl_dist.backends import make_backend

    with pytest.raises(ConfigError, match="backend.name: unknown backend 'nope'"):
        make_backend(config("nope", "/tmp/x").backend)


def test_local_backend_buckets_shard_counts_and_keeps_idle_slots(tmp_path):
    """n = 1..4 compiles 3 shapes (1, 2, 4), each once; slots a round skips keep their state."""
    from jaxrl_dist.backends import Job, ShardTask
    from jaxrl_dist.backends.local import LocalBackend
    from jaxrl_dist.core.learner import init_train
    from jaxrl_dist.trainers.rounds import init_table, shard_learner
    from jaxrl_dist.backends.shard import ShardProgram, round_keys, spec_from_config

    cfg = config("local", tmp_path)
    program = ShardProgram(spec_from_config(cfg, "gymnax", False))
    train = init_train(shard_learner(cfg, program, 3.0), 0)
    table = init_table(program, 0, 4)
    backend = LocalBackend(cfg.backend)
    backend.start(Job(program.spec, 0, "t", program))
    for r, n in enumerate([4, 1, 2, 3, 2, 4]):
        before = jax.tree.map(np.array, table.data)
        keys, _ = round_keys(0, r, np.arange(4))
        result = backend.run_round(r, train.params, [ShardTask(s, keys[s]) for s in range(n)], table)
        assert result.traj.obs.shape[1] == len(result.bootstrap) >= n
        after = jax.tree.map(np.array, table.data)
        for s in range(n, 4):  # idle slots untouched
            assert all(jax.tree.leaves(jax.tree.map(lambda a, b: np.array_equal(a[s], b[s]), before, after)))
        assert not np.array_equal(before.obs[0], after.obs[0])
    assert sorted(backend._fns) == [1, 2, 4]
    assert all(fn._cache_size() == 1 for fn in backend._fns.values())


def test_round_trainer_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="scheduler.num_shards=8 exceeds backend.max_shards=4"):
        from_dict({"trainer": "sync", "backend": {"name": "local", "max_shards": 4}, "scheduler": {"num_shards": 8}})
    with pytest.raises(ConfigError, match="backend.urls"):
        from_dict({"trainer": "sync", "backend": {"name": "http"}})
    with pytest.raises(ConfigError, match="num_seeds"):
        from_dict({"trainer": "sync", "backend": {"name": "local"}, "num_seeds": 2})
    with pytest.raises(ConfigError, match="backend.envs_per_shard"):
        from_dict({"trainer": "sync", "backend": {"name": "local", "envs_per_shard": 3}, "algo": {"num_minibatches": 4, "num_steps": 1}})
    # what a library caller sets that the run would not read, as on the command line
    with pytest.raises(ConfigError, match="^scheduler.num_shards: trainer=fused does not use it"):
        from_dict({"scheduler": {"num_shards": 8}})
    with pytest.raises(ConfigError, match="^env.wrapper_options.indices: no env.wrapper is set"):
        from_dict({"env": {"wrapper_options": {"indices": [1]}}})
    assert from_dict({"scheduler": {"num_shards": 8}}, ()).scheduler.num_shards == 8  # a whole saved config


def test_no_recompile_after_the_first_round(tmp_path):
    """Learner, keys and the local shard call compile in round 1 only."""
    from jaxrl_dist.trainers.sync import RoundTrainer
    from test_schedulers import compile_log

    events = []

    class Marks:
        def log(self, records):
            events.extend(("round", r.update) for r in records)

    cfg = config("local", tmp_path, algo={"total_timesteps": 3 * 4 * 16 * 4})
    trainer = RoundTrainer(cfg, tmp_path, False)
    try:
        with compile_log(events):
            trainer.run(Marks(), [])
    finally:
        trainer.ckpt.close()
    first = events.index(("round", 1))
    assert any(kind == "compile" for kind, _ in events[:first])
    assert [e for e in events[first:] if e[0] == "compile"] == []
    assert [e[1] for e in events if e[0] == "round"] == [1, 2, 3, 4]

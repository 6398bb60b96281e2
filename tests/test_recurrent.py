"""Recurrent policies, action masks and the hide wrapper, end to end on small runs.

The GRU's written-out gradient against autodiff; the update replays each segment from
its stored carry to the rollout's own log-probabilities; a fused GRU run loads as a
policy that keeps (and resets) its hidden state; a GRU run of the sync trainer gives the
same params on the local and HTTP backends (Ray: under `slow`); masks over a test
wrapper that allows one action (none sampled illegal, the unmasked control does; an
all-false mask on a live step is exit 4); the support table's refusals (exit 2).
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_dist.config import ConfigError, from_dict
from jaxrl_dist.core import networks, recurrent
from jaxrl_dist.core.rollout import RolloutOptions, init_actor, make_rollout
from jaxrl_dist.envs import make_env
from jaxrl_dist.envs.wrappers import WRAPPERS

TESTS = Path(__file__).resolve().parent


# --- the GRU and the replay ---------------------------------------------------------------

def _plain_gru(gx, h0, reset, w_h, b_hn):
    def step(h, xs):
        g, r = xs
        return recurrent._gru(recurrent._reset(h, r), g, w_h, b_hn)

    return jax.lax.scan(step, h0, (gx, reset))


@pytest.mark.parametrize("unroll", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_the_written_out_gru_gradient_is_autodiff_s(unroll):
    T, B, H = 9, 3, 5
    k = jax.random.split(jax.random.key(0), 6)
    gx, h0 = jax.random.normal(k[0], (T, B, 3 * H)), jax.random.normal(k[1], (B, H))
    reset = jax.random.bernoulli(k[2], 0.2, (T, B))
    w_h, b_hn = jax.random.normal(k[3], (H, 3 * H)) * 0.5, jax.random.normal(k[4], (H,))
    weights = jax.random.normal(k[5], (T, B, H))

    def loss(fn):
        return lambda *a: (lambda hT, hs: (hs * weights).sum() + (hT ** 2).sum())(*fn(*a))

    ours = jax.grad(loss(lambda *a: recurrent.gru_sequence(*a, unroll)), (0, 1, 3, 4))(gx, h0, reset, w_h, b_hn)
    auto = jax.grad(loss(_plain_gru), (0, 1, 3, 4))(gx, h0, reset, w_h, b_hn)
    for a, b in zip(ours, auto):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(recurrent.gru_sequence(gx, h0, reset, w_h, b_hn)[1], _plain_gru(gx, h0, reset, w_h, b_hn)[1],
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cell", ["gru", pytest.param("lstm", marks=pytest.mark.slow)])
def test_the_update_replays_each_segment_to_the_rollouts_log_probs(cell):
    env = make_env("CartPole-v1", 4)
    net = networks.make_network(env.spec, cell, (32, 32), "tanh", {"hidden_size": 16})
    params = networks.init_params(net, env.spec.obs_shape, jnp.float32, jax.random.key(1))
    stacked = jax.tree.map(lambda x: x[None], params)  # one seed
    opts = RolloutOptions(num_steps=40, num_seeds=1, normalize_obs=False, normalize_reward=False, gamma=0.99)
    rollout = jax.jit(make_rollout(env, net, opts))
    actor = init_actor(env, jax.random.key(2), 1, net)
    for i in range(2):  # the second segment starts from the first one's carry
        actor, traj, _ = rollout(stacked, actor, jax.random.split(jax.random.key(3 + i), 1))
        seg = jax.tree.map(lambda x: x[:, 0], traj)  # [T, B]
        first = jax.tree.map(lambda c: c[0], seg.carry)
        out = networks.replay(net.apply, params, first, seg.obs, seg.reset)
        logp = networks.log_prob(out, seg.action, True)
        np.testing.assert_allclose(logp, seg.log_prob, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out.value, seg.value, rtol=1e-5, atol=1e-5)
        # an episode's end resets the carry before the next observation, and only then
        np.testing.assert_array_equal(seg.reset[1:], seg.done[:-1])
        assert seg.done.any()


# --- a fused GRU run, loaded as a policy --------------------------------------------------

def small(**over) -> dict:
    base = {"trainer": "fused", "algo": {"network": "gru", "total_timesteps": 4 * 32 * 4, "num_steps": 32,
                                         "num_minibatches": 2, "update_epochs": 2, "hidden_sizes": [32, 32],
                                         "network_options": {"hidden_size": 16}},
            "run": {"progress": False, "tensorboard": False}}
    for key, value in over.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return base


@pytest.fixture(scope="module")
def gru_run(tmp_path_factory):
    from jaxrl_dist.trainers.runner import train

    run_dir = tmp_path_factory.mktemp("gru")
    summary = train(from_dict(small(num_seeds=2, run={"dir": str(run_dir)})))
    return run_dir, summary


def test_a_fused_gru_run_loads_as_a_policy_that_keeps_its_hidden_state(gru_run):
    from jaxrl_dist.config import EvalConfig
    from jaxrl_dist.evaluation import evaluate, load_policy

    run_dir, summary = gru_run
    assert summary["num_seeds"] == 2 and np.isfinite(summary["final_return"])
    policy = load_policy(run_dir)
    assert policy.recurrent and policy.carry is None
    obs = np.array([[0.01, 0.2, -0.03, 0.1], [0.0, -0.1, 0.02, 0.0]], np.float32)
    policy(obs)
    first = np.asarray(policy.carry)
    assert first.shape == (2, 16) and np.abs(first).sum() > 0
    policy(obs)
    assert not np.allclose(policy.carry, first)  # the state moves on between calls
    policy(obs, reset=np.array([True, False]))
    np.testing.assert_allclose(policy.carry[0], first[0], rtol=1e-6)  # env 0 started again
    policy.reset()
    policy(obs)
    np.testing.assert_allclose(policy.carry, first, rtol=1e-6)
    result = evaluate(run_dir, EvalConfig(episodes=3, max_steps=600))
    assert len(result["returns"]) == 3 and all(np.isfinite(result["returns"]))


# --- sync: the same params on the local and HTTP backends (Ray under `slow`) ---------------

def sync_gru(run_dir: Path, backend: dict) -> dict:
    from jaxrl_dist.trainers.runner import train

    return train(from_dict(small(trainer="sync", algo={"total_timesteps": 4 * 16 * 2 * 2, "num_steps": 16},
                                 backend={"envs_per_shard": 4, "max_shards": 2, **backend},
                                 scheduler={"num_shards": 2}, run={"dir": str(run_dir), "compile_cache": False})))


@pytest.fixture(scope="module")
def local_gru(tmp_path_factory):
    return sync_gru(tmp_path_factory.mktemp("local-gru"), {"name": "local"})


def test_a_gru_trains_the_same_params_over_http(local_gru, tmp_path):
    from serving import TOKEN, Server

    server = Server("serve.allowed_envs=[CartPole-v1]")
    try:
        summary = sync_gru(tmp_path, {"name": "http", "urls": [server.url], "token": TOKEN})
    finally:
        server.stop()
    assert summary["params_sha256"] == local_gru["params_sha256"]


@pytest.mark.slow  # a Ray runtime
def test_a_gru_trains_the_same_params_over_ray(local_gru, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    summary = sync_gru(tmp_path, {"name": "ray"})
    assert summary["params_sha256"] == local_gru["params_sha256"]


# --- action masks, over a wrapper that makes CartPole a masked env -------------------------

class OneLegal:
    """CartPole with a mask: only action 0 is legal (`none=True`: no action is)."""

    @dataclass
    class Options:
        none: bool = False

    def __init__(self, env, options):
        self.inner, self.none = env, options.none
        self.spec = env.spec._replace(masked=True)
        self.num_envs = env.num_envs

    def action_mask(self, env_state):
        n = jax.tree.leaves(env_state)[0].shape[0]  # not self.num_envs: a worker vmaps over shards
        legal = jnp.arange(self.spec.num_actions) == 0
        return jnp.broadcast_to(legal & (not self.none), (n, self.spec.num_actions))

    def reset(self, key):
        return self.inner.reset(key)

    def step(self, env_state, action, key):
        illegal = ~jnp.take_along_axis(self.action_mask(env_state), action[:, None], 1)[:, 0]  # before the step
        env_state, out = self.inner.step(env_state, action, key)
        return env_state, out._replace(action_mask=self.action_mask(env_state), illegal=illegal)


@pytest.fixture
def one_legal():
    WRAPPERS.register("one_legal", OneLegal)
    yield
    WRAPPERS._builtin.pop("one_legal", None)


def records(run_dir: Path) -> list:
    from jaxrl_dist.trainers.logger import read_records

    return read_records(run_dir / "metrics.jsonl")  # none: the run stopped before its first records


OPTIONS = {"mlp": {}, "gru": {"hidden_size": 16}}


@pytest.mark.parametrize("network", ["mlp", pytest.param("gru", marks=pytest.mark.slow)])
def test_a_masked_policy_never_sends_an_illegal_action_and_the_control_does(network, one_legal, tmp_path):
    from jaxrl_dist.trainers.runner import train

    counts = {}
    for mask in (True, False):
        run_dir = tmp_path / str(mask)
        train(from_dict(small(env={"wrapper": "one_legal"}, algo={"network": network, "action_mask": mask,
                                                              "network_options": OPTIONS[network]},
                              run={"dir": str(run_dir)})))
        counts[mask] = sum(r["illegal_actions"] for r in records(run_dir))
    assert counts[True] == 0 and counts[False] > 100  # about half of 512 steps in the control


_STUCK = """
import sys
sys.path.insert(0, sys.argv[1])
from test_recurrent import OneLegal
from jaxrl_dist.envs.wrappers import WRAPPERS
from jaxrl_dist import cli
WRAPPERS.register("one_legal", OneLegal)
sys.exit(cli.main(sys.argv[2:]))
"""


def test_a_live_step_with_no_legal_action_is_one_line_and_exit_4(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", _STUCK, str(TESTS), "train", "run.progress=false",
                           "env.wrapper=one_legal", "env.wrapper_options.none=true", "algo.total_timesteps=2048",
                           f"run.dir={run_dir}"], capture_output=True, text=True, timeout=300)
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("error:")]
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert len(lines) == 1 and "CartPole-v1" in lines[0] and "no legal action" in lines[0] and "update 1" in lines[0]
    assert not np.isnan([r["loss"] for r in records(run_dir)] or [0]).any()


# --- refusals before any compile -----------------------------------------------------------

_EACH = """
import contextlib, io, json, sys
from jaxrl_dist import cli
out = []
for overrides in json.loads(sys.argv[1]):
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = cli.main(["train", "run.progress=false", "trainer=fused", "algo.total_timesteps=5120",
                            *overrides])
    out.append([code, said.getvalue()])
print(json.dumps(out))
"""

REFUSED = [  # overrides (after trainer=fused), what the one line names
    (["algo.network=gru", "env.suite=envpool"], "env.suite=envpool"),
    (["algo.network=lstm", "env.id=Pong-v5"], "env.suite=envpool"),
    (["algo.network=lstm", "trainer.devices=2"], "trainer.devices"),
    (["algo.network=gru", "algo.minibatch_size=64"], "not a whole number of sequences"),
    (["trainer=sync", "scheduler=fixed", "algo.network=gru", "backend.envs_per_shard=6", "algo.minibatch_size=null"],
     "algo.num_minibatches"),
    (["algo.network=gru", "algo.network_options.hidden_size=0"], "algo.network_options.hidden_size"),
    (["algo.action_mask=true"], "algo.action_mask"),
    (["trainer=sync", "scheduler=fixed", "algo.action_mask=true"], "algo.action_mask"),
    (["env.wrapper=nosuch"], "env.wrapper"),
    (["env.wrapper=hide", "env.wrapper_options.indices=[7]"], "env.wrapper_options.indices"),
    (["env.wrapper=hide", "env.wrapper_options.width=2"], "env.wrapper_options.width"),
]


def test_unsupported_paths_are_one_line_exit_2_before_any_compile(tmp_path):
    cases = [o + [f"run.dir={tmp_path / str(i)}"] for i, (o, _) in enumerate(REFUSED)]
    proc = subprocess.run([sys.executable, "-c", _EACH, json.dumps(cases)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for (overrides, named), (code, said) in zip(REFUSED, json.loads(proc.stdout.splitlines()[-1])):
        lines = [x for x in said.splitlines() if x.strip()]
        assert code == 2, (overrides, lines)
        assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], (overrides, lines)
    assert not list(tmp_path.glob("**/metrics.jsonl"))


def test_a_recurrent_module_handed_to_make_train_is_checked_as_a_named_one():
    """The sequence split is checked from the built network, not only from `algo.network`."""
    from jaxrl_dist import AlgoConfig, Config, EnvConfig, make_env, make_train
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.core.networks import make_network

    env = make_env("CartPole-v1", 2)
    gru = make_network(env.spec, "gru", (64, 64), "tanh", {"hidden_size": 8})
    cfg = Config(env=EnvConfig(num_envs=2), algo=AlgoConfig(total_timesteps=4096))
    with pytest.raises(ConfigError, match=r"^algo.num_minibatches=4 does not divide env.num_envs=2 \(a recurrent"):
        make_train(cfg, env, network=gru)


# --- the hide wrapper ----------------------------------------------------------------------

def test_hide_removes_the_chosen_entries_everywhere():
    from jaxrl_dist.backends import shard

    inner = make_env("CartPole-v1", 3)
    env = make_env("CartPole-v1", 3, wrapper="hide", wrapper_options={"indices": [1, 3]})
    assert env.spec.obs_shape == (2,)
    key = jax.random.key(0)
    (s_in, o_in), (s, o) = inner.reset(key), env.reset(key)
    np.testing.assert_array_equal(o, np.asarray(o_in)[:, [0, 2]])
    _, out_in = inner.step(s_in, jnp.ones(3, jnp.int32), key)
    _, out = env.step(s, jnp.ones(3, jnp.int32), key)
    np.testing.assert_array_equal(out.obs, np.asarray(out_in.obs)[:, [0, 2]])
    np.testing.assert_array_equal(out.reward, out_in.reward)
    # the shard spec carries it; a worker makes the same env
    cfg = from_dict({"trainer": "sync", "env": {"wrapper": "hide", "wrapper_options": {"indices": [1, 3]}}})
    spec = shard.spec_from_config(cfg, "gymnax", False)
    assert shard.ShardSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert shard.ShardProgram(spec).env.spec.obs_shape == (2,)


@pytest.mark.parametrize("indices, word", [([], "empty"), ([4], "out of range"), ([1, 1], "twice"),
                                           ([0, 1, 2, 3], "every entry"), (["a"], "converted")])
def test_bad_hide_indices_name_the_key(indices, word):
    with pytest.raises(ConfigError, match=f"env.wrapper_options.indices.*{word}"):
        make_env("CartPole-v1", 1, wrapper="hide", wrapper_options={"indices": indices})

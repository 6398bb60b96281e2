"""The brax suite: its adapter (spec, shapes, truncation apart from termination, fresh
resets), its errors, and, under `slow`, Hopper's termination and learning through the CLI.

brax compiles a physics step in tens of seconds here, so the default suite only steps
brax's physics-free `fast` env; everything with real physics is `slow`.
"""
from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("brax")

from jaxrl_dist.envs import make_env, resolve_suite  # noqa: E402

from test_envs import one_line_error, run_steps  # noqa: E402


def test_fast_env_spec_shapes_and_truncation():
    """`fast` never terminates: only the time limit ends its episodes, and the transition
    that hits it keeps the pre-reset observation to bootstrap from."""
    env = make_env("fast", 3, "brax", kwargs={"episode_length": 4})
    s = env.spec
    assert (s.env_id, s.suite, s.obs_shape, s.discrete, s.num_actions, s.delayed_reset) == (
        "fast", "brax", (2,), False, 1, False)
    np.testing.assert_array_equal(s.action_low, [-1.0])
    np.testing.assert_array_equal(s.action_high, [1.0])
    obs0, outs = run_steps(env, jnp.ones((10, 3, 1), jnp.float32))
    assert obs0.shape == (3, 2) and outs.obs.shape == (10, 3, 2) and outs.reward.shape == (10, 3)
    assert outs.obs.dtype == np.float32 and outs.reward.dtype == np.float32
    expected = np.zeros((10, 3), bool)
    expected[[3, 7]] = True  # steps 4 and 8 (1-based)
    np.testing.assert_array_equal(outs.truncated, expected)
    assert not outs.terminated.any()
    np.testing.assert_array_equal(outs.episode_end, expected)
    # obs is [position, velocity]; pushing forward every step makes both grow until a reset
    np.testing.assert_array_equal(outs.obs[expected], 0.0)
    assert np.all(outs.final_obs[expected][:, 1] > 0)
    np.testing.assert_array_equal(outs.obs[~expected], outs.final_obs[~expected])
    np.testing.assert_array_equal(outs.valid, True)


def test_auto_resolves_brax_ids():
    assert resolve_suite("hopper") == "brax"
    assert resolve_suite("CartPole-v1") == "gymnax"


def test_missing_brax_names_the_extra(monkeypatch):
    from jaxrl_dist.envs.brax_env import BraxSuite

    monkeypatch.setattr(BraxSuite, "installed", classmethod(lambda cls: False))  # as without brax
    msg = one_line_error(env_id="hopper", suite="brax")
    assert "env.suite=brax" in msg and "jaxrl-dist[brax]" in msg


def test_bad_brax_kwargs_name_the_key():
    msg = one_line_error(env_id="hopper", suite="brax", kwargs={"pipeline": "warp"})
    assert "env.kwargs.pipeline" in msg and "spring" in msg
    msg = one_line_error(env_id="hopper", suite="brax", kwargs={"episode_length": 0})
    assert "env.kwargs.episode_length" in msg
    msg = one_line_error(env_id="nosuchtask", suite="brax")
    assert "nosuchtask" in msg and "brax" in msg


@pytest.mark.slow
def test_hopper_termination_and_truncation_stay_apart():
    """Full backward torque topples the hopper (termination: no bootstrap) within a few
    steps; zero torque keeps it standing until the 20-step limit (truncation)."""
    env = make_env("hopper", 2, "brax", kwargs={"episode_length": 20})
    actions = jnp.stack([-jnp.ones((45, 3)), jnp.zeros((45, 3))], axis=1)
    obs0, outs = run_steps(env, actions)
    assert outs.terminated[:, 0].sum() >= 2 and not outs.truncated[:, 0].any()
    # it ended unhealthy: the torso's angle (obs[1]) is past 0.2 rad
    assert np.all(np.abs(outs.final_obs[:, 0][outs.terminated[:, 0]][:, 1]) > 0.2)
    assert not outs.terminated[:, 1].any()
    np.testing.assert_array_equal(np.flatnonzero(outs.truncated[:, 1]), [19, 39])
    ended = outs.episode_end
    np.testing.assert_array_equal(ended, outs.terminated | outs.truncated)
    # each ended env restarts from a fresh reset: the start pose and velocity within
    # the reset noise (0.005), not the final observation
    assert np.all(np.abs(outs.obs[ended] - obs0[0]) <= 0.011)
    assert not np.any(np.all(outs.obs[ended] == outs.final_obs[ended], axis=-1))
    np.testing.assert_array_equal(outs.obs[~ended], outs.final_obs[~ended])


# final returns (the episodes of the last 10% of updates) of 1,403, 1,541 and 1,576 in three
# seeds at this budget on CPU, on the preset's positional pipeline (bench/RESULTS.md); a random
# policy gets about 40 an episode
HOPPER_STEPS, HOPPER_MIN_RETURN = 500_000, 1000.0


@pytest.mark.slow
def test_hopper_learns_through_the_cli(tmp_path):
    """`jaxrl-dist train trainer=fused env=brax_hopper`: physics, policy and update in one
    program, to a return of at least 1,000 in 5e5 steps."""
    from test_cli import run_cli

    out = run_cli("train", "trainer=fused", "env=brax_hopper", f"algo.total_timesteps={HOPPER_STEPS}",
                  "run.progress=false", "run.tensorboard=false", f"run.dir={tmp_path / 'run'}",
                  timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["env_steps"] >= HOPPER_STEPS * 0.99
    assert summary["final_return"] >= HOPPER_MIN_RETURN, summary["final_return"]

"""env.suite=jumanji: the adapter's shapes, masks and auto-reset on Knapsack-v1; the
env's own count of illegal actions (none from a masked rollout, some from the unmasked
control); the uniform random legal baseline; a masked Snake-v1 run of the CLI. (A mask
on an env without one is refused with the other refusals, in tests/test_recurrent.py.)"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("jumanji")

from jaxrl_dist.core import networks  # noqa: E402
from jaxrl_dist.core.rollout import RolloutOptions, init_actor, make_rollout  # noqa: E402
from jaxrl_dist.envs import make_env, resolve_suite  # noqa: E402
from jaxrl_dist.envs.jumanji_env import JumanjiSuite, random_legal_return  # noqa: E402
from test_cli import run_cli  # noqa: E402

N, ITEMS = 4, 50  # Knapsack-v1: 50 items, observed as weights, values and packed flags


@pytest.fixture(scope="module")
def knapsack():
    env = make_env("Knapsack-v1", N, suite="jumanji")
    return env, jax.jit(env.step)


def test_the_suite_is_registered_and_gives_a_masked_flat_spec(knapsack):
    env, _ = knapsack
    assert JumanjiSuite.installed() and JumanjiSuite.has("Snake-v1")
    assert not JumanjiSuite.has("Sokoban-v0") and not JumanjiSuite.has("Minesweeper-v0")
    assert resolve_suite("Knapsack-v1", "jumanji") == "jumanji"
    spec = env.spec
    assert spec.masked and spec.discrete and spec.suite == "jumanji"
    assert spec.obs_shape == (3 * ITEMS,) and spec.num_actions == ITEMS
    assert spec.obs_dtype == np.float32


def test_reset_and_step_shapes_and_an_auto_reset(knapsack):
    env, step = knapsack
    state, obs = env.reset(jax.random.key(0))
    mask = env.action_mask(state)
    assert obs.shape == (N, 3 * ITEMS) and obs.dtype == jnp.float32
    assert mask.shape == (N, ITEMS) and mask.dtype == jnp.bool_ and bool(mask.all())  # every item fits
    legal = jnp.arange(N)  # env i packs item i
    state, out = step(state, legal, jax.random.key(1))
    assert out.obs.shape == out.final_obs.shape == (N, 3 * ITEMS) and out.obs.dtype == jnp.float32
    assert out.action_mask.shape == (N, ITEMS) and out.action_mask.dtype == jnp.bool_
    for x in (out.reward, out.terminated, out.truncated, out.illegal, out.episode_end):
        assert x.shape == (N,)
    assert out.reward.dtype == jnp.float32 and out.illegal.dtype == jnp.bool_
    assert not out.illegal.any() and not out.episode_end.any()
    assert bool((out.reward > 0).all())  # the value of the packed item
    packed = np.asarray(out.obs[:, 2 * ITEMS:])
    np.testing.assert_array_equal(packed, np.eye(N, ITEMS))
    assert not np.asarray(out.action_mask)[np.arange(N), np.arange(N)].any()  # packed: not legal again
    np.testing.assert_array_equal(env.action_mask(state), out.action_mask)

    # an illegal action (item i again) is counted, ends the episode (jumanji's rule), and
    # the batch auto-resets: final_obs is the ended episode's, obs and mask the next one's
    again = legal.at[0].set(N)  # env 0 packs a fresh item: legal, its episode goes on
    state, out = step(state, again, jax.random.key(2))
    np.testing.assert_array_equal(out.illegal, [False, True, True, True])
    np.testing.assert_array_equal(out.terminated, [False, True, True, True])
    assert not out.truncated.any()
    np.testing.assert_array_equal(out.episode_end, out.terminated)
    assert float(out.reward[1:].sum()) == 0.0
    assert bool((out.final_obs[1:, 2 * ITEMS:].sum(-1) == 1).all())  # the ended episode's one item
    assert bool((out.obs[1:, 2 * ITEMS:] == 0).all()) and bool(out.action_mask[1:].all())
    assert float(out.obs[0, 2 * ITEMS:].sum()) == 2  # env 0: two items packed
    assert not bool(jnp.array_equal(out.obs[1:, :ITEMS], out.final_obs[1:, :ITEMS]))  # new items


def _illegal_count(env, mask_actions: bool, steps: int = 256) -> tuple:
    """Illegal actions the envs counted over `steps` of a one-seed rollout of a fresh MLP
    that samples from the legal actions only (`mask_actions`) or from all of them."""
    network = networks.make_network(env.spec, "mlp", (16,), "tanh")
    params = jax.vmap(lambda k: networks.init_params(network, env.spec.obs_shape, env.spec.obs_dtype, k))(
        jax.random.split(jax.random.key(0), 1))
    opts = RolloutOptions(steps, 1, False, False, 1.0, mask_actions=mask_actions)
    actor = init_actor(env, jax.random.key(1), 1, network, mask_actions)
    rollout = jax.jit(make_rollout(env, network, opts))
    _, traj, _ = rollout(params, actor, jax.random.split(jax.random.key(2), 1))
    assert traj.illegal.shape == (steps, 1, N)
    return int(traj.illegal.sum()), int(traj.done.sum())


def test_a_masked_rollout_sends_no_illegal_action_and_the_unmasked_control_does(knapsack):
    env, _ = knapsack
    illegal, episodes = _illegal_count(env, True)
    assert illegal == 0 and episodes >= 20  # whole episodes of about 25 items
    illegal, episodes = _illegal_count(env, False)
    assert 20 < illegal <= episodes  # each illegal item ends its episode


def test_random_legal_return_is_the_baseline():
    returns = random_legal_return("Knapsack-v1", episodes=16, seed=0)
    assert returns.shape == (16,) and np.isfinite(returns).all()
    assert 10.0 < returns.mean() < 16.0  # budget 12.5 of items worth their weight on average


def test_a_masked_snake_run_of_the_cli(tmp_path):
    # on a 5 x 5 board snakes wall themselves in within these 4,096 steps: the adapter
    # ends those episodes, where the core would stop the run on a live step with no
    # legal action (exit 4)
    run_dir = tmp_path / "run"
    out = run_cli("train", "trainer=fused", "env.id=Snake-v1", "env.suite=jumanji",
                  "algo.action_mask=true", "env.kwargs.num_rows=5", "env.kwargs.num_cols=5",
                  "env.num_envs=16", "algo.num_steps=32", "algo.total_timesteps=4096",
                  "algo.update_epochs=1", "algo.minibatch_size=null", "algo.hidden_sizes=[16]",
                  "run.progress=false", "run.tensorboard=false", f"run.dir={run_dir}")
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_id"] == "Snake-v1" and summary["env_steps"] == 4096
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 8 and sum(sum(r["episodes"]) for r in records) > 0
    assert all(r["illegal_actions"] == 0 and r["no_legal_actions"] == 0 for r in records)

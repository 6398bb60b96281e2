"""Env adapters (gymnax, envpool XLA), their error messages, and the networks
`make_network` builds from their specs."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_dist.core.rollout import init_episodes, track_episodes
from jaxrl_dist.envs import EnvMakeError, make_env
from jaxrl_dist.core.networks import make_network, sample_action
from jaxrl_dist.core.types import EnvSpec, StepOut

# CartPole-v1 limits (gymnax and gym): pole angle 12 degrees, cart position 2.4;
# reset draws every state variable from U(-0.05, 0.05).
THETA_LIMIT = 12 * 2 * np.pi / 360
X_LIMIT = 2.4


def out_of_bounds(obs):
    return (np.abs(obs[..., 0]) > X_LIMIT) | (np.abs(obs[..., 2]) > THETA_LIMIT)


def is_reset_obs(obs):
    return np.all(np.abs(obs) <= 0.05, axis=-1)


def run_steps(env, actions, key=0):
    """Reset, then step `actions[t]` inside one jitted scan; returns StepOuts `[T, N]`."""
    state, obs0 = env.reset(jax.random.PRNGKey(key))

    @jax.jit
    def run(state, actions):
        keys = jax.random.split(jax.random.PRNGKey(key + 1), actions.shape[0])
        return jax.lax.scan(lambda s, xs: env.step(s, xs[0], xs[1]), state, (actions, keys))

    _, outs = run(state, actions)
    return obs0, jax.tree.map(np.asarray, outs)


# ---------------------------------------------------------------------------
# gymnax
# ---------------------------------------------------------------------------


def test_gymnax_spec_discrete():
    env = make_env("CartPole-v1", 4)
    assert env.num_envs == 4
    s = env.spec
    assert (s.env_id, s.suite, s.obs_shape, s.discrete, s.num_actions) == (
        "CartPole-v1", "gymnax", (4,), True, 2)
    assert np.dtype(s.obs_dtype) == np.float32
    assert s.delayed_reset is False
    assert s.action_low is None and s.action_high is None


def test_gymnax_spec_continuous():
    s = make_env("Pendulum-v1", 2).spec
    assert (s.suite, s.obs_shape, s.discrete, s.num_actions) == ("gymnax", (3,), False, 1)
    np.testing.assert_array_equal(s.action_low, [-2.0])
    np.testing.assert_array_equal(s.action_high, [2.0])


def test_gymnax_step_inside_jit_shapes_and_dtypes():
    env = make_env("CartPole-v1", 4)
    state, obs = env.reset(jax.random.PRNGKey(0))
    assert obs.shape == (4, 4)
    assert np.all(is_reset_obs(np.asarray(obs)))
    state, out = jax.jit(env.step)(state, jnp.ones((4,), jnp.int32), jax.random.PRNGKey(1))
    assert isinstance(out, StepOut)
    for name in ("obs", "final_obs"):
        assert getattr(out, name).shape == (4, 4) and getattr(out, name).dtype == jnp.float32
    for name in ("reward", "log_reward"):
        assert getattr(out, name).shape == (4,) and getattr(out, name).dtype == jnp.float32
    for name in ("terminated", "truncated", "valid", "episode_end"):
        assert getattr(out, name).shape == (4,) and getattr(out, name).dtype == jnp.bool_
    np.testing.assert_array_equal(out.reward, 1.0)
    assert bool(out.valid.all())
    # no episode ended: the next observation is the final one
    np.testing.assert_array_equal(out.obs, out.final_obs)


def test_gymnax_continuous_step_takes_action_vectors():
    env = make_env("Pendulum-v1", 3)
    state, _ = env.reset(jax.random.PRNGKey(0))
    action = jnp.asarray([[-2.0], [0.0], [2.0]])
    state, out = jax.jit(env.step)(state, action, jax.random.PRNGKey(1))
    assert out.obs.shape == (3, 3) and out.reward.shape == (3,)
    assert np.all(np.asarray(out.reward) <= 0.0)  # Pendulum rewards are costs


def test_gymnax_auto_reset_keeps_final_obs_separate():
    # Always pushing right topples the pole within a few dozen steps.
    env = make_env("CartPole-v1", 4)
    _, outs = run_steps(env, jnp.ones((40, 4), jnp.int32))
    term = outs.terminated
    assert term.any(axis=0).all(), "every env should have terminated"
    assert not outs.truncated.any()
    # where an episode terminated: final_obs is the out-of-bounds state, obs a fresh reset
    assert np.all(out_of_bounds(outs.final_obs[term]))
    assert np.all(is_reset_obs(outs.obs[term]))
    assert not np.any(np.all(outs.obs[term] == outs.final_obs[term], axis=-1))
    # elsewhere the two are the same observation, inside the bounds
    np.testing.assert_array_equal(outs.obs[~term], outs.final_obs[~term])
    assert not np.any(out_of_bounds(outs.final_obs[~term]))
    np.testing.assert_array_equal(outs.episode_end, term)
    # CartPole pays 1 on every step, the terminating one included
    np.testing.assert_array_equal(outs.reward, 1.0)


def test_gymnax_truncation_is_separate_from_termination():
    env = make_env("CartPole-v1", 4)
    env.params = env.params.replace(max_steps_in_episode=5)
    # alternating pushes keep the pole up: only the time limit ends episodes
    actions = jnp.tile(jnp.asarray([0, 1], jnp.int32), 6)[:, None] * jnp.ones((1, 4), jnp.int32)
    _, outs = run_steps(env, actions)
    expected = np.zeros((12, 4), bool)
    expected[[4, 9]] = True  # steps 5 and 10 (1-based)
    np.testing.assert_array_equal(outs.truncated, expected)
    assert not outs.terminated.any()
    np.testing.assert_array_equal(outs.episode_end, expected)
    # truncation keeps the final observation (to bootstrap from) apart from the reset one
    assert np.all(is_reset_obs(outs.obs[expected]))
    assert not np.any(np.all(outs.obs[expected] == outs.final_obs[expected], axis=-1))
    assert not np.any(out_of_bounds(outs.final_obs[expected]))


def test_gymnax_termination_wins_over_simultaneous_truncation():
    env = make_env("CartPole-v1", 1)
    _, outs = run_steps(env, jnp.ones((40, 1), jnp.int32))
    k = int(np.argmax(outs.terminated[:, 0])) + 1  # 1-based step of the first termination
    env.params = env.params.replace(max_steps_in_episode=k)
    _, outs = run_steps(env, jnp.ones((k, 1), jnp.int32))  # same keys, same trajectory
    assert outs.terminated[k - 1, 0] and not outs.truncated[k - 1, 0]
    assert not outs.terminated[: k - 1].any() and not outs.truncated.any()


def test_track_episodes_survives_auto_reset():
    env = make_env("CartPole-v1", 4)
    env.params = env.params.replace(max_steps_in_episode=5)
    actions = jnp.tile(jnp.asarray([0, 1], jnp.int32), 6)[:, None] * jnp.ones((1, 4), jnp.int32)
    _, outs = run_steps(env, actions)
    stats = init_episodes(4)
    returns, ends = [], []
    for t in range(12):
        stats, done_return, end = track_episodes(stats, jax.tree.map(lambda x: x[t], outs))
        returns.append(np.asarray(done_return))
        ends.append(np.asarray(end))
    returns, ends = np.stack(returns), np.stack(ends)
    np.testing.assert_array_equal(ends, outs.truncated)
    # two complete 5-step episodes with reward 1 per step, 0 elsewhere
    np.testing.assert_array_equal(returns[4], 5.0)
    np.testing.assert_array_equal(returns[9], 5.0)
    assert returns.sum() == 2 * 4 * 5.0
    # the running episode has 2 steps in it
    np.testing.assert_array_equal(stats.ep_return, 2.0)
    np.testing.assert_array_equal(stats.ep_length, 2)


def test_track_episodes_skips_invalid_steps():
    # env 0: an invalid (reset) step with a reward is not counted;
    # env 1: an episode end on an invalid step is not an episode end.
    def out(reward, valid, end):
        r = jnp.asarray(reward, jnp.float32)
        b = jnp.asarray(end)
        return StepOut(obs=None, final_obs=None, reward=r, terminated=b, truncated=~b & b,
                       valid=jnp.asarray(valid), log_reward=r, episode_end=b)

    stats = init_episodes(2)
    stats, ret, end = track_episodes(stats, out([1.0, 2.0], [True, True], [False, False]))
    stats, ret, end = track_episodes(stats, out([7.0, 3.0], [False, False], [False, True]))
    assert not end.any()
    np.testing.assert_array_equal(stats.ep_return, [1.0, 2.0])
    np.testing.assert_array_equal(stats.ep_length, [1, 1])
    stats, ret, end = track_episodes(stats, out([0.5, 1.0], [True, True], [True, False]))
    np.testing.assert_array_equal(end, [True, False])
    np.testing.assert_array_equal(ret, [1.5, 0.0])
    np.testing.assert_array_equal(stats.ep_return, [0.0, 3.0])
    np.testing.assert_array_equal(stats.ep_length, [0, 2])


# ---------------------------------------------------------------------------
# error messages
# ---------------------------------------------------------------------------


def one_line_error(**kwargs):
    with pytest.raises(EnvMakeError) as info:
        make_env(num_envs=2, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_unknown_id_names_the_id():
    assert "NoSuchEnv-v0" in one_line_error(env_id="NoSuchEnv-v0")


def test_gymnax_suite_without_the_id_names_it():
    msg = one_line_error(env_id="NoSuchEnv-v0", suite="gymnax")
    assert "NoSuchEnv-v0" in msg and "gymnax" in msg


def test_unknown_suite_is_an_error():
    assert "nosuchsuite" in one_line_error(env_id="CartPole-v1", suite="nosuchsuite")


def test_bad_env_kwargs_name_the_env():
    msg = one_line_error(env_id="CartPole-v1", kwargs={"no_such_option": 1})
    assert "CartPole-v1" in msg
    # a maker argument the run sets itself names the key that sets it
    msg = one_line_error(env_id="CartPole-v1", kwargs={"num_envs": 8})
    assert msg.startswith("env.kwargs.num_envs: the run sets it; use env.num_envs"), msg


def test_envpool_suite_without_the_id_names_it():
    pytest.importorskip("envpool")
    msg = one_line_error(env_id="Breakout-MinAtar", suite="envpool")
    assert "Breakout-MinAtar" in msg and "envpool" in msg


# ---------------------------------------------------------------------------
# envpool: the XLA path against envpool's own numpy API
# ---------------------------------------------------------------------------


def numpy_reference(env_id, num_envs, seed, actions, **options):
    """Observations and step results from envpool's numpy API, `[T, N, ...]`."""
    envpool = pytest.importorskip("envpool")
    pool = envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs,
                        seed=seed, **options)
    obs0, _ = pool.reset()
    steps = [pool.step(a) for a in actions]
    obs, rew, term, trunc = (np.stack([s[i] for s in steps]) for i in range(4))
    pool.close()
    return obs0, obs, rew, term, trunc & ~term


def xla_path(env_id, num_envs, seed, actions, **kwargs):
    pytest.importorskip("envpool")
    env = make_env(env_id, num_envs, suite="envpool", seed=seed, kwargs=kwargs)
    state, obs0 = env.reset()

    @jax.jit
    def run(state, actions):
        return jax.lax.scan(lambda s, a: env.step(s, a, None), state, actions)

    _, outs = run(state, jnp.asarray(actions))
    return env, np.asarray(obs0), jax.tree.map(np.asarray, outs)


def check_against_numpy(env_id, num_envs, seed, actions, obs_dtype, ref_options=None, **kwargs):
    env, obs0, outs = xla_path(env_id, num_envs, seed, actions, **kwargs)
    ref_actions = actions.astype(np.float64) if actions.dtype == np.float32 else actions
    r_obs0, r_obs, r_rew, r_term, r_trunc = numpy_reference(
        env_id, num_envs, seed, ref_actions, **{**(ref_options or {}), **kwargs})
    assert obs0.dtype == obs_dtype and outs.obs.dtype == obs_dtype
    np.testing.assert_array_equal(obs0, r_obs0.astype(obs_dtype))
    np.testing.assert_array_equal(outs.obs, r_obs.astype(obs_dtype))
    np.testing.assert_array_equal(outs.final_obs, outs.obs)  # envpool: the next obs is the final one
    assert outs.reward.dtype == np.float32
    np.testing.assert_array_equal(outs.reward, r_rew.astype(np.float32))
    np.testing.assert_array_equal(outs.terminated, r_term.astype(bool))
    np.testing.assert_array_equal(outs.truncated, r_trunc.astype(bool))
    # `valid` is False exactly on the step after an episode ended
    done = outs.terminated | outs.truncated
    expected_valid = np.concatenate([np.ones((1, num_envs), bool), ~done[:-1]])
    np.testing.assert_array_equal(outs.valid, expected_valid)
    return env, outs


def test_envpool_cartpole_matches_numpy_api():
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=(60, 4)).astype(np.int32)
    env, outs = check_against_numpy("CartPole-v1", 4, 7, actions, np.float32)
    s = env.spec
    assert (s.suite, s.obs_shape, s.discrete, s.num_actions, s.delayed_reset) == (
        "envpool", (4,), True, 2, True)
    assert outs.terminated.any(axis=0).all(), "every env should end an episode in 60 random steps"
    # the reset step after an end pays nothing, ends nothing
    reset_steps = ~outs.valid
    assert not (outs.terminated | outs.truncated)[reset_steps].any()
    np.testing.assert_array_equal(outs.reward[reset_steps], 0.0)


def test_shard_programs_take_env_num_threads():
    """`env.num_threads` reaches each slot's envpool pool (it was dropped on the way,
    leaving envpool's own choice, slower for small pools on 2 cores)."""
    pytest.importorskip("envpool")
    from jaxrl_dist.cli.compose import load_config
    from jaxrl_dist.backends.shard import ShardProgram, ShardSpec, spec_from_config

    spec = spec_from_config(load_config(["env=cartpole", "env.suite=envpool", "env.num_threads=1"]),
                            "envpool", False)
    assert ShardSpec.from_dict(spec.to_dict()) == spec and spec.num_threads == 1
    assert ShardProgram(spec).env.pool.config["num_threads"] == 1


def test_envpool_truncation_is_separate():
    # alternating actions keep CartPole up; a 10-step limit truncates it
    actions = np.tile(np.asarray([[0], [1]], np.int32), (12, 3))
    _, outs = check_against_numpy("CartPole-v1", 3, 1, actions, np.float32, max_episode_steps=10)
    assert not outs.terminated.any()
    expected = np.zeros((24, 3), bool)
    expected[[9, 20]] = True  # step 10, then a reset step and 10 more steps
    np.testing.assert_array_equal(outs.truncated, expected)
    np.testing.assert_array_equal(outs.episode_end, expected)


def test_envpool_hopper_matches_numpy_api_in_float32():
    rng = np.random.default_rng(1)
    actions = rng.uniform(-1.0, 1.0, size=(60, 3, 3)).astype(np.float32)
    env, outs = check_against_numpy("Hopper-v3", 3, 3, actions, np.float32)
    s = env.spec
    assert (s.obs_shape, s.discrete, s.num_actions) == ((11,), False, 3)
    np.testing.assert_array_equal(s.action_low, [-1.0] * 3)
    np.testing.assert_array_equal(s.action_high, [1.0] * 3)
    assert (outs.terminated | outs.truncated).any(), "random Hopper actions should fall over"


def test_envpool_pong_frames_match_numpy_api():
    actions = np.asarray([[0, 1], [2, 3], [4, 5], [1, 0]], np.int32)
    env, outs = check_against_numpy("Pong-v5", 2, 5, actions, np.uint8,
                                    ref_options=dict(episodic_life=True, reward_clip=True))
    assert env.spec.obs_shape == (4, 84, 84)
    assert env.spec.num_actions == 6
    assert outs.obs.shape == (4, 2, 4, 84, 84)
    assert outs.obs.max() > 0


# ---------------------------------------------------------------------------
# networks
# ---------------------------------------------------------------------------


def init_apply(spec, obs):
    """Network for `spec`, its initial parameters and its output on `obs` (one compile)."""
    net = make_network(spec)

    @jax.jit
    def run(key, obs):
        params = net.init(key, obs[:1])
        return params, net.apply(params, obs)

    return (net,) + run(jax.random.PRNGKey(0), obs)


def test_network_cnn_for_atari_frames():
    spec = EnvSpec("Pong-v5", "envpool", (4, 84, 84), np.dtype(np.uint8), True, 6,
                   delayed_reset=True)
    obs = jax.random.randint(jax.random.PRNGKey(1), (2, 4, 84, 84), 0, 256).astype(jnp.uint8)
    net, params, out = init_apply(spec, obs)
    assert net.torso == "cnn"
    assert "NatureCNN_0" in params["params"]
    # the Nature CNN on 84x84 ends in a 7x7x64 map
    assert params["params"]["NatureCNN_0"]["Dense_0"]["kernel"].shape == (7 * 7 * 64, 512)
    assert out.logits.shape == (2, 6) and out.value.shape == (2,)
    assert out.log_std.shape == (6,)
    assert not np.allclose(out.value[0], out.value[1])  # it looks at the frames


def test_network_mlp_for_vectors():
    spec = make_env("CartPole-v1", 1).spec
    obs = jax.random.normal(jax.random.PRNGKey(1), (5, 4))
    net, params, out = init_apply(spec, obs)
    assert net.torso == "mlp"
    assert "log_std" not in params["params"]
    assert not any("NatureCNN" in k for k in params["params"])
    assert out.logits.shape == (5, 2) and out.value.shape == (5,)
    # time-major [T, B, obs] batches work too
    out_tb = jax.jit(net.apply)(params, obs.reshape(1, 5, 4))
    assert out_tb.logits.shape == (1, 5, 2) and out_tb.value.shape == (1, 5)
    np.testing.assert_allclose(out_tb.value[0], out.value, rtol=1e-5)


def test_network_gaussian_for_continuous():
    spec = make_env("Pendulum-v1", 1).spec
    obs = jax.random.normal(jax.random.PRNGKey(1), (5, 3))
    net, params, out = init_apply(spec, obs)
    assert net.torso == "mlp"
    log_std = params["params"]["log_std"]
    assert log_std.shape == (1,)
    np.testing.assert_array_equal(log_std, 0.0)  # unit std at init
    assert out.logits.shape == (5, 1) and out.value.shape == (5,)
    action = sample_action(out, jax.random.PRNGKey(2), discrete=False)
    assert action.shape == (5, 1)
    # log_std is a parameter of the loss: it gets a gradient
    grad = jax.grad(lambda p: net.apply(p, obs).log_std.sum())(params)
    np.testing.assert_array_equal(grad["params"]["log_std"], 1.0)


def test_network_small_gymnax_images_see_the_observation():
    # gymnax MinAtar frames are [10, 10, C] floats (channels last); whatever
    # torso `make_network` picks, its output must depend on the observation.
    spec = make_env("Breakout-MinAtar", 1).spec
    assert spec.obs_shape == (10, 10, 4)
    obs = (jax.random.uniform(jax.random.PRNGKey(1), (2,) + spec.obs_shape) < 0.3)
    net, params, out = init_apply(spec, obs.astype(jnp.float32))
    assert out.logits.shape == (2, 3) and out.value.shape == (2,)
    assert not np.allclose(out.value[0], out.value[1]), (
        f"torso={net.torso!r} ignores the observation: "
        f"{jax.tree.map(lambda x: x.shape, params)}")


def test_a_suite_plugin_that_fails_to_import_troubles_only_ids_no_other_suite_has(monkeypatch):
    """`env.suite=auto` tries the built-in suites first, one at a time: a broken plugin
    suite must not stop a gymnax id."""
    from jaxrl_dist.envs import SUITES, EnvMakeError, resolve_suite

    from importlib.metadata import EntryPoint

    broken = EntryPoint("zz_broken", "jaxrl_dist_no_such_module:Suite", "jaxrl_dist.env_suites")
    monkeypatch.setattr(SUITES, "_plugins", lambda: {"zz_broken": broken})
    assert resolve_suite("CartPole-v1") == "gymnax"
    with pytest.raises(EnvMakeError, match="zz_broken"):
        resolve_suite("NoSuchEnv-v0")


def test_a_suite_plugin_that_breaks_its_contract_is_one_line_naming_it(monkeypatch):
    """A suite without part of its contract, a make of another signature, a make that
    returns no adapter or another number of envs: one line each, not an AttributeError or
    a run that trains (and counts its steps) on the wrong batch."""
    from jaxrl_dist.envs import SUITES, EnvMakeError, make_env
    from jaxrl_dist.envs.gymnax_env import GymnaxEnv

    def suite(make, without=()):
        parts = {"hint": "test", "installed": staticmethod(lambda: True), "has": staticmethod(lambda i: i == "Toy-v0"),
                 "make": staticmethod(make)}
        return type("Toy", (), {k: v for k, v in parts.items() if k not in without})

    cases = [(suite(lambda *a: None, ("make",)), "the suite 'toy' lacks make"),
             (suite(lambda env_id, num_envs: None), "its make cannot be called as make"),
             (suite(lambda i, n, seed=0, num_threads=0, kwargs=None: "cartpole"), "returned a str, which lacks spec"),
             (suite(lambda i, n, seed=0, num_threads=0, kwargs=None: GymnaxEnv("CartPole-v1", n + 1)),
              r"make\('Toy-v0', num_envs=4\) returned 5 envs")]
    for cls, said in cases:
        monkeypatch.setitem(SUITES._builtin, "toy", cls)
        with pytest.raises(EnvMakeError, match=f"^env.suite.*{said}"):
            make_env("Toy-v0", 4, "toy")


def test_an_envpool_env_is_made_without_gymnasium_s_space_warnings():
    """envpool's float64 space bounds made gymnasium warn on every env made (noise)."""
    import warnings

    pytest.importorskip("envpool")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = make_env("CartPole-v1", 2, "envpool")
    assert env.spec.obs_shape == (4,)


def test_the_cnn_on_observations_it_cannot_see_is_one_line():
    """A vector, or a grid smaller than the convolutions' reach (MinAtar's 10x10), is refused
    naming the key before any compile; an Atari stack builds."""
    from jaxrl_dist.config import ConfigError

    for shape in ((4,), (10, 10, 4), (4, 20, 20)):
        spec = EnvSpec("X-v0", "gymnax", shape, np.float32, True, 3)
        with pytest.raises(ConfigError, match=rf"^algo.network=cnn: X-v0's observations are {re.escape(str(shape))}"):
            make_network(spec, "cnn")
    make_network(EnvSpec("Pong-v5", "envpool", (4, 84, 84), np.uint8, True, 6), "cnn")

"""`jaxrl-dist eval` and `jaxrl_dist.load_policy`: a saved run acts, greedily or not."""
from __future__ import annotations

import json
import logging
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_dist import load_policy
from jaxrl_dist.cli.eval import eval_options
from jaxrl_dist.config import ConfigError as CliConfigError
from jaxrl_dist.core import normalize
from jaxrl_dist.evaluation import merge_moments, write_video
from test_cli import run_cli


@pytest.fixture(scope="module")
def solved(tmp_path_factory):
    """CartPole trained by the fused trainer on its defaults (5e5 steps)."""
    run = tmp_path_factory.mktemp("eval") / "cartpole"
    out = run_cli("train", "trainer=fused", f"run.dir={run}", "run.progress=false")
    assert out.returncode == 0, out.stderr
    return run


def test_a_trained_cartpole_evaluates_to_475_greedily_deterministically_and_on_video(solved):
    """Two greedy evaluations give the same returns; the second also writes a video of
    episode 0, which decodes to one frame a step."""
    import imageio.v2 as imageio

    results = []
    for extra in ([], ["eval.video=true"]):
        out = run_cli("eval", str(solved), "eval.episodes=16", *extra, timeout=180)
        assert out.returncode == 0, out.stderr
        # neither orbax's missing-metadata warning nor JAX's fork warning (ffmpeg's start)
        assert "_CHECKPOINT_METADATA" not in out.stderr and "os.fork()" not in out.stderr, out.stderr
        assert "return" in out.stdout and "eval.json" in out.stdout
        results.append(json.loads((solved / "eval.json").read_text()))
    first, again = results
    assert {k: v for k, v in again.items() if not k.startswith("video")} == first  # deterministic
    assert first["mean_return"] >= 475 and first["episodes_ended"] == 16
    assert len(first["returns"]) == len(first["lengths"]) == 16
    assert first["checkpoint_step"] == json.loads((solved / "summary.json").read_text())["num_updates"]
    reader = imageio.get_reader(solved / "eval.mp4")
    assert sum(1 for _ in reader) == again["video_frames"] == again["lengths"][0]
    assert reader.get_meta_data()["size"] == (600, 400)  # gymnasium's CartPole picture
    out = run_cli("eval", str(solved), "eval.seed_index=3", timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: eval.seed_index: 3 is not one of the run's 1 seeds"], out.stderr


def test_image_observations_render_from_the_observation():
    """MinAtar (gymnax) draws its grid from the observation; an Atari frame is drawn from
    the newest frame of the stack; envpool's MuJoCo envs do not render."""
    from jaxrl_dist.envs import EnvMakeError, make_env
    from jaxrl_dist.envs.base import image_frame

    env = make_env("Breakout-MinAtar", 2)
    state, obs = env.reset(__import__("jax").random.PRNGKey(0))
    frame = env.frame(state, 1, obs)
    assert frame.shape == (160, 160, 3) and frame.dtype == np.uint8 and frame.max() == 255
    catch = make_env("Catch-bsuite", 1)  # a grid without channels
    state, obs = catch.reset(__import__("jax").random.PRNGKey(0))
    assert catch.frame(state, 0, obs).shape == (obs.shape[1] * 16, obs.shape[2] * 16, 3)
    stack = np.zeros((4, 84, 84), np.uint8)
    stack[-1, 10, 20] = 200
    atari = image_frame(stack[-1], scale=2)
    assert atari.shape == (168, 168, 3) and atari[20, 40, 0] == 255 and atari.sum() == 255 * 3 * 4
    hopper = make_env("Hopper-v3", 1)
    with pytest.raises(EnvMakeError, match="eval.video: envpool does not render Hopper-v3"):
        hopper.frame(None, 0, np.zeros((1, 11)))


def test_load_policy_acts_on_a_batch_of_observations(solved, caplog, capfd):
    with caplog.at_level(logging.INFO):
        policy = load_policy(solved)
    assert "_CHECKPOINT_METADATA" not in caplog.text + capfd.readouterr().err
    actions = policy(jnp.zeros((5, 4)))
    assert actions.shape == (5,) and set(np.asarray(actions).tolist()) <= {0, 1}
    assert policy.obs_moments is None  # CartPole's run did not normalise observations
    assert repr(policy).startswith("Policy(CartPole-v1, obs (4,), 2 actions, ") and "\n" not in repr(policy)
    with pytest.raises(CliConfigError, match=r"observations of shape \(2, 5\); this policy takes \[N, 4\]"):
        policy(jnp.zeros((2, 5)))


def test_a_sampling_policy_without_a_key_draws_anew_each_call(solved):
    """Without a key a sampled policy draws from its own stream; with one it is the key's."""
    sampled = load_policy(solved, deterministic=False)
    obs = jax.random.normal(jax.random.PRNGKey(0), (512, 4))  # states of all kinds, some of them unsure
    draws = [np.asarray(sampled(obs)) for _ in range(3)]
    assert not (np.array_equal(draws[0], draws[1]) and np.array_equal(draws[1], draws[2]))
    key = jax.random.PRNGKey(7)
    assert np.array_equal(sampled(obs, key), sampled(obs, key))


def test_writing_a_video_starts_ffmpeg_without_a_fork_warning(tmp_path):
    """JAX warns on every fork of its (multithreaded) process; ffmpeg starts without one."""
    from imageio_ffmpeg import count_frames_and_secs

    jax.devices()  # a started backend installs JAX's fork handler
    frames = [np.full((32, 48, 3), 40 * i, np.uint8) for i in range(4)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = write_video(frames, tmp_path / "v.mp4", fps=4)
    assert not [w for w in caught if "os.fork()" in str(w.message)]
    assert count_frames_and_secs(str(path))[0] == 4  # (a reader of imageio's would fork, with a warning)


@pytest.mark.slow  # the merge itself is checked below on numbers
def test_a_round_trainer_run_loads_with_its_slots_statistics_merged(tmp_path):
    run = tmp_path / "pendulum"
    out = run_cli("train", "trainer=sync", "env=pendulum", "scheduler=fixed", "scheduler.num_shards=2",
                  "backend.max_shards=3", "algo.total_timesteps=4096", "algo.num_steps=32",
                  f"run.dir={run}", "run.progress=false", "run.tensorboard=false")
    assert out.returncode == 0, out.stderr
    policy = load_policy(run)
    assert policy.obs_moments is not None and policy.obs_moments.mean.shape == (3,)
    # two slots ran and the third did not: the merge counts the observations the two saw
    assert 4096 * 0.9 < float(policy.obs_moments.count) < 4096 * 1.1 + 1
    action = policy(jnp.zeros((2, 3)))
    assert action.shape == (2, 1) and np.all(np.abs(np.asarray(action)) <= 2.0)


def test_merged_moments_are_the_moments_of_all_the_data():
    rng = np.random.default_rng(0)
    parts = [rng.normal(i, 1 + i, size=(n, 3)).astype(np.float32) for i, n in enumerate((50, 200, 7))]
    stacked = [normalize.update_moments(normalize.init_moments((3,)), jnp.asarray(x)) for x in parts]
    merged = merge_moments(np.stack([m.mean for m in stacked]), np.stack([m.var for m in stacked]),
                           np.stack([m.count for m in stacked]))
    every = np.concatenate(parts)
    np.testing.assert_allclose(merged.mean, every.mean(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(merged.var, every.var(0), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("override, key", [
    ("eval.episodez=3", "eval.episodez"), ("eval.episodes=x", "eval.episodes"),
    ("episodes=3", "eval.KEY=VALUE"), ("eval.episodes=0", "eval.episodes"), ("eval.video_fps=0", "eval.video_fps"),
])
def test_bad_eval_options_name_the_key(override, key):
    with pytest.raises(CliConfigError, match=key):
        eval_options([override])


def test_eval_of_a_directory_that_is_no_run_is_one_line(tmp_path):
    out = run_cli("eval", str(tmp_path), timeout=60)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: {tmp_path}: not a run directory (no config.yaml)"]
    out = run_cli("eval", str(tmp_path / "nope"), timeout=60)  # as `report` says it
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nope'}: not a run directory (does not exist)"]
    with pytest.raises(CliConfigError, match=f"^load_policy: {tmp_path / 'nope'}: not a run directory"):
        load_policy(tmp_path / "nope")  # the library's call names itself, not eval


def test_a_run_trained_with_a_loss_plugin_loads_without_it(solved, tmp_path):
    """A loss shapes no state: a colleague without the run's loss plugin still evaluates it."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(solved, copy)
    config = copy / "config.yaml"
    config.write_text(config.read_text().replace("loss: ppo", "loss: not_installed_here"))
    assert "loss: not_installed_here" in config.read_text()
    actions = load_policy(copy)(jnp.zeros((3, 4)))
    assert actions.shape == (3,)


@pytest.mark.parametrize("opts, named", [({"episodes": 0}, "eval.episodes"), ({"max_steps": -5}, "eval.max_steps"),
                                         ({"episodes": 2.5}, "eval.episodes"), ({"epsiodes": 3}, "eval.epsiodes")])
def test_evaluate_checks_its_options_as_the_cli_does(tmp_path, opts, named):
    """`evaluate(RUN_DIR, opts)` from a library: an `EvalConfig` or a mapping, checked first."""
    from jaxrl_dist.config import EvalConfig
    from jaxrl_dist.evaluation import evaluate

    for given in (opts, None if "epsiodes" in opts or isinstance(opts.get("episodes"), float) else EvalConfig(**opts)):
        if given is not None:
            with pytest.raises(CliConfigError, match=named):
                evaluate(tmp_path, given)

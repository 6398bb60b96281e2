"""Short learning checks through the fused trainer (whole training in one jit)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_dist.config import AlgoConfig, Config, EnvConfig
from jaxrl_dist.envs import make_env
from jaxrl_dist.trainers.fused import make_train


def late_return(metrics, frac=0.1):
    """Per-seed mean return of the episodes finished in the last `frac` of updates.

    `metrics` holds `[U, S]` arrays; episodes are weighted equally, so this is
    sum(episode_return_sum) / sum(episodes) over the last updates.
    """
    ret = np.asarray(metrics["episode_return_sum"])
    count = np.asarray(metrics["episodes"])
    tail = max(1, int(round(ret.shape[0] * frac)))
    assert count[-tail:].sum(axis=0).min() > 0, "no episode finished late in training"
    return ret[-tail:].sum(axis=0) / count[-tail:].sum(axis=0)


def train(cfg: Config):
    env = make_env(cfg.env.id, cfg.env.num_envs * cfg.num_seeds, cfg.env.suite, cfg.seed)
    runner, metrics = make_train(cfg, env)(cfg.seed)
    return runner, jax.tree.map(np.asarray, metrics)


def test_cartpole_learns_with_default_config():
    cfg = Config()
    assert cfg.env.id == "CartPole-v1"
    _, metrics = train(cfg)
    U = cfg.algo.total_timesteps // (cfg.env.num_envs * cfg.algo.num_steps)
    assert metrics["episode_return_sum"].shape == (U, 1)
    assert np.all(np.isfinite(metrics["loss"]))
    early = late_return({k: v[: U // 10] for k, v in metrics.items()}, frac=1.0)
    late = late_return(metrics)
    assert late[0] >= 475.0, f"late mean return {late[0]:.1f} (first 10%: {early[0]:.1f})"


def test_cartpole_two_seeds_give_per_seed_metrics():
    # Two seeds train side by side in one call; each has its own [U] metrics.
    cfg = Config(num_seeds=2, algo=AlgoConfig(total_timesteps=100_000))
    _, metrics = train(cfg)
    U = 100_000 // (4 * 128)
    for k in ("loss", "pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac",
              "episode_return_sum", "episodes", "return_mean"):
        assert metrics[k].shape == (U, 2), k
    # the seeds explore differently...
    assert not np.array_equal(metrics["loss"][:, 0], metrics["loss"][:, 1])
    # ...and both learn: well above the ~20 of a random policy
    late = late_return(metrics)
    assert np.all(late >= 100.0), late


@pytest.mark.slow
def test_pendulum_learns():
    # gymnax Pendulum-v1 (continuous actions): observation normalisation and
    # reward scaling are on by default for continuous actions. A random
    # policy scores about -1200 per episode, a swing-up policy about -150 to
    # -200; these settings reach that in 500k steps for every seed tried.
    cfg = Config(
        env=EnvConfig(id="Pendulum-v1", num_envs=8),
        algo=AlgoConfig(total_timesteps=500_000, num_steps=256, update_epochs=10,
                        num_minibatches=32, lr=1e-3, gamma=0.9, ent_coef=0.0),
    )
    _, metrics = train(cfg)
    early = late_return({k: v[:20] for k, v in metrics.items()}, frac=1.0)
    late = late_return(metrics)
    assert early[0] < -600.0, early
    assert late[0] >= -300.0, late

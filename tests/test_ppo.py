"""PPO core: GAE against hand-computed values, the loss pieces, jit agreement,
no recompiles, and the learning-rate schedule."""
from __future__ import annotations

import contextlib
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_dist.trainers import fused
from jaxrl_dist.core import ppo
from jaxrl_dist.config import AlgoConfig, Config, EnvConfig
from jaxrl_dist.envs import make_env
from jaxrl_dist.core.networks import PolicyOut, make_network
from jaxrl_dist.core.types import EnvSpec, TrainState, Transition


def col(*xs):
    """A `[T, 1]` float32 column (time-major, one env)."""
    return jnp.asarray(xs, jnp.float32)[:, None]


# ---------------------------------------------------------------------------
# GAE
#
# Shared episode, T=4, gamma=0.5, lambda=0.5, so gamma*lambda = 0.25:
#   reward     = [1.0, 2.0, 3.0, 4.0]
#   value      = [0.5, 1.0, 1.5, 2.0]
#   next_value = [1.0, 1.5, 2.0, 2.5]  (value shifted by one; 2.5 bootstraps)
# delta_t = r_t + gamma * (1 - term_t) * next_value_t - value_t
#   d0 = 1 + 0.5*1.0 - 0.5 = 1.0
#   d1 = 2 + 0.5*1.5 - 1.0 = 1.75
#   d2 = 3 + 0.5*2.0 - 1.5 = 2.5
#   d3 = 4 + 0.5*2.5 - 2.0 = 3.25
# A_t = d_t + gamma*lambda*(1 - done_t)*A_{t+1}
#   A3 = 3.25
#   A2 = 2.5  + 0.25*3.25     = 3.3125
#   A1 = 1.75 + 0.25*3.3125   = 2.578125
#   A0 = 1.0  + 0.25*2.578125 = 1.64453125
# ---------------------------------------------------------------------------

REWARD = col(1.0, 2.0, 3.0, 4.0)
VALUE = col(0.5, 1.0, 1.5, 2.0)
NEXT_VALUE = col(1.0, 1.5, 2.0, 2.5)
ZEROS = col(0.0, 0.0, 0.0, 0.0)


def run_gae(reward, value, next_value, terminated, done, gamma, lam):
    adv, target = ppo.gae(reward, value, next_value, terminated, done, gamma, lam)
    return np.asarray(adv), np.asarray(target)


def test_gae_no_episode_end():
    adv, target = run_gae(REWARD, VALUE, NEXT_VALUE, ZEROS, ZEROS, 0.5, 0.5)
    expected = col(1.64453125, 2.578125, 3.3125, 3.25)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    # value targets are advantages plus the values they were measured against
    np.testing.assert_allclose(target, expected + VALUE, rtol=1e-6)
    assert adv.shape == (4, 1) and adv.dtype == np.float32


def test_gae_terminated_step_does_not_bootstrap_and_cuts_recursion():
    # Episode terminates on step 1. Its next_value (the terminal observation's
    # value, 9.0 here) must be ignored, and A1 must not see A2.
    next_value = col(1.0, 9.0, 2.0, 2.5)
    term = col(0.0, 1.0, 0.0, 0.0)
    adv, target = run_gae(REWARD, VALUE, next_value, term, term, 0.5, 0.5)
    # d1 = 2 + 0 - 1.0 = 1.0 ; A1 = d1 = 1.0 ; A0 = 1.0 + 0.25*1.0 = 1.25
    # A2, A3 belong to the next episode and are unchanged.
    expected = col(1.25, 1.0, 3.3125, 3.25)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(target, expected + VALUE, rtol=1e-6)


def test_gae_truncated_step_bootstraps_from_final_observation():
    # Episode is truncated on step 1: it bootstraps from next_value[1] = 9.0
    # (the final observation's value, not value[2] = 1.5 of the reset obs),
    # and the recursion is still cut.
    next_value = col(1.0, 9.0, 2.0, 2.5)
    done = col(0.0, 1.0, 0.0, 0.0)
    adv, _ = run_gae(REWARD, VALUE, next_value, ZEROS, done, 0.5, 0.5)
    # d1 = 2 + 0.5*9.0 - 1.0 = 5.5 ; A1 = 5.5 ; A0 = 1.0 + 0.25*5.5 = 2.375
    expected = col(2.375, 5.5, 3.3125, 3.25)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)


def test_gae_terminated_on_last_step():
    term = col(0.0, 0.0, 0.0, 1.0)
    adv, _ = run_gae(REWARD, VALUE, NEXT_VALUE, term, term, 0.5, 0.5)
    # d3 = 4 + 0 - 2.0 = 2.0 ; A3 = 2.0
    # A2 = 2.5 + 0.25*2.0 = 3.0 ; A1 = 1.75 + 0.25*3.0 = 2.5 ; A0 = 1.0 + 0.25*2.5 = 1.625
    np.testing.assert_allclose(adv, col(1.625, 2.5, 3.0, 2.0), rtol=1e-6)


def test_gae_batch_columns_are_independent():
    # B=2: column 0 is the terminated case, column 1 the truncated case;
    # each must equal its single-env result.
    next_value = jnp.concatenate([col(1.0, 9.0, 2.0, 2.5)] * 2, axis=1)
    reward = jnp.concatenate([REWARD] * 2, axis=1)
    value = jnp.concatenate([VALUE] * 2, axis=1)
    term = jnp.concatenate([col(0.0, 1.0, 0.0, 0.0), ZEROS], axis=1)
    done = jnp.concatenate([col(0.0, 1.0, 0.0, 0.0)] * 2, axis=1)
    adv, _ = run_gae(reward, value, next_value, term, done, 0.5, 0.5)
    np.testing.assert_allclose(adv[:, 0], [1.25, 1.0, 3.3125, 3.25], rtol=1e-6)
    np.testing.assert_allclose(adv[:, 1], [2.375, 5.5, 3.3125, 3.25], rtol=1e-6)


def test_gae_gamma_zero_is_immediate_reward():
    # gamma = 0: A_t = r_t - v_t whatever lambda and next values are.
    adv, target = run_gae(REWARD, VALUE, NEXT_VALUE, ZEROS, ZEROS, 0.0, 0.95)
    np.testing.assert_allclose(adv, col(0.5, 1.0, 1.5, 2.0), rtol=1e-6)
    np.testing.assert_allclose(target, REWARD, rtol=1e-6)


def test_gae_lambda_zero_is_one_step_td():
    # lambda = 0: A_t = delta_t (the deltas listed at the top).
    adv, _ = run_gae(REWARD, VALUE, NEXT_VALUE, ZEROS, ZEROS, 0.5, 0.0)
    np.testing.assert_allclose(adv, col(1.0, 1.75, 2.5, 3.25), rtol=1e-6)


def test_gae_gamma_lambda_one_is_monte_carlo_return():
    # gamma = lambda = 1 with next_value = value shifted: the values telescope,
    # A_t = sum_{k>=t} r_k + next_value[T-1] - v_t  (bootstrap 2.5):
    #   A0 = 10 + 2.5 - 0.5 = 12.0 ; A1 = 9 + 2.5 - 1.0 = 10.5
    #   A2 =  7 + 2.5 - 1.5 =  8.0 ; A3 = 4 + 2.5 - 2.0 =  4.5
    adv, target = run_gae(REWARD, VALUE, NEXT_VALUE, ZEROS, ZEROS, 1.0, 1.0)
    np.testing.assert_allclose(adv, col(12.0, 10.5, 8.0, 4.5), rtol=1e-6)
    np.testing.assert_allclose(target, col(12.5, 11.5, 9.5, 6.5), rtol=1e-6)


def test_gae_t5_two_episodes_with_gamma_and_lambda_one():
    # T=5, gamma = lambda = 1, all values 0, episode terminates at t=1,
    # the second one runs on: advantages are plain reward-to-go per episode.
    reward = col(1.0, 1.0, 1.0, 1.0, 1.0)
    zeros = col(0.0, 0.0, 0.0, 0.0, 0.0)
    term = col(0.0, 1.0, 0.0, 0.0, 0.0)
    adv, _ = run_gae(reward, zeros, zeros, term, term, 1.0, 1.0)
    np.testing.assert_allclose(adv, col(2.0, 1.0, 3.0, 2.0, 1.0), rtol=1e-6)


def test_gae_under_jit_matches_eager():
    next_value = col(1.0, 9.0, 2.0, 2.5)
    done = col(0.0, 1.0, 0.0, 0.0)
    jitted = jax.jit(ppo.gae, static_argnums=(5, 6))
    adv_j, _ = jitted(REWARD, VALUE, next_value, ZEROS, done, 0.5, 0.5)
    np.testing.assert_allclose(np.asarray(adv_j), col(2.375, 5.5, 3.3125, 3.25), rtol=1e-6)


def value_of_obs_sum(params, obs):
    """A tiny deterministic 'network': the value is the sum of the observation."""
    value = obs.sum(-1)
    return PolicyOut(jnp.zeros(value.shape + (2,)), jnp.zeros((2,)), value)


def make_traj(obs, final_obs, reward, terminated, truncated):
    T, B = reward.shape
    zeros = jnp.zeros((T, B), jnp.float32)
    return Transition(obs=obs, final_obs=final_obs, action=jnp.zeros((T, B), jnp.int32),
                      log_prob=zeros, value=obs.sum(-1), reward=reward,
                      terminated=terminated, truncated=truncated,
                      valid=jnp.ones((T, B), bool), done_return=zeros,
                      done=jnp.zeros((T, B), bool))


def test_make_batch_truncation_bootstraps_from_stored_final_obs():
    # T=3, B=1, obs values v = [1, 2, 3]; step 1 is truncated and its final
    # observation has value 10 (the reset observation at t=2 has value 3).
    obs = jnp.asarray([[[1.0]], [[2.0]], [[3.0]]])
    final_obs = jnp.asarray([[[2.0]], [[10.0]], [[4.0]]])
    reward = jnp.ones((3, 1))
    trunc = jnp.asarray([[False], [True], [False]])
    traj = make_traj(obs, final_obs, reward, jnp.zeros((3, 1), bool), trunc)
    opts = ppo.PPOOptions(gamma=0.5, gae_lambda=1.0)
    batch = ppo.make_batch(value_of_obs_sum, None, traj, jnp.asarray([4.0]), opts)
    # d2 = 1 + 0.5*4 - 3 = 0 ; A2 = 0
    # d1 = 1 + 0.5*10 - 2 = 4 ; A1 = 4 (cut)
    # d0 = 1 + 0.5*2 - 1 = 1 ; A0 = 1 + 0.5*4 = 3
    np.testing.assert_allclose(np.asarray(batch.advantage), [3.0, 4.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(batch.target), [4.0, 6.0, 3.0], rtol=1e-6)


def test_make_batch_delayed_reset_uses_next_obs_value():
    # envpool-style trajectory (final_obs=None): the next value is the next
    # step's value and the last one is the rollout's bootstrap value 5.
    obs = jnp.asarray([[[1.0]], [[2.0]], [[3.0]]])
    traj = make_traj(obs, None, jnp.ones((3, 1)), jnp.zeros((3, 1), bool),
                     jnp.zeros((3, 1), bool))
    nv = ppo.next_values(value_of_obs_sum, None, traj, jnp.asarray([5.0]))
    np.testing.assert_allclose(np.asarray(nv), [[2.0], [3.0], [5.0]])


# ---------------------------------------------------------------------------
# Loss pieces. `fixed_policy` returns the parameters themselves as the network
# output, so every log-probability, value and entropy is known exactly.
# ---------------------------------------------------------------------------


def fixed_policy(params, obs):
    return PolicyOut(params["logits"], params["log_std"], params["value"])


def make_loss_batch(ratio, adv, value_old=None, target=None, valid=None):
    """Discrete 2-action batch with uniform current policy (log p = log 0.5)."""
    ratio = np.asarray(ratio, np.float32)
    m = ratio.shape[0]
    old_logp = np.log(0.5) - np.log(ratio)
    return ppo.Batch(
        obs=jnp.zeros((m, 1)), action=jnp.zeros((m,), jnp.int32),
        log_prob=jnp.asarray(old_logp, jnp.float32),
        value=jnp.zeros((m,)) if value_old is None else jnp.asarray(value_old, jnp.float32),
        advantage=jnp.asarray(adv, jnp.float32),
        target=jnp.zeros((m,)) if target is None else jnp.asarray(target, jnp.float32),
        valid=jnp.ones((m,), bool) if valid is None else jnp.asarray(valid))


def uniform_params(m, value=None):
    return {"logits": jnp.zeros((m, 2)), "log_std": jnp.zeros((2,)),
            "value": jnp.zeros((m,)) if value is None else jnp.asarray(value, jnp.float32)}


RAW = dict(norm_adv=False, ent_coef=0.0, vf_coef=0.0, clip_eps=0.2)


def test_clipped_surrogate_inside_and_outside_clip_range():
    # clip_eps = 0.2, per row -min(r*A, clip(r, 0.8, 1.2)*A):
    #   r=1.1, A= 1: min(1.1, 1.1)   -> -1.1   (inside the range)
    #   r=1.5, A= 1: min(1.5, 1.2)   -> -1.2   (clipped above)
    #   r=0.5, A=-1: min(-0.5, -0.8) ->  0.8   (clipped below)
    #   r=1.5, A=-1: min(-1.5, -1.2) ->  1.5   (outside, pessimistic unclipped)
    #   r=0.5, A= 1: min(0.5, 0.8)   -> -0.5   (outside, pessimistic unclipped)
    # mean = (-1.1 - 1.2 + 0.8 + 1.5 - 0.5) / 5 = -0.1
    ratio = [1.1, 1.5, 0.5, 1.5, 0.5]
    batch = make_loss_batch(ratio, [1.0, 1.0, -1.0, -1.0, 1.0])
    opts = ppo.PPOOptions(**RAW)
    loss, m = ppo.ppo_loss(uniform_params(5), fixed_policy, batch, opts)
    np.testing.assert_allclose(float(m["pg_loss"]), -0.1, atol=1e-6)
    np.testing.assert_allclose(float(loss), -0.1, atol=1e-6)
    # |r - 1| > 0.2 for every row but the first
    np.testing.assert_allclose(float(m["clipfrac"]), 0.8, atol=1e-6)
    # approx_kl = mean((r - 1) - log r)
    kl = np.mean([(r - 1.0) - math.log(r) for r in ratio])
    np.testing.assert_allclose(float(m["approx_kl"]), kl, rtol=1e-5)

    # Clipped rows carry no policy gradient; the others do.
    grads = jax.grad(lambda p: ppo.ppo_loss(p, fixed_policy, batch, opts)[0])(uniform_params(5))
    g = np.abs(np.asarray(grads["logits"])).sum(-1)
    assert g[1] == 0.0 and g[2] == 0.0
    assert np.all(g[[0, 3, 4]] > 1e-3)


def test_ratio_one_gives_zero_kl_and_clipfrac():
    batch = make_loss_batch([1.0, 1.0, 1.0], [1.0, -2.0, 4.0])
    _, m = ppo.ppo_loss(uniform_params(3), fixed_policy, batch, ppo.PPOOptions(**RAW))
    # ratio 1: pg_loss = -mean(A) = -(1 - 2 + 4)/3 = -1
    np.testing.assert_allclose(float(m["pg_loss"]), -1.0, atol=1e-6)
    assert float(m["approx_kl"]) == pytest.approx(0.0, abs=1e-7)
    assert float(m["clipfrac"]) == 0.0


def test_advantage_normalisation():
    # A = [1, 2, 3, 4]: mean 2.5, std sqrt(1.25); all ratios inside the clip
    # range, so pg_loss = -mean(r * (A - 2.5) / sqrt(1.25)).
    ratio = np.array([1.0, 1.1, 0.9, 1.0])
    adv = np.array([1.0, 2.0, 3.0, 4.0])
    batch = make_loss_batch(ratio, adv)
    opts = ppo.PPOOptions(**{**RAW, "norm_adv": True})
    _, m = ppo.ppo_loss(uniform_params(4), fixed_policy, batch, opts)
    expected = -np.mean(ratio * (adv - 2.5) / math.sqrt(1.25))  # = -0.02236068
    np.testing.assert_allclose(float(m["pg_loss"]), expected, rtol=1e-5)


VALUE_NEW = [0.1, 1.0, -1.0, 0.5]
VALUE_OLD = [0.0, 0.0, 0.0, 0.0]
TARGET = [0.0, 2.0, 0.0, 0.3]


def test_value_loss_unclipped():
    # squared errors: 0.01, 1.0, 1.0, 0.04 -> mean 0.5125 -> v_loss = 0.25625
    batch = make_loss_batch([1.0] * 4, [0.0] * 4, VALUE_OLD, TARGET)
    opts = ppo.PPOOptions(**{**RAW, "vf_coef": 0.5})
    loss, m = ppo.ppo_loss(uniform_params(4, VALUE_NEW), fixed_policy, batch, opts)
    np.testing.assert_allclose(float(m["v_loss"]), 0.25625, rtol=1e-5)
    np.testing.assert_allclose(float(loss), 0.5 * 0.25625, rtol=1e-5)


def test_value_loss_clipped():
    # v_clip = v_old + clip(v - v_old, -0.2, 0.2) = [0.1, 0.2, -0.2, 0.2]
    # max(unclipped, clipped) per row:
    #   row0: max(0.01, 0.01)             = 0.01
    #   row1: max(1.0, (0.2-2)^2 = 3.24)  = 3.24
    #   row2: max(1.0, 0.04)              = 1.0
    #   row3: max(0.04, (0.2-0.3)^2=0.01) = 0.04
    # mean = 4.29 / 4 = 1.0725 -> v_loss = 0.53625
    batch = make_loss_batch([1.0] * 4, [0.0] * 4, VALUE_OLD, TARGET)
    opts = ppo.PPOOptions(**{**RAW, "clip_vloss": True})
    _, m = ppo.ppo_loss(uniform_params(4, VALUE_NEW), fixed_policy, batch, opts)
    np.testing.assert_allclose(float(m["v_loss"]), 0.53625, rtol=1e-5)


def test_entropy_categorical():
    # row 0: logits [0, 0]     -> p = [1/2, 1/2], H = ln 2
    # row 1: logits [0, ln 3]  -> p = [1/4, 3/4], H = -(1/4 ln 1/4 + 3/4 ln 3/4)
    params = uniform_params(2)
    params["logits"] = jnp.asarray([[0.0, 0.0], [0.0, math.log(3.0)]])
    batch = make_loss_batch([1.0, 1.0], [0.0, 0.0])
    opts = ppo.PPOOptions(**{**RAW, "ent_coef": 0.1})
    loss, m = ppo.ppo_loss(params, fixed_policy, batch, opts)
    h1 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623351
    ent = (math.log(2.0) + h1) / 2
    np.testing.assert_allclose(float(m["entropy"]), ent, rtol=1e-5)
    # loss = pg(=0: ratio 1, A 0) + 0 * v_loss - 0.1 * entropy
    np.testing.assert_allclose(float(loss), -0.1 * ent, rtol=1e-5)


def test_entropy_gaussian():
    # log_std = [0, ln 2]: H = sum(log_std) + A/2 * (1 + ln 2pi)
    #                        = ln 2 + (1 + ln 2pi)  ~= 3.5310
    m_rows = 3
    params = {"logits": jnp.zeros((m_rows, 2)), "log_std": jnp.asarray([0.0, math.log(2.0)]),
              "value": jnp.zeros((m_rows,))}
    action = jnp.zeros((m_rows, 2))  # at the mean
    # log N(mean | mean, std) = -sum(log_std) - A/2 ln 2pi
    logp = -math.log(2.0) - math.log(2 * math.pi)
    batch = ppo.Batch(obs=jnp.zeros((m_rows, 1)), action=action,
                      log_prob=jnp.full((m_rows,), logp, jnp.float32),
                      value=jnp.zeros((m_rows,)), advantage=jnp.ones((m_rows,)),
                      target=jnp.zeros((m_rows,)), valid=jnp.ones((m_rows,), bool))
    opts = ppo.PPOOptions(**{**RAW, "discrete": False})
    _, m = ppo.ppo_loss(params, fixed_policy, batch, opts)
    np.testing.assert_allclose(float(m["entropy"]), math.log(2.0) + 1 + math.log(2 * math.pi),
                               rtol=1e-5)
    # the stored log-prob is exact, so the ratio is 1 everywhere
    np.testing.assert_allclose(float(m["pg_loss"]), -1.0, rtol=1e-5)
    assert float(m["approx_kl"]) == pytest.approx(0.0, abs=1e-6)
    # a log-std per state (`[M, A]`, a network's own head): the same per-sample entropy
    per_state = {**params, "log_std": jnp.tile(params["log_std"], (m_rows, 1))}
    _, m2 = ppo.ppo_loss(per_state, fixed_policy, batch, opts)
    np.testing.assert_allclose(float(m2["entropy"]), float(m["entropy"]), rtol=1e-6)
    np.testing.assert_allclose(float(m2["pg_loss"]), -1.0, rtol=1e-5)


def test_masked_mean_ignores_invalid_rows():
    # Rows 2 and 4 are invalid with wild values; the masked loss must equal
    # the unmasked loss over the valid rows only (advantage normalisation
    # statistics included).
    ratio = [1.1, 1.5, 3.0, 0.5, 0.1]
    adv = [1.0, 2.0, 100.0, -1.0, -50.0]
    v_new = [0.1, 1.0, 40.0, -1.0, -30.0]
    v_old = [0.0, 0.0, -5.0, 0.0, 7.0]
    target = [0.0, 2.0, 99.0, 0.0, -99.0]
    valid = [True, True, False, True, False]
    keep = np.flatnonzero(valid)
    params = uniform_params(5, v_new)
    params["logits"] = jnp.asarray([[0.0, 0.0]] * 4 + [[0.0, 1.0]])
    full = make_loss_batch(ratio, adv, v_old, target, valid)
    part = jax.tree.map(lambda x: x[keep], full)
    part_params = {**params, "logits": params["logits"][keep], "value": params["value"][keep]}
    for clip_vloss in (False, True):
        opts = ppo.PPOOptions(clip_vloss=clip_vloss, norm_adv=True, ent_coef=0.01)
        loss_m, m_m = ppo.ppo_loss(params, fixed_policy, full, opts._replace(masked=True))
        loss_p, m_p = ppo.ppo_loss(part_params, fixed_policy, part, opts)
        np.testing.assert_allclose(float(loss_m), float(loss_p), rtol=1e-5)
        for k in m_p:
            np.testing.assert_allclose(float(m_m[k]), float(m_p[k]), rtol=1e-5, atol=1e-7,
                                       err_msg=k)
    # without the mask the invalid rows do change the result
    loss_u, _ = ppo.ppo_loss(params, fixed_policy, full, ppo.PPOOptions(norm_adv=True))
    assert abs(float(loss_u) - float(loss_p)) > 1e-2


def test_masked_all_invalid_is_finite():
    batch = make_loss_batch([1.5, 0.5], [1.0, -1.0], valid=[False, False])
    loss, m = ppo.ppo_loss(uniform_params(2), fixed_policy, batch, ppo.PPOOptions(masked=True))
    assert np.isfinite(float(loss))
    assert all(np.isfinite(float(v)) for v in m.values())


# ---------------------------------------------------------------------------
# jit agreement and recompiles, with the real network
# ---------------------------------------------------------------------------

CARTPOLE_SPEC = EnvSpec("CartPole-v1", "gymnax", (4,), np.dtype(np.float32), True, 2)
T_, B_ = 8, 4  # minibatch of T*B/2 = 16 rows in the update; the loss test uses the same


@pytest.fixture(scope="module")
def real():
    """Real CartPole actor-critic, its train state and a random trajectory."""
    net = make_network(CARTPOLE_SPEC)
    params = jax.jit(net.init)(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
    tx = ppo.make_optimizer(2.5e-4, 0.5, 1e-5, anneal_steps=100)
    state = TrainState(params=params, opt_state=jax.jit(tx.init)(params),
                       step=jnp.zeros((), jnp.int32), apply_fn=net.apply, tx=tx)
    opts = ppo.PPOOptions(update_epochs=2, num_minibatches=2)
    make_traj_j = jax.jit(random_traj, static_argnums=1)
    trajs = [make_traj_j(jax.random.PRNGKey(i), net, params) for i in (1, 2)]
    return net, state, opts, trajs


def random_traj(key, net, params):
    k = jax.random.split(key, 6)
    obs = jax.random.normal(k[0], (T_, B_, 4))
    final_obs = jax.random.normal(k[1], (T_, B_, 4))
    out = net.apply(params, obs)
    action = jax.random.randint(k[2], (T_, B_), 0, 2)
    logp = jax.nn.log_softmax(out.logits)
    log_prob = jnp.take_along_axis(logp, action[..., None], -1)[..., 0]
    # perturb the behaviour log-prob so ratios differ from 1 and some get clipped
    log_prob = log_prob + 0.3 * jax.random.normal(k[3], (T_, B_))
    term = jax.random.uniform(k[4], (T_, B_)) < 0.1
    trunc = (jax.random.uniform(k[5], (T_, B_)) < 0.1) & ~term
    return Transition(obs=obs, final_obs=final_obs, action=action, log_prob=log_prob,
                      value=out.value, reward=jnp.ones((T_, B_)), terminated=term,
                      truncated=trunc, valid=jnp.ones((T_, B_), bool),
                      done_return=jnp.zeros((T_, B_)), done=term | trunc)


def test_update_jit_matches_eager(real):
    net, state, opts, (traj, _) = real
    last_value = jnp.zeros((B_,))
    key = jax.random.PRNGKey(3)
    update = ppo.make_update(net.apply, opts)
    new_j, m_j = jax.jit(update)(state, traj, last_value, key)
    with jax.disable_jit():
        new_e, m_e = update(state, traj, last_value, key)
    assert int(new_j.step) == int(new_e.step) == opts.update_epochs * opts.num_minibatches
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 new_j.params, new_e.params)
    for k in m_e:
        np.testing.assert_allclose(float(m_j[k]), float(m_e[k]), rtol=1e-4, atol=1e-6, err_msg=k)
    # the update did move the parameters
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), new_j.params, state.params)
    assert max(jax.tree.leaves(moved)) > 1e-5


def test_loss_jit_matches_eager(real):
    net, state, opts, (traj, _) = real
    batch = jax.jit(lambda p, t: ppo.make_batch(net.apply, p, t, jnp.zeros((B_,)), opts))(
        state.params, traj)
    batch = jax.tree.map(lambda x: x[: T_ * B_ // 2], batch)  # one minibatch
    grad_fn = jax.value_and_grad(ppo.ppo_loss, has_aux=True)
    (loss_j, m_j), g_j = jax.jit(lambda p, b: grad_fn(p, net.apply, b, opts))(state.params, batch)
    with jax.disable_jit():
        (loss_e, m_e), g_e = grad_fn(state.params, net.apply, batch, opts)
    np.testing.assert_allclose(float(loss_j), float(loss_e), rtol=1e-5, atol=1e-6)
    for k in m_e:
        np.testing.assert_allclose(float(m_j[k]), float(m_e[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(m_e["clipfrac"]) > 0  # the perturbed ratios reach the clip
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g_j, g_e)


class CompileLog(logging.Handler):
    """Collects jax's 'Compiling ...' log lines (jax_log_compiles)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Compiling") or "Finished XLA compilation" in msg:
            self.lines.append(msg)


@contextlib.contextmanager
def log_compiles():
    """Yields the list of XLA compilations that happen inside the block."""
    handler = CompileLog()
    logger = logging.getLogger("jax")
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # keep the compile log out of pytest's captured output
    jax.config.update("jax_log_compiles", True)
    try:
        yield handler.lines
    finally:
        jax.config.update("jax_log_compiles", False)
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate


def test_second_update_call_does_not_recompile(real):
    net, state, opts, (traj1, traj2) = real
    update = jax.jit(ppo.make_update(net.apply, opts))
    state1, _ = update(state, traj1, jnp.zeros((B_,)), jax.random.PRNGKey(6))
    assert update._cache_size() == 1
    with log_compiles() as compiled:
        state2, _ = update(state1, traj2, jnp.ones((B_,)), jax.random.PRNGKey(7))
        jax.block_until_ready(state2)
    assert update._cache_size() == 1
    assert compiled == []


def small_cfg(**algo):
    # 4 envs x 16 steps = 64 per update, 4 updates, 2 epochs x 2 minibatches
    algo = {"total_timesteps": 4 * 16 * 4, "num_steps": 16, "update_epochs": 2,
            "num_minibatches": 2, **algo}
    return Config(env=EnvConfig(num_envs=4), algo=AlgoConfig(**algo))


def run_two_chunks(env_id, suite="auto"):
    """Two calls of one 2-update chunk; records compiles during the second."""
    cfg = small_cfg()
    env = make_env(env_id, cfg.env.num_envs, suite=suite)
    setup = fused.make_setup(cfg, env.spec)
    chunk = fused.make_train_chunk(setup, env, 2)
    runner = fused.init_runner(setup, env, 0)
    types_in = avals(runner)
    runner, m1 = chunk(runner)
    sizes = [chunk._cache_size()]
    with log_compiles() as compiled:
        runner, m2 = chunk(runner)
        jax.block_until_ready(m2)
    sizes.append(chunk._cache_size())
    changed = {k: (v, avals(runner)[k]) for k, v in types_in.items() if avals(runner)[k] != v}
    return dict(cfg=cfg, env=env, setup=setup, runner=runner, metrics=(m1, m2),
                cache_sizes=sizes, compiled=list(compiled), changed=changed)


def avals(tree):
    """`{path: (shape, dtype, weak_type)}` of every array leaf."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(k): (x.shape, str(x.dtype), x.weak_type) for k, x in leaves}


@pytest.fixture(scope="module")
def cartpole_chunks():
    return run_two_chunks("CartPole-v1")


def test_second_train_chunk_call_does_not_recompile(cartpole_chunks):
    run = cartpole_chunks
    assert run["changed"] == {}  # the chunk returns the runner types it takes
    assert run["cache_sizes"] == [1, 1]
    assert run["compiled"] == []
    assert int(run["runner"].update) == 4
    assert run["metrics"][1]["loss"].shape == (2, 1)


def test_second_train_chunk_call_does_not_recompile_continuous():
    run = run_two_chunks("Pendulum-v1")
    # (shape, dtype, weak_type) of runner leaves before -> after one chunk
    assert run["changed"] == {}
    assert run["cache_sizes"] == [1, 1]
    assert run["compiled"] == []


def test_second_train_chunk_call_does_not_recompile_envpool():
    pytest.importorskip("envpool")
    run = run_two_chunks("CartPole-v1", suite="envpool")
    assert run["changed"] == {}
    assert run["cache_sizes"] == [1, 1]
    assert run["compiled"] == []


def test_train_chunks_continue_a_single_call(cartpole_chunks):
    # Two chunks of 2 updates reproduce one 4-update training call exactly.
    run = cartpole_chunks
    runner4, metrics = fused.make_train(run["cfg"], run["env"])(0)
    assert metrics["loss"].shape == (4, 1)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 run["runner"].train.params, runner4.train.params)
    for k in ("loss", "approx_kl", "episodes"):
        np.testing.assert_allclose(np.concatenate([m[k] for m in run["metrics"]]),
                                   metrics[k], rtol=1e-5, atol=1e-6, err_msg=k)


# ---------------------------------------------------------------------------
# optimiser
# ---------------------------------------------------------------------------


def adam_steps(tx, n):
    """Updates for `n` steps of a constant unit gradient on one scalar."""
    params = jnp.zeros(())
    state = tx.init(params)
    out = []
    for _ in range(n):
        upd, state = tx.update(jnp.ones(()), state, params)
        out.append(float(upd))
    return np.asarray(out)


def test_make_optimizer_anneals_lr_linearly_to_zero():
    # With a constant gradient Adam's bias-corrected step is exactly
    # -lr_t * g / (|g| + eps), so the updates trace the schedule:
    # lr_t = 1 - t/4 for t = 0..4, then 0.
    tx = ppo.make_optimizer(1.0, max_grad_norm=10.0, adam_eps=1e-8, anneal_steps=4)
    np.testing.assert_allclose(-adam_steps(tx, 6), [1.0, 0.75, 0.5, 0.25, 0.0, 0.0],
                               rtol=1e-4, atol=1e-6)


def test_make_optimizer_without_annealing_is_constant():
    tx = ppo.make_optimizer(0.5, max_grad_norm=10.0, adam_eps=1e-8, anneal_steps=0)
    np.testing.assert_allclose(-adam_steps(tx, 4), [0.5] * 4, rtol=1e-4)


def test_setup_anneals_over_all_gradient_steps(cartpole_chunks):
    # make_setup anneals over num_updates * epochs * minibatches gradient
    # steps: after the whole training the learning rate is zero, so one more
    # optimiser step leaves the parameters unchanged.
    run = cartpole_chunks
    setup, runner = run["setup"], run["runner"]
    assert setup.derived.num_updates == 4
    assert int(runner.train.step[0]) == 4 * 2 * 2
    params = jax.tree.map(lambda x: x[0], runner.train.params)
    opt_state = jax.tree.map(lambda x: x[0], runner.train.opt_state)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = jax.jit(setup.tx.update)(grads, opt_state, params)
    assert max(float(jnp.abs(u).max()) for u in jax.tree.leaves(updates)) == 0.0


def test_minibatch_size_runs_one_step_per_minibatch_of_real_samples(real):
    """Under `minibatch_size` the real samples set the step count; skipped steps
    leave params and the optimiser (and so the LR schedule) untouched."""
    net, state, opts, (traj, _) = real
    size = T_ * B_ // 4
    update = jax.jit(ppo.make_update(net.apply, opts._replace(minibatch_size=size, masked=True)))
    last_value, key = jnp.zeros((B_,)), jax.random.PRNGKey(3)
    half = jnp.broadcast_to(jnp.arange(B_) < B_ // 2, (T_, B_))
    for real_mask, steps in ((jnp.ones((T_, B_), bool), 4), (half, 2), (jnp.zeros((T_, B_), bool), 0)):
        padded = traj._replace(valid=real_mask)
        new, metrics = update(state, padded, last_value, key, real_mask)
        assert int(new.step) == steps * opts.update_epochs
        counts = [int(x) for x in jax.tree.leaves(new.opt_state) if jnp.issubdtype(x.dtype, jnp.integer)]
        assert counts and all(c == steps * opts.update_epochs for c in counts)
        if steps == 0:
            jax.tree.map(np.testing.assert_array_equal, new.params, state.params)
        assert all(np.isfinite(float(v)) for v in metrics.values())


def test_make_train_checks_its_config_and_the_env_size():
    """The low-level entry checks what `train` checks, and that the env holds every seed's envs."""
    from jaxrl_dist.config import ConfigError

    cfg = Config(env=EnvConfig(num_envs=4), algo=AlgoConfig(total_timesteps=4096), num_seeds=3)
    with pytest.raises(ConfigError, match=r"the env has 4 envs; the config's seeds need env.num_envs\*num_seeds=12"):
        fused.make_train(cfg, make_env("CartPole-v1", 4))
    bad = Config(algo=AlgoConfig(minibatch_size=100))
    with pytest.raises(ConfigError, match="algo.minibatch_size=100 does not divide"):
        fused.make_train(bad, make_env("CartPole-v1", 4))


@pytest.mark.parametrize("returns, said", [
    (lambda loss, m: loss, r"returned one array of shape \(\), not a \(loss, metrics\) pair"),  # the scalar alone
    (lambda loss, m: (loss, 1.0), "returned metrics as a float, not a dict"),
    (lambda loss, m: (jnp.stack([loss] * 3), m), r"returned a loss of shape \(3,\), not a scalar"),
    (lambda loss, m: (loss, m, 0.0), "returned a tuple of 3"),
    (lambda loss, m: (loss, {**m, "per_sample": jnp.zeros(3)}), r"returned metrics \['per_sample'\] that are not scalars"),
])
def test_a_loss_that_breaks_its_contract_is_one_line_naming_it(real, returns, said):
    """A plugin loss's output is checked as the update traces it (a wrong structure failed as
    a shape error in the trainer), and a loss of another signature when it is chosen."""
    from jaxrl_dist.config import ConfigError

    net, state, opts, (traj, _) = real

    def mine(params, apply_fn, batch, opts, options):
        return returns(*ppo.ppo_loss(params, apply_fn, batch, opts))

    update = ppo.make_update(net.apply, opts._replace(loss=mine))
    with pytest.raises(ConfigError, match=f"^algo.loss: the loss mine {said}.*a loss is loss\\(params"):
        jax.eval_shape(update, state, traj, jnp.zeros((B_,)), jax.random.PRNGKey(3))

    def four(params, apply_fn, batch, opts):
        return 0.0

    with pytest.raises(ConfigError, match=r"^algo.loss=four: it cannot be called as loss\(params, apply_fn, batch"):
        ppo.checked_loss(AlgoConfig(), four)

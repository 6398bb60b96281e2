"""The learned scheduler: its scheduling MDP, training with the core PPO, loading and use."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_dist.scheduling import learned
from jaxrl_dist import scheduler_training
from jaxrl_dist.scheduling import mdp
from jaxrl_dist.scheduling import profile
from jaxrl_dist.scheduling import cost
from jaxrl_dist.scheduling.records import Record
from jaxrl_dist.backends.local import make_round_body
from jaxrl_dist.config import CostConfig, from_dict

M = 2


def task(env_id="CartPole-v1"):
    return from_dict({"trainer": "sync", "env": {"id": env_id}, "backend": {"name": "local", "envs_per_shard": 2, "max_shards": M},
                      "scheduler": {"num_shards": M},
                      "algo": {"num_steps": 8, "num_minibatches": 1, "update_epochs": 1,
                               "total_timesteps": 2 * 8 * 20}})


def make_env(target=475.0, max_rounds=3, episodes=2, budgets=(0.0, 0.0), deadlines=(0.0, 0.0), no_limit=0.5,
             features=mdp.BASE_FEATURES):
    """The scheduling MDP of a tiny CartPole run; by default no episode has a limit."""
    opts = mdp.SchedOptions(M, max_rounds, target, 0.5, 10.0, profile.Profile(),
                            mdp.Scale(0.0, 500.0, max_rounds, M), budgets, deadlines, no_limit, features=features)
    return mdp.SchedulingEnv(task(), CostConfig(), opts, episodes)


def limited_env(budget: float, deadline: float):
    """The tiny task's MDP with every episode under a budget and a deadline (shares of
    `max_rounds` rounds at M shards), seeing every feature: one program for the tests of
    limits (XLA's compile cache serves it to the second)."""
    return make_env(budgets=(budget, budget), deadlines=(deadline, deadline), no_limit=0.0, features=mdp.FEATURES)


def acrobot_env(max_rounds=3, episodes=2):
    """The tiny task's scheduling MDP on Acrobot, on its own return range."""
    opts = mdp.SchedOptions(M, max_rounds, -100.0, 0.5, 10.0, profile.Profile(),
                            mdp.Scale(-500.0, -60.0, max_rounds, M))
    return mdp.SchedulingEnv(task("Acrobot-v1"), CostConfig(), opts, episodes)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A scheduler trained over two tasks, one update each (CartPole first)."""
    out = scheduler_training.train_scheduler([make_env(), acrobot_env()], num_steps=2, updates=2,
                                             log=lambda s: None)
    return learned.save(out, tmp_path_factory.mktemp("sched") / "s.msgpack")


def test_a_scheduler_over_several_tasks_scales_each_on_its_own_range(trained, capsys):
    """Each task of the set keeps the scale it was trained with; a task outside the set
    is scheduled zero-shot on its own range, with a note; one shard range for all."""
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.scheduling.schedulers import make_scheduler

    t = learned.load(trained)
    assert [e["env_id"] for e in t.meta["tasks"]] == ["CartPole-v1", "Acrobot-v1"]
    assert t.meta["env_id"] == "CartPole-v1" and t.meta["recipe"]["epochs"] == 4
    for env_id, target, lo, hi in (("Acrobot-v1", -100.0, -500.0, -60.0), ("CartPole-v1", 475.0, 0.0, 500.0),
                                   ("MountainCar-v0", -110.0, -200.0, -110.0)):
        cfg = from_dict({"trainer": "sync", "env": {"id": env_id}, "run": {"target_return": target},
                         "backend": {"name": "local"},
                         "scheduler": {"name": "learned", "path": str(trained), "min_return": -200.0}})
        sched = make_scheduler(cfg.scheduler, cfg.backend, cfg)
        assert (sched.scale.return_lo, sched.scale.return_hi) == (lo, hi), env_id
        assert ("zero-shot" in capsys.readouterr().err) == (env_id == "MountainCar-v0")
        assert 1 <= sched.num_shards(0, []) <= M
    wide = mdp.SchedOptions(4, 3, 475.0, 0.5, 10.0, profile.Profile(), mdp.Scale(0.0, 500.0, 3, 4))
    with pytest.raises(ConfigError, match="every task of one scheduler chooses from 1..2 shards"):
        scheduler_training.check_tasks([make_env(), mdp.SchedulingEnv(task(), CostConfig(), wide, 2)], None)


@pytest.mark.slow  # ~18 s: a program of its own; the MDP's output is test_golden.py's digest
def test_a_round_rolls_out_only_its_bucket_and_matches_the_padded_round():
    """n = 3 of M = 5 runs the 4-slot rollout: shards 0-2 and the slots they write are
    the padded 5-slot round's, bit for bit; shard 4, outside the bucket, is zeros (the
    update masks shards 3 and 4 alike), and slots 3 and 4 are left as they were."""
    assert mdp.shard_buckets(5) == (1, 2, 4, 5) and mdp.shard_buckets(16) == (1, 2, 4, 8, 16)
    opts = mdp.SchedOptions(5, 3, 475.0, 0.5, 10.0, profile.Profile(), mdp.Scale(0.0, 500.0, 3, 5))
    env = mdp.SchedulingEnv(task(), CostConfig(), opts, 1)
    inner = jax.tree.map(lambda x: x[0], env.reset(jax.random.key(0))[0])
    keys = jax.random.key_data(jax.random.split(jax.random.key(1), 5))
    n = jnp.asarray(3)
    table, traj, boot = jax.jit(env._rollouts)(inner.train.params, inner.table, n, keys)
    idx = jnp.where(jnp.arange(5) < n, jnp.arange(5), 5)
    want = make_round_body(env.program, 5)(inner.train.params, inner.table, idx, keys)
    pairs = [(g, r, 1) for g, r in zip(jax.tree.leaves(traj), jax.tree.leaves(want[1]))]  # [T, M, B]
    for got, ref, axis in pairs + [(boot, want[2], 0)]:  # boot: [M, B]
        np.testing.assert_array_equal(np.take(got, range(3), axis), np.take(ref, range(3), axis))
        assert not np.take(got, [4], axis).any()
    for got, ref in zip(jax.tree.leaves(table), jax.tree.leaves(want[0])):
        np.testing.assert_array_equal(got, ref)


def test_rounds_cost_time_and_money_and_episodes_end():
    env = make_env(target=-1.0, max_rounds=2)  # any return reaches the target
    state, obs = env.reset(jax.random.key(0))
    assert obs.shape == (2, len(mdp.BASE_FEATURES)) and np.isfinite(np.asarray(obs)).all()
    state, out = jax.jit(env.step)(state, jnp.array([0, 1]), jax.random.key(1))
    assert bool(out.terminated.all()) and not bool(out.truncated.any())
    # reward = -(w * s / ref_s + (1 - w) * usd / ref_usd) + bonus; two shards cost more
    assert float(out.reward[1]) < float(out.reward[0]) < 10.0
    assert np.asarray(out.obs[:, 0]).tolist() == [0.0, 0.0]  # reset after the end


def test_unreached_targets_truncate_at_max_rounds():
    env = make_env(target=1e9, max_rounds=2)
    state, _ = env.reset(jax.random.key(0))
    step = jax.jit(env.step)
    state, first = step(state, jnp.array([0, 0]), jax.random.key(1))
    state, second = step(state, jnp.array([1, 1]), jax.random.key(2))
    assert not bool(first.truncated.any()) and bool(second.truncated.all())
    assert bool((second.reward < 0).all())
    assert np.asarray(second.final_obs[:, -1]).tolist() == [1.0, 1.0]  # n / max_shards


def test_trained_scheduler_round_trips_and_drives_a_run(trained, tmp_path):
    from jaxrl_dist.trainers.runner import train

    loaded = learned.load(trained)
    assert loaded.meta["max_shards"] == M and loaded.meta["features"] == list(mdp.BASE_FEATURES)
    act = learned.policy(loaded)
    scale = mdp.Scale(**loaded.meta["scale"])
    x = np.asarray(mdp.features(mdp.obs_from_records([], scale), scale, np))
    assert 1 <= act(x) <= M
    cfg = from_dict({"trainer": "sync", **json.loads(json.dumps({"backend": {"name": "local", "envs_per_shard": 2,
                                                           "max_shards": M}})),
                     "algo": {"num_steps": 8, "num_minibatches": 1, "update_epochs": 1,
                              "total_timesteps": 2 * 8 * 6},
                     "scheduler": {"name": "learned", "path": str(trained)},
                     "run": {"dir": str(tmp_path), "progress": False, "tensorboard": False,
                             "compile_cache": False, "budget_usd": 0.004}})
    summary = train(cfg)  # azure_aci: $0.001-0.002 a round, so the budget ends it first
    shards = [json.loads(line)["num_shards"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert summary["scheduler"] == "learned" and all(1 <= n <= M for n in shards)
    assert summary["stop_reason"] == "budget_usd" and 1 <= len(shards) < 6 and summary["cost_usd"] <= 0.004


def test_fine_tuning_starts_from_the_given_params(trained):
    start = learned.load(trained)
    env = make_env()
    tuned = scheduler_training.train_scheduler(env, num_steps=2, updates=2, init_from=start, log=lambda s: None)
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                         tuned.params, start.params)
    assert 0 < max(jax.tree.leaves(moved)) < 1.0  # two small steps from the start, not a fresh init


def test_missing_scheduler_file_names_the_key():
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.scheduling.schedulers import make_scheduler

    cfg = from_dict({"trainer": "sync", "backend": {"name": "local"}, "scheduler": {"name": "learned", "path": "/nope.msgpack"}})
    with pytest.raises(ConfigError, match="scheduler.path"):
        make_scheduler(cfg.scheduler, cfg.backend, cfg)


def test_the_default_is_the_generalist_and_other_tasks_run_it_zero_shot(capsys):
    """No `scheduler.path`: the shipped generalist. Acrobot, one of its tasks, sees the
    scale it was trained with; MountainCar, outside its set, runs it zero-shot on its
    own range with a note; without a target or range, on the running range of its
    returns, with one note saying so (`test_without_a_return_scale_the_cli_runs_on_the_running_range`)."""
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.scheduling.schedulers import make_scheduler

    base = {"trainer": "sync", "backend": {"name": "local"}, "scheduler": {"name": "learned"}}
    cfg = from_dict({**base, "env": {"id": "Acrobot-v1"}, "run": {"target_return": -100.0}})
    sched = make_scheduler(cfg.scheduler, cfg.backend, cfg)
    assert [t["env_id"] for t in sched.trained.meta["tasks"]] == ["CartPole-v1", "Acrobot-v1"]
    assert (sched.scale.return_lo, sched.scale.return_hi) == (-500.0, -60.0)
    assert "zero-shot" not in capsys.readouterr().err
    cfg = from_dict({**base, "env": {"id": "MountainCar-v0"}, "run": {"target_return": -110.0},
                     "scheduler": {"name": "learned", "min_return": -200.0}})
    sched = make_scheduler(cfg.scheduler, cfg.backend, cfg)
    assert "MountainCar-v0 zero-shot" in capsys.readouterr().err
    assert (sched.scale.return_lo, sched.scale.return_hi) == (-200.0, -110.0)
    assert 1 <= sched.num_shards(0, []) <= sched.scale.max_shards
    cfg = from_dict({**base, "env": {"id": "MountainCar-v0"}})
    sched = make_scheduler(cfg.scheduler, cfg.backend, cfg)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no return scale for MountainCar-v0" in err[0] and "running range" in err[0], err
    assert sched.running and 1 <= sched.num_shards(0, []) <= sched.scale.max_shards
    with pytest.raises(ConfigError, match="run.target_return"):  # a fixed scale (the MDP's) still needs it
        learned.scale_for(sched.trained, cfg)
    # a target below the range's floor (0 by default) would read every return alike: refused before the run
    from jaxrl_dist.trainers.parts import check_parts

    below = from_dict({**base, "env": {"id": "MountainCar-v0"}, "run": {"target_return": -150.0}})
    with pytest.raises(ConfigError, match=r"^run.target_return=-150 is not above scheduler.min_return=0 \(its "
                       r"default\): the learned scheduler scales MountainCar-v0's returns"):
        check_parts(below)


def test_an_envpool_task_cannot_be_the_scheduling_mdp():
    from jaxrl_dist.config import ConfigError, CostConfig

    cfg = from_dict({"trainer": "sync", "env": {"id": "CartPole-v1", "suite": "envpool"}, "backend": {"name": "local"}})
    opts = mdp.SchedOptions(2, 4, 475.0, 0.5, 10.0, profile.Profile(), mdp.Scale(0.0, 500.0, 4, 2))
    with pytest.raises(ConfigError, match="env.id: the scheduling MDP runs the task in JAX"):
        mdp.SchedulingEnv(cfg, CostConfig(), opts, 2)


def test_features_from_records_hand_checked():
    """What `scheduler=learned` sees after some rounds (the MDP computes the same)."""
    scale = mdp.Scale(0.0, 500.0, 60, 16)
    empty = mdp.features(mdp.obs_from_records([], scale, cost.Left(0.5, 0.25)), scale, np)
    assert empty.dtype == np.float32 and empty.shape == (len(mdp.FEATURES),)
    assert dict(zip(mdp.FEATURES, empty))["budget_left"] == 0.5
    assert dict(zip(mdp.FEATURES, empty))["time_left"] == 0.25
    def rec(recent, loss, kl, busy, n):
        return Record(update=1, env_steps=0, ret=None, losses={"loss": loss, "approx_kl": kl}, sps=None,
                      episode_return_sum=(0.0,), episodes=(0.0,), num_shards=n,
                      learn_s=1.0, round_s=4.0, busy_s=busy, return_recent=recent)

    history = [rec(100.0, 1.0, 0.01, 1.0, 8), rec(None, 0.0, 0.0, 2.0, 4)]
    f = dict(zip(mdp.FEATURES, mdp.features(mdp.obs_from_records(history, scale), scale, np)))
    want = {"round_frac": 2 / 60, "loss": 0.0, "return": 0.2, "approx_kl": 0.0, "learn_frac": 0.25,
            "actor_frac": 0.5, "round_s": np.tanh(np.log1p(4.0)), "budget_left": 1.0, "time_left": 1.0,
            "n_frac": 0.25, "budget_rounds": 1.0, "time_rounds": 1.0}
    assert f == pytest.approx(want)


def test_running_scale_hand_checked():
    """Without a return scale the range is that of the recent returns seen (their
    running min up to their running max, or `scheduler.min_return` up to the max), so
    the latest reads within it; before any return it reads 0."""
    s = mdp.Scale(0.0, 500.0, 60, 16)

    def rec(recent):
        return Record(update=1, env_steps=0, ret=None, losses={}, sps=None, episode_return_sum=(0.0,), episodes=(0.0,),
                      num_shards=4, learn_s=1.0, round_s=4.0, return_recent=recent)

    def ret(history, min_return=None):
        scale = learned.running_scale(s, history, min_return)
        f = dict(zip(mdp.FEATURES, mdp.features(mdp.obs_from_records(history, scale), scale, np)))
        return (scale.return_lo, scale.return_hi), f["return"]

    assert ret([]) == ((0.0, 0.0), 0.0) and ret([rec(None)], -200.0) == ((-200.0, -200.0), 0.0)
    assert ret([rec(-150.0)]) == ((-150.0, -150.0), 0.0)
    assert ret([rec(-200.0), rec(float("nan")), rec(-100.0), rec(-150.0), rec(None)]) == \
        ((-200.0, -100.0), pytest.approx(0.5))
    assert ret([rec(-150.0), rec(-120.0)], -200.0) == ((-200.0, -120.0), pytest.approx(1.0))
    assert learned.running_scale(s, [rec(3.0)])._replace(return_lo=0.0, return_hi=500.0) == s


def test_without_a_return_scale_the_cli_runs_on_the_running_range(tmp_path):
    """The plain command on an id without a preset (no target, no return range) runs the
    default learned scheduler: exit 0 and exactly one line saying how returns are scaled."""
    from test_cli import run_cli

    out = run_cli("train", "env.id=MountainCar-v0", "algo.total_timesteps=2048", "algo.num_steps=32", "backend.envs_per_shard=4",
                  "algo.update_epochs=1", "run.max_rounds=2", f"run.dir={tmp_path / 'run'}", "run.progress=false",
                  "run.tensorboard=false")
    assert out.returncode == 0, out.stderr[-2000:]
    notes = [line for line in out.stderr.splitlines() if line.startswith(("note:", "error:"))]
    assert len(notes) == 1 and notes[0].startswith("note: no return scale for MountainCar-v0 ") \
        and "the learned scheduler" in notes[0] and notes[0].endswith("by their running range"), out.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["scheduler"] == "learned" and summary["rounds"] == 2


def test_scheduler_train_on_an_envpool_task_exits_2_with_one_line(tmp_path, capsys):
    from jaxrl_dist import cli

    code = cli.main(["scheduler", "train", "env=hopper", "run.target_return=1000",
                     "--out", str(tmp_path / "s.msgpack")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: env.id: the scheduling MDP")
    assert not (tmp_path / "s.msgpack").exists()


@pytest.mark.parametrize("args, says", [
    (["env=cartpole", "scheduler=adapt"], "error: scheduler=adapt: scheduler train trains a learned scheduler"),
    # a file no run with that backend could load
    (["env=cartpole", "backend.max_shards=8", "scheduler.max_shards=16"],
     "error: scheduler.max_shards=16 exceeds backend.max_shards=8"),
    (["env.id=MountainCar-v0", "run.target_return=-110"], "error: run.target_return=-110 is not above scheduler.min_return=0"),
    # overrides after the options are overrides still (a bad one named as a key, not as an argument)
    (["env=cartpole", "--updates", "1", "scheduler.max_shard=4"], "scheduler.max_shard"),
])
def test_scheduler_train_checks_what_train_checks(tmp_path, capsys, args, says):
    from jaxrl_dist import cli

    code = cli.main(["scheduler", "train", *args, "--out", str(tmp_path / "s.msgpack")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and says in err[0], err
    assert not (tmp_path / "s.msgpack").exists()


def test_a_profile_measured_on_another_env_is_said(capsys):
    from jaxrl_dist.cli.compose import load_config
    from jaxrl_dist.scheduling.profile import profile_file

    cartpole = profile_file("CartPole-v1", None)
    for env, notes in (("cartpole", 0), ("acrobot", 1)):
        scheduler_training.task_and_options(load_config([f"env={env}", "backend=local"]), 10, 0.5, 10.0, cartpole)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == notes and all(line.startswith("note: Acrobot-v1 is modeled with the latencies of "
                                                         "CartPole-v1") for line in err), err


def test_budget_and_deadline_spans_are_flags_and_a_bad_one_names_itself(tmp_path, capsys):
    from jaxrl_dist import cli
    from jaxrl_dist.cli.compose import load_config

    cfg = load_config(["env=cartpole", "backend=local"])
    _, opts = scheduler_training.task_and_options(cfg, 60, 0.6, 10.0, limits={"budgets": (0.02, 0.2)})
    assert opts.budgets == (0.02, 0.2) and opts.deadlines == mdp.SchedOptions._field_defaults["deadlines"]
    for bad in ("0.5,0.1", "abc"):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["scheduler", "train", "env=cartpole", "--budgets", bad, "--out", str(tmp_path / "s")])
        assert exit_.value.code == 2
        assert "argument --budgets: expected" in capsys.readouterr().err.strip().splitlines()[-1]
    for flag, bad, says in [("--updates", "0", "expected > 0"), ("--lr", "x", "expected a number"),
                            ("--time-weight", "2", "expected >= 0.0 and <= 1.0")]:
        with pytest.raises(SystemExit) as exit_:
            cli.main(["scheduler", "train", flag, bad, "--out", str(tmp_path / "s")])
        assert exit_.value.code == 2
        assert f"argument {flag}: {says}" in capsys.readouterr().err.strip().splitlines()[-1]


def test_fine_tuning_from_another_shard_range_names_the_key(trained):
    from jaxrl_dist.config import ConfigError

    start = learned.load(trained)
    start = start._replace(meta={**start.meta, "max_shards": start.meta["max_shards"] + 1})
    with pytest.raises(ConfigError, match="scheduler.init_from: .*scheduler.max_shards="):
        scheduler_training.train_scheduler(make_env(), num_steps=2, updates=1, init_from=start, log=lambda s: None)


def test_limits_end_episodes_and_their_features_move():
    """Every episode (never "none") has a budget of 0.9 rounds at M shards and a deadline
    of 2.7: the first round (one shard) shows both partly spent; the next (M shards) would
    pass the budget, so the episode ends before it, terminated, with the bonus share of
    the return reached. With `limit_reward="progress"` the first round earns nothing."""
    env = limited_env(0.3, 0.9)
    state, _ = env.reset(jax.random.key(0))
    assert np.isfinite(np.asarray(state.budget)).all() and np.isfinite(np.asarray(state.deadline)).all()
    step = jax.jit(env.step)
    state, first = step(state, jnp.array([0, 0]), jax.random.key(1))
    assert (np.asarray(first.reward) < 0).all()  # a round's price, limit or not
    progress = mdp.SchedulingEnv(env.task_cfg, env.cost_cfg, env.opts._replace(limit_reward="progress"), 2)
    _, unpriced = jax.jit(progress.step)(progress.reset(jax.random.key(0))[0], jnp.array([0, 0]),
                                         jax.random.key(1))
    assert (np.asarray(unpriced.reward) == 0).all()  # under a limit only the end earns
    np.testing.assert_array_equal(unpriced.obs, first.obs)
    f = dict(zip(mdp.FEATURES, np.asarray(first.obs).T))
    assert ((0.0 < f["budget_left"]) & (f["budget_left"] < 1.0)).all()
    assert ((0.0 < f["time_left"]) & (f["time_left"] < 1.0)).all()
    _, second = step(state, jnp.array([1, 1]), jax.random.key(2))  # two shards: past the budget
    assert bool(second.terminated.all()) and not bool(second.truncated.any())
    r = np.asarray(second.reward)  # no round run, so no cost: the bonus share of the return reached
    assert ((0.0 <= r) & (r < 1.0)).all()
    none = make_env(max_rounds=3, budgets=(0.4, 0.4), deadlines=(1.0, 1.0), no_limit=1.0)
    state, _ = none.reset(jax.random.key(0))
    assert np.isinf(np.asarray(state.budget)).all() and np.isinf(np.asarray(state.deadline)).all()


@pytest.mark.slow  # ~15 s: a second limited program; the limits' test above covers the features' moves
def test_absolute_limits_tell_a_tight_budget_from_a_loose_one_from_the_first_round(tmp_path, capsys):
    """`budget_left` starts at 1.0 under any budget; `budget_rounds` starts at the budget's
    share of `max_rounds` rounds at M shards (here 0.3 and 0.9), the same in the MDP and
    in a live run with that budget, and falls as rounds spend it. Without a limit it is 1."""
    from jaxrl_dist import cli

    envs = [limited_env(b, 0.9) for b in (0.3, 0.9)]
    for env, want in zip(envs, (0.3, 0.9)):
        scale = env.opts.scale
        assert (scale.ref_s, scale.ref_usd) == pytest.approx(env.ref)
        state, obs = env.reset(jax.random.key(0))
        f = dict(zip(env.opts.features, np.asarray(obs).T))
        assert f["budget_left"] == pytest.approx([1.0, 1.0]) and f["budget_rounds"] == pytest.approx([want] * 2)
        assert f["time_rounds"] == pytest.approx([0.9, 0.9])
        budget = want * scale.ref_usd * scale.max_rounds  # the same budget in a live run
        live = cost.run_left(from_dict({"trainer": "sync", "run": {"budget_usd": budget}}).run, 0.0, 0.0)
        x = dict(zip(mdp.FEATURES, mdp.features(mdp.obs_from_records([], scale, live), scale, np)))
        assert x["budget_rounds"] == pytest.approx(want) and x["time_rounds"] == 1.0
        _, out = jax.jit(env.step)(state, jnp.array([0, 0]), jax.random.key(1))
        after = dict(zip(env.opts.features, np.asarray(out.obs).T))
        assert not np.asarray(out.episode_end).any()
        assert (after["budget_rounds"] < want).all() and (after["time_rounds"] < 0.9).all()
    code = cli.main(["scheduler", "train", "env=cartpole", "--features", "budget_rounds,cpu_load",
                     "--out", str(tmp_path / "s.msgpack")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: --features: cpu_load unknown")


def test_a_scheduler_of_another_feature_set_or_shard_range_is_refused(trained, tmp_path):
    """One line naming the file and the mismatch (the CLI prints it and exits 2)."""
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.scheduling.schedulers import make_scheduler

    old = learned.load(trained)
    unnamed = learned.save(old._replace(meta={k: v for k, v in old.meta.items() if k != "features"}),
                           tmp_path / "unnamed.msgpack")
    renamed = learned.save(old._replace(meta={**old.meta, "features": ["cpu_load", *mdp.FEATURES[1:]]}),
                           tmp_path / "renamed.msgpack")
    fewer = learned.save(old._replace(meta={**old.meta, "features": old.meta["features"][:5]}),
                         tmp_path / "fewer.msgpack")  # names its weights do not read
    base = {"trainer": "sync", "backend": {"name": "local", "max_shards": M}}
    for sched, named, why in (({"path": str(unnamed)}, unnamed, "records no feature names"),
                              ({"path": str(renamed)}, renamed, "cpu_load unknown"),
                              ({"path": str(fewer)}, fewer, "names 5 features but its network reads"),
                              ({"path": str(trained), "max_shards": 1}, trained, "1..2 shards")):
        cfg = from_dict({**base, "scheduler": {"name": "learned", **sched}})
        with pytest.raises(ConfigError) as err:
            make_scheduler(cfg.scheduler, cfg.backend, cfg)
        line = str(err.value)
        assert "\n" not in line and str(named) in line and why in line, line


def _first_rows(params, rows):
    """`params` with each MLP's first kernel cut to (or zeroed outside) `rows`."""
    out = jax.tree.map(np.asarray, params)
    for mlp in out["params"].values():
        mlp["Dense_0"] = {**mlp["Dense_0"], "kernel": rows(mlp["Dense_0"]["kernel"])}
    return out


def test_a_scheduler_trained_on_fewer_features_reads_its_own_by_name(trained, tmp_path, capsys):
    """A file from before `time_left` (its 9 features named) acts on those 9, selected by
    name: the same n as the 10-feature network whose `time_left` weights are zero. A run
    that sets a limit it was not trained to see says so (the run still stops there)."""
    from jaxrl_dist.scheduling.schedulers import make_scheduler

    new = learned.load(trained)
    t = new.meta["features"].index("time_left")
    names = [f for f in new.meta["features"] if f != "time_left"]
    meta = {k: v for k, v in new.meta.items() if k not in ("budgets", "deadlines", "no_limit")}
    old = learned.Trained(_first_rows(new.params, lambda k: np.delete(k, t, 0)), {**meta, "features": names})
    zeroed = learned.Trained(_first_rows(new.params, lambda k: np.where(np.arange(len(k))[:, None] == t, 0.0, k)),
                             new.meta)
    path = learned.save(old, tmp_path / "old.msgpack")
    cfg = from_dict({"trainer": "sync", "backend": {"name": "local", "max_shards": M},
                     "scheduler": {"name": "learned", "path": str(path)}, "run": {"deadline_s": 60.0}})
    sched = make_scheduler(cfg.scheduler, cfg.backend, cfg)
    assert "without seeing run.deadline_s" in capsys.readouterr().err
    act, rng_ = learned.policy(zeroed), np.random.default_rng(0)
    for _ in range(20):
        x = rng_.uniform(-1.0, 1.0, len(mdp.FEATURES)).astype(np.float32)
        assert sched.act(x) == act(x)
    widened = learned.widen(old, new.meta["features"])  # the start of a fine-tune: the zeroed network itself
    assert widened.meta["features"] == new.meta["features"]
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), widened.params, zeroed.params)
    assert all(jax.tree.leaves(same))

"""`hydra/launcher=vmap` and the grouped trainer under it: a sweep's jobs that differ only
in traced coefficients and seeds train as one program, each member as its job alone."""
from __future__ import annotations

import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest

from jaxrl_dist.config import TRACED, from_dict, key_kind
from jaxrl_dist.evaluation import latest_state
from jaxrl_dist.trainers.group import plan, train_group
from jaxrl_dist.trainers.runner import train
from test_cli import run_cli
from test_sweeps import TINY, job_dirs

UPDATES = 10
# every traced key away from its default in at least one job; seeds and seed counts differ too
JOBS = [dict(seed=0, num_seeds=1, algo={"lr": 1e-3}),
        dict(seed=1, num_seeds=2, algo={"lr": 3e-3, "ent_coef": 0.0, "gamma": 0.9, "clip_eps": 0.1}),
        dict(seed=2, num_seeds=1, algo={"lr": 1e-2, "vf_coef": 1.0, "gae_lambda": 0.8, "max_grad_norm": 0.1})]


def job(run_dir, seed=0, num_seeds=1, algo=(), **run):
    return from_dict({"trainer": "fused", "env": {"num_envs": 4}, "seed": seed, "num_seeds": num_seeds,
                      "algo": {"total_timesteps": 4 * 32 * UPDATES, "num_steps": 32, "num_minibatches": 2,
                               "update_epochs": 2, **dict(algo)},
                      "run": {"dir": str(run_dir), "progress": False, "tensorboard": False, **run}})


def params(run_dir):
    return jax.tree.leaves(latest_state(run_dir)[1].train.params)


def largest_difference(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(params(a), params(b)))


def test_the_traced_keys_are_declared_beside_the_config():
    assert all(key_kind(k) == "traced" for k in TRACED) and len(TRACED) == 7
    assert key_kind("algo.num_steps") == key_kind("env.id") == key_kind("run.log_chunks") == "shaping"
    assert key_kind("run.dir") == key_kind("logger.wandb") == "host" and key_kind("seed") == "member"


def test_each_member_trains_as_its_job_alone_and_resumes_alone(tmp_path):
    """After 10 updates each member's params are its job's alone within 1e-5, whichever
    traced keys it changed; a member's mid-run checkpoint continues alone (unvmapped)."""
    cfgs = [job(tmp_path / f"member{i}", checkpoint_every=5, **j) for i, j in enumerate(JOBS)]
    summaries = train_group(cfgs, [c.run.dir for c in cfgs], say=lambda _: None)
    assert [s["group"]["members"] for s in summaries] == [4, 4, 4]
    for i, (cfg, summary) in enumerate(zip(cfgs, summaries)):
        alone = tmp_path / f"alone{i}"
        train(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=str(alone))))
        assert largest_difference(cfg.run.dir, alone) <= 1e-5, i
        written = json.loads((tmp_path / f"member{i}" / "summary.json").read_text())
        assert written["params_sha256"] == summary["params_sha256"] and written["num_seeds"] == cfg.num_seeds
        assert len((tmp_path / f"member{i}" / "metrics.jsonl").read_text().splitlines()) == UPDATES
    # member 1 from its checkpoint at update 5, alone
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "member1", resumed)
    shutil.rmtree(resumed / "checkpoints" / str(UPDATES))
    train(from_dict({"run": {"resume": str(resumed), "progress": False}}))
    assert largest_difference(resumed, tmp_path / "member1") <= 1e-5


def test_the_plan_groups_by_shaping_keys_in_chunks_of_whole_jobs(tmp_path):
    base = [job(tmp_path, seed=s, num_seeds=2) for s in range(5)]
    other = job(tmp_path, algo={"num_steps": 16})
    rounds = dataclasses.replace(base[0], trainer=dataclasses.replace(base[0].trainer, name="sync"), num_seeds=1)
    groups, alone = plan(base + [other, rounds], max_members=4)
    assert groups == [[0, 1], [2, 3], [4]]
    assert alone[5] == "alone in its group" and "trainer=sync" in alone[6]
    resumed = dataclasses.replace(rounds, run=dataclasses.replace(rounds.run, resume=str(tmp_path)))
    assert plan([resumed], 4)[1] == {0: "run.resume continues one run"}  # not its composed trainer's reason


def test_a_sweep_with_the_vmap_launcher(tmp_path):
    """The jobs that differ in a traced key train as one program; a job whose config fails
    fails alone with its line; every other job leaves what a job leaves, and the table
    of the jobs ends the sweep."""
    sweep = tmp_path / "sweep"
    out = run_cli("train", "-m", "hydra/launcher=vmap", *TINY, "algo.lr=1e-3,3e-4", "env.num_envs=4,0",
                  f"run.dir={sweep}", "run.progress=false")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert sum(x.startswith("error: env.num_envs must be positive, got 0 [job") for x in lines) == 2
    assert sum(x.startswith("group 1/1: 2 jobs, 2 members, one program") for x in lines) == 1, out.stderr
    runs = job_dirs(sweep)
    assert len(runs) == 4
    for run in runs:
        assert (run / ".hydra" / "overrides.yaml").is_file() and (run / "train.log").is_file()
        if (run / "FAILED").exists():
            continue
        summary = json.loads((run / "summary.json").read_text())
        assert summary["group"]["jobs"] == 2 and summary["run_dir"] == str(run)
        assert (run / "metrics.jsonl").is_file() and any((run / "checkpoints").iterdir())
    assert len([r for r in runs if (r / "summary.json").exists()]) == 2
    assert "params sha256" in out.stdout  # the table of the jobs


def test_the_table_shows_the_objective_only_where_it_is_not_the_final_return(capsys, monkeypatch):
    from jaxrl_dist.cli.vmap import _table

    monkeypatch.setenv("COLUMNS", "80")  # a log's width: an Optuna trial's value fits unfolded

    overrides = [["algo.lr=0.00202430635528", "seed=0"], ["algo.lr=0.0001", "seed=0"]]
    rows = [("0", overrides[0], "group 1/1", "500", "fe5be3f2539a", "500"),
            ("1", overrides[1], "group 1/1", "-", "31157921b6b8", "nan")]
    _table(rows[:1] + [rows[1][:5] + ("-",)], overrides)  # the objective is the final return
    out = capsys.readouterr().out
    assert "objective" not in out and "algo.lr=0.00202430635528" in out.replace("\n", "")
    _table(rows, overrides)  # a job without a final return: its objective is NaN
    assert "objective" in capsys.readouterr().out


def test_a_swept_shaping_key_is_said_in_one_line(tmp_path, capsys):
    from jaxrl_dist.cli.vmap import _describe

    cfgs = [job(tmp_path, algo={"lr": lr, "num_steps": n}) for lr in (1e-3, 3e-4) for n in (16, 32)]
    _describe(cfgs, *plan(cfgs, 1024))
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["vmap: algo.num_steps differs between jobs (shaping keys): jobs with different values "
                     "train in different programs",
                     "vmap: 4 jobs: 2 group(s) of 2 members, one program each"]
    _describe(cfgs[:3], *plan(cfgs[:3], 1024))  # a group of 2 jobs, and one alone
    assert capsys.readouterr().err.splitlines()[-1] == \
        "vmap: 3 jobs: 1 group(s) of 2 members, one program each, 1 on its own"
    _describe(cfgs, *plan(cfgs, 1))  # each group over max_members=1: a program a job
    assert capsys.readouterr().err.splitlines()[-1] == \
        "vmap: 4 jobs: 2 group(s) in 4 program(s) of 1 members (hydra.launcher.max_members)"
    # a swept preset names itself, not only the keys it sets; a job above max_members is said
    presets = [job(tmp_path, algo={"num_steps": n, "update_epochs": n // 8, "num_minibatches": 2, "lr": lr},
                   num_seeds=2) for n in (16, 32) for lr in (1e-3, 3e-4)]
    swept = [["env=a", "algo.lr=1e-3"], ["env=a", "algo.lr=3e-4"], ["env=b", "algo.lr=1e-3"], ["env=b", "algo.lr=3e-4"]]
    _describe(presets, *plan(presets, 1), swept, 1)
    assert capsys.readouterr().err.splitlines()[:2] == [
        "vmap: env differs between jobs (shaping keys algo.num_steps, algo.update_epochs): jobs with different "
        "values train in different programs",
        "vmap: a job of 2 seeds (num_seeds) is more than hydra.launcher.max_members=1; a job's seeds stay in "
        "one program"]
    _describe([cfgs[0], None], *plan(cfgs[:1], 1024))  # no group at all: one alone, one that failed
    assert capsys.readouterr().err.splitlines()[-1] == "vmap: 2 jobs: 1 on its own, 1 failed its checks"


def test_a_launcher_option_out_of_range_is_one_line(tmp_path):
    out = run_cli("train", "-m", "hydra/launcher=vmap", "hydra.launcher.max_members=0", "seed=1,2",
                  f"run.dir={tmp_path / 's'}", timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == "error: hydra.launcher.max_members must be a positive integer, got 0"
    out = run_cli("train", "-m", "hydra/launcher=vmap", "hydra.launcher.max_member=4", "seed=1,2",
                  f"run.dir={tmp_path / 's'}", timeout=120)
    assert out.returncode == 2 and out.stderr.strip() == ("error: unknown config key 'hydra.launcher.max_member' "
                                                          "(did you mean 'hydra.launcher.max_members'?)")


def test_a_later_group_of_the_same_shape_loads_its_program(tmp_path, monkeypatch):
    """`run.compile_cache` holds for groups as for a job alone: a later group of the same
    shapes (Optuna's next batch) loads the program from the cache instead of compiling it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    hits = []

    def listen(event, **_):
        if event == "/jax/compilation_cache/cache_hits":
            hits.append(event)

    jax.monitoring.register_event_listener(listen)
    try:
        for batch in range(2):
            cfgs = [job(tmp_path / f"b{batch}m{i}", seed=i, algo={"lr": lr}) for i, lr in enumerate((1e-3, 3e-3))]
            train_group(cfgs, [c.run.dir for c in cfgs], say=lambda _: None)
            assert (bool(hits), any((tmp_path / "cache" / "jaxrl-dist" / "xla").iterdir())) == (batch == 1, True)
    finally:
        jax.monitoring.unregister_event_listener(listen)


def test_a_checkpoint_without_coefficients_resumes_with_the_configs(tmp_path):
    """A run dir saved before the train state carried its coefficients restores, and
    its train state gets the values of the config it resumes with."""
    from jaxrl_dist.envs import make_env
    from jaxrl_dist.trainers import checkpoint, fused

    cfg = job(tmp_path, algo={"lr": 2e-3})
    env = make_env("CartPole-v1", 4, "gymnax", 0, 0, {})
    fresh = fused.init_runner(fused.make_setup(cfg, env.spec), env, 0)
    older = fresh._replace(train=fresh.train.replace(hyper=None), update=fresh.update + 3)
    saver = checkpoint.Checkpointer(tmp_path / "run")
    saver.save(older)
    saver.close()
    restored = checkpoint.Checkpointer(tmp_path / "run").restore_latest(fresh)
    assert int(restored.update) == 3 and np.allclose(restored.train.hyper.lr, 2e-3)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(restored.train.params),
                                                     jax.tree.leaves(older.train.params)))


def test_the_launcher_composes_each_job_as_hydra_does():
    """Jobs of one kind are one compose and a copy with their own values: the same config
    Hydra composes for each (its job numbers aside)."""
    from types import SimpleNamespace

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict

    from jaxrl_dist.cli.compose import CONFIG_DIR, store_schemas
    from jaxrl_dist.cli.vmap import _jobs

    store_schemas()
    jobs = [["trainer=fused", f"algo.lr={lr}", f"seed={seed}", f"env={env}", "algo.hidden_sizes=[32,32]"]
            for env in ("cartpole", "acrobot") for lr in (1e-3, 3e-4) for seed in (0, 1)]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        master = compose("config", overrides=["hydra/launcher=vmap"], return_hydra_config=True)
        loader = GlobalHydra.instance().config_loader()
        launcher = SimpleNamespace(config=master, hydra_context=SimpleNamespace(config_loader=loader))
        for i, (overrides, fast) in enumerate(_jobs(launcher, jobs, 5)):
            full = loader.load_sweep_config(master, overrides)
            with open_dict(full):
                full.hydra.job.id = full.hydra.job.num = 5 + i
            assert OmegaConf.to_container(fast) == OmegaConf.to_container(full), overrides


@pytest.mark.slow  # ~27 s: a member's resume alone is test_each_member_trains_as_its_job_alone_and_resumes_alone's; this adds a GRU's carry
def test_a_recurrent_member_checkpoints_its_own_hidden_state(tmp_path):
    """A GRU group's member writes the hidden state of its own envs only: its checkpoint
    evaluates and resumes alone, and matches its job run alone."""
    from jaxrl_dist.config import EvalConfig
    from jaxrl_dist.evaluation import evaluate

    gru = {"network": "gru", "hidden_sizes": [16]}
    cfgs = [job(tmp_path / f"member{i}", seed=i, num_seeds=n, checkpoint_every=5, algo={**gru, "lr": lr})
            for i, (n, lr) in enumerate([(1, 1e-3), (2, 3e-3)])]
    train_group(cfgs, [c.run.dir for c in cfgs], say=lambda _: None)
    member = tmp_path / "member1"
    alone = tmp_path / "alone1"
    train(dataclasses.replace(cfgs[1], run=dataclasses.replace(cfgs[1].run, dir=str(alone))))
    assert largest_difference(member, alone) <= 1e-5
    carry = jax.tree.leaves(latest_state(member)[1].actor.carry)
    assert carry and all(x.shape[0] == 2 * 4 for x in carry)  # 2 seeds x 4 envs, not the group's 3 x 4
    assert np.isfinite(evaluate(member, EvalConfig(episodes=2, max_steps=50))["mean_return"])
    resumed = tmp_path / "resumed"
    shutil.copytree(member, resumed)
    shutil.rmtree(resumed / "checkpoints" / str(UPDATES))
    train(from_dict({"run": {"resume": str(resumed), "progress": False}}))
    assert largest_difference(resumed, member) <= 1e-5

"""`jaxrl-dist train` as a Hydra application: multirun sweeps, the joblib and Ray
launchers, the Optuna sweeper, Hydra's flags, and what each run leaves on disk."""
from __future__ import annotations

import datetime
import json
import os
import re

import pytest
import yaml

from test_cli import run_cli

TINY = ["trainer=fused", "algo.total_timesteps=256", "algo.num_steps=32", "run.tensorboard=false"]


def job_dirs(sweep) -> list:
    return sorted((p for p in sweep.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def overrides_of(run) -> list:
    return yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())


def log_span(run) -> tuple:
    """The first and last time stamps of a run's job log."""
    stamps = re.findall(r"^\[([\d-]+ [\d:,]+)\]", (run / "train.log").read_text(), re.M)
    parse = lambda s: datetime.datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f")  # noqa: E731
    return parse(stamps[0]), parse(stamps[-1])


def test_a_2x2_sweep_runs_every_job_and_a_bad_one_fails_alone(tmp_path):
    sweep = tmp_path / "sweep"
    out = run_cli("train", "-m", *TINY, "seed=1,2", "env.num_envs=0,4", f"run.dir={sweep}")
    assert out.returncode == 2, out.stderr
    errors = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(errors) == 2 and all(e.startswith("error: env.num_envs must be positive") for e in errors)
    runs = job_dirs(sweep)
    assert len(runs) == 4 and (sweep / "multirun.yaml").is_file()
    for run in runs:
        given = overrides_of(run)
        assert {o.split("=")[0] for o in given} >= {"seed", "env.num_envs"}
        assert (run / ".hydra" / "config.yaml").is_file() and (run / "train.log").is_file()
        if "env.num_envs=0" in given:
            assert (run / "FAILED").read_text().startswith("2 error: env.num_envs")
            assert not (run / "summary.json").exists()
        else:
            summary = json.loads((run / "summary.json").read_text())
            assert summary["run_dir"] == str(run)
            assert "summary" in (run / "train.log").read_text()
    seeds = {yaml.safe_load((r / "config.yaml").read_text())["seed"] for r in runs if (r / "config.yaml").exists()}
    assert seeds == {1, 2}
    from jaxrl_dist.tools.sweep_report import _load_jobs  # what the report's note names

    assert _load_jobs(sweep)[1] == [f"{r.name} (failed)" for r in runs if (r / "FAILED").is_file()]


def test_an_optuna_sweep_dir_is_a_sweep_for_the_report(tmp_path):
    from jaxrl_dist.tools.sweep_report import is_sweep

    (tmp_path / "0" / ".hydra").mkdir(parents=True)  # the Optuna sweeper writes no multirun.yaml
    (tmp_path / "optimization_results.yaml").write_text("name: optuna\n")
    assert is_sweep(tmp_path) and not is_sweep(tmp_path / "0")


@pytest.mark.slow  # the default suite's multirun runs are the 2x2 sweep and the report's sweep
def test_joblib_runs_two_jobs_at_once(tmp_path):
    sweep = tmp_path / "sweep"
    out = run_cli("train", "-m", *TINY, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                  "seed=1,2", f"hydra.sweep.dir={sweep}", "run.progress=false")
    assert out.returncode == 0, out.stderr
    (a0, a1), (b0, b1) = (log_span(r) for r in job_dirs(sweep))
    assert a0 < b1 and b0 < a1  # the two jobs' lifetimes overlap
    assert all((r / "summary.json").is_file() for r in job_dirs(sweep))


@pytest.mark.slow  # three trials compile three programs (~18 s)
def test_optuna_sweeps_a_few_trials_on_the_final_return(tmp_path):
    sweep = tmp_path / "optuna"
    out = run_cli("train", "-m", *TINY, "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3",
                  "algo.lr=interval(1e-4,1e-2)", f"run.dir={sweep}", "run.progress=false")
    assert out.returncode == 0, out.stderr
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert 1e-4 <= result["best_params"]["algo.lr"] <= 1e-2
    finals = [json.loads((r / "summary.json").read_text())["final_return"] for r in job_dirs(sweep)]
    assert len(finals) == 3 and result["best_value"] == max(finals)  # maximised
    said = out.stdout + out.stderr  # plain lines: no plugin list from alembic, no colour codes from Optuna
    assert "alembic" not in said and "\x1b[" not in said and "A new study created" in said


def test_a_failed_optuna_trial_stays_failed_and_the_study_goes_on():
    """A NaN objective (no episode ended, or a failed job) is a failed trial; the sweeper
    tells Optuna so with the NaN still attached, which Optuna refused, ending the study."""
    optuna = pytest.importorskip("optuna")
    from jaxrl_dist.cli.train import _set_up_optuna

    _set_up_optuna()
    _set_up_optuna()  # once is enough: the second call wraps nothing again
    study = optuna.create_study(direction="maximize")
    failed, done = study.ask(), study.ask()
    with pytest.raises(ValueError):
        study.tell(trial=failed, state=optuna.trial.TrialState.COMPLETE, values=[float("nan")])
    study.tell(trial=failed, state=optuna.trial.TrialState.FAIL, values=[float("nan")])  # the sweeper's retry
    study.tell(trial=done, state=optuna.trial.TrialState.COMPLETE, values=[1.5])
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"] and study.best_value == 1.5


@pytest.mark.slow  # two trials compile two programs (~14 s)
def test_an_optuna_study_with_no_completed_trial_is_one_line(tmp_path):
    out = run_cli("train", "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "trainer=fused", "env=acrobot",
                  "algo.lr=interval(1e-4,1e-2)", "algo.total_timesteps=512", f"run.dir={tmp_path / 's'}",
                  "run.progress=false")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: hydra/sweeper=optuna: no trial completed")


@pytest.mark.parametrize("args, line", [
    (["hydra/sweeper=optuna", "hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials must be a positive integer, got 0"),
    (["hydra/launcher=joblib", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs=0: joblib takes a positive count"),
])
def test_a_bad_sweeper_or_launcher_count_is_one_line_before_any_job(tmp_path, args, line):
    pytest.importorskip("optuna")
    out = run_cli("train", "-m", *args, "seed=1,2", f"run.dir={tmp_path / 's'}", timeout=60)
    assert out.returncode == 2 and out.stderr.strip().startswith(f"error: {line}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "s").exists()


@pytest.mark.slow
def test_the_ray_launcher_runs_jobs_on_a_loopback_runtime(tmp_path):
    sweep = tmp_path / "ray"
    out = run_cli("train", "-m", *TINY, "hydra/launcher=ray", "seed=1,2", f"run.dir={sweep}",
                  "run.progress=false")
    assert out.returncode == 0, out.stderr
    assert len(job_dirs(sweep)) == 2 and all((r / "summary.json").is_file() for r in job_dirs(sweep))
    launcher = yaml.safe_load((sweep / "multirun.yaml").read_text())["hydra"]["launcher"]
    assert launcher["ray"]["init"]["_node_ip_address"].startswith("127.")
    for noise in ("Token authentication", "Started a local Ray instance", "\x1b["):  # Ray's, in a log
        assert noise not in out.stdout + out.stderr, noise


def test_hydra_run_dir_and_a_user_config_dir(tmp_path):
    (tmp_path / "mine" / "env").mkdir(parents=True)
    # a preset of the user's own (its seed leaves the compiled program, and the cache, as TINY's)
    (tmp_path / "mine" / "env" / "acro.yaml").write_text("# @package _global_\nseed: 7\n")
    run = tmp_path / "run"
    out = run_cli("train", "--config-dir", str(tmp_path / "mine"), "env=acro", *TINY,
                  f"hydra.run.dir={run}", "run.progress=false")
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == 7
    assert overrides_of(run)[0] == "env=acro"
    # the same preset without the config dir is the usual one-line error
    out = run_cli("train", "env=acro", f"run.dir={tmp_path / 'no'}")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        out.stderr.strip()] and "unknown env preset 'acro'" in out.stderr


def test_a_user_preset_in_print_config_and_a_broken_one(tmp_path):
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "acro.yaml").write_text("# @package _global_\nseed: 7\n")
    (tmp_path / "env" / "broken.yaml").write_text("env:\n  id: [CartPole\n")
    out = run_cli("train", "--config-dir", str(tmp_path), "env=acro", "--print-config", timeout=60)
    assert out.returncode == 0 and "\nseed: 7\n" in out.stdout, out.stderr
    out = run_cli("train", "--config-dir", str(tmp_path), "env=broken", f"run.dir={tmp_path / 'run'}", timeout=60)
    assert out.returncode == 2 and out.stderr.strip() == (
        f"error: {tmp_path / 'env' / 'broken.yaml'}:3:1: not readable YAML (expected ',' or ']', but got '<stream end>')")


def test_a_report_read_by_a_pipe_that_closes_early_is_quiet(lr_sweep):
    import subprocess
    from test_cli import command

    report = subprocess.Popen(command() + ["report", str(lr_sweep), "--out", str(lr_sweep.parent / "again")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    report.stdout.close()  # the reader leaves before the report prints (`| head`)
    assert report.wait(timeout=180) == 1 and b"Traceback" not in report.stderr.read()
    report.stderr.close()


@pytest.mark.parametrize("args, want", [
    (["--help"], r"trainer: async, fused, sync"),
    (["--info"], r"Hydra 1\.3"),
    (["--cfg", "job", "trainer=fused"], r"name: fused"),
])
def test_hydra_flags(args, want):
    out = run_cli("train", *args, timeout=60)
    assert out.returncode == 0, out.stderr
    assert re.search(want, out.stdout), out.stdout[-2000:]


def test_help_lists_every_group_and_its_presets():
    out = run_cli("train", "--help", timeout=60).stdout
    for group, option in (("env", "cartpole"), ("backend", "ray"), ("scheduler", "learned"),
                          ("cost", "aws_lambda"), ("algo", "ppo"), ("trainer", "fused")):
        assert re.search(rf"^{group}: .*{option}", out, re.M), group
    assert "hydra/launcher=vmap" in out and "hydra.sweeper.n_jobs" in out  # the packaged launcher, too


def test_shell_completion_completes_after_train():
    script = run_cli("-sc", "install=bash", timeout=60)
    assert script.returncode == 0 and "complete -o nospace -o default -F hydra_bash_completion jaxrl-dist" in script.stdout
    env = dict(os.environ, COMP_LINE="jaxrl-dist train env=ca", COMP_POINT="24")
    from test_cli import command
    import subprocess

    out = subprocess.run(command() + ["-sc", "query=bash"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["env=cartpole", "env=cartpole_po"], out.stderr
    for line, words in (("jaxrl-dist tr", ["train"]), ("jaxrl-dist eval ru", [])):  # a subcommand; not Hydra's
        env = dict(os.environ, COMP_LINE=line, COMP_POINT=str(len(line)))
        out = subprocess.run(command() + ["-sc", "query=bash"], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.split() == words and not out.stderr, out.stderr


@pytest.mark.parametrize("args, line", [
    (["seed=1,2"], "seed=1,2: a sweep; run it with -m (multirun)"),
    (["-m", "run.dir=a,b"], "run.dir=a,b: a sweep of run.dir; a sweep's jobs each get a directory of their own"),
    (["-m", "algo.lr=interval(1e-4,1e-2)"], "algo.lr=interval(1e-4,1e-2): interval() is for a sampling sweeper"),
])
def test_a_sweep_hydra_would_refuse_in_its_own_words_is_one_line(args, line):
    out = run_cli("train", *args, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().startswith(f"error: {line}"), out.stderr


def test_a_bad_key_in_a_sweep_fails_before_any_job(tmp_path):
    out = run_cli("train", "-m", "algo.lrr=1,2", f"run.dir={tmp_path / 's'}", timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == "error: unknown config key 'algo.lrr' (did you mean 'algo.lr'?)"
    assert not (tmp_path / "s").exists()


@pytest.fixture(scope="module")
def lr_sweep(tmp_path_factory):
    """Two learning rates x two seeds of the fused trainer, and its report."""
    sweep = tmp_path_factory.mktemp("report") / "sweep"
    out = run_cli("train", "-m", *TINY, "algo.total_timesteps=1024", "algo.lr=1e-3,3e-4", "seed=1,2",
                  f"run.dir={sweep}", "run.progress=false")
    assert out.returncode == 0, out.stderr
    out = run_cli("report", str(sweep), timeout=180)
    assert out.returncode == 0, out.stderr
    (sweep.parent / "report.out").write_text(out.stdout)
    return sweep


def test_report_groups_a_sweep_by_its_overrides_and_aggregates_seeds(lr_sweep):
    """`jaxrl-dist report MULTIRUN_DIR`: two learning rates x two seeds give two groups of
    two seeds each: mean curves with bands, the IQM of the final returns (rliable), and a
    markdown table; fused runs are on the wall-time figure. Two runs a group are too few
    for a performance profile: sweep.md says it was skipped."""
    sweep = lr_sweep
    for name in ("sweep_return_vs_steps.png", "sweep_return_vs_wall_time.png", "sweep_final_iqm.png",
                 "sweep.md"):
        assert (sweep / name).stat().st_size > 0, name
    assert not (sweep / "sweep_performance_profile.png").exists()
    text, note = (sweep / "sweep.md").read_text(), "performance profile skipped: groups have 2 runs, it needs at least 5"
    assert f"- {note}" in text.splitlines() and note in (sweep.parent / "report.out").read_text().splitlines()
    rows = [line for line in text.splitlines()[2:] if line.startswith("|")]
    assert len(rows) == 2 and all("| CartPole-v1 | 2 |" in row for row in rows)
    # named by what differs between the groups (Hydra writes the values it parsed)
    assert {row.split("|")[1].strip() for row in rows} == {"algo.lr=0.001", "algo.lr=0.0003"}
    assert all(re.search(r"\| -?[\d.]+ \[-?[\d.]+, -?[\d.]+\] \|", row) for row in rows)  # IQM [CI]


def test_a_sweep_into_a_dir_that_holds_one_is_refused_before_it_writes(lr_sweep):
    """A sweep numbers its jobs from 0: a second one in the same dir would write over the
    first's `.hydra/`, `multirun.yaml` and job logs."""
    kept = {p: p.read_bytes() for p in lr_sweep.rglob("*") if p.is_file()}
    out = run_cli("train", "-m", *TINY, "seed=5,6", f"run.dir={lr_sweep}", timeout=60)
    assert out.returncode == 2 and out.stderr.strip() == (
        f"error: run.dir: {lr_sweep} already holds a sweep (multirun.yaml, 0, 1, ...); pick another run.dir")
    assert {p: p.read_bytes() for p in lr_sweep.rglob("*") if p.is_file()} == kept


def test_a_fused_run_has_a_wall_clock_for_the_report(lr_sweep):
    from jaxrl_dist.tools.report import load_run, wall_clock

    run = lr_sweep / "0"
    clock = wall_clock(load_run(run))
    summary = json.loads((run / "summary.json").read_text())
    assert clock[0] >= summary["compile_seconds"] and all(b > a for a, b in zip(clock, clock[1:]))
    assert clock[-1] <= summary["compile_seconds"] + summary["train_seconds"] + 1e-6

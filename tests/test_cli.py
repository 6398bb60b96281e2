"""The `jaxrl-dist` CLI end to end: run files, config errors, presets, learning."""
from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_dist.cli import COMMANDS
from jaxrl_dist.cli import compose as cli
from jaxrl_dist.config import Config, ConfigError, from_dict

SUMMARY_KEYS = {
    "env_id", "final_return", "returns_per_seed", "env_steps", "wall_seconds",
    "compile_seconds", "train_seconds", "sps", "params_sha256", "peak_rss_mb",
    "num_seeds", "num_updates", "trainer", "jaxrl_dist_version", "commit", "jax_version",
    "jaxlib_version", "platform", "device_kind", "device_count",
}
# the run's own cache directory (conftest): its compile cache is shared by every process of the run
CACHE_HOME = Path(os.environ["XDG_CACHE_HOME"])


def command() -> list:
    script = Path(sys.executable).with_name("jaxrl-dist")
    return [str(script)] if script.exists() else [sys.executable, "-m", "jaxrl_dist.cli"]


def cli_env(**extra: str) -> dict:
    """The environment of a CLI process a test starts: this one's, on the run's cache
    directory (whatever a test has set `XDG_CACHE_HOME` to in-process), and `extra`."""
    return dict(os.environ, XDG_CACHE_HOME=str(CACHE_HOME), **extra)


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(command() + list(args), capture_output=True, text=True,
                          timeout=timeout, env=cli_env())


def test_help_prints_usage():
    out = run_cli("--help", timeout=60)
    assert out.returncode == 0
    assert "usage: jaxrl-dist" in out.stdout and "train" in out.stdout
    assert "cartpole" in out.stdout  # presets are listed
    out = run_cli("--version", timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("jaxrl-dist 0.")
    out = run_cli("trian", timeout=60)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: unknown command 'trian' (did you mean 'train'?); commands: " + ", ".join(COMMANDS)]


def test_the_help_examples_are_valid_configs():
    """Each `jaxrl-dist train` example and override line of both help texts composes to
    a checked config (the default trainer, sync, refuses num_seeds > 1)."""
    from jaxrl_dist.cli import _EPILOG

    footer = (Path(cli.CONFIG_DIR) / "hydra" / "help" / "jaxrl_dist.yaml").read_text()
    lines = [line.strip() for line in (_EPILOG + footer).splitlines()]
    examples = [line.split()[2:] for line in lines if re.match(r"jaxrl-dist train( |$)", line)]
    examples += [line.split("   ")[0].split() for line in lines if re.match(r"(algo|trainer)\.?\w*=", line)]
    assert ["trainer=fused", "num_seeds=4"] in examples and len(examples) >= 5
    for overrides in examples:
        cli.load_config(overrides)


def test_train_writes_complete_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli("train", "trainer=fused", f"run.dir={run_dir}", "algo.total_timesteps=10240",
                  "run.progress=false", "num_seeds=2")
    assert out.returncode == 0, out.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["num_updates"] == 20 and summary["num_seeds"] == 2
    assert summary["env_steps"] == 20 * 512
    assert len(summary["returns_per_seed"]) == 2 and len(summary["params_sha256"]) == 64
    assert summary["compile_seconds"] > 0 and summary["peak_rss_mb"] > 0
    assert summary["wall_seconds"] >= summary["compile_seconds"] + summary["train_seconds"]
    import jax

    assert summary["jax_version"] == jax.__version__ and summary["platform"] == "cpu"
    assert summary["device_count"] >= 1 and summary["trainer"] == "fused"
    # the table: labels with units, a short digest
    assert "env steps/s (training)" in out.stdout and summary["params_sha256"][:12] in out.stdout
    assert summary["params_sha256"] not in out.stdout

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records] == list(range(1, 21))
    assert {"env_steps", "return", "loss", "pg_loss", "v_loss", "approx_kl", "clipfrac",
            "sps"} <= set(records[0])

    import yaml

    saved = from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()), ())
    assert saved.algo.total_timesteps == 10240 and saved.run.dir == str(run_dir)
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert (run_dir / "checkpoints" / "20").is_dir()  # the final checkpoint


@pytest.mark.parametrize("override, key", [
    ("algo.foo=1", "'algo.foo'"),
    ("+algo.foo=1", "'algo.foo'"),
    ("algo.lrr=1", "unknown config key 'algo.lrr' (did you mean 'algo.lr'?)"),
    ("hydra.job.chdirr=true", "unknown config key 'hydra.job.chdirr' (did you mean 'hydra.job.chdir'?)"),
    ("algo.lr=fast", "algo.lr: Value 'fast' of type 'str' could not be converted to Float"),
    ("env=cartpol", "unknown env preset 'cartpol' (did you mean 'cartpole'?)"),
    ("env=CartPole", "unknown env preset 'CartPole' (did you mean 'cartpole'?)"),
    ("backend=rya", "unknown backend preset 'rya' (did you mean 'ray'?)"),
    ("cost=azure", "unknown cost preset 'azure' (did you mean 'azure_aci'?)"),
    ("hydra/launcher=vmapp", "unknown hydra/launcher preset 'vmapp' (did you mean 'vmap'?)"),
    ("async.max_staleness=2", "the async trainer's keys are asynchronous.* now (use asynchronous.max_staleness)"),
    ("backend.num_cpus=1", "only backend=ray takes this key"),
    ("env.id=NoSuchEnv-v0", "env.id"),
    ("env.id=CartPol-v1", "unknown env.id 'CartPol-v1' (did you mean 'CartPole-v1'?)"),
    ("env.num_envs=0", "env.num_envs"),
    ("algo.network=nope", "algo.network: unknown network 'nope' (registered: "),
    ("algo.minibatch_size=100", "algo.minibatch_size"),
    ("env=nosuch", "env preset 'nosuch'"),
    ("algo.lr=[", "algo.lr"),
    ("algo.loss_options=5", "error: algo.loss_options: Cannot assign int"),
    ("backend.options.x=1", "backend.options.x: backend=local is built in and takes no backend.options"),
    ("run.objective=final_retrun", "run.objective: a trainer=sync summary has no number 'final_retrun' "
                                   "(did you mean 'final_return'?)"),
    ("trainer", "bad override 'trainer': an override is KEY=VALUE (trainer=...)"),  # `trainer fused`
    ("--print-confg", "unknown flag '--print-confg' (did you mean '--print-config'?)"),
])
def test_config_errors_exit_2_with_one_line(tmp_path, override, key):
    run_dir = tmp_path / "run"
    out = run_cli("train", f"run.dir={run_dir}", override, timeout=120)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 2
    assert len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], lines
    assert not run_dir.exists()  # failed before making the run (nothing compiled)


def test_a_misspelt_key_set_in_code_is_an_error_not_a_new_attribute():
    """A library caller's typo (`cfg.algo.lrr = ...`) raises instead of training on the
    default: every config dataclass has slots, the serve config's too."""
    import dataclasses

    from jaxrl_dist import config

    with pytest.raises(AttributeError, match="lrr"):
        from_dict({}).algo.lrr = 1e-3
    parts = [cls for cls in vars(config).values() if isinstance(cls, type) and dataclasses.is_dataclass(cls)
             and cls.__module__ == config.__name__]
    assert len(parts) >= 18
    for cls in parts:
        with pytest.raises(AttributeError):
            cls().not_a_key = 1


def test_a_long_flags_unique_prefix_is_the_flag_and_an_unknown_one_is_one_line():
    """argparse takes `--multi` for `--multirun`: the checks read it written out, so
    `--multi --cfg job` is the one line for -m with --cfg, not Hydra's traceback."""
    from jaxrl_dist.cli.train import _full_flags

    assert _full_flags(["--multi", "--cfg", "job", "--config-d", "d", "-cn=x"]) == \
        ["--multirun", "--cfg", "job", "--config-dir", "d", "-cn=x"]
    for bad, near in (("--conf", "--cfg"), ("--hydra-hlp", "--hydra-help"), ("-x", None)):
        with pytest.raises(ConfigError, match=f"unknown flag '{bad}'" + (f" \\(did you mean '{near}'" if near else ";")):
            _full_flags([bad])
    out = run_cli("train", "--multi", "--cfg", "job", timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("error: -m with --cfg:") and "Traceback" not in out.stderr


def test_an_info_flag_with_a_bad_key_is_one_line():
    """`--cfg job` composes as a run does: a misspelt key is the same one line, exit 2."""
    out = run_cli("train", "--cfg", "job", "algo.lrr=1", timeout=120)
    assert out.returncode == 2, out.stderr
    assert (out.stdout + out.stderr).strip() == "error: unknown config key 'algo.lrr' (did you mean 'algo.lr'?)"


def test_an_unknown_loss_is_the_runs_only_line(tmp_path):
    """The loss is checked before anything is written, and before the note on the step
    budget (500,000 steps is not a whole number of updates here)."""
    out = run_cli("train", "trainer=fused", "algo.loss=nope", f"run.dir={tmp_path / 'run'}", timeout=120)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: algo.loss: unknown loss 'nope' (registered: "), lines
    assert not (tmp_path / "run").exists()  # checked before Hydra wrote the run


def test_a_schedulers_name_over_the_default_preset_drops_the_presets_own_keys():
    """`scheduler.name=X` over the default (learned) preset: the library's compose keeps
    only X's keys, as the CLI's does; a key of another schema the user set is still named."""
    from jaxrl_dist.cli.compose import load_config
    from jaxrl_dist.config import AdaptSchedulerConfig, ConfigError

    assert isinstance(load_config(["scheduler.name=adapt"]).scheduler, AdaptSchedulerConfig)
    assert load_config(["scheduler.name=max"]).scheduler.name == "max"
    with pytest.raises(ConfigError, match="'scheduler.path': only scheduler=learned takes this key"):
        load_config(["scheduler.name=max", "scheduler.path=x"])
    # a built-in's name picks its preset, so its own keys are taken beside it
    assert load_config(["trainer=sync", "scheduler.name=adapt", "scheduler.window=3"]).scheduler.window == 3
    assert load_config(["trainer=sync", "backend.name=ray", "backend.num_cpus=0.5"]).backend.num_cpus == 0.5


def test_yaml_defaults_match_the_dataclass_defaults():
    """The CLI's values come from the dataclasses (configs/ only picks presets): the main
    job picks the sync trainer and the learned scheduler, and the default env preset
    (cartpole) sets its minibatch size, target and the adapt scheduler's range."""
    import dataclasses

    from jaxrl_dist.config import LearnedSchedulerConfig

    expected = Config()
    expected = dataclasses.replace(
        expected, scheduler=LearnedSchedulerConfig(min_return=0.0, max_return=500.0),
        trainer=dataclasses.replace(expected.trainer, name="sync"),
        algo=dataclasses.replace(expected.algo, minibatch_size=128),
        run=dataclasses.replace(expected.run, target_return=475.0))
    assert from_dict(cli.compose([]), ()) == expected


@pytest.mark.parametrize("overrides, key", [
    (["backend=fused"], "trainer=fused"),
    (["trainer=fused", "backend=ray"], "backend: trainer=fused does not use it"),
    (["trainer=fused", "scheduler.num_shards=3"], "scheduler.num_shards: trainer=fused"),
    (["trainer=sync", "asynchronous.max_staleness=2"], "asynchronous.max_staleness: trainer=sync"),
    (["algo.num_minibatches=7"], "algo.num_minibatches: ignored while algo.minibatch_size=128"),
    (["trainer=nope"], "unknown trainer preset 'nope'"),
    (["scheduler=adapt", "scheduler.num_shards=8"], "scheduler.num_shards: scheduler=adapt does not read it"),
    (["scheduler=fixed", "scheduler.max_shards=3"], "scheduler.max_shards: scheduler=fixed does not read it "
                                                    "(it reads scheduler.num_shards)"),
    (["scheduler.num_shards=8"], "scheduler.num_shards: scheduler=learned does not read it"),
])
def test_a_key_the_chosen_trainer_ignores_is_one_line(overrides, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        cli.load_config(overrides)


@pytest.mark.parametrize("override, line", [
    ("algo.clip_eps=nan", "algo.clip_eps must be positive, got nan"),
    ("algo.clip_eps=-0.1", "algo.clip_eps must be positive"),
    ("algo.lr=inf", "algo.lr must be a finite number >= 0, got inf"),
    ("algo.max_grad_norm=-1", "algo.max_grad_norm must be positive"),
    ("algo.vf_coef=-5", "algo.vf_coef must be a finite number >= 0"),
    ("algo.ent_coef=nan", "algo.ent_coef must be a finite number >= 0"),
    ("env.clip_obs=-1", "env.clip_obs must be positive"),
    ("env.num_threads=-1", "env.num_threads must be >= 0 (0: envpool chooses), got -1"),
    ("algo.total_timesteps=1e19", "algo.total_timesteps=1e+19 is too many: 3.12e+17 gradient steps"),
])
def test_a_coefficient_out_of_range_is_one_line(override, line):
    """Values that would train to the end on NaN, or overflow deep inside, are refused."""
    with pytest.raises(ConfigError, match=re.escape(line)):
        cli.load_config(["trainer=fused", override])


@pytest.mark.parametrize("preset", cli.presets())
def test_every_preset_composes_to_a_valid_config(preset):
    cfg = from_dict(cli.compose([f"env={preset}"]), ())
    assert cfg.env.id and cfg.env.num_envs > 0


def test_preset_values_are_defaults_that_overrides_win():
    cfg = from_dict(cli.compose(["env.id=Pendulum-v1", "algo.lr=1e-3", "algo.total_timesteps=1e6"]), ())
    assert cfg.env.id == "Pendulum-v1" and cfg.algo.lr == 1e-3
    assert cfg.algo.total_timesteps == 1_000_000
    hopper = from_dict(cli.compose(["env=hopper", "algo.num_minibatches=16"]), ())
    assert (hopper.env.id, hopper.env.suite, hopper.algo.num_minibatches) == ("Hopper-v3", "envpool", 16)
    assert hopper.algo.update_epochs == 10 and hopper.algo.clip_vloss


def test_env_kwargs_is_an_open_mapping():
    cfg = from_dict(cli.compose(["env.kwargs.max_episode_steps=100"]), ())
    assert cfg.env.kwargs == {"max_episode_steps": 100}
    cfg = from_dict(cli.compose(["env.kwargs={a: 1, b: x}"]), ())
    assert cfg.env.kwargs == {"a": 1, "b": "x"}


def test_default_train_solves_cartpole(tmp_path):
    """`jaxrl-dist train` with the defaults, on a terminal: CartPole-v1, 5e5 steps, the
    local backend, the learned scheduler and serverless prices; the table shows both
    clocks and dollars. The bar waits for the first round's figures: until then a status
    line says the round compiles (it was a bar at 0 steps with no word for seconds)."""
    from test_terminal import on_a_terminal

    run_dir = tmp_path / "run"
    code, text = on_a_terminal(["train", f"run.dir={run_dir}"])
    assert code == 0, text[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_id"] == "CartPole-v1" and summary["env_steps"] >= 490_000
    assert summary["final_return"] >= 475, summary
    assert (summary["backend"], summary["scheduler"], summary["cost_preset"]) == ("local", "learned", "azure_aci")
    assert summary["cost_usd"] > 0 and summary["modeled_seconds"] > 0 and summary["time_to_target_s"] > 0
    for label in ("final return", "wall time (s)", "modeled cloud time (s)", "dollars (cost preset)",
                  "measured time to target (s)"):
        assert label in text
    spots = [text.find(f"{s} (") for s in ("checking the config", "starting the local backend",
                                            "compiling and running the first round")]
    assert -1 not in spots and spots == sorted(spots), spots
    frames = re.findall(r"(\d+)/(\d+) steps +(\S+) steps/s", text)
    assert frames and int(frames[0][0]) > 0 and frames[0][2] != "-", frames[:2]  # its first look has figures
    assert spots[-1] < text.find(f"{frames[0][0]}/{frames[0][1]} steps")


@pytest.mark.parametrize("env_id, preset, target", [
    ("CartPole-v1", "cartpole", 475.0), ("Acrobot-v1", "acrobot", -100.0),
    ("MountainCar-v0", "auto_discrete", None), ("MountainCarContinuous-v0", "auto_continuous", None),
    ("Asterix-MinAtar", "auto_grid", None), ("Walker2d-v3", "auto_mujoco", None),
    ("Breakout-v5", "auto_image", None),
])
def test_an_env_id_gets_the_defaults_that_fit_it(env_id, preset, target):
    """`env.id=X` alone takes X's own preset, else the defaults of its kind of task (by its
    spaces and suite), never CartPole's target return."""
    from jaxrl_dist.cli.compose import task_preset

    assert task_preset([f"env.id={env_id}"])[0] == f"env={preset}"
    cfg = from_dict(cli.compose([f"env.id={env_id}"]), ())
    assert cfg.env.id == env_id and cfg.run.target_return == target
    if preset.startswith("auto_"):
        assert cfg.scheduler.min_return is None and cfg.scheduler.max_return is None
    # an explicit preset, or a sweep of ids, is left as the user wrote it
    assert task_preset(["env=pong", f"env.id={env_id}"]) == ["env=pong", f"env.id={env_id}"]
    assert task_preset([f"env.id={env_id},CartPole-v1"]) == [f"env.id={env_id},CartPole-v1"]


def test_a_parts_name_picks_its_preset_only_where_one_has_that_name():
    """`GROUP.name=PRESET` (one value or a sweep of them) is `GROUP=PRESET`; other keys of the
    group, and a name no preset has (a plugin's), stay as given."""
    from jaxrl_dist.cli.compose import normalise

    given = ["scheduler.name=adapt", "cost.name=aws_lambda", "backend.name=fixed,ray", "scheduler.step=adapt",
             "backend.name=marked", "cost.kind=cluster"]
    assert normalise(given) == ["scheduler=adapt", "cost=aws_lambda", "backend.name=fixed,ray",
                                "scheduler.step=adapt", "backend.name=marked", "cost.kind=cluster"]
    assert normalise(["scheduler.name=fixed,adapt"]) == ["scheduler=fixed,adapt"]
    assert normalise(["scheduler=ramp", "scheduler.name=adapt"]) == ["scheduler=ramp", "scheduler.name=adapt"]


def test_hydra_s_flags_see_the_config_that_would_train(capsys):
    """`--cfg job` composes what a run would (a part's name picks its preset); `-m` beside it,
    two run directories, a misspelt cost preset under `cost.name`: one line each."""
    from jaxrl_dist import cli

    assert cli.main(["train", "--cfg", "job", "cost.name=aws_lambda"]) == 0
    assert "vcpu_second_usd: 0.0" in capsys.readouterr().out  # Lambda's, not the default preset's
    cases = [(["-m", "seed=1,2", "--cfg", "job"], "error: -m with --cfg: Hydra takes one of"),
             (["hydra.run.dir=a", "run.dir=b"], "error: run.dir=b and hydra.run.dir=a: two directories"),
             (["cost.name=aws_lamda"], "error: cost.name=aws_lamda: no such cost preset (did you mean 'aws_lambda'?)")]
    for args, line in cases:
        assert cli.main(["train", *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(line), err
    assert cli.main(["train", "--version"]) == 0
    assert capsys.readouterr().out.startswith("jaxrl-dist ")


@pytest.mark.parametrize("make, named", [
    (lambda c: Config(algo=c.AlgoConfig(total_timesteps=2e4)), "algo.total_timesteps"),
    (lambda c: Config(env=c.EnvConfig(num_envs=4.0)), "env.num_envs"),
    (lambda c: Config(algo=c.AlgoConfig(hidden_sizes="64")), "algo.hidden_sizes"),
    (lambda c: Config(algo={"lrr": 1e-3}), "algo.lrr"),
    (lambda c: Config(seed=1.5), "seed"),
])
def test_a_config_built_in_python_is_typed_as_a_composed_one(make, named):
    """A library caller's dataclasses get the type checks OmegaConf gives a composed config,
    before anything is written (a float step count failed deep in the first chunk)."""
    from jaxrl_dist import config as c

    with pytest.raises(ConfigError, match=re.escape(named)):
        c.validate(make(c))


def test_a_config_built_in_python_takes_short_forms():
    from jaxrl_dist.config import AdaptSchedulerConfig, RayBackendConfig, validate

    cfg = validate(Config(trainer="sync", backend="ray", scheduler={"name": "adapt", "window": 3}, algo={"lr": 3e-4}))
    assert isinstance(cfg.backend, RayBackendConfig) and isinstance(cfg.scheduler, AdaptSchedulerConfig)
    assert cfg.scheduler.window == 3 and cfg.algo.lr == 3e-4 and cfg.trainer.name == "sync"

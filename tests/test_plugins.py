"""The five extension points, used the way a research fork uses them: the worked
plugins in the README's "Extending" section are installed as a real distribution
(pip, into a temporary directory outside the package) and CartPole trains with each."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
from jaxrl_dist.cli.compose import load_config
from jaxrl_dist.config import ConfigError as CliConfigError
from jaxrl_dist.trainers.runner import train

out, run = {}, sys.argv[1]
SHORT = ["algo.total_timesteps=2048", "algo.num_steps=32", "run.progress=false",
         "run.tensorboard=false", "run.compile_cache=false"]
ROUNDS = ["backend.envs_per_shard=4", "backend.max_shards=4", "algo.minibatch_size=null",
          "algo.num_minibatches=2"]
cases = {
    "loss": ["trainer=fused", "algo.loss=clipped_kl", "algo.loss_options.kl_coef=0.5"],
    "network": ["trainer=fused", "algo.network=wide", "algo.network_options.width=32"],
    "suite": ["trainer=fused", "env.id=ToyCartPole-v0", "env.suite=toy"],
    "backend": ["backend.name=marked", f"backend.options.marker={run}/marker.txt", "scheduler=fixed",
                "scheduler.num_shards=2"] + ROUNDS,
    "scheduler": ["scheduler=alternate", "scheduler.options.high=3"] + ROUNDS,
}
for name in sys.argv[2:]:
    over = cases[name]
    summary = train(load_config(over + SHORT + [f"run.dir={run}/{name}"]))
    out[name] = {"final_return": summary["final_return"], "params_sha256": summary["params_sha256"]}
errors = {}
for name, over in {"bad_option": ["trainer=fused", "algo.loss=clipped_kl", "algo.loss_options.kl=1"],
                   "bad_type": ["trainer=fused", "algo.network=wide", "algo.network_options.width=wide"],
                   "unknown": ["trainer=fused", "algo.loss=nope"]}.items():
    try:
        train(load_config(over + SHORT + [f"run.dir={run}/{name}"]))
    except Exception as err:
        errors[name] = str(err)
out["errors"] = errors
picked = load_config(["trainer=sync", "scheduler=alternate", "scheduler.options.high=3", "backend=marked",
                      f"backend.options.marker={run}/m.txt"] + ROUNDS)  # plugins picked as presets are
out["presets"] = [picked.scheduler.name, picked.backend.name, picked.scheduler.options]
print("RESULT " + json.dumps(out))
"""


def readme_files() -> dict:
    """`{path: text}` of the README's Extending blocks, each naming its file on line one."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Extending"):]
    files = {}
    for block in re.findall(r"```(?:python|toml)\n(.*?)```", section, re.S):
        first, _, body = block.partition("\n")
        match = re.match(r"# file: (\S+)", first)
        if match:
            files[match.group(1)] = body
    return files


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    src, site = tmp_path_factory.mktemp("plugin-src"), tmp_path_factory.mktemp("site")
    for name, body in readme_files().items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(body)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
           "--no-index", "--target", str(site), str(src)]
    subprocess.run(pip, check=True, capture_output=True, timeout=300)
    return site


def test_readme_holds_the_five_plugins():
    files = readme_files()
    assert set(files) == {"pyproject.toml", "jaxrl_dist_example/plugins.py"}
    for group in ("losses", "networks", "env_suites", "backends", "schedulers"):
        assert f'"jaxrl_dist.{group}"' in files["pyproject.toml"]


def train_with(installed, run, *cases: str) -> dict:
    """Train CartPole with each named plugin case in one fresh interpreter that sees the
    installed distribution (and only it) beside the package; the bad-option cases too."""
    env = dict(os.environ, PYTHONPATH=str(installed))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(run), *cases], capture_output=True,
                          text=True, timeout=600, env=env, cwd=run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    for name in cases:
        assert len(out[name]["params_sha256"]) == 64, name
    errors = out["errors"]
    assert "algo.loss_options.kl: unknown option (options: kl_coef)" in errors["bad_option"]
    assert "algo.network_options.width" in errors["bad_type"]
    assert re.search(r"algo.loss: unknown loss 'nope' \(registered: .*clipped_kl.*ppo", errors["unknown"])
    assert all("\n" not in e for e in errors.values())
    assert out["presets"] == ["alternate", "marked", {"high": 3}]
    return out


def logs_its_own_metric(run) -> bool:
    """The plugin loss's own metric is logged under its own name."""
    recs = [json.loads(x) for x in (run / "loss" / "metrics.jsonl").read_text().splitlines()]
    return bool(recs) and all("kl_penalty" in r for r in recs)


def test_a_plugin_loss_trains_cartpole_from_an_installed_distribution(installed, tmp_path):
    """The default suite's share: one plugin trains, the bad-option errors name the key
    (all five train in the slow test below: a compile each)."""
    train_with(installed, tmp_path, "loss")
    assert logs_its_own_metric(tmp_path)


@pytest.mark.slow
def test_each_plugin_trains_cartpole_from_an_installed_distribution(installed, tmp_path):
    out = train_with(installed, tmp_path, "loss", "network", "suite", "backend", "scheduler")
    assert logs_its_own_metric(tmp_path)
    # the wider network really is wider than the default (64, 64)
    assert out["network"]["params_sha256"] != out["loss"]["params_sha256"]
    marks = (tmp_path / "marker.txt").read_text().split()
    assert marks and marks[1::2] == ["2"] * (len(marks) // 2)
    assert marks[0::2] == [str(r) for r in range(len(marks) // 2)]  # each round once (warming is not one)
    shards = [json.loads(x)["num_shards"] for x in
              (tmp_path / "scheduler" / "metrics.jsonl").read_text().splitlines()]
    assert shards[:4] == [1, 3, 1, 3]


def test_a_plugin_that_breaks_its_contract_is_one_line_naming_the_key(monkeypatch):
    """A network that is no module, a scheduler that cannot be built as one, a backend
    without the methods the trainer calls: each is a `ConfigError` naming the key and the
    contract, not a traceback at the first use (or in the clean-up that calls `close`)."""
    from jaxrl_dist.backends import BACKENDS, make_backend
    from jaxrl_dist.config import BackendConfig, ConfigError, SchedulerConfig
    from jaxrl_dist.core.networks import NETWORKS, make_network
    from jaxrl_dist.envs import make_env
    from jaxrl_dist.scheduling.schedulers import SCHEDULERS, make_scheduler

    class NoArgs:
        pass

    class Half:
        def __init__(self, cfg):
            pass

        def start(self, job):
            pass

    monkeypatch.setitem(NETWORKS._builtin, "word", lambda spec, sizes, activation, options: "not a module")
    monkeypatch.setitem(SCHEDULERS._builtin, "noargs", NoArgs)
    monkeypatch.setitem(BACKENDS._builtin, "half", Half)
    with pytest.raises(ConfigError, match="^algo.network: 'word' made a str, which lacks init, apply"):
        make_network(make_env("CartPole-v1", 1).spec, "word")
    with pytest.raises(ConfigError, match="^scheduler.name: 'noargs' cannot be called as a subclass of "
                       "jaxrl_dist.scheduling.schedulers.Scheduler"):
        make_scheduler(SchedulerConfig(name="noargs"), BackendConfig())
    with pytest.raises(ConfigError, match="^backend.name: 'half' made a Half, which lacks run_round, close"):
        make_backend(BackendConfig(name="half"))

    import flax.linen as nn

    class Logits(nn.Module):  # a plain array, not a PolicyOut
        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(x)

    class Column(nn.Module):  # a value of [B, 1]: the loss would broadcast it against [B]
        @nn.compact
        def __call__(self, x):
            from jaxrl_dist.core.networks import PolicyOut

            return PolicyOut(nn.Dense(2)(x), x[0, :2] * 0, nn.Dense(1)(x))

    for name, module, got in (("logits", Logits, "ShapeDtypeStruct"), ("column", Column, r"PolicyOut of shapes")):
        monkeypatch.setitem(NETWORKS._builtin, name, lambda spec, sizes, activation, options, m=module: m())
        with pytest.raises(ConfigError, match=rf"^algo.network={name}: on observations \[2, 4\] it returned {got}.*"
                           r"a network returns PolicyOut\(logits or mean \[2, 2\]"):
            make_network(make_env("CartPole-v1", 1).spec, name)

    import jax.numpy as jnp

    class Flat(nn.Module):  # right on [B, obs], but a trajectory's [T, B, obs] is called too
        @nn.compact
        def __call__(self, x):
            from jaxrl_dist.core.networks import PolicyOut

            h = nn.Dense(8)(x.reshape(x.shape[0], -1))
            return PolicyOut(nn.Dense(2)(h), jnp.zeros(2), nn.Dense(1)(h)[..., 0])

    monkeypatch.setitem(NETWORKS._builtin, "flat", lambda spec, sizes, activation, options: Flat())
    with pytest.raises(ConfigError, match=r"^algo.network=flat: on observations \[2, 2, 4\] it raised "
                       r"ScopeParamShapeError: .*PolicyOut\(logits or mean \[2, 2, 2\].* any leading dims"):
        make_network(make_env("CartPole-v1", 1).spec, "flat")


def test_a_plugin_options_declaration_that_cannot_be_read_is_the_plugin_s_line():
    """`Options` that is no dataclass, or whose default does not fit its type: one line
    naming the plugin's declaration, not the user's options."""
    from dataclasses import dataclass

    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.registry import options

    class Plain:
        pass

    @dataclass
    class Wrong:
        k: int = "x"

    def mine():
        pass

    for cls, said in ((Plain, "mine.Options is a plain class, not a dataclass"),
                      (Wrong, "mine.Options cannot be read as a config .*a plugin's mistake")):
        mine.Options = cls
        with pytest.raises(ConfigError, match=f"^algo.loss_options: {said}"):
            options(mine, {}, "algo.loss_options")


def test_a_part_registered_in_process_is_refused_where_shards_run_in_other_processes(monkeypatch):
    """An in-process network (or suite, or wrapper) does not exist in a Ray actor or a serve
    instance: one line before the run, not a shard failing in every try there."""
    from jaxrl_dist.config import ConfigError, from_dict
    from jaxrl_dist.core.networks import NETWORKS, make_network
    from jaxrl_dist.trainers.parts import check_parts

    monkeypatch.setattr(NETWORKS, "_builtin", dict(NETWORKS._builtin))
    monkeypatch.setattr(NETWORKS, "_here", set())
    NETWORKS.register("narrow", lambda spec, sizes, activation, options: make_network(spec, "mlp", (8,)))
    cfg = {"trainer": "sync", "algo": {"network": "narrow"}}
    check_parts(from_dict(cfg))  # the local backend runs shards in this process
    with pytest.raises(ConfigError, match=r"^algo.network=narrow: registered in this process only; "
                       r"backend=http's shards run in other processes, .*\(jaxrl_dist.networks\)"):
        check_parts(from_dict({**cfg, "backend": {"name": "http", "urls": ["http://127.0.0.1:9"]}}))

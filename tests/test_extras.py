"""A command that needs an optional dependency which is not installed says so in one
line naming the extra that installs it, and exits 2: no traceback.

Each case runs the real CLI with the dependency made unimportable: a `sitecustomize`
on `PYTHONPATH` puts a finder first on `sys.meta_path` that refuses those modules, as
Python refuses a module that is not installed."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxrl_dist.config import ConfigError, needs
from test_cli import cli_env, command

BLOCKER = """
import importlib.abc, os, sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    names = set(os.environ["BLOCKED_MODULES"].split(","))

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def run_without(tmp_path, blocked: str, *args: str, env: dict = None) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = cli_env(PYTHONPATH=path, BLOCKED_MODULES=blocked, **(env or {}))
    return subprocess.run(command() + list(args), capture_output=True, text=True, timeout=180, env=env,
                          cwd=tmp_path)


def one_line(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def test_needs_names_what_needs_the_module_and_its_extra(monkeypatch):
    assert needs("json", "none", "x").dumps(1) == "1"
    monkeypatch.setitem(sys.modules, "rliable.library", None)  # Python's mark of a module that cannot import
    with pytest.raises(ConfigError, match=r"^jaxrl-dist report SWEEP_DIR needs rliable.library, .*"
                                          r"pip install 'jaxrl-dist\[report\]'$"):
        from jaxrl_dist.tools import sweep_report

        sweep_report.iqm_intervals([])


@pytest.mark.parametrize("blocked, args, extra", [
    ("uvicorn", ["serve", "--token", "t"], "http"),
    ("optuna", ["train", "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "algo.lr=interval(1e-4,1e-2)"],
     "sweep"),
])
def test_a_command_without_its_extra_is_one_line(tmp_path, blocked, args, extra):
    line = one_line(run_without(tmp_path, blocked, *args))
    assert line.startswith("error: ") and f"needs {blocked}" in line and f"jaxrl-dist[{extra}]" in line


def test_http_backend_and_video_without_their_extras(tmp_path):
    """`backend=http` without httpx and `logger.wandb=true` without wandb, before the run
    is written; `eval.video=true` without pygame, before its episodes."""
    common = ["algo.total_timesteps=1024", "run.progress=false", "run.tensorboard=false"]
    line = one_line(run_without(tmp_path, "httpx", "train", "backend=http", "backend.urls=[http://127.0.0.1:9]",
                                "run.dir=http", *common, env={"JAXRL_DIST_TOKEN": "t"}))
    assert "backend=http needs httpx" in line and "jaxrl-dist[http]" in line
    assert not (tmp_path / "http").exists()  # checked before Hydra wrote the run
    line = one_line(run_without(tmp_path, "wandb", "train", "logger.wandb=true", "run.dir=wandb", *common))
    assert "logger.wandb=true needs wandb" in line and "jaxrl-dist[wandb]" in line
    assert not (tmp_path / "wandb").exists()
    run = tmp_path / "fused"
    out = subprocess.run(command() + ["train", "trainer=fused", f"run.dir={run}", *common], capture_output=True,
                         text=True, timeout=180, env=cli_env())
    assert out.returncode == 0, out.stderr
    line = one_line(run_without(tmp_path, "pygame", "eval", str(run), "eval.video=true", "eval.episodes=2"))
    assert "needs pygame" in line and "jaxrl-dist[video]" in line
    assert not (run / "eval.json").exists()

"""A plain (non-editable) install works from any directory: the wheel ships the Hydra
configs, `py.typed` and the presets; `jaxrl-dist train` and `jaxrl-dist serve` run from
an empty directory with the wheel's package, not the source tree's."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from jaxrl_dist.serve.local import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """`(wheel, site)`: the wheel built from this tree, installed (not editable) into `site`."""
    dist, site = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(dist.glob("jaxrl_dist-*.whl"))
    subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return wheel, site


def run(site: Path, cwd: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-m", "jaxrl_dist", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, **kw)


def test_the_wheel_ships_configs_and_type_marker(installed):
    names = zipfile.ZipFile(installed[0]).namelist()
    assert "jaxrl_dist/configs/config.yaml" in names and "jaxrl_dist/py.typed" in names
    assert "jaxrl_dist/configs/env/cartpole.yaml" in names
    assert "jaxrl_dist/configs/trainer/async.yaml" in names
    assert any(n.startswith("jaxrl_dist/presets/schedulers/") for n in names)
    # Hydra's plugin scan: the launcher in the `hydra_plugins` namespace, which it must not own
    assert "hydra_plugins/jaxrl_dist_vmap/vmap_launcher.py" in names and "hydra_plugins/__init__.py" not in names


def test_hydra_finds_the_vmap_launcher_of_the_installed_wheel(installed, tmp_path):
    out = run(installed[1], tmp_path, "train", "--info", "plugins")
    assert out.returncode == 0 and "VmapLauncher" in out.stdout, out.stderr[-2000:]


def test_train_from_an_empty_directory(installed, tmp_path):
    site = installed[1]
    where = run(site, tmp_path, "--help")  # `python -m jaxrl_dist` is the console script
    assert where.returncode == 0 and "cartpole" in where.stdout, where.stderr
    out = run(site, tmp_path, "train", "trainer=fused", "algo.total_timesteps=2048", "algo.num_steps=32",
              "run.progress=false", "run.tensorboard=false", "run.dir=run")
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(summary["params_sha256"]) == 64
    code = "import jaxrl_dist; print(jaxrl_dist.__file__)"
    origin = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(site))).stdout.strip()
    assert origin.startswith(str(site))  # the installed copy ran, not the source tree


def test_serve_from_an_empty_directory(installed, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "jaxrl_dist", "serve", "--host", "127.0.0.1",
                             "--port", str(port), "--token", "t"], cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(installed[1])),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, ok = time.time() + 60, False
        while time.time() < deadline and not ok and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
                    ok = resp.status == 200
            except OSError:
                time.sleep(0.2)
        assert ok, "serve did not answer /healthz"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)

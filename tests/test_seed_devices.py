"""Seeds split over devices train exactly as they do on one device."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json
import jax, numpy as np
from jaxrl_dist.trainers import fused
from jaxrl_dist.config import AlgoConfig, Config
from jaxrl_dist.envs import make_env
cfg = Config(algo=AlgoConfig(total_timesteps=512 * 6), num_seeds=4)
env = make_env(cfg.env.id, 16)
setup = fused.make_setup(cfg, env.spec)
chunk = fused.make_train_chunk(setup, env, 3)
runner = fused.init_runner(setup, env, 0)
parts = []
for _ in range(2):  # the second call takes the first call's (sharded) output
    runner, metrics = chunk(runner)
    parts.append(np.asarray(metrics["loss"]).tolist())
print(json.dumps({"devices": len(fused.seed_devices(setup, env.spec)), "loss": parts,
                  "episodes": np.asarray(metrics["episodes"]).tolist()}))
"""


def run(devices: int) -> dict:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two fused runs in fresh processes, 34 s
def test_seed_results_do_not_depend_on_the_device_split():
    one, two = run(1), run(2)
    assert one["devices"] == 1 and two["devices"] == 2
    assert one["loss"] == two["loss"]
    assert one["episodes"] == two["episodes"]

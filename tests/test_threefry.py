"""The unrolled CPU threefry lowering: an explicit opt-in (`platform.use_unrolled_threefry`)
that draws the same bits as JAX's default, and that no import of the package makes.
(Whole programs around the draws may still compile to different float rounding:
tests/test_golden.py's Pendulum digest holds only with the opt-in, which conftest makes.)

Each check runs in a fresh interpreter: a lowering registered once stays for the
whole process (and the tests' conftest opts in)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "jaxrl_dist"

# draws like the trainers' (split keys, vmapped splits, uniform, normal, categorical),
# eager and jitted; prints their bits and whether the jitted hash is a rolled loop
DRAWS = """
import hashlib, json, sys
import jax, jax.numpy as jnp, numpy as np
from jaxrl_dist import platform
if sys.argv[1] == "on":
    assert platform.use_unrolled_threefry()
from jaxrl_dist.core import rng

def draws(seed):
    key = rng.key(seed)
    keys = jax.random.split(key, 7)
    out = [rng.unwrap(keys), rng.unwrap(jax.vmap(lambda k: jax.random.split(k, 3))(keys)),
           jax.random.uniform(keys[0], (1000,)), jax.random.normal(keys[1], (257, 3)),
           jax.random.categorical(keys[2], jnp.zeros((64, 5))), jax.random.bits(keys[3], (99,))]
    return out

eager = [np.asarray(x) for x in draws(3)]
jitted = [np.asarray(x) for x in jax.jit(draws, static_argnums=0)(3)]
hlo = jax.jit(lambda k: jax.random.uniform(k, (8,))).lower(rng.key(0)).as_text()
digest = hashlib.sha256(b"".join(x.tobytes() for x in eager + jitted)).hexdigest()
same = all(np.array_equal(a, b) for a, b in zip(eager, jitted))
print(json.dumps({"digest": digest, "eager_is_jitted": same, "rolled": "stablehlo.while" in hlo}))
"""

# the CPU threefry lowering before and after importing the package's modules that use keys
IMPORT = """
import json
import jax
from jax._src.interpreters import mlir
from jax._src.random import threefry2x32 as threefry
table = mlir._platform_specific_lowerings["cpu"]
before = table.get(threefry.threefry2x32_p)
registered = []
register = mlir.register_lowering
mlir.register_lowering = lambda prim, *a, **k: (registered.append(prim.name), register(prim, *a, **k))[1]
import jaxrl_dist.core.rng, jaxrl_dist.trainers.fused, jaxrl_dist.trainers.runner, jaxrl_dist.platform
untouched = table.get(threefry.threefry2x32_p) is before
on_import = [n for n in registered if "threefry" in n]
jaxrl_dist.platform.use_unrolled_threefry()
print(json.dumps({"untouched": untouched, "on_import": on_import,
                  "on_opt_in": [n for n in registered if "threefry" in n][len(on_import):],
                  "opt_in_changes_it": table.get(threefry.threefry2x32_p) is not before}))
"""


def run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_unrolled_lowering_draws_the_same_bits():
    default, unrolled = run(DRAWS, "off"), run(DRAWS, "on")
    assert default["rolled"] and not unrolled["rolled"]  # the opt-in did change the program
    assert default["eager_is_jitted"] and unrolled["eager_is_jitted"]
    assert unrolled["digest"] == default["digest"]


def test_importing_the_package_leaves_the_threefry_lowering_alone():
    found = run(IMPORT)
    assert found["untouched"] and found["on_import"] == []
    # the check would see one: the opt-in registers the lowering and replaces the entry
    assert found["on_opt_in"] == ["threefry2x32"] and found["opt_in_changes_it"]


def test_rng_does_not_reach_into_private_jax():
    assert "jax._src" not in (PKG / "core" / "rng.py").read_text()

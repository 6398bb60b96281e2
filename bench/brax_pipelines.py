"""Raw env steps/s of a brax task on each physics pipeline (no policy, no learning).

    python bench/brax_pipelines.py [--env hopper] [--num-envs 64] [--steps 200]
                                   [--pipelines generalized,positional,spring,mjx]

Each pipeline steps `num_envs` envs with uniform random actions for `steps` steps in one
jitted `lax.scan` through the suite's adapter (resets included); the first call
(compile and run) and a second, timed call are reported apart.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, print_table  # noqa: E402

import jax  # noqa: E402

from jaxrl_dist.envs import make_env  # noqa: E402


def measure(env_id: str, pipeline: str, num_envs: int, steps: int) -> dict:
    env = make_env(env_id, num_envs, "brax", kwargs={"pipeline": pipeline})
    state, _ = env.reset(jax.random.key(0))

    @jax.jit
    def run(state, key):
        def body(s, k):
            act_key, env_key = jax.random.split(k)
            action = jax.random.uniform(act_key, (num_envs, env.spec.num_actions), minval=-1, maxval=1)
            s, out = env.step(s, action, env_key)
            return s, out.reward.sum()
        return jax.lax.scan(body, state, jax.random.split(key, steps))

    t0 = time.perf_counter()
    jax.block_until_ready(run(state, jax.random.key(1)))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(run(state, jax.random.key(2)))
    timed = time.perf_counter() - t0
    return {"pipeline": pipeline, "first_call_s": first, "run_s": timed,
            "steps_per_s": num_envs * steps / timed}


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="hopper")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--pipelines", default="generalized,positional,spring,mjx")
    args = p.parse_args(argv)
    meta = machine_info()
    rows = [measure(args.env, name, args.num_envs, args.steps) for name in args.pipelines.split(",")]
    print_table(f"{args.env}, {args.num_envs} envs x {args.steps} steps, {meta['cpu_model']}",
                ["pipeline", "compile + first run (s)", "env steps/s"],
                [[r["pipeline"], f"{r['first_call_s']:.1f}", f"{r['steps_per_s']:,.0f}"] for r in rows])
    return rows


if __name__ == "__main__":
    main()

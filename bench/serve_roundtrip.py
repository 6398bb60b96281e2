"""One CartPole shard's round trip to a warm `jaxrl-dist serve` on loopback.

    python bench/serve_roundtrip.py --requests 50

Posts the same shard (`--envs` envs x `--steps` steps) `--warmup` times, then
times `--requests` posts and prints the median and mean milliseconds as JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx
import jax
import numpy as np

from jaxrl_dist.backends import shard, wire
from jaxrl_dist.config import from_dict
from jaxrl_dist.platform import use_unrolled_threefry
from jaxrl_dist.serve.local import LocalServer

TOKEN = "bench-token"


def request(envs: int, steps: int) -> bytes:
    cfg = from_dict({"trainer": "sync", "backend": {"name": "local", "envs_per_shard": envs},
                     "algo": {"num_steps": steps, "num_minibatches": 1}})
    spec = shard.spec_from_config(cfg, "gymnax", False)
    prog = shard.ShardProgram(spec)
    params = prog.network.init(jax.random.key(0), np.zeros((1,) + prog.env.spec.obs_shape, np.float32))
    actor = prog.init_slot(shard.slot_init_key(0, 0))
    return wire.encode_request(wire.ShardRequest(spec, 0, shard.shard_key(0, 1, 0), params, actor, "b", 0, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=128)
    opts = parser.parse_args()
    use_unrolled_threefry()
    body = request(opts.envs, opts.steps)
    server = LocalServer("serve.allowed_envs=[CartPole-v1]", token=TOKEN)
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/msgpack"}
    try:
        with httpx.Client(timeout=120) as client:
            times = []
            for i in range(opts.warmup + opts.requests):
                t0 = time.perf_counter()
                resp = client.post(server.url + "/v1/rollout", content=body, headers=headers)
                assert resp.status_code == 200, resp.text
                if i >= opts.warmup:
                    times.append(1000 * (time.perf_counter() - t0))
    finally:
        server.stop()
    print(json.dumps({"requests": opts.requests, "envs": opts.envs, "steps": opts.steps,
                      "median_ms": round(statistics.median(times), 2),
                      "mean_ms": round(statistics.mean(times), 2), "body_bytes": len(body)}))


if __name__ == "__main__":
    main()

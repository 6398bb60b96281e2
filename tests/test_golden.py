"""Behaviour kept across refactors: the final params of small runs, as sha256 digests.

Each digest was recorded before the package was reorganised by layer; a change
that moves code must leave every one identical. A deliberate fix that changes
one updates it here, and says why in its commit. Above staleness 0 the async
trainer's chunk/version pairing depends on thread timing, so it is checked by
its invariants instead of a digest.
"""
from __future__ import annotations

import hashlib
import json
import os

import jax
import numpy as np
import pytest
from flax import serialization

from jaxrl_dist import scheduler_training
from jaxrl_dist.scheduling import mdp
from jaxrl_dist.scheduling import profile
from jaxrl_dist.config import CostConfig, from_dict
from jaxrl_dist.trainers.runner import train
from serving import TOKEN, Server

# XLA compiles for the CPU it runs on, so float results (and digests) differ between
# CPU kinds: each digest below was produced on the machine it names, there by the code
# as last landed (the Intel row by the pre-reorganisation commit a137695 as well), so a
# change that moves code must reproduce the digest of the machine the tests run on
INTEL = "2-vCPU Intel Xeon (KVM)"
EPYC_AVX512 = "2-vCPU AMD EPYC, AVX-512"
EPYC_AVX2 = "2-vCPU AMD EPYC, no AVX-512 (e7c88c9)"
# an EPYC whose AVX-512 has VP2INTERSECT (XLA targets the host's features, so its floats
# differ from the other AVX-512 EPYC's): recorded from 6fde311 and again from ccdb954
EPYC_VP2I = "2-vCPU AMD EPYC, AVX-512 with VP2INTERSECT"
_SHARDS_VP2I = "f5728c51b48bb580ebd866a175cebe4fa98d4b4aabbf33c42a8fe74c2ba5645e"
_SHARDS = "9faf53a90aeed83f8ba866ba5669d709349aa98224ad240e454ca3c7a9a6f6b9"
_SHARDS_AVX2 = "c7fbfe4727d52e35b5ec420b976ded4ce4463923c8ab2897c1b06ed4e08bcde6"
GOLDEN = {
    "fused_cartpole_1seed": {
        INTEL: "67a0550aac6f29c254457262be798cdaadc43de69f660b5b49ea5d2b3b494b42",
        EPYC_AVX512: "67a0550aac6f29c254457262be798cdaadc43de69f660b5b49ea5d2b3b494b42",
        EPYC_AVX2: "59dab6ec75e864f7e92461ae84fbe53834705f1d3115180cded0231913e3ab75",
        EPYC_VP2I: "86ee28d8b1aa0313a177e224b5c09f7a8d1a41ffcc6a0bff847434c089d80275"},
    "fused_cartpole_4seeds": {
        INTEL: "bf427c84ad0d4f8b7cdb4ec8c1ef5ffe9db4dede890a7f021300d9590189389a",
        EPYC_AVX512: "bf427c84ad0d4f8b7cdb4ec8c1ef5ffe9db4dede890a7f021300d9590189389a",
        EPYC_AVX2: "94d9ff5970ed5dd88acdea7171981e6e30c5d7bba3dbaa982c2f5878322fc950",
        EPYC_VP2I: "6638e45916857b0346dc23be0d17a97016a9d2c923bd1167c95886f33fda54d6"},
    "fused_pendulum": {  # Pendulum's rewards round differently even between the first two
        INTEL: "62f3ef3c001c1e9fc1ac554740baf764bff3c7abbd4764c7820c05639b70bae8",
        EPYC_AVX512: "9149e96430fe432d05636b78ee23287e54a6b84f86398c63d36f87b076534ee6",
        EPYC_AVX2: "8bab72c9b7f2a961dea9d5d8e6b1ff6f11021129c69bc28893c34d48382ae1b2",
        EPYC_VP2I: "68a72c2755447d493f2dcf125b5f3a30ffdf4340c768b99927e1245615346fc4"},
    "sync_local_4shards": {INTEL: _SHARDS, EPYC_AVX512: _SHARDS, EPYC_AVX2: _SHARDS_AVX2, EPYC_VP2I: _SHARDS_VP2I},
    "sync_http": {INTEL: _SHARDS, EPYC_AVX512: _SHARDS, EPYC_AVX2: _SHARDS_AVX2, EPYC_VP2I: _SHARDS_VP2I},
    "async_staleness0": {INTEL: _SHARDS, EPYC_AVX512: _SHARDS, EPYC_AVX2: _SHARDS_AVX2, EPYC_VP2I: _SHARDS_VP2I},
    "scheduling_mdp_2updates": {
        # the MDP draws budgets and deadlines per episode since 93d2df6: recorded on these kinds
        # (the AVX-512 EPYC's from 9623172)
        EPYC_AVX512: "615348223465baad39fb993be3e46f61a81f804f036525096894f5324b8cb2df",
        EPYC_AVX2: "6c6ee2877ae8067bbe7a15ddfec90be4042732e561fd1af0dd2cfc99010fb402",
        EPYC_VP2I: "b0d47257a7a1637597a8cced289bfefd8d5a44c7f4f47c6af145a379c262be1d"},
}

RUN = {"progress": False, "tensorboard": False, "compile_cache": False}
SMALL = {"num_steps": 32, "num_minibatches": 2, "update_epochs": 2}


def fused(tmp_path, env_id="CartPole-v1", seeds=1, updates=4, **algo):
    return train(from_dict({
        "env": {"id": env_id, "num_envs": 4}, "num_seeds": seeds,
        "algo": {**SMALL, "total_timesteps": 4 * 32 * updates, **algo},
        "trainer": "fused", "run": {**RUN, "dir": str(tmp_path)},
    }))["params_sha256"]


def rounds(tmp_path, name="local", urls=(), trainer="sync", **async_):
    return train(from_dict({
        "trainer": trainer,
        "algo": {**SMALL, "total_timesteps": 4 * 4 * 32 * 4},
        "backend": {"name": name, "envs_per_shard": 4, "max_shards": 4,
                    **({"urls": list(urls), "token": TOKEN} if name == "http" else {})},
        **({"scheduler": {"name": "fixed", "num_shards": 4}} if trainer == "sync" else
           {"asynchronous": {"batch_chunks": 4, "actors": 4, "balance": False, **async_}}),
        "run": {**RUN, "dir": str(tmp_path)},
    }))


def mdp_digest():
    task = from_dict({"trainer": "sync", "backend": {"name": "local", "envs_per_shard": 2, "max_shards": 2},
                      "scheduler": {"num_shards": 2},
                      "algo": {"num_steps": 8, "num_minibatches": 1, "update_epochs": 1,
                               "total_timesteps": 2 * 8 * 20}})
    opts = mdp.SchedOptions(2, 3, 475.0, 0.5, 10.0, profile.Profile(),
                                mdp.Scale(0.0, 500.0, 3, 2))
    env = mdp.SchedulingEnv(task, CostConfig(), opts, 2)
    out = scheduler_training.train_scheduler(env, num_steps=2, updates=2, log=lambda s: None)
    host = jax.tree.map(np.asarray, out.params)
    return hashlib.sha256(serialization.to_bytes(host)).hexdigest()


def machine_kind() -> str:
    """This CPU's row in `GOLDEN` (by /proc/cpuinfo's vendor and AVX-512)."""
    info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if "GenuineIntel" in info:
        return INTEL
    if " avx512_vp2intersect" in info:
        return EPYC_VP2I
    return EPYC_AVX512 if " avx512f" in info else EPYC_AVX2


def check(name, digest):
    want = GOLDEN[name]
    if digest not in want.values() and machine_kind() not in want:
        pytest.skip(f"{name}: no digest recorded on a {machine_kind()} yet; this one gives {digest}")
    assert digest in want.values(), f"{name}: {digest} is none of the golden digests {want}"
    print(f"GOLDEN {name} {digest} ({', '.join(m for m, d in want.items() if d == digest)})")


def test_fused_digests(tmp_path):
    check("fused_cartpole_1seed", fused(tmp_path / "a"))
    check("fused_cartpole_4seeds", fused(tmp_path / "b", seeds=4))
    check("fused_pendulum", fused(tmp_path / "c", "Pendulum-v1", updates=3))


def test_round_trainer_digests(tmp_path):
    check("sync_local_4shards", rounds(tmp_path / "sync")["params_sha256"])
    check("async_staleness0", rounds(tmp_path / "async", trainer="async",
                                     max_staleness=0)["params_sha256"])
    server = Server()
    try:
        check("sync_http", rounds(tmp_path / "http", "http", [server.url])["params_sha256"])
    finally:
        server.stop()


def test_scheduling_mdp_digest():
    check("scheduling_mdp_2updates", mdp_digest())


def test_async_above_staleness_zero_keeps_its_invariants(tmp_path):
    summary = rounds(tmp_path, trainer="async", max_staleness=2)
    assert max(int(k) for k in summary["staleness_histogram"]) <= 2
    seen = {}
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        for slot, index, _ in json.loads(line)["chunks"]:
            seen.setdefault(slot, []).append(index)
    assert seen
    for slot, indices in seen.items():  # every chunk learned or dropped exactly once
        assert sorted(indices) == list(range(len(indices))), (slot, indices)


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q", "-s"])

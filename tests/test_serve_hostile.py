"""`jaxrl-dist serve` under hostile traffic, over real HTTP on loopback: generated bad
requests (every spec and head field out of range, random bytes, truncations, bit flips,
nesting, deflate bombs, lying and slow clients) from concurrent clients, with the
server's RSS (its own and its rollout worker's) sampled from /proc. Every answer is the
expected 4xx (or 200 for what is still a valid request), no connection drops, no 5xx
but the contained-crash path, and the server stays up under the RSS ceiling.

A short run in the default suite; 10,000 requests under `slow`. By hand:
`python -m tests.hostile --requests 10000`."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

import hostile


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = hostile.start_server(hostile.install_abort_suite(tmp_path_factory.mktemp("site")))
    try:
        hostile.wait_worker(s.url)
        yield s
    finally:
        s.stop()


def soak(server, requests: int, seed: int, slow_share: float) -> dict:
    sampler = hostile.RssSampler(server.proc.pid)
    try:
        gen = hostile.Generator(seed, 2**20, slow_share)
        tally = hostile.run_cases(server.url, [gen.draw() for _ in range(requests)])
    finally:
        peak = sampler.stop()
    figures = {**tally._asdict(), "unexpected": tally.unexpected[:10], "peak_rss_mb": peak}
    print("hostile:", json.dumps(figures))
    assert tally.dropped == 0 and tally.server_errors == 0 and tally.busy == 0, figures
    assert not tally.unexpected, figures
    assert server.healthy() and peak < hostile.RSS_CEILING_MB, figures
    return figures


def test_hostile_requests_get_4xx_and_the_server_holds(server):
    soak(server, 100, seed=0, slow_share=0.03)


@pytest.mark.slow
def test_ten_thousand_hostile_requests(server):
    figures = soak(server, 10_000, seed=1, slow_share=0.01)
    assert figures["requests"] >= 10_000


def _request(**spec) -> bytes:
    _, data = hostile.valid_request()
    return hostile.pack({**data, "spec": {**data["spec"], **spec}})


@pytest.mark.slow
def test_a_hung_rollout_is_cut_off_and_the_worker_restarted(tmp_path):
    """An env whose maker never returns: past serve.rollout_timeout_s the worker is
    killed and restarted, the request answered 503 + Retry-After."""
    s = hostile.start_server(hostile.install_abort_suite(tmp_path), "serve.rollout_timeout_s=3",
                             f"serve.allowed_envs=[{hostile.ENV_ID},{hostile.HANG_ENV}]")
    try:
        hostile.wait_worker(s.url)
        resp = httpx.post(s.url + "/v1/rollout", content=_request(env_id=hostile.HANG_ENV, suite="crashy"),
                          headers=dict(hostile.AUTH), timeout=60)
        assert resp.status_code == 503 and resp.headers["retry-after"], resp.text
        assert "rollout_timeout_s" in resp.json()["error"]
        assert hostile.wait_worker(s.url)["worker"]["restarts"] == 1
    finally:
        s.stop()


def test_cnn_on_cartpole_and_an_oversized_trajectory_are_422(server):
    """Refused naming the field once the env's spaces are known, before any compile."""
    for field, value in (("network", "cnn"), ("num_steps", 4096)):  # 4096 steps: over 1 MB
        resp = httpx.post(server.url + "/v1/rollout", content=_request(**{field: value}),
                          headers=dict(hostile.AUTH), timeout=60)
        assert resp.status_code == 422 and resp.json()["error"].startswith(f"spec.{field}:"), resp.text


def _sticky(slot: int, bad_params: bool) -> bytes:
    """An envpool CartPole request for `slot` (the worker keeps its envs)."""
    _, data = hostile.valid_request()
    params = data["params"]
    if bad_params:
        params = {"params": {**params["params"], "log_std": np.zeros(3, np.float32)}}
    return hostile.pack({**data, "spec": {**data["spec"], "suite": "envpool"}, "slot": slot,
                         "actor": None, "params": params})


def test_env_pools_are_built_only_for_checked_requests(server):
    """Bad params for many envpool slots: refused against the spec's templates, so at
    most the one pool that the templates came from is built, not one per slot."""
    for slot in range(6):
        resp = httpx.post(server.url + "/v1/rollout", content=_sticky(slot, True),
                          headers=dict(hostile.AUTH), timeout=60)
        assert resp.status_code == 422 and resp.json()["error"].startswith("params"), resp.text
    assert hostile.health(server.url)["pools"] <= 1


@pytest.mark.slow
def test_compiled_specs_and_pools_are_bounded(server):
    """Distinct specs past serve.max_programs=2, slots past serve.max_pools=2: the least
    recently used go, counted in /healthz."""
    for gamma in (0.9, 0.95, 0.97):
        assert hostile.send(server.url, hostile.Case("g", _request(gamma=gamma), hostile.AUTH))[0] == 200
    for slot in range(3):
        assert hostile.send(server.url, hostile.Case("s", _sticky(slot, False), hostile.AUTH))[0] == 200
    found = hostile.health(server.url)
    assert found["programs"] <= 2 and found["evicted_programs"] >= 1, found
    assert found["pools"] <= 2 and found["evicted_pools"] >= 1, found


def test_lying_and_slow_clients_are_timed_out(server):
    """A body shorter than its Content-Length, headers that never end: 408 from the
    server's timeouts (1 s here), not a connection held open until the client's (30 s)
    gives up; a 2^31 claim: 413; a connection that never sends a byte is closed by the
    server, without an answer."""
    assert hostile.claims_more(server.url) == 408
    assert hostile.trickled_headers(server.url) == 408
    assert hostile.huge_claim(server.url) == 413
    assert hostile.idle(server.url) == 0  # -1 would be the client's timeout: the server held it


def test_beyond_max_concurrent_is_503_with_retry_after(server):
    """More concurrent rollouts than serve.max_concurrent: the rest are told when to
    come back, none is dropped."""
    gen = hostile.Generator(0, 2**20)
    # a longer rollout first: a new program to compile, so the worker is busy while the
    # others arrive (warm CartPole shards alone can finish before the queue fills)
    long = hostile.Case("valid:long", hostile.pack(hostile.mutate(gen.data, ("spec", "num_steps"), 2048)),
                        hostile.AUTH, frozenset({200}))
    tally = hostile.run_cases(server.url, [long] + [gen.ok()] * 12, threads=13)
    assert tally.dropped == 0 and tally.server_errors == 0
    assert tally.busy > 0 and tally.by_status.get(200, 0) > 0, tally


def test_a_native_crash_in_an_env_is_contained(server):
    """An env whose maker aborts (a test-only suite from an installed entry point) kills
    the rollout process, not the server: 503 + Retry-After, /healthz answers and counts
    the restart, and the next request is checked by a fresh worker. (Last in this module:
    the fresh worker has compiled nothing yet.)"""
    before = hostile.health(server.url)["worker"]["restarts"]
    case = hostile.Case("abort", _request(env_id=hostile.ABORT_ENV, suite="crashy"), hostile.AUTH)
    status, retry_after = hostile.send(server.url, case)
    assert status == 503 and retry_after and int(retry_after) > 0
    assert hostile.health(server.url)["status"] == "ok"  # answers while the worker restarts
    worker = hostile.wait_worker(server.url)["worker"]
    assert worker["restarts"] == before + 1 and worker["last_exit"] == -6  # SIGABRT
    resp = httpx.post(server.url + "/v1/rollout", content=_request(gamma=2.0),
                      headers=dict(hostile.AUTH), timeout=60)
    assert resp.status_code == 422 and resp.json()["error"].startswith("spec.gamma")
    assert hostile.health(server.url)["worker"]["restarts"] == before + 1

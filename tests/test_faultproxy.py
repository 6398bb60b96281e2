"""The loopback fault proxy (tests/tools/faultproxy.py) on its own, in front of a
small HTTP server: each kind of fault on a first attempt, retries relayed
untouched, the same choice from the same seed, added latency, and its log."""
from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tools.faultproxy import FAULTS, FaultProxy, fault_for, straggler_factor


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx uses it

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def post(conn: http.client.HTTPConnection, shard: str, attempt: int, body: bytes = b"shard") -> int:
    conn.request("POST", "/v1/rollout", body, {"x-shard": shard, "x-attempt": str(attempt)})
    resp = conn.getresponse()
    data = resp.read()
    assert resp.status != 200 or data == body
    return resp.status


def shard_with(fault: str, seed: int) -> str:
    """A `run/round/slot` whose first attempt gets `fault` when every first attempt is hit."""
    r = next(r for r in range(100) if fault_for(seed, str(r), "0", 1.0, FAULTS) == fault)
    return f"run/{r}/0"


def test_each_fault_hits_first_attempts_only_and_is_logged(upstream, tmp_path):
    seed = 7
    proxy = FaultProxy(upstream, tmp_path / "log.json", share=1.0, seed=seed, fault_delay_s=0.5)
    port = proxy.port
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        assert post(conn, shard_with("500", seed), 0) == 500  # answered by the proxy ...
        assert post(conn, shard_with("500", seed), 1) == 200  # ... its retry relayed
        drop = shard_with("drop", seed)
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            post(conn, drop, 0)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        assert post(conn, drop, 1) == 200
        t0 = time.perf_counter()
        assert post(conn, shard_with("delay", seed), 0) == 200  # late, past a short timeout
        assert time.perf_counter() - t0 >= 0.5
        stats = proxy.stats()
    finally:
        log = proxy.stop()
    assert log == stats
    assert log["faults"] == {"delay": 1, "drop": 1, "500": 1} and log["first_attempts"] == 3
    assert log["retries"] == 2 and log["relayed"] == 3
    assert [f["fault"] for f in log["injected"]] == ["500", "drop", "delay"]


def test_the_choice_is_the_seeds_and_the_share_is_kept():
    picks = [fault_for(0, str(r), str(s), 0.1, FAULTS) for r in range(500) for s in range(8)]
    assert picks == [fault_for(0, str(r), str(s), 0.1, FAULTS) for r in range(500) for s in range(8)]
    share = sum(p is not None for p in picks) / len(picks)
    assert 0.08 < share < 0.12, share
    assert {p for p in picks if p} == set(FAULTS)
    assert picks != [fault_for(1, str(r), str(s), 0.1, FAULTS) for r in range(500) for s in range(8)]


def test_latency_delays_each_chunk_and_keeps_the_order(upstream, tmp_path):
    proxy = FaultProxy(upstream, tmp_path / "log.json", latency_ms=40, jitter_ms=20, seed=1)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        bodies = [bytes([i]) * (1 + 5000 * i) for i in range(6)]
        t0 = time.perf_counter()
        for i, body in enumerate(bodies):  # responses arrive whole and in order
            assert post(conn, f"run/{i}/0", 1, body) == 200
        per_request = (time.perf_counter() - t0) / len(bodies)
    finally:
        log = proxy.stop()
    assert per_request >= 0.04, per_request  # at least one delayed chunk each way, mean 40 ms
    assert log["relayed"] == 6 and sum(log["faults"].values()) == 0


def test_delayed_chunks_are_pipelined_and_never_overtake():
    """Delays 0.3, 0, 0.2, 0, 0.3 s, all written at one instant (the loop's clock held
    still while they are written): each chunk is due at the largest delay so far (not
    the sum: pipelined); they arrive in order and none before it is due."""
    import asyncio

    from tools.faultproxy import DelayedWriter

    async def main():
        got, done = [], asyncio.Event()

        async def reader(r, w):
            while len(got) < 5:
                got.append((await r.readexactly(1), asyncio.get_running_loop().time()))
            done.set()
            w.close()

        server = await asyncio.start_server(reader, "127.0.0.1", 0)
        _, w = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        delays = iter([0.3, 0.0, 0.2, 0.0, 0.3])
        out = DelayedWriter(w, lambda: next(delays))
        loop = asyncio.get_running_loop()
        t0, due = loop.time(), []
        loop.time = lambda: t0  # the writes' instant, exactly (no await runs meanwhile)
        try:
            for i in range(5):
                out.write(bytes([i]))
                due.append(out.last - t0)
        finally:
            del loop.time
        await out.flush()
        await done.wait()
        out.close()
        server.close()
        return t0, due, got

    t0, due, got = asyncio.run(main())
    assert due == pytest.approx([0.3] * 5)  # never before the chunk ahead; 0.3 s in all, not 0.8
    assert [g[0] for g in got] == [bytes([i]) for i in range(5)]
    assert all(t - t0 >= d for (_, t), d in zip(got, due)), (got, due)  # none before it is due


def test_stragglers_are_the_seeds_share_and_stretch_the_whole_request(upstream, tmp_path):
    """A quarter of the requests (chosen by the seed, whatever their order) wait 5x the
    10 ms each way; the log's delay summary shows the tail, and the client feels it."""

    seed, n = 3, 40
    proxy = FaultProxy(upstream, tmp_path / "log.json", latency_ms=10, jitter_ms=1, seed=seed,
                       straggler_share=0.25, straggler_factor=5)
    slow, fast = [], []
    try:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        for i in range(n):
            t0 = time.perf_counter()
            assert post(conn, f"run/{i}/0", 0) == 200
            hit = straggler_factor(seed, f"{i}/0", "0", 0.25, 5.0) > 1.0  # the run id left out
            (slow if hit else fast).append(time.perf_counter() - t0)
    finally:
        log = proxy.stop()
    assert log["stragglers"] == len(slow) and 0.1 <= len(slow) / n <= 0.4, len(slow)
    d = log["delays_ms"]
    assert d["count"] == 2 * n  # one delayed chunk each way per request
    assert 8 <= d["p50"] <= 12 and 40 <= d["max"] <= 60 and d["p99"] >= 40, d
    assert log["link"]["straggler_share"] == 0.25
    # a straggler waits ~100 ms in all (at least its two delays: a lower bound, whatever
    # the machine's load); the others ~20 ms, not asserted (their time is load's too)
    assert sorted(slow)[len(slow) // 2] >= 0.09, slow


def test_the_straggler_tail_is_the_seeds_and_heavy():
    shards = [f"{r}/{s}" for r in range(500) for s in range(8)]
    fixed = [straggler_factor(0, sh, "0", 0.1, 5.0) for sh in shards]
    assert fixed == [straggler_factor(0, sh, "0", 0.1, 5.0) for sh in shards]
    assert 0.08 < sum(f > 1 for f in fixed) / len(fixed) < 0.12 and set(fixed) == {1.0, 5.0}
    pareto = [f for sh in shards if (f := straggler_factor(0, sh, "0", 0.1, 5.0, alpha=1.5)) > 1]
    assert min(pareto) >= 5.0 and max(pareto) > 4 * 5.0  # a tail well past the least factor
    assert [straggler_factor(0, sh, "1", 0.1, 5.0) for sh in shards] != fixed  # a retry draws anew

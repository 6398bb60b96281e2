"""A loopback HTTP fault proxy: in front of one `jaxrl-dist serve` instance, it delays,
drops or answers 500 for a chosen share of first attempts, and can add latency.

    python tests/tools/faultproxy.py --port 8700 --upstream 127.0.0.1:8600 \
        --share 0.1 --faults delay,drop,500 --fault-delay-s 5 --seed 0 --log faults.json

It reads HTTP/1.1 requests one by one off each client connection (headers and a
`Content-Length` body; the body is never parsed) and relays them to the upstream
on a connection of its own. A request is a shard's first attempt when its
`X-Attempt` header is 0, or, without one, when its `X-Shard` (`run_id/round/slot`)
has not been seen before; retries are always relayed untouched, so they have a
healthy path. Whether a first attempt is faulted, and how, is a pure function of
`(seed, round, slot)`: the same shards are hit in every run with the same seed.

Faults: `delay` holds the request `--fault-delay-s` seconds (past the client's
timeout) before relaying it; `drop` closes the connection without an answer;
`500` answers `500 Internal Server Error` without relaying.

Latency (for every request, faulted or not): each chunk read from either side is
delivered after a delay drawn from a normal(`--latency-ms`, `--jitter-ms`) clipped
at 0; chunks stay pipelined (a chunk's delay starts when it arrives, not when the
previous one left) and in order (none overtakes the one before it).

Stragglers: a share `--straggler-share` of requests (the whole exchange of one
shard try, both directions) is slower: every chunk of such a request waits
`--straggler-factor` times its sampled delay, or, with `--straggler-alpha A > 0`,
a heavy (Pareto) tail: `factor * (1 - u) ** (-1 / A)` times it, `u` uniform, so
the factor is at least `--straggler-factor` and a few requests wait far longer.
Which requests straggle, by how much, and every chunk's delay are a pure function
of the seed, the shard's `round/slot` in `X-Shard` (its run id left out, as for the
faults) and `X-Attempt` (a request without `X-Shard` draws from the seed's own
stream), so runs with one seed meet the same delays whatever the order requests
arrive in. At `--latency-ms 0` there is no delay to stretch.

`GET /proxy/stats` answers the counts, the faults injected and the delays sampled
so far (`delays_ms`: count, mean, p50, p99, max of every chunk's delay, and
`stragglers`: requests slowed) as JSON (not relayed); on SIGTERM or SIGINT the
same JSON is written to `--log` and the process exits. `FaultProxy` starts it as its own process and stops it by PID.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple, Optional

FAULTS = ("delay", "drop", "500")
MAX_HEAD = 64 << 10
STATS_PATH = "/proxy/stats"


class Options(NamedTuple):
    port: int
    upstream: tuple  # (host, port)
    share: float = 0.0  # of first attempts faulted
    faults: tuple = FAULTS
    fault_delay_s: float = 5.0
    seed: int = 0
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    log: Optional[str] = None
    straggler_share: float = 0.0  # of requests (shard tries) slowed ...
    straggler_factor: float = 5.0  # ... their chunks' delays times this ...
    straggler_alpha: float = 0.0  # ... times a Pareto(alpha) draw >= 1 when alpha > 0


class Head(NamedTuple):
    """An HTTP message head: the start line, lower-cased headers, the raw bytes."""

    line: str
    headers: dict
    raw: bytes

    @property
    def length(self) -> int:
        return int(self.headers.get("content-length", "0") or 0)

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()


def fault_for(seed: int, round_: str, slot: str, share: float, faults: tuple) -> Optional[str]:
    """The fault a first attempt of shard `(round_, slot)` gets, or None: a hash of the
    seed and the shard, so the choice is the same in every run and every process."""
    digest = hashlib.sha256(f"{seed}/{round_}/{slot}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0 ** 64
    if u >= share:
        return None
    return faults[int.from_bytes(digest[8:12], "big") % len(faults)]


def _uniforms(*parts) -> tuple:
    """Two uniforms in [0, 1) from a hash of `parts`: the same in every run and process."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return tuple(int.from_bytes(digest[i:i + 8], "big") / 2.0 ** 64 for i in (0, 8))


def straggler_factor(seed: int, shard: str, attempt: str, share: float, factor: float,
                     alpha: float = 0.0) -> float:
    """How many times its sampled delays a request (try `attempt` of shard `round/slot`)
    waits: 1, or for a `share` of requests `factor` (times a Pareto(`alpha`) draw when
    `alpha` > 0)."""
    u, v = _uniforms("straggler", seed, shard, attempt)
    if u >= share:
        return 1.0
    return factor * (1.0 - v) ** (-1.0 / alpha) if alpha > 0 else factor


def delay_stats(delays_ms: list) -> dict:
    """count, mean, p50, p99 and max of the sampled delays (ms; None when there are none)."""
    xs = sorted(delays_ms)
    if not xs:
        return {"count": 0, "mean": None, "p50": None, "p99": None, "max": None}
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {"count": len(xs), "mean": sum(xs) / len(xs), "p50": pick(0.5), "p99": pick(0.99), "max": xs[-1]}


def parse_head(raw: bytes) -> Head:
    text = raw.decode("latin-1")
    line, *rest = text.split("\r\n")
    headers = {}
    for h in rest:
        name, sep, value = h.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return Head(line, headers, raw)


async def read_head(reader: asyncio.StreamReader) -> Optional[Head]:
    """The next message head, or None at a clean end of the stream."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as err:
        if err.partial:
            raise ConnectionError("the stream ended inside a message head") from None
        return None
    except asyncio.LimitOverrunError:
        raise ConnectionError("message head too large") from None
    return parse_head(raw)


async def read_body(reader: asyncio.StreamReader, head: Head) -> bytes:
    """The body as it was on the wire (chunked framing kept)."""
    if not head.chunked:
        return await reader.readexactly(head.length)
    out = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        out += size_line
        size = int(size_line.split(b";")[0].strip(), 16)
        out += await reader.readexactly(size + 2)  # the data and its CRLF
        if size == 0:
            return bytes(out)


class DelayedWriter:
    """Writes chunks each after a sampled delay, pipelined and in order."""

    def __init__(self, writer: asyncio.StreamWriter, sample):
        self.writer, self.sample = writer, sample
        self.queue: asyncio.Queue = asyncio.Queue()
        self.last = 0.0
        self.task = asyncio.ensure_future(self._drain()) if sample else None

    def write(self, data: bytes) -> None:
        if self.task is None:
            self.writer.write(data)
            return
        loop = asyncio.get_running_loop()
        self.last = max(self.last, loop.time() + self.sample())  # never before the chunk ahead
        self.queue.put_nowait((self.last, data))

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            at, data = await self.queue.get()
            await asyncio.sleep(max(0.0, at - loop.time()))
            self.writer.write(data)
            self.queue.task_done()

    async def flush(self) -> None:
        if self.task is not None:
            await self.queue.join()
        await self.writer.drain()

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.writer.close()


class Link:
    """One client connection's delays: the current request's random stream and
    straggler factor, set as each request's head arrives (HTTP/1.1 requests on a
    connection come one after the other), used by both directions' writers."""

    def __init__(self, proxy: "Proxy"):
        self.proxy, self.rng, self.factor, self.counted = proxy, proxy.rng, 1.0, True

    def begin(self, head: Head) -> None:
        o, shard = self.proxy.opts, head.headers.get("x-shard")
        # the proxy's own stats answer is delayed too, but not counted: its log then
        # equals the last stats read
        self.counted = head.line.split(" ")[1:2] != [STATS_PATH]
        if not shard:
            self.rng, self.factor = self.proxy.rng, 1.0
            return
        attempt = head.headers.get("x-attempt", "")
        parts = shard.split("/")
        shard = "/".join(parts[1:]) if len(parts) == 3 else shard  # round/slot: not the run's id
        self.rng = random.Random(hashlib.sha256(f"{o.seed}/{shard}/{attempt}".encode()).digest())
        self.factor = straggler_factor(o.seed, shard, attempt, o.straggler_share, o.straggler_factor,
                                       o.straggler_alpha)
        self.proxy.stats["stragglers"] += self.factor > 1.0

    def sample(self) -> float:
        o = self.proxy.opts
        ms = max(0.0, self.rng.gauss(o.latency_ms, o.jitter_ms)) * self.factor
        if self.counted:
            self.proxy.delays_ms.append(ms)
        return ms / 1000.0


class Proxy:
    def __init__(self, opts: Options):
        self.opts = opts
        self.rng = random.Random(opts.seed)
        self.seen: set = set()
        self.delays_ms: list = []  # every chunk's sampled delay
        self.stats = {"requests": 0, "first_attempts": 0, "retries": 0, "relayed": 0,
                      "faults": {k: 0 for k in FAULTS}, "injected": [], "stragglers": 0}

    def report(self) -> dict:
        """The stats with the delays' summary (`delays_ms`) and the link's settings."""
        o = self.opts
        link = {k: getattr(o, k) for k in ("latency_ms", "jitter_ms", "straggler_share",
                                           "straggler_factor", "straggler_alpha", "seed")}
        return {**self.stats, "delays_ms": delay_stats(self.delays_ms), "link": link}

    def classify(self, head: Head) -> Optional[str]:
        """Count the request; the fault its first attempt gets (None: relay it)."""
        self.stats["requests"] += 1
        shard = head.headers.get("x-shard", "")
        attempt = head.headers.get("x-attempt")
        first = attempt == "0" if attempt is not None else (shard and shard not in self.seen)
        self.seen.add(shard)
        if not first:
            self.stats["retries"] += attempt is not None and attempt != "0"
            return None
        self.stats["first_attempts"] += 1
        parts = shard.split("/")
        if len(parts) != 3:
            return None
        fault = fault_for(self.opts.seed, parts[1], parts[2], self.opts.share, self.opts.faults)
        if fault is not None:
            self.stats["faults"][fault] += 1
            self.stats["injected"].append({"shard": shard, "fault": fault, "t": time.time()})
        return fault

    async def handle(self, c_reader, c_writer) -> None:
        link = Link(self)
        sample = link.sample if self.opts.latency_ms or self.opts.jitter_ms else None
        client = DelayedWriter(c_writer, sample)
        upstream = None
        try:
            while (head := await read_head(c_reader)) is not None:
                body = await read_body(c_reader, head)
                link.begin(head)
                if head.line.split(" ")[1:2] == [STATS_PATH]:
                    self._answer(client, 200, json.dumps(self.report()).encode(), "application/json")
                    await client.flush()
                    continue
                fault = self.classify(head)
                if fault == "drop":
                    return
                if fault == "500":
                    self._answer(client, 500, b"injected fault", "text/plain")
                    await client.flush()
                    continue
                if fault == "delay":
                    await asyncio.sleep(self.opts.fault_delay_s)
                upstream = await self._relay(head, body, upstream, client, sample)
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            pass  # either side went away: this connection is over
        finally:
            client.close()
            if upstream is not None:
                upstream[1].close()

    async def _relay(self, head: Head, body: bytes, upstream, client: DelayedWriter, sample):
        """Relay one request and its answer; returns the upstream connection for the next.
        A kept-alive upstream connection the server closed meanwhile is opened again
        once (the request had not reached it), so only injected faults fail a request."""
        for fresh in (upstream is None, True):
            if fresh:
                if upstream is not None:
                    upstream[1].close()
                r, w = await asyncio.open_connection(*self.opts.upstream, limit=MAX_HEAD)
                upstream = (r, DelayedWriter(w, sample))
            try:
                upstream[1].write(head.raw + body)
                await upstream[1].flush()
                resp = await read_head(upstream[0])
            except (ConnectionError, OSError):
                resp = None
            if resp is not None:
                break
            if fresh:
                raise ConnectionError("the upstream closed the connection")
        client.write(resp.raw + await read_body(upstream[0], resp))
        await client.flush()
        self.stats["relayed"] += 1
        return upstream

    @staticmethod
    def _answer(client: DelayedWriter, code: int, body: bytes, kind: str) -> None:
        reason = {200: "OK", 500: "Internal Server Error"}[code]
        client.write(f"HTTP/1.1 {code} {reason}\r\ncontent-type: {kind}\r\n"
                     f"content-length: {len(body)}\r\n\r\n".encode() + body)

    def write_log(self) -> None:
        if self.opts.log:
            tmp = Path(self.opts.log + ".tmp")
            tmp.write_text(json.dumps(self.report(), indent=1))
            tmp.replace(self.opts.log)


async def serve(opts: Options) -> None:
    proxy = Proxy(opts)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", opts.port, limit=MAX_HEAD)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    proxy.write_log()


def parse_args(argv=None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="HOST:PORT of the server behind the proxy")
    p.add_argument("--share", type=float, default=0.0)
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--fault-delay-s", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--straggler-share", type=float, default=0.0,
                   help="share of requests (shard tries) whose chunks wait longer")
    p.add_argument("--straggler-factor", type=float, default=5.0,
                   help="a straggler's delays times this (the least, with --straggler-alpha)")
    p.add_argument("--straggler-alpha", type=float, default=0.0,
                   help="> 0: a Pareto tail of this shape on top of --straggler-factor")
    p.add_argument("--log")
    a = p.parse_args(argv)
    host, _, port = a.upstream.rpartition(":")
    faults = tuple(f for f in a.faults.split(",") if f)
    if not host.startswith("127.") or any(f not in FAULTS for f in faults) or not 0 <= a.share <= 1:
        p.error("--upstream must be a 127.x.x.x address, --faults from delay,drop,500, --share in [0, 1]")
    if not 0 <= a.straggler_share <= 1 or a.straggler_factor < 1 or a.straggler_alpha < 0:
        p.error("--straggler-share in [0, 1], --straggler-factor >= 1, --straggler-alpha >= 0")
    return Options(a.port, (host, int(port)), a.share, faults, a.fault_delay_s, a.seed,
                   a.latency_ms, a.jitter_ms, a.log, a.straggler_share, a.straggler_factor,
                   a.straggler_alpha)


class FaultProxy:
    """The proxy as its own process on `127.0.0.1:port`, in front of `upstream_url`;
    `stats()` while it runs, `stop()` (SIGTERM to its PID) returns its log."""

    def __init__(self, upstream_url: str, log: Path, port: int = 0, timeout: float = 30.0, **opts):
        from jaxrl_dist.serve.local import free_port

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log)
        args = [sys.executable, __file__, "--port", str(self.port),
                "--upstream", upstream_url.split("://")[-1].rstrip("/"), "--log", str(self.log)]
        for key, value in opts.items():
            value = ",".join(value) if isinstance(value, (tuple, list)) else value
            args += [f"--{key.replace('_', '-')}", str(value)]
        self.proc = subprocess.Popen(args, start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the fault proxy exited with {self.proc.returncode}")
            try:
                self.stats()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"the fault proxy on {self.url} did not answer in {timeout:.0f} s")

    def stats(self) -> dict:
        with urllib.request.urlopen(self.url + STATS_PATH, timeout=5) as resp:
            return json.loads(resp.read())

    def stop(self) -> Optional[dict]:
        """SIGTERM, then SIGKILL after 10 s; its log (None if it wrote none)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return json.loads(self.log.read_text()) if self.log.exists() else None


if __name__ == "__main__":
    asyncio.run(serve(parse_args()))

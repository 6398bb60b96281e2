"""Hostile requests for `jaxrl-dist serve`, shared by the in-process schema fuzz
(tests/test_serve_schema.py, hypothesis) and the HTTP suite against a real server
(tests/test_serve_hostile.py). Loopback only.

By hand, from the repository root (prints the counts and the peak RSS as JSON):

    python -m tests.hostile --requests 10000
"""
from __future__ import annotations

import functools
import http.client
import json
import os
import random
import socket
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import numpy as np

TOKEN = "hostile-token-51c2"
ENV_ID = "CartPole-v1"
ABORT_ENV = "Abort-v0"  # served by the test-only `crashy` suite: making it calls os.abort()
HANG_ENV = "Hang-v0"  # the same suite: making it never returns
RSS_CEILING_MB = 1536.0
NAN, INF = float("nan"), float("inf")

# Out-of-range or mistyped values for every field of a request (spec and head):
# each must be refused with a 4xx naming the field, before any env or program is built.
SPEC_CASES = {
    "env_id": ["", "x" * 1000, 5, None, "Acrobot-v1", "../../etc/passwd", [ENV_ID]],
    "suite": ["", "nope", "__class__", 1, None, ["gymnax"]],
    "num_envs": [0, -1, 257, 4097, 2**40, 2**63, "4", 4.5, True, None],
    "num_steps": [0, -1, 4097, 2**62, "16", 16.5, False, None],
    "network": ["", "foo", "__class__", "cnn", 1, None],
    "hidden_sizes": [[], [0], [-1], [5000], [1] * 9, [1] * 1000, "64", [64.5], [True], None, [[64]]],
    "activation": ["sigmoid", "", "__class__", "TANH", 1, None],
    "normalize_obs": [1, 0, "true", None, []],
    "normalize_reward": [1, "false", None, {}],
    "gamma": [NAN, INF, -INF, -1.0, 1.0000001, 1e308, "0.99", True, None, [0.99]],
    "clip_obs": [NAN, INF, -1.0, 0.0, 1e7, "10", True, None],
    "clip_reward": [NAN, -INF, -1.0, 0.0, 1e300, "10", None],
    "env_kwargs": ["not json", "[]", "1", '{"base_path": "/nonexistent"}', '{"a": {"b": 1}}',
                   "[" * 5000, '{"a":' * 1000 + "1" + "}" * 1000, 5, None,
                   '{"max_episode_steps": 10}', json.dumps({"img_height": 1024})],
    "num_threads": [-1, 65, 10_000, "1", True, None],
    "network_options": ["not json", '{"width": 3}', "[]", 1, None],
    "unknown_field": [1],
}
HEAD_CASES = {
    "v": [True, 1, 3, 0, -1, "2", 2.0, [2], None, {"a": 1}, 2**64 - 1],  # the wire is version 2
    "slot": [-1, 1024, 2**20, 2**63 - 1, "0", 1.0, True, None, [0]],
    "seed": [-1, 2**31, 2**63, "0", None, True, 0.5],
    "round": [-1, 2**31, "1", None, 1.5],
    "run_id": [5, None, "x" * 129, ["a"], b"bytes"],
    "key": [None, "key", np.zeros(3, np.uint32), np.zeros(2, np.int64),
            np.zeros((2, 2), np.uint32), [1, 2]],
    "actor": [None, 5, "x", {}, {"obs": 1}],
    "params": [None, 5, {}, {"params": 1}, [1]],
    "spec": [None, 5, "x", [], {}],
    "unknown_field": [1],
}


def field_cases() -> list:
    """Every `(path, value)` mutation: `("spec", name)` or `(name,)` paths."""
    return ([(("spec", k), v) for k, vs in SPEC_CASES.items() for v in vs]
            + [((k,), v) for k, vs in HEAD_CASES.items() for v in vs])


def mutate(data: dict, path: tuple, value) -> dict:
    """A copy of a decoded request with `path` set to `value` (deleted for `...`)."""
    out = dict(data)
    if len(path) == 2:
        if not isinstance(out.get(path[0]), dict):
            return out  # the spec itself was replaced: nothing inside it to set
        out[path[0]] = dict(out[path[0]])
    target = out if len(path) == 1 else out[path[0]]
    if value is ...:
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value
    return out


def pack(data) -> bytes:
    from flax import serialization

    return serialization.msgpack_serialize(data)


def unpack(body: bytes):
    from flax import serialization

    return serialization.msgpack_restore(body)


@functools.lru_cache(maxsize=8)
def valid_request(gamma: float = 0.99, slot: int = 0):
    """A small valid CartPole request (4 envs x 16 steps) as `(body, decoded dict)` (shared:
    copy before changing it, as `mutate` does)."""
    import jax

    from jaxrl_dist.backends import shard, wire
    from jaxrl_dist.config import from_dict

    cfg = from_dict({"trainer": "sync", "backend": {"name": "local", "envs_per_shard": 4},
                     "algo": {"num_steps": 16, "num_minibatches": 2, "gamma": gamma}})
    spec = shard.spec_from_config(cfg, "gymnax", False)
    prog = shard.ShardProgram(spec)
    params = prog.network.init(jax.random.key(0), np.zeros((1,) + prog.env.spec.obs_shape, np.float32))
    actor = prog.init_slot(shard.slot_init_key(0, slot))
    req = wire.ShardRequest(spec, slot, shard.shard_key(0, 1, slot), params, actor, "hostile", 0, 1)
    body = wire.encode_request(req)
    return body, unpack(body)


def nested(depth: int, leaf=1):
    """A list nested `depth` deep, as msgpack bytes (built flat: no recursion here)."""
    return b"\x91" * depth + pack(leaf)


def nested_json(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# ---------------------------------------------------------------------------
# HTTP cases: what is sent and what answers are right.
# ---------------------------------------------------------------------------

class Case(NamedTuple):
    kind: str
    body: bytes = b""
    headers: tuple = ()
    expect: frozenset = frozenset({400, 413, 422})
    method: str = "POST"
    path: str = "/v1/rollout"
    raw: Optional[Callable] = None  # sends itself on a socket; returns the status (0: dropped)


AUTH = (("authorization", f"Bearer {TOKEN}"), ("content-type", "application/msgpack"))
BUSY = 503  # with Retry-After: serve.max_concurrent reached (allowed under load)


def _deflated(data: bytes) -> bytes:
    from jaxrl_dist.backends import wire

    return wire.deflate(data)


class Generator:
    """Draws hostile `Case`s from one seeded random stream, around one valid request."""

    def __init__(self, seed: int, max_body: int, slow_share: float = 0.01):
        self.rng = random.Random(seed)
        self.max_body = max_body
        self.slow_share = slow_share
        self.valid, self.data = valid_request()
        self.cases = field_cases()
        self.gammas = [0.99]

    def draw(self) -> Case:
        r = self.rng.random()
        if r < self.slow_share:
            return self.slow()
        kinds = [(0.40, self.field), (0.05, self.ok), (0.10, self.random_bytes),
                 (0.10, self.truncated), (0.10, self.flipped), (0.05, self.nesting),
                 (0.05, self.bomb), (0.05, self.deleted), (0.10, self.http_level)]
        x = self.rng.random() * sum(w for w, _ in kinds)
        for w, make in kinds:
            x -= w
            if x <= 0:
                return make()
        return self.ok()

    def ok(self) -> Case:
        return Case("valid", self.valid, AUTH, frozenset({200}))

    def field(self) -> Case:
        path, value = self.rng.choice(self.cases)
        return Case("field:" + ".".join(path), pack(mutate(self.data, path, value)), AUTH)

    def deleted(self) -> Case:
        path, _ = self.rng.choice(self.cases)
        if path[-1] in ("env_kwargs", "num_threads", "network_options", "unknown_field"):
            path = ("spec", "gamma")  # optional fields: deleting them is no error
        return Case("missing:" + ".".join(path), pack(mutate(self.data, path, ...)), AUTH)

    def random_bytes(self) -> Case:
        size = self.rng.choice([0, 1, 7, 100, 4096, 100_000])
        return Case("random_bytes", self.rng.randbytes(size), AUTH)

    def truncated(self) -> Case:
        return Case("truncated", self.valid[:self.rng.randrange(len(self.valid))], AUTH)

    def flipped(self) -> Case:
        """Bit flips in the params' bytes (the tail): a request that may still be valid."""
        body = bytearray(self.valid)
        for _ in range(self.rng.randint(1, 8)):
            i = self.rng.randrange(len(body) // 2, len(body))
            body[i] ^= 1 << self.rng.randrange(8)
        return Case("flipped", bytes(body), AUTH, frozenset({200, 400, 422}))

    def nesting(self) -> Case:
        depth = self.rng.choice([100, 1000, 10_000, 100_000])
        which = self.rng.random()
        if which < 0.4:
            return Case("nesting:body", nested(depth), AUTH)
        if which < 0.7:
            return Case("nesting:spec", pack(mutate(self.data, ("spec", "env_kwargs"), nested_json(depth))), AUTH)
        inner = b"\x81" + pack("params") + nested(min(depth, 100_000))
        return Case("nesting:params", inner, AUTH)

    def bomb(self) -> Case:
        size = self.rng.choice([self.max_body + 1, 8 * self.max_body, 64 * self.max_body])
        return Case("deflate_bomb", _deflated(b"\0" * size), AUTH + (("content-encoding", "deflate"),),
                    frozenset({413}))

    def http_level(self) -> Case:
        r = self.rng.randrange(7)
        if r == 0:
            return Case("no_token", self.valid, (), frozenset({401}))
        if r == 1:
            return Case("wrong_token", self.valid, (("authorization", "Bearer " + "x" * 64),), frozenset({401}))
        if r == 2:
            return Case("method", b"", AUTH, frozenset({405}), method=self.rng.choice(["GET", "PUT", "DELETE"]))
        if r == 3:
            return Case("path", b"", AUTH, frozenset({404}), path="/" + self.rng.choice(["x", "..", "v1/rollout/"]))
        if r == 4:
            return Case("encoding", b"x", AUTH + (("content-encoding", "br"),), frozenset({400}))
        if r == 5:
            return Case("bad_deflate", self.rng.randbytes(64), AUTH + (("content-encoding", "deflate"),))
        return Case("oversize", b"\0" * (self.max_body + 1), AUTH, frozenset({413}))

    def slow(self) -> Case:
        r = self.rng.randrange(4)
        if r == 0:
            return Case("claims_more", raw=lambda url: claims_more(url), expect=frozenset({408}))
        if r == 1:
            return Case("trickled_headers", raw=lambda url: trickled_headers(url), expect=frozenset({408}))
        if r == 2:
            return Case("huge_claim", raw=lambda url: huge_claim(url), expect=frozenset({413}))
        return Case("garbage_line", raw=lambda url: garbage_line(url, self.rng.randbytes(200)),
                    expect=frozenset({400}))


# ---------------------------------------------------------------------------
# Raw-socket clients: slow, lying and broken senders.
# ---------------------------------------------------------------------------

def _addr(url: str) -> tuple:
    host, port = url.split("//", 1)[1].split(":")
    return host, int(port)


def _status(sock: socket.socket, timeout: float) -> int:
    """The status of the answer on `sock` (0 when it closes with none)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    parts = data.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def _head(length: int) -> bytes:
    return (f"POST /v1/rollout HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n"
            f"content-type: application/msgpack\r\ncontent-length: {length}\r\n\r\n").encode()


def claims_more(url: str, timeout: float = 30.0) -> int:
    """A Content-Length of 1000 with 10 bytes sent: answered 408 once the body times out."""
    with socket.create_connection(_addr(url)) as sock:
        sock.sendall(_head(1000) + b"\x00" * 10)
        return _status(sock, timeout)


def trickled_headers(url: str, timeout: float = 30.0) -> int:
    """Half a request line and a header, then silence: answered 408 and closed."""
    with socket.create_connection(_addr(url)) as sock:
        sock.sendall(b"POST /v1/rollout HTTP/1.1\r\nhost: x\r\n")
        return _status(sock, timeout)


def idle(url: str, timeout: float = 30.0) -> int:
    """A connection that sends nothing: the server's answer (0: it closed the connection
    without one), or -1 when it still held the connection after `timeout` seconds."""
    with socket.create_connection(_addr(url)) as sock:
        sock.settimeout(timeout)
        try:
            sock.recv(1, socket.MSG_PEEK)  # returns once the server answers or closes
        except TimeoutError:
            return -1
        except OSError:  # reset: closed
            return 0
        return _status(sock, timeout)


def huge_claim(url: str, timeout: float = 30.0) -> int:
    with socket.create_connection(_addr(url)) as sock:
        sock.sendall(_head(2**31) + b"\x00" * 100)
        return _status(sock, timeout)


def garbage_line(url: str, junk: bytes, timeout: float = 30.0) -> int:
    with socket.create_connection(_addr(url)) as sock:
        sock.sendall(junk.replace(b"\r", b"").replace(b"\n", b"") + b"\r\n\r\n")
        return _status(sock, timeout)


# ---------------------------------------------------------------------------
# Running cases against a server, and its memory.
# ---------------------------------------------------------------------------

def send(url: str, case: Case, timeout: float = 60.0) -> tuple:
    """`(status, retry_after)`; status 0 is a dropped connection (no answer)."""
    if case.raw is not None:
        return case.raw(url), None
    host, port = _addr(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(case.method, case.path, body=case.body or None, headers=dict(case.headers))
        resp = conn.getresponse()
        resp.read()
        return resp.status, resp.getheader("retry-after")
    except (OSError, http.client.HTTPException):
        return 0, None
    finally:
        conn.close()


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` and its children (the rollout worker), in MB."""
    total, seen, todo = 0.0, set(), [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


class RssSampler:
    """Samples `rss_mb(pid)` every `every` seconds in a thread: `.samples` `(t, MB)`."""

    def __init__(self, pid: int, every: float = 0.25):
        self.pid, self.every, self.samples = pid, every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        t0 = time.time()
        while not self._stop.is_set():
            self.samples.append((round(time.time() - t0, 2), round(rss_mb(self.pid), 1)))
            self._stop.wait(self.every)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(mb for _, mb in self.samples)


class Tally(NamedTuple):
    requests: int
    by_status: dict
    dropped: int
    unexpected: list  # (kind, status) not in the case's expected set
    server_errors: int  # 5xx other than 503 busy with Retry-After
    busy: int


def run_cases(url: str, cases: list, threads: int = 6) -> Tally:
    """Send `cases` from `threads` concurrent clients and tally the answers."""
    with ThreadPoolExecutor(threads) as pool:
        answers = list(pool.map(lambda c: send(url, c), cases))
    by_status, unexpected, dropped, errors, busy = {}, [], 0, 0, 0
    for case, (status, retry_after) in zip(cases, answers):
        by_status[status] = by_status.get(status, 0) + 1
        if status == 0:
            dropped += 1
        elif status == BUSY and retry_after:
            busy += 1
            continue
        elif status >= 500:
            errors += 1
        if status not in case.expect:
            unexpected.append((case.kind, status))
    return Tally(len(cases), by_status, dropped, unexpected, errors, busy)


def health(url: str) -> dict:
    host, port = _addr(url)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def wait_worker(url: str, timeout: float = 120.0) -> dict:
    """Health once the rollout process is up (it starts in the background)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = health(url)
        if found["worker"]["state"] == "up":
            return found
        time.sleep(0.2)
    raise TimeoutError(f"{url}: the rollout worker did not come up in {timeout:.0f} s")


def install_abort_suite(where: Path) -> Path:
    """A test-only env suite, registered as a distribution's `jaxrl_dist.env_suites` entry
    point under `where` (put it on PYTHONPATH): `Abort-v0`, whose maker calls os.abort(),
    and `Hang-v0`, whose maker never returns."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "crashy_suite.py").write_text(textwrap.dedent(f'''
        import os
        import time

        class CrashySuite:
            hint = "test only"

            @staticmethod
            def installed():
                return True

            @staticmethod
            def has(env_id):
                return env_id in ("{ABORT_ENV}", "{HANG_ENV}")

            @staticmethod
            def make(env_id, num_envs, seed=0, num_threads=0, kwargs=None):
                if env_id == "{HANG_ENV}":
                    while True:
                        time.sleep(1)
                os.abort()  # a native crash, as an env's C++ would
        '''))
    info = where / "crashy_suite-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: crashy-suite\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[jaxrl_dist.env_suites]\ncrashy = crashy_suite:CrashySuite\n")
    return where


def server_overrides(max_body_mb: float = 1.0) -> list:
    return [f"serve.max_body_mb={max_body_mb}", f"serve.allowed_envs=[{ENV_ID},{ABORT_ENV}]",
            "serve.body_timeout_s=1", "serve.header_timeout_s=1", "serve.max_concurrent=6",
            "serve.max_programs=2", "serve.max_pools=2", "serve.max_rollout_mb=1"]


def start_server(site: Path, *extra: str):
    from jaxrl_dist.serve.local import LocalServer

    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return LocalServer(*server_overrides(), *extra, token=TOKEN, env={"PYTHONPATH": path}, timeout=120)


def main() -> None:
    import argparse
    import tempfile

    from jaxrl_dist.platform import use_unrolled_threefry

    parser = argparse.ArgumentParser(description="hostile requests against a loopback jaxrl-dist serve")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=6)
    opts = parser.parse_args()
    use_unrolled_threefry()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(install_abort_suite(Path(tmp)))
        sampler = RssSampler(server.proc.pid)
        try:
            wait_worker(server.url)
            gen = Generator(opts.seed, 2**20)
            t0 = time.time()
            tally = run_cases(server.url, [gen.draw() for _ in range(opts.requests)], opts.threads)
            seconds = time.time() - t0
            alive = server.healthy()
        finally:
            peak = sampler.stop()
            server.stop()
    print(json.dumps({**tally._asdict(), "unexpected": tally.unexpected[:20], "seconds": round(seconds, 1),
                      "server_alive": alive, "peak_rss_mb": peak,
                      "rss_start_mb": sampler.samples[0][1], "rss_end_mb": sampler.samples[-1][1]}))


if __name__ == "__main__":
    main()

"""The serverless actor function: an ASGI app that runs one shard per request.

Routes: `GET /healthz` and `POST /v1/rollout`. Bodies are msgpack
(`jaxrl_dist.backends.wire`), optionally raw-deflated (`Content-Encoding: deflate`);
nothing is ever unpickled. Every field of a request is checked against the
schema (type, range, size; names registered here) before an env or a program
is built. Bad requests get a one-line JSON `{"error": ...}` naming the field
and the instance keeps serving:

- 401: no bearer token, or the wrong one;
- 413: a body over `serve.max_body_mb` (sent, or once inflated);
- 400: a body that is not a wire document (bad deflate, not msgpack, wrong version), or
  `Authorization` or `Content-Encoding` sent more than once;
- 408: headers or body not received within `serve.header_timeout_s` / `serve.body_timeout_s`
  (the connection is closed);
- 422: a document with a bad field, a wrong shape or dtype, an env id outside
  `serve.allowed_envs`, or an env kwarg outside `serve.allowed_env_kwargs`;
- 503 with `Retry-After`: `serve.max_concurrent` requests already running or
  queued, or the rollout process died (a native crash in an env) or hung past
  `serve.rollout_timeout_s`; it is restarted and `/healthz` counts the restarts;
- 500: a bug, in one line (and logged).

Envs are built and shards run in a separate process (`RolloutWorker`), which
keeps its compiled programs across requests (at most `serve.max_programs`
specs and `serve.max_pools` envpool slot pools, least recently used out), so a
warm instance does not recompile. Each response reports the instance's own
billed duration, from the request's arrival to its response, rounded up to
the millisecond. One shard runs at a time (a function instance's
concurrency is 1); health checks answer meanwhile.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from jaxrl_dist.config import ServeConfig
from jaxrl_dist.serve_protocol import HEAD, REPLY, json_bytes, one_line
from jaxrl_dist.platform import unrolled_threefry, use_unrolled_threefry

TOKEN_ENV = "JAXRL_DIST_TOKEN"
MSGPACK = b"application/msgpack"


RETRY_AFTER_S = 2  # what a 503 asks a client to wait: a restarting worker is back in seconds


class HttpError(Exception):
    def __init__(self, status: int, message: str, headers: Optional[list] = None):
        super().__init__(message)
        self.status = status
        self.headers = headers or []


def _retry_later(message: str) -> HttpError:
    return HttpError(503, message, [(b"retry-after", str(RETRY_AFTER_S).encode())])


class WorkerDied(Exception):
    """The rollout process died or hung; it has been (or will be) started again."""


class RolloutWorker:
    """The process that decodes, checks and runs shards (a fresh interpreter, so it
    shares nothing with the server but a pipe of bytes). A native crash in an env (an abort, a
    segfault) kills it, not the server: the request that was running is answered 503
    and the next one starts a fresh process. It keeps its compiled programs between
    requests, so a warm instance stays warm."""

    START_TIMEOUT_S = 300.0

    def __init__(self, setup: dict):
        self.setup = json.dumps(setup).encode()
        self.proc = self.conn = None
        self.restarts, self.last_exit, self.stats = 0, None, {}
        self._lock = threading.Lock()  # held while a process starts
        self._reap_lock = threading.Lock()
        self._closed = False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def state(self) -> dict:
        alive = self.alive()
        return {"pid": self.proc.pid if alive else None, "state": "up" if alive else "down",
                "restarts": self.restarts, "last_exit": self.last_exit}

    def ensure(self) -> None:
        """Start the process if none is running (a died one counts as a restart)."""
        with self._lock:
            if self.alive():
                return
            if self._closed:
                raise WorkerDied("the server is stopping")
            if self.proc is not None:
                self._reap()
                self.restarts += 1
            self.proc, self.conn = _spawn_worker()
            if self._closed:  # close() ran while it started, and found no process to stop
                self.kill()
                raise WorkerDied("the server is stopping")
            self._wait_ready()

    def _wait_ready(self) -> None:
        """Send the setup, then wait for the process to say it is ready."""
        try:
            self.conn.send_bytes(self.setup)
            if self.conn.poll(self.START_TIMEOUT_S) and self.conn.recv_bytes() == b"ready":
                return
        except (EOFError, OSError):  # it died while starting, or close() stopped it
            raise WorkerDied(f"the rollout process exited while starting ({_exit_text(self._reap())})") from None
        self.kill()
        raise WorkerDied(f"the rollout process did not start in {self.START_TIMEOUT_S:.0f} s")

    def call(self, message: bytes, timeout: float) -> tuple:
        """`(status, payload)` for one request; `WorkerDied` if the process died or hung."""
        self.ensure()
        try:
            self.conn.send_bytes(message)
            if not self.conn.poll(timeout):
                self.kill()
                raise WorkerDied(f"the rollout took over serve.rollout_timeout_s={timeout:g} s; "
                                 "the process was restarted")
            reply = self.conn.recv_bytes()
        except (EOFError, OSError):
            code = self._reap()
            raise WorkerDied(f"the rollout process died ({_exit_text(code)}); it restarts") from None
        status, size = REPLY.unpack_from(reply)
        self.stats = json.loads(reply[REPLY.size:REPLY.size + size])
        return status, reply[REPLY.size + size:]

    def _reap(self):
        import subprocess

        with self._reap_lock:  # close() may reap from the server's thread as this one does
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # its pipe closed, yet it lives on
                self.proc.kill()
                self.proc.wait()
            self.last_exit = self.proc.returncode
            self.conn.close()
        return self.last_exit

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        if self.proc is not None:
            self._reap()

    def close(self) -> None:
        """Stop the process for good: the server is stopping, and no new one starts."""
        self._closed = True
        self.kill()


# the rollout process's program: the server's sys.path first (as multiprocessing's spawn
# does), then the worker loop on the inherited end of the pipe
_WORKER_CODE = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
                "from jaxrl_dist.serve_worker import worker_entry; worker_entry(int(sys.argv[2]))")


def _spawn_worker() -> tuple:
    """A started rollout process and the server's end of its pipe (the process reads its
    setup from the pipe first).

    It runs in a process group of its own: Ctrl-C in a terminal signals the foreground
    group, and the server stops its worker itself, so the worker never sees the signal,
    not even while it imports (no KeyboardInterrupt traceback from it)."""
    import subprocess
    from multiprocessing import Pipe

    conn, child = Pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-c", _WORKER_CODE, json.dumps(sys.path), str(child.fileno())],
                                stdin=subprocess.DEVNULL, pass_fds=(child.fileno(),), process_group=0)
    finally:
        child.close()
    return proc, conn


def _exit_text(code) -> str:
    import signal

    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class ServeApp:
    """ASGI 3 app; `token=None` or `""` turns authentication off."""

    def __init__(self, cfg: ServeConfig = ServeConfig(), token: Optional[str] = None):
        self.cfg = cfg
        self.token = token or None
        self.max_bytes = int(cfg.max_body_mb * 2**20)
        self.worker = RolloutWorker({
            "name": f"serve:{os.uname().nodename}:{os.getpid()}", "max_bytes": self.max_bytes,
            "allowed_envs": list(cfg.allowed_envs), "allowed_env_kwargs": cfg.allowed_env_kwargs,
            "max_slot": cfg.max_slot, "max_programs": cfg.max_programs, "max_pools": cfg.max_pools,
            "max_envs": cfg.max_envs, "max_rollout_mb": cfg.max_rollout_mb,
            "unrolled_threefry": unrolled_threefry()})
        # one thread talks to the one worker process: a function instance runs one shard at a time
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard")
        self.served, self.admitted = 0, 0
        self.counts = {"busy": 0, "body_timeouts": 0, "worker_failures": 0, "errors": 0}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return
        try:
            status, body, headers = await self._route(scope, receive)
        except HttpError as err:
            status, body, headers = err.status, json_bytes({"error": str(err)}), err.headers
        except Exception as err:  # a bug must not take the instance down, nor drop the connection
            self.counts["errors"] += 1
            _log(f"internal error on {scope.get('path')}: {one_line(err)}")
            status, body, headers = 500, json_bytes({"error": f"internal error: {one_line(err)}"}), []
        ctype = MSGPACK if status == 200 and scope["path"] == "/v1/rollout" else b"application/json"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype),
                                (b"content-length", str(len(body)).encode())] + headers})
        await send({"type": "http.response.body", "body": body})

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._pool.submit(self.worker.ensure)  # warm up in the background
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def close(self) -> None:
        """Stop the rollout process; requests still queued for it are dropped."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.worker.close()

    def health(self) -> dict:
        stats = self.worker.stats
        return {"status": "ok", "served": self.served, "compiled": stats.get("compiled", 0),
                "programs": stats.get("programs", 0), "pools": stats.get("pools", 0),
                "evicted_programs": stats.get("evicted_programs", 0),
                "evicted_pools": stats.get("evicted_pools", 0), "admitted": self.admitted,
                "worker": self.worker.state(), **self.counts}

    async def _route(self, scope, receive):
        path, method = scope["path"], scope["method"]
        if path == "/healthz":
            if method != "GET":
                raise HttpError(405, f"method {method} not allowed on /healthz")
            return 200, json_bytes(self.health()), []
        if path != "/v1/rollout":
            raise HttpError(404, f"no route {path[:200]}")
        if method != "POST":
            raise HttpError(405, f"method {method} not allowed on /v1/rollout")
        received = time.time()
        headers = _request_headers(scope)
        self._authorize(headers.get(b"authorization", b""))
        encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
        if encoding not in ("identity", "deflate"):
            raise HttpError(400, f"content-encoding: {encoding[:64]!r} is not identity or deflate")
        body = await self._read_body(headers, receive)
        compress = b"deflate" in headers.get(b"accept-encoding", b"")
        status, reply = await self._run(body, encoding == "deflate", compress, received)
        if status != 200:
            self.counts["errors"] += status >= 500  # the worker logged its traceback
            raise HttpError(status, json.loads(reply)["error"])
        self.served += 1
        return 200, reply, [(b"content-encoding", b"deflate")] if compress else []

    async def _run(self, body: bytes, compressed: bool, compress: bool, received: float) -> tuple:
        """The request in the worker process, if there is room in its queue."""
        if self.admitted >= self.cfg.max_concurrent:
            self.counts["busy"] += 1
            raise _retry_later(f"busy: {self.admitted} requests running or queued "
                               f"(serve.max_concurrent={self.cfg.max_concurrent})")
        message = HEAD.pack(int(compressed) | 2 * int(compress), received) + body
        self.admitted += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, self.worker.call, message,
                                              self.cfg.rollout_timeout_s)
        except WorkerDied as err:
            self.counts["worker_failures"] += 1
            _log(f"rollout worker: {err}")
            self._pool.submit(self.worker.ensure)  # the next request finds it up again
            raise _retry_later(f"worker: {err}") from None
        finally:
            self.admitted -= 1

    def _authorize(self, header: bytes) -> None:
        if self.token is None:
            return
        scheme, _, given = header.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise HttpError(401, "authorization: a bearer token is required")
        if not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise HttpError(401, "authorization: wrong token")

    async def _read_body(self, headers: dict, receive) -> bytes:
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                raise HttpError(400, "content-length: not an integer") from None
            if size > self.max_bytes:
                raise HttpError(413, f"body: {size} bytes is over serve.max_body_mb={self.cfg.max_body_mb}")
        chunks, total = [], 0
        deadline = time.monotonic() + self.cfg.body_timeout_s
        while True:
            message = await self._receive_by(receive, deadline)
            if message["type"] == "http.disconnect":
                raise HttpError(400, "body: the client disconnected")
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                raise HttpError(413, f"body: over serve.max_body_mb={self.cfg.max_body_mb}")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _receive_by(self, receive, deadline: float) -> dict:
        """The next body message, or 408 (and the connection closed) past `deadline`: a
        client that claims more than it sends, or sends it too slowly, holds nothing for long."""
        try:
            return await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            self.counts["body_timeouts"] += 1
            raise HttpError(408, f"body: not received within serve.body_timeout_s="
                                 f"{self.cfg.body_timeout_s:g} s", [(b"connection", b"close")]) from None


# the headers whose one value decides who is asking and how the body is read: a second
# copy is refused, rather than letting one of them silently win
_SINGLEHEADERS = (b"authorization", b"content-encoding")


def _request_headers(scope) -> dict:
    """Lower-cased header name -> value; 400 naming a header of `_SINGLEHEADERS` sent twice."""
    headers = {}
    for name, value in scope["headers"]:
        name = name.lower()
        if name in headers and name in _SINGLEHEADERS:
            raise HttpError(400, f"{name.decode('latin-1')}: sent more than once; send one")
        headers[name] = value
    return headers


def _log(line: str) -> None:
    print(f"jaxrl-dist serve: {line}", file=sys.stderr, flush=True)


def resolve_token(token: Optional[str]) -> Optional[str]:
    """`serve.token`, else `$JAXRL_DIST_TOKEN`; `""` means no authentication."""
    return os.environ.get(TOKEN_ENV) if token is None else token


def create_app(cfg: ServeConfig = ServeConfig(), token: Optional[str] = None) -> ServeApp:
    return ServeApp(cfg, resolve_token(token if token is not None else cfg.token))


def config_from_env(cfg: ServeConfig = ServeConfig()) -> ServeConfig:
    """`cfg` with what the container's environment sets: `JAXRL_DIST_ALLOWED_ENVS`
    (comma-separated ids) and `JAXRL_DIST_MAX_BODY_MB`."""
    import dataclasses

    allowed = os.environ.get("JAXRL_DIST_ALLOWED_ENVS")
    if allowed:
        cfg = dataclasses.replace(cfg, allowed_envs=tuple(a.strip() for a in allowed.split(",") if a.strip()))
    limit = os.environ.get("JAXRL_DIST_MAX_BODY_MB")
    if limit:
        try:
            cfg = dataclasses.replace(cfg, max_body_mb=float(limit))
        except ValueError:
            raise ValueError(f"JAXRL_DIST_MAX_BODY_MB: expected a number, got {limit!r}") from None
    return cfg


def app_from_env() -> ServeApp:
    """The app configured from the environment alone, for containers and AWS Lambda
    (`JAXRL_DIST_TOKEN` too). As an entry point it opts in to the unrolled CPU threefry."""
    use_unrolled_threefry()
    return create_app(config_from_env())


EXIT_INTERRUPTED = 130  # the shell's code for a program stopped by Ctrl-C, as `train` uses
READY_PREFIX = "serving on "  # the line `serve` prints once it accepts connections


def serve(cfg: ServeConfig) -> None:
    """Run the app under uvicorn on `cfg.host`, port `$PORT` if set else `cfg.port`.

    Prints `serving on URL (...)` once it accepts connections, and `stopped (SIGNAL)` once
    SIGINT or SIGTERM has stopped it and its worker; after Ctrl-C it exits with 130."""
    import signal

    import uvicorn

    port = int(os.environ.get("PORT") or cfg.port)
    app = create_app(cfg)
    if app.token is None:
        print("warning: serving without authentication (serve.token is empty)", flush=True)
    config = uvicorn.Config(app, host=cfg.host, port=port, log_level="warning", lifespan="on",
                            http=header_timeout_protocol(cfg.header_timeout_s), timeout_keep_alive=5,
                            h11_max_incomplete_event_size=16 * 1024)
    server = _ready_server_class()(config, _ready_text(cfg, app))
    with _StopSignal(server) as stop:
        try:
            server.run()
        finally:
            app.close()  # a forced stop (a second Ctrl-C) skips the app's own shutdown
    print(f"stopped ({signal.Signals(stop.signal).name})" if stop.signal else "stopped", flush=True)
    if stop.signal == signal.SIGINT:
        raise SystemExit(EXIT_INTERRUPTED)


def _ready_text(cfg: ServeConfig, app: ServeApp) -> str:
    """What follows the URL in the ready line: the env ids served and the authentication."""
    envs = list(cfg.allowed_envs)
    shown = ", ".join(envs[:3]) + (f" +{len(envs) - 3} more" if len(envs) > 3 else "")
    return f"envs: {shown or 'none'}; auth: {'bearer token' if app.token else 'none'}"


class _StopSignal:
    """The signal that stopped a uvicorn server, noted while in a `with` block. uvicorn
    handles SIGINT and SIGTERM itself (a graceful shutdown, in which the app stops its
    worker) and, once stopped, raises the signal again to the handlers it found: these
    note it, in place of Python's KeyboardInterrupt traceback or a death by SIGTERM.
    One that arrives before uvicorn's own handlers are in place stops the server too."""

    def __init__(self, server):
        self.server, self.signal, self._previous = server, None, {}

    def _note(self, signum: int, frame) -> None:
        self.signal = self.signal or signum
        self.server.should_exit = True

    def __enter__(self) -> "_StopSignal":
        import signal

        self._previous = {sig: signal.signal(sig, self._note) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _ready_server_class():
    """uvicorn's `Server`, printing one line with its URL once it accepts connections
    (after the app's startup and the socket's bind)."""
    import uvicorn

    class ReadyServer(uvicorn.Server):
        def __init__(self, config, detail: str):
            super().__init__(config)
            self.detail = detail

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
                print(f"{READY_PREFIX}{url} ({self.detail})", flush=True)

    return ReadyServer


_TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


def _close_late(proto, timeout_s: float) -> None:
    """Close `proto`'s connection whose request headers are late (408 if it began one)."""
    if proto.cycle is not None and not proto.cycle.response_complete:
        return  # headers are in; the app's body timeout takes over
    if not proto.transport.is_closing():
        if proto._started:  # a request begun and never finished is told why
            why = f"headers: not received within serve.header_timeout_s={timeout_s:g} s"
            body = json_bytes({"error": why})
            proto.transport.write(_TIMEOUT_408 % (len(body), body))
        proto.transport.close()


def header_timeout_protocol(timeout_s: float):
    """uvicorn's h11 protocol, closing a connection whose request headers are not all in
    within `timeout_s` of it opening or of its last response (uvicorn's own keep-alive
    timer stops at the first byte, so a client trickling headers would hold it forever)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutH11(H11Protocol):
        _header_timer = None

        def _arm(self) -> None:
            self._disarm()
            self._started = False  # no byte of the next request yet: an idle keep-alive
            self._header_timer = self.loop.call_later(timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            _close_late(self, timeout_s)

        def data_received(self, data: bytes) -> None:
            self._started = True
            super().data_received(data)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutH11


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalServer:
    """`jaxrl-dist serve` in a subprocess on a loopback port, for tests, benchmarks
    and experiments on one machine; `stop()` kills it."""

    def __init__(self, *overrides: str, token: Optional[str] = None, port: int = 0,
                 env: Optional[dict] = None, timeout: float = 60.0):
        """Returns once it prints its ready line; what it printed up to there is in
        `startup_output` (the rest is on `proc.stdout`, stderr merged in)."""
        import subprocess
        import sys
        from pathlib import Path

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready_line, self.startup_output = None, ""
        script = Path(sys.executable).with_name("jaxrl-dist")
        cmd = [str(script)] if script.exists() else [sys.executable, "-m", "jaxrl_dist.cli"]
        cmd += ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--token", token] if token is not None else []
        self.proc = subprocess.Popen(cmd + list(overrides), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=dict(os.environ, **(env or {})))
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        """Until the server prints its ready line (`self.ready_line`); it then accepts
        connections. Read from the pipe's descriptor, a line at a time as it comes."""
        import selectors

        deadline, out = time.time() + timeout, b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while sel.select(max(0.0, deadline - time.time())):
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                out += chunk
                self.startup_output = out.decode(errors="replace")
                if not chunk:
                    raise RuntimeError(f"serve exited ({self.proc.wait()}): {self.startup_output[-2000:]}")
                ready = [line for line in self.startup_output.splitlines(keepends=True)
                         if line.startswith(READY_PREFIX) and line.endswith("\n")]
                if ready:
                    self.ready_line = ready[0].strip()
                    return
        self.stop()
        raise TimeoutError(f"serve on {self.url} did not say it was ready in {timeout:.0f} s: "
                           f"{self.startup_output[-2000:]}")

    def healthy(self, timeout: float = 5.0) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=timeout) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()

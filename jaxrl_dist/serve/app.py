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

Envs are built and shards run in a separate process (`supervisor.RolloutWorker`), which
keeps its compiled programs across requests (at most `serve.max_programs`
specs and `serve.max_pools` envpool slot pools, least recently used out), so a
warm instance does not recompile. Each response reports the instance's own
billed duration, from the request's arrival to its response, rounded up to
the millisecond. One shard runs at a time (a function instance's
concurrency is 1); health checks answer meanwhile.

`serve(cfg)` runs the app under uvicorn (`serve.protocol`: the header timeout, the ready
line, the stopping signal); `app_from_env()` builds it from the environment alone, for
containers and AWS Lambda.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from jaxrl_dist.config import ServeConfig
from jaxrl_dist.platform import unrolled_threefry, use_unrolled_threefry
from jaxrl_dist.serve.pipe import HEAD, json_bytes, one_line
from jaxrl_dist.serve.protocol import StopSignal, header_timeout_protocol, ready_server_class
from jaxrl_dist.serve.supervisor import RolloutWorker, WorkerDied

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
    server = ready_server_class()(config, _ready_text(cfg, app))
    with StopSignal(server) as stop:
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



"""The serverless actor function: an ASGI app that runs one shard per request.

Routes: `GET /healthz` and `POST /v1/rollout`. Bodies are msgpack
(`jaxrl_dist.backends.wire`), optionally raw-deflated (`Content-Encoding: deflate`);
nothing is ever unpickled. Bad requests get a JSON `{"error": ...}` naming
the field and the instance keeps serving:

- 401: no bearer token, or the wrong one;
- 413: a body over `serve.max_body_mb` (sent, or once inflated);
- 400: a body that is not a wire document (bad deflate, not msgpack, wrong version);
- 422: a document with a bad field, a wrong shape or dtype, or an env id
  outside `serve.allowed_envs`.

Compiled rollouts are cached per spec and shapes (`shard.ShardWorker`), so a
warm instance does not recompile. Each response reports the instance's own
billed duration, from the request's arrival to its response, rounded up to
the millisecond. One shard runs at a time (a function instance's
concurrency is 1); health checks answer meanwhile.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from jaxrl_dist.config import ServeConfig
from jaxrl_dist.platform import use_unrolled_threefry

TOKEN_ENV = "JAXRL_DIST_TOKEN"
MSGPACK = b"application/msgpack"


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _billed(received: float, finished: float) -> float:
    return math.ceil((finished - received) * 1000.0) / 1000.0


class ServeApp:
    """ASGI 3 app; `token=None` or `""` turns authentication off."""

    def __init__(self, cfg: ServeConfig = ServeConfig(), token: Optional[str] = None):
        from jaxrl_dist.backends.shard import ShardWorker

        self.cfg = cfg
        self.token = token or None
        self.max_bytes = int(cfg.max_body_mb * 2**20)
        self.allowed = frozenset(cfg.allowed_envs)
        self.worker = ShardWorker(f"serve:{os.uname().nodename}:{os.getpid()}")
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard")
        self.served = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if scope["type"] != "http":
            return
        try:
            status, body, headers = await self._route(scope, receive)
        except HttpError as err:
            status, body, headers = err.status, _json({"error": str(err)}), []
        except Exception as err:  # a bug must not take the instance down
            status, body, headers = 500, _json({"error": f"internal error: {type(err).__name__}: {err}"}), []
        ctype = MSGPACK if status == 200 and scope["path"] == "/v1/rollout" else b"application/json"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype),
                                (b"content-length", str(len(body)).encode())] + headers})
        await send({"type": "http.response.body", "body": body})

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self._pool.shutdown(wait=False)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, scope, receive):
        path, method = scope["path"], scope["method"]
        if path == "/healthz":
            if method != "GET":
                raise HttpError(405, f"method {method} not allowed on /healthz")
            return 200, _json({"status": "ok", "served": self.served,
                               "compiled": self.worker.compiled()}), []
        if path != "/v1/rollout":
            raise HttpError(404, f"no route {path}")
        if method != "POST":
            raise HttpError(405, f"method {method} not allowed on /v1/rollout")
        received = time.time()
        headers = {k.lower(): v for k, v in scope["headers"]}
        self._authorize(headers.get(b"authorization", b""))
        encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").strip().lower()
        if encoding not in ("identity", "deflate"):
            raise HttpError(400, f"content-encoding: {encoding!r} is not identity or deflate")
        body = await self._read_body(headers, receive)
        compress = b"deflate" in headers.get(b"accept-encoding", b"")
        loop = asyncio.get_running_loop()
        reply = await loop.run_in_executor(self._pool, self._rollout, body, encoding == "deflate",
                                           compress, received)
        self.served += 1
        return 200, reply, [(b"content-encoding", b"deflate")] if compress else []

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
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HttpError(400, "body: the client disconnected")
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                raise HttpError(413, f"body: over serve.max_body_mb={self.cfg.max_body_mb}")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    def _rollout(self, body: bytes, compressed: bool, compress: bool, received: float) -> bytes:
        """Decode, check, run and encode one shard (in the worker thread)."""
        from jaxrl_dist.backends import wire
        from jaxrl_dist.envs import EnvMakeError
        from jaxrl_dist.backends.shard import ShardError, Timings

        try:
            spec, data = wire.decode_request_head(body, compressed, self.max_bytes)
            if spec.env_id not in self.allowed:
                raise ShardError(f"spec.env_id: {spec.env_id!r} is not in serve.allowed_envs")
            req = wire.decode_request_for(self.worker, spec, data)
        except wire.BodyTooLarge as err:
            raise HttpError(413, str(err)) from err
        except wire.MalformedBody as err:
            raise HttpError(400, str(err)) from err
        except (ShardError, EnvMakeError) as err:
            raise HttpError(422, " ".join(str(err).split())) from err
        out, t, reset = self.worker.run(spec, req.params, req.actor, req.key, req.slot,
                                        req.run_id, req.seed, received)
        finished = time.time()
        timings = Timings(t.received, t.started, finished, _billed(t.received, finished))
        return wire.encode_response(req.slot, out, timings, reset, self.worker.name, compress)


def _json(data: dict) -> bytes:
    return json.dumps(data).encode()


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


def serve(cfg: ServeConfig) -> None:
    """Run the app under uvicorn on `cfg.host`, port `$PORT` if set else `cfg.port`."""
    import uvicorn

    port = int(os.environ.get("PORT") or cfg.port)
    app = create_app(cfg)
    if app.token is None:
        print("warning: serving without authentication (serve.token is empty)", flush=True)
    uvicorn.run(app, host=cfg.host, port=port, log_level="warning", lifespan="on")


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
        import subprocess
        import sys
        from pathlib import Path

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        script = Path(sys.executable).with_name("jaxrl-dist")
        cmd = [str(script)] if script.exists() else [sys.executable, "-m", "jaxrl_dist.cli"]
        cmd += ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--token", token] if token is not None else []
        self.proc = subprocess.Popen(cmd + list(overrides), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=dict(os.environ, **(env or {})))
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {self.proc.stdout.read().decode()[-2000:]}")
            if self.healthy(1.0):
                return
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"serve on {self.url} did not answer /healthz in {timeout:.0f} s")

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

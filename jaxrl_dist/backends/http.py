"""HTTP backend: shards posted concurrently to serverless actor functions.

Each round's requests go out at once from an `httpx.AsyncClient` on a
private event loop. Slot `s` goes first to endpoint `s % len(urls)` (so an
envpool slot keeps landing on the instance that holds its envs); a shard that
fails or passes `backend.shard_timeout` is retried with the same keys on the
next endpoint under the backends' retry policy (`retry.py`: up to
`backend.max_retries` times, after a backoff, or the wait a 429/503 answer's
`Retry-After` asks for). With every try spent the round raises `BackendError`.
Bodies are msgpack, raw-deflated with `backend.compression=deflate`; the
params are packed once per round. Each try names its shard and try number in
`X-Shard` (`run_id/round/slot`) and `X-Attempt` (0 for the first), so a proxy
or a function's logs can tell a retry from a new shard.

The async trainer's actors post one shard each (`run_shard`, no round around
it) with the newest published params; the params are packed (and deflated)
once per params object, not once per chunk, since every actor posts the same
version until the learner publishes the next.
"""
from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from jaxrl_dist.backends import (BackendError, Capabilities, RoundStats, Job, RoundResult, ShardInfo, bucket,
                                 stack_outputs)
from jaxrl_dist.backends import wire
from jaxrl_dist.config import ConfigError, needs
from jaxrl_dist.backends.retry import Failure, GaveUp, RetryPolicy, retry_after_s

TOKEN_ENV = "JAXRL_DIST_TOKEN"
FINAL_CODES = (400, 401, 413, 422)  # the request itself is wrong: another try cannot help
TOKEN_HINT = f"the instances' token goes in ${TOKEN_ENV} or backend.token_file"


def bearer_token(cfg) -> Optional[str]:
    """`backend.token`, else the contents of `backend.token_file`, else $JAXRL_DIST_TOKEN."""
    if cfg.token is not None:
        return cfg.token
    if cfg.token_file:
        return read_token_file(cfg.token_file)
    return os.environ.get(TOKEN_ENV)


def read_token_file(name: str) -> str:
    """The token in file `name`; `ConfigError` naming `backend.token_file` (a run checks
    it before it writes anything)."""
    try:
        return Path(name).expanduser().read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        why = getattr(err, "strerror", None) or "not a text file"
        raise ConfigError(f"backend.token_file: cannot read {name} ({why})") from None


class HttpBackend:
    name = "http"
    # no `warms`: a warm-up would be a billed shard per slot on a function platform, so the
    # instances compile on their first shard (the first round's `wait`)
    capabilities = Capabilities(one_shard=True)

    def __init__(self, cfg):
        self.cfg = cfg
        self.retry = RetryPolicy.from_config(cfg)
        self.urls = [u.rstrip("/") + "/v1/rollout" for u in cfg.urls]
        if not self.urls:
            raise BackendError("backend.urls: the http backend needs at least one endpoint")
        token = bearer_token(cfg)
        self.headers = {"content-type": "application/msgpack"}
        if token:
            self.headers["authorization"] = f"Bearer {token}"
        self.compress = cfg.compression == "deflate"
        if self.compress:
            self.headers.update({"content-encoding": "deflate", "accept-encoding": "deflate"})
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="jaxrl-dist-http")
        self._thread.start()
        self._client = self._call(self._make_client())
        self._packed, self._packed_lock = None, threading.Lock()  # (params, its encoder)
        self._down = set()  # endpoints whose last try failed (touched on the event loop only)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _make_client(self):
        httpx = needs("httpx", "http", "backend=http")
        limits = httpx.Limits(max_connections=max(64, self.cfg.max_shards),
                              max_keepalive_connections=max(64, self.cfg.max_shards))
        return httpx.AsyncClient(timeout=self.cfg.shard_timeout, limits=limits)

    def _encoder(self, params) -> wire.RequestEncoder:
        """The requests' encoder for `params`, packed once per params object (the
        reference kept here keeps the identity check sound)."""
        with self._packed_lock:
            if self._packed is None or self._packed[0] is not params:
                self._packed = (params, wire.RequestEncoder(params, self.compress))
            return self._packed[1]

    def start(self, job: Job) -> None:
        self.job = job
        self.templates = wire.output_templates(job.program)

    async def _post(self, slot: int, body: bytes, shard: str = ""):
        """Post one shard under the retry policy, each try on the next endpoint;
        `(body, retries, url, bytes on the wire, seconds)`. `shard`: its `run_id/round/slot`."""
        async def post(attempt: int):
            url = self.urls[(slot + attempt) % len(self.urls)]
            headers = {**self.headers, "x-shard": shard, "x-attempt": str(attempt)}
            try:
                answer = await self._post_once(url, body, headers)
            except Failure as failure:
                self._failing(url, failure)
                raise
            self._down.discard(url)
            return answer

        t0 = time.perf_counter()
        try:
            (content, url, size), retries = await self.retry.call_async(post)
        except GaveUp as gave_up:
            raise BackendError(f"shard slot {slot} failed after {GaveUp.count(gave_up.tries)}: "
                               f"{gave_up.error}") from gave_up.error
        return content, retries, url, size, time.perf_counter() - t0

    def _failing(self, url: str, failure: Failure) -> None:
        """Say once (until it answers again) that an endpoint fails: a dead instance
        otherwise costs every round its retries without a word."""
        if url not in self._down and len(self.urls) > 1 and failure.retryable:
            print(f"warning: {failure}; its shards are retried on the next endpoint until it answers "
                  "(each round's retries are in metrics.jsonl)", file=sys.stderr, flush=True)
        self._down.add(url)

    async def _post_once(self, url: str, body: bytes, headers: Optional[dict] = None):
        """One try at `url`: `(body, url, bytes on the wire)`, or a `Failure` naming the url."""
        try:
            resp = await asyncio.wait_for(
                self._client.post(url, content=body, headers=headers or self.headers),
                self.cfg.shard_timeout)
        except Exception as err:  # connection refused, timeout, reset: worth a try elsewhere
            raise Failure(f"{url}: {type(err).__name__} {err}".strip()) from err
        if resp.status_code == 200:  # httpx has inflated a deflated response already
            return resp.content, url, resp.num_bytes_downloaded
        hint = f" ({TOKEN_HINT})" if resp.status_code == 401 else ""
        raise Failure(f"{url}: HTTP {resp.status_code} {resp.text[:200]}{hint}",
                      retryable=resp.status_code not in FINAL_CODES, retry_after_s=retry_after_s(resp))

    async def _round(self, bodies: list, slots: list, round_: int = 0):
        # every shard runs to its end before the round fails: a task still
        # posting when the loop stops would report its error after ours
        run_id = self.job.run_id
        replies = await asyncio.gather(*(self._post(s, b, f"{run_id}/{round_}/{s}")
                                         for s, b in zip(slots, bodies)),
                                       return_exceptions=True)
        failed = [r for r in replies if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        return replies

    def run_round(self, round_: int, params, tasks, table) -> RoundResult:
        t0 = time.time()
        job = self.job
        encoder = self._encoder(params)
        bodies = [encoder.encode(wire.ShardRequest(job.spec, t.slot, t.key, None,
                                                   None if table is None else table.get(t.slot),
                                                   job.run_id, job.seed, round_))
                  for t in tasks]
        t1 = time.time()
        replies = self._call(self._round(bodies, [t.slot for t in tasks], round_))
        t2 = time.time()
        decoded = [wire.decode_response(r[0], False, self.templates) for r in replies]
        for t, d in zip(tasks, decoded):
            if d.slot != t.slot:
                raise BackendError(f"shard slot {t.slot}: the response is for slot {d.slot}")
        t3 = time.time()
        if table is not None:
            table.put([t.slot for t in tasks], [d.output.actor for d in decoded])
        traj, boot = stack_outputs([d.output for d in decoded], bucket(len(tasks), self.cfg.max_shards))
        t4 = time.time()
        shards = [ShardInfo(t.slot, d.timings, d.reset, r[1], f"{r[2]} {d.worker}", r[4])
                  for t, d, r in zip(tasks, decoded, replies)]
        # dispatch: encode the requests; wait: send, run, receive; transfer: decode; then stack
        stats = RoundStats(t1 - t0, t3 - t2, t2 - t1, sum(len(b) for b in bodies), sum(r[3] for r in replies),
                           t4 - t3)
        return RoundResult(traj, boot, shards, stats)

    def run_shard(self, index: int, params, task, state) -> tuple:
        """One shard, the `index`-th of its slot, from slot state `state` (None: sticky),
        posted on its own; `(output, info, stats)` as `backends.run_shard` returns them."""
        t0, job = time.time(), self.job
        body = self._encoder(params).encode(wire.ShardRequest(job.spec, task.slot, task.key, None, state,
                                                              job.run_id, job.seed, index))
        t1 = time.time()
        content, retries, url, size, seconds = self._call(
            self._post(task.slot, body, f"{job.run_id}/{index}/{task.slot}"))
        t2 = time.time()
        d = wire.decode_response(content, False, self.templates)
        if d.slot != task.slot:
            raise BackendError(f"shard slot {task.slot}: the response is for slot {d.slot}")
        info = ShardInfo(task.slot, d.timings, d.reset, retries, f"{url} {d.worker}", seconds)
        return d.output, info, RoundStats(t1 - t0, time.time() - t2, t2 - t1, len(body), size)

    async def _shutdown(self):
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self._client.aclose()

    def close(self) -> None:
        if self._loop.is_running():
            self._call(self._shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

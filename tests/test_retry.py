"""The backends' one retry policy (`jaxrl_dist/backends/retry.py`).

The policy on its own (jittered exponential backoff within its bounds, the
number of tries, what ends them), `Retry-After` read from real answers of a
stdlib HTTP server on loopback, the HTTP backend waiting it out against that
server before trying the next endpoint with the same body, and the local
backend retrying a failed shard with the same keys into the same data.
"""
from __future__ import annotations

import email.utils
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import jax
import numpy as np
import pytest

from jaxrl_dist.backends import BackendError, Job, ShardTask, shard
from jaxrl_dist.backends.http import HttpBackend
from jaxrl_dist.backends.local import LocalBackend
from jaxrl_dist.backends.retry import RETRY_AFTER_MAX_S, Failure, GaveUp, RetryPolicy, retry_after_s
from jaxrl_dist.config import ConfigError, HttpBackendConfig, from_dict


# -- the policy on its own -----------------------------------------------------

def test_backoff_grows_and_is_jittered_within_bounds():
    policy = RetryPolicy(max_retries=8, backoff_s=0.1, backoff_max_s=1.0)
    draws = {n: [policy.backoff(n) for _ in range(200)] for n in range(1, 8)}
    for n, waits in draws.items():
        ceiling = min(0.1 * 2 ** (n - 1), 1.0)
        assert all(ceiling / 2 <= w <= ceiling for w in waits), (n, min(waits), max(waits))
        assert len(set(waits)) > 100  # jittered, not one fixed value
    for n in range(1, 4):  # below the cap each try waits at least as long as the last could
        assert min(draws[n + 1]) >= max(draws[n]) - 1e-12
    assert max(draws[7]) <= 1.0  # capped
    assert RetryPolicy(3, 0.0, 0.0).backoff(3) == 0.0


def test_tries_are_max_retries_plus_one_each_with_its_index():
    seen = []

    def fail(attempt: int):
        seen.append(attempt)
        raise RuntimeError(f"try {attempt}")

    with pytest.raises(GaveUp) as err:
        RetryPolicy(3, 0.0, 0.0).call(fail)
    assert seen == [0, 1, 2, 3] and err.value.tries == 4 and str(err.value.error) == "try 3"
    assert RetryPolicy(3, 0.0, 0.0).call(lambda i: i if i == 2 else fail(i)) == (2, 2)


def test_a_final_failure_or_an_interrupt_ends_the_tries_at_once():
    tries = []

    def final(attempt: int):
        tries.append(attempt)
        raise Failure("the request is wrong", retryable=False)

    with pytest.raises(GaveUp) as err:
        RetryPolicy(5, 0.0, 0.0).call(final)
    assert tries == [0] and err.value.tries == 1

    def interrupted(attempt: int):
        tries.append(attempt)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # not a failure: not retried, not wrapped
        RetryPolicy(5, 0.0, 0.0).call(interrupted)
    assert tries == [0, 0]


def test_retry_after_sets_the_least_wait_up_to_its_cap():
    policy = RetryPolicy(2, 0.05, 0.1)
    assert policy.wait_s(1, Failure("503", retry_after_s=1.0)) == 1.0
    assert policy.wait_s(1, Failure("503", retry_after_s=3600.0)) == RETRY_AFTER_MAX_S
    assert policy.wait_s(1, Failure("503", retry_after_s=0.0)) <= 0.05  # the backoff wins


@pytest.mark.parametrize("key", ["retry_backoff_s", "retry_backoff_max_s"])
def test_negative_backoff_is_a_config_error_naming_the_key(key):
    with pytest.raises(ConfigError, match=f"backend.{key} must be >= 0"):
        from_dict({"trainer": "sync", "backend": {"name": "local", key: -1.0}})


# -- a real HTTP server on loopback --------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    def _answer(self):
        size = int(self.headers.get("content-length") or 0)
        status, headers, body = self.server.script.next(self.rfile.read(size))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):  # keep the test output to the test's own lines
        pass


class Scripted:
    """A stdlib HTTP server on 127.0.0.1 answering each request with the next of
    `answers` (`(status, headers, body)`; the last one repeats), keeping the bodies."""

    def __init__(self, *answers):
        self.answers, self.bodies, self.lock = list(answers), [], threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.script = self
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # a short poll, so `close` (shutdown) returns at once
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def next(self, body: bytes):
        with self.lock:
            self.bodies.append(body)
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def scripted():
    started = []

    def start(*answers):
        started.append(Scripted(*answers))
        return started[-1]

    yield start
    for s in started:
        s.close()


def _http_date(in_s: float) -> str:
    return email.utils.formatdate(time.time() + in_s, usegmt=True)


def test_retry_after_in_seconds_and_as_a_date_is_read_from_429_and_503(scripted):
    server = scripted((503, {"Retry-After": "1"}, b"busy"), (429, {"Retry-After": _http_date(3)}, b"slow"),
                      (503, {"Retry-After": "3600"}, b"down"))
    seconds, date, long = (httpx.get(server.url) for _ in range(3))
    assert retry_after_s(seconds) == 1.0
    assert 1.5 < retry_after_s(date) <= 3.0  # the date has whole seconds
    policy = RetryPolicy(2, 0.05, 0.1)
    assert policy.wait_s(1, Failure("503", retry_after_s=retry_after_s(seconds))) == 1.0
    assert 1.5 < policy.wait_s(1, Failure("429", retry_after_s=retry_after_s(date))) <= 3.0
    assert policy.wait_s(1, Failure("503", retry_after_s=retry_after_s(long))) == RETRY_AFTER_MAX_S


def test_retry_after_is_ignored_on_other_codes_and_when_unreadable(scripted):
    server = scripted((500, {"Retry-After": "7"}, b""), (502, {"Retry-After": "7"}, b""),
                      (200, {"Retry-After": "7"}, b""), (503, {"Retry-After": "soon"}, b""),
                      (503, {}, b""))
    assert [retry_after_s(httpx.get(server.url)) for _ in range(5)] == [None] * 5


def _http_backend(urls, max_retries: int) -> HttpBackend:
    return HttpBackend(HttpBackendConfig(urls=list(urls), max_retries=max_retries,
                                     compression="none", shard_timeout=10.0, token="t"))


def test_the_http_backend_waits_out_retry_after_then_tries_the_next_endpoint(scripted):
    busy = scripted((503, {"Retry-After": "1"}, b"busy"))
    live = scripted((200, {}, b"shard output"))
    backend = _http_backend([busy.url, live.url], max_retries=2)
    try:
        t0 = time.perf_counter()
        body, retries, url, _, _ = backend._call(backend._post(0, b"the shard's request"))
        waited = time.perf_counter() - t0
    finally:
        backend.close()
    assert body == b"shard output" and retries == 1 and url.startswith(live.url)
    assert 1.0 <= waited < 5.0
    assert busy.bodies == live.bodies == [b"the shard's request"]  # the same request, elsewhere


def test_a_failing_endpoint_is_said_once_until_it_answers_again(scripted, capsys):
    """A dead instance costs every round a retry: one line says so, not one a round."""
    flaky = scripted((500, {}, b"broken"), (500, {}, b"broken"), (200, {}, b"back"), (500, {}, b"again"))
    live = scripted((200, {}, b"shard output"))
    backend = _http_backend([flaky.url, live.url], max_retries=1)
    try:
        answers = [backend._call(backend._post(0, b"r"))[0] for _ in range(4)]
    finally:
        backend.close()
    assert answers == [b"shard output", b"shard output", b"back", b"shard output"]
    said = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(said) == 2, said  # failing, then (after it answered) failing again
    assert all(line.startswith(f"warning: {flaky.url}") and "retried on the next endpoint" in line for line in said)


def test_the_http_backend_tries_max_retries_plus_one_times_then_names_the_slot(scripted):
    failing = scripted((500, {"Retry-After": "30"}, b"broken"))  # a 500's Retry-After is ignored
    wrong = scripted((422, {}, b"bad request"))
    backend = _http_backend([failing.url], max_retries=2)
    try:
        t0 = time.perf_counter()
        with pytest.raises(BackendError, match=r"shard slot 3 failed after 3 tries: .* HTTP 500 broken"):
            backend._call(backend._post(3, b"same"))
        assert time.perf_counter() - t0 < 5.0
    finally:
        backend.close()
    assert failing.bodies == [b"same"] * 3
    backend = _http_backend([wrong.url], max_retries=2)
    try:
        with pytest.raises(BackendError, match=r"shard slot 0 failed after 1 try: .* HTTP 422"):
            backend._call(backend._post(0, b"same"))
    finally:
        backend.close()
    assert wrong.bodies == [b"same"]  # a wrong request is not sent again


# -- the local backend: the same keys every try, the same data ------------------

class Flaky:
    """A `ShardWorker` whose first `fails` runs raise; keeps every try's key."""

    def __init__(self, worker, fails: int):
        self.worker, self.fails, self.keys = worker, fails, []

    def run(self, spec, params, actor, key, *rest):
        self.keys.append(np.asarray(key).copy())
        if len(self.keys) <= self.fails:
            raise RuntimeError("injected failure")
        return self.worker.run(spec, params, actor, key, *rest)


@pytest.fixture(scope="module")
def shard_parts():
    cfg = from_dict({"trainer": "sync", "backend": {"name": "local", "envs_per_shard": 2, "max_retries": 2,
                                 "retry_backoff_s": 0.01},
                     "algo": {"num_steps": 8, "num_minibatches": 2}})
    program = shard.ShardProgram(shard.spec_from_config(cfg, "gymnax", False))
    params = program.network.init(jax.random.key(0),
                                  np.zeros((1,) + program.env.spec.obs_shape, np.float32))
    state = program.init_slot(shard.slot_init_key(0, 1))
    task = ShardTask(1, shard.shard_key(0, 1, 1))
    return cfg, Job(program.spec, 0, "retry", program), params, task, state


def test_local_retries_use_the_same_keys_and_give_the_same_shard(shard_parts):
    cfg, job, params, task, state = shard_parts
    clean, flaky = LocalBackend(cfg.backend), LocalBackend(cfg.backend)
    for backend in (clean, flaky):
        backend.start(job)
    want, info, _ = clean.run_shard(1, params, task, state)
    flaky._worker = Flaky(clean._worker, fails=2)
    got, flaky_info, _ = flaky.run_shard(1, params, task, state)
    assert info.retries == 0 and flaky_info.retries == 2
    assert len(flaky._worker.keys) == 3
    assert all(np.array_equal(k, np.asarray(task.key)) for k in flaky._worker.keys)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_local_gives_up_after_max_retries_plus_one_tries(shard_parts):
    cfg, job, params, task, state = shard_parts
    backend = LocalBackend(cfg.backend)
    backend.start(job)
    backend._worker = Flaky(backend._worker, fails=99)
    with pytest.raises(BackendError, match="local shard failed after 3 tries: injected failure"):
        backend.run_shard(1, params, task, state)
    assert len(backend._worker.keys) == 3
    assert all(np.array_equal(k, np.asarray(task.key)) for k in backend._worker.keys)

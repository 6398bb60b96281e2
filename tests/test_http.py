"""The actor function over real HTTP: a `jaxrl-dist serve` subprocess on loopback.

Request validation (401, 413, 400, 422, the server still answering), the
warm-instance compile cache, and the HTTP backend's retries, timeouts and
failure handling.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import httpx
import jax
import numpy as np
import pytest
from test_phases import assert_phases_add_up

from jaxrl_dist.backends import shard, wire
from jaxrl_dist.config import from_dict
from jaxrl_dist.core.networks import init_params
from jaxrl_dist.trainers.checkpoint import saved_steps
from serving import TOKEN, Server, free_port

AUTH = {"authorization": f"Bearer {TOKEN}", "content-type": "application/msgpack"}


@pytest.fixture(scope="module")
def server():
    s = Server("serve.max_body_mb=1", "serve.allowed_envs=[CartPole-v1,Pendulum-v1]")
    yield s
    s.stop()


def make_request(env_id="CartPole-v1", slot=2, network="auto"):
    cfg = from_dict({"trainer": "sync", "env": {"id": env_id}, "backend": {"name": "local", "envs_per_shard": 4},
                     "algo": {"num_steps": 16, "num_minibatches": 2, "network": network}})
    spec = shard.spec_from_config(cfg, "gymnax", env_id == "Pendulum-v1")
    prog = shard.ShardProgram(spec)
    params = init_params(prog.network, prog.env.spec.obs_shape, np.float32, jax.random.key(0))
    actor = prog.init_slot(shard.slot_init_key(0, slot))
    req = wire.ShardRequest(spec, slot, shard.shard_key(0, 1, slot), params, actor, "t", 0, 1)
    return prog, req


def post(server, body, headers=AUTH):
    return httpx.post(server.url + "/v1/rollout", content=body, headers=headers, timeout=60)


def test_rollout_matches_the_local_worker_and_reports_billing(server):
    prog, req = make_request()
    for compress in (False, True):
        headers = dict(AUTH, **({"content-encoding": "deflate", "accept-encoding": "deflate"}
                                if compress else {}))
        resp = post(server, wire.encode_request(req, compress), headers)
        assert resp.status_code == 200, resp.text
        reply = wire.decode_response(resp.content, False, wire.output_templates(prog))
        local = prog.run_one(req.params, req.actor, req.key)
        same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)),
                            (reply.output.traj, reply.output.actor, reply.output.bootstrap),
                            (local.traj, local.actor, local.bootstrap))
        assert all(jax.tree.leaves(same))
        t = reply.timings
        assert t.received <= t.started <= t.finished and t.billed >= t.finished - t.received - 1e-3
        assert reply.slot == req.slot and reply.worker.startswith("serve:")


def test_a_warm_instance_does_not_recompile(server):
    _, req = make_request(slot=5)
    assert post(server, wire.encode_request(req)).status_code == 200
    before = httpx.get(server.url + "/healthz").json()["compiled"]
    req = req._replace(key=shard.shard_key(0, 9, 5), round=9)
    assert post(server, wire.encode_request(req)).status_code == 200
    assert httpx.get(server.url + "/healthz").json()["compiled"] == before


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer nope"},
                                     {"authorization": f"Basic {TOKEN}"}])
def test_missing_or_wrong_token_is_401(server, headers):
    _, req = make_request()
    resp = post(server, wire.encode_request(req), headers)
    assert resp.status_code == 401 and "authorization" in resp.json()["error"]


def test_bodies_over_the_limit_are_413(server):
    assert post(server, b"\0" * (2 << 20)).status_code == 413
    bomb = wire.deflate(b"\0" * (8 << 20))  # small on the wire, 8 MB inflated
    assert len(bomb) < 1 << 20
    resp = post(server, bomb, dict(AUTH, **{"content-encoding": "deflate"}))
    assert resp.status_code == 413 and "inflates" in resp.json()["error"]


@pytest.mark.parametrize("body,headers,word", [
    (b"\xc1 not msgpack", AUTH, "msgpack"),
    (b"garbage", dict(AUTH, **{"content-encoding": "deflate"}), "deflate"),
    (b"x", dict(AUTH, **{"content-encoding": "br"}), "content-encoding"),
])
def test_malformed_bodies_are_400(server, body, headers, word):
    resp = post(server, body, headers)
    assert resp.status_code == 400 and word in resp.json()["error"]


def _corrupt(req, path):
    prog, req = req
    if path in ("carry_shape", "carry_dtype"):  # a GRU's hidden state in the slot state
        carry = np.asarray(req.actor.carry)
        bad = np.zeros(carry.shape[:-1] + (carry.shape[-1] + 1,), np.float32) if path == "carry_shape" \
            else carry.astype(np.float16)
        return req._replace(actor=req.actor._replace(carry=bad))
    if path == "params":
        params = jax.tree.map(lambda x: x, req.params)
        leaf = params["params"]["MLP_0"]["Dense_0"]["kernel"]
        params["params"]["MLP_0"]["Dense_0"]["kernel"] = np.zeros((leaf.shape[0] + 1, leaf.shape[1]), np.float32)
        return req._replace(params=params)
    if path == "dtype":
        return req._replace(actor=req.actor._replace(obs=np.asarray(req.actor.obs, np.float64)))
    raise ValueError(path)


@pytest.mark.parametrize("case,word", [("params", "params"), ("dtype", "actor"), ("carry_shape", "actor.carry"),
                                       ("carry_dtype", "actor.carry")])
def test_wrong_shapes_or_dtypes_are_422(server, case, word):
    req = _corrupt(make_request(network="gru" if case.startswith("carry") else "auto"), case)
    resp = post(server, wire.encode_request(req))
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"].startswith(word)


@pytest.mark.parametrize("params", [False, True])
def test_a_request_packed_in_pieces_reads_as_its_fields(params):
    """The encoder packs the spec once and may take a slot's state packed ahead (the Ray
    backend packs it while the learner runs): the same bytes, and every field reads back."""
    from flax import serialization

    _, req = make_request()
    req = req if params else req._replace(params=None)
    encoder = wire.RequestEncoder(req.params, False)
    body = encoder.encode(req)
    assert encoder.encode(req._replace(actor=wire.pack_actor(req.actor))) == body == wire.encode_request(req)
    data = serialization.msgpack_restore(body)
    assert set(data) == set(wire.HEAD_FIELDS) and list(data)[-1] == "params"
    assert (data["v"], data["spec"], data["slot"], data["run_id"], data["seed"], data["round"]) == (
        wire.VERSION, req.spec.to_dict(), req.slot, req.run_id, req.seed, req.round)
    np.testing.assert_array_equal(data["key"], req.key)
    want = serialization.to_state_dict(jax.device_get(req.actor))
    assert jax.tree.all(jax.tree.map(np.array_equal, data["actor"], want))
    assert (data["params"] is None) != params


def test_bad_fields_and_disallowed_envs_are_422(server):
    from flax import serialization

    _, req = make_request()
    data = serialization.msgpack_restore(wire.encode_request(req))
    data["spec"]["num_envs"] = "four"
    resp = post(server, serialization.msgpack_serialize(data))
    assert resp.status_code == 422 and "spec.num_envs" in resp.json()["error"]
    data["spec"]["num_envs"], data["spec"]["num_threads"] = 4, 10_000  # a worker's threads are capped
    resp = post(server, serialization.msgpack_serialize(data))
    assert resp.status_code == 422 and "spec.num_threads" in resp.json()["error"]
    data["spec"]["num_threads"], data["spec"]["env_id"] = 1, "Acrobot-v1"
    resp = post(server, serialization.msgpack_serialize(data))
    assert resp.status_code == 422 and "allowed_envs" in resp.json()["error"]
    del data["key"]
    data["spec"]["env_id"] = "CartPole-v1"
    resp = post(server, serialization.msgpack_serialize(data))
    assert resp.status_code == 422 and resp.json()["error"].startswith("key")


@pytest.mark.parametrize("name,values", [
    ("authorization", ["Bearer nope", f"Bearer {TOKEN}"]),  # the right one last would win
    ("authorization", [f"Bearer {TOKEN}", "Bearer nope"]),
    ("content-encoding", ["identity", "deflate"]),
])
def test_a_header_sent_twice_is_400_naming_it(server, name, values):
    _, req = make_request()
    headers = [(k, v) for k, v in AUTH.items() if k != name] + [(name, v) for v in values]
    resp = post(server, wire.encode_request(req), headers)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == f"{name}: sent more than once; send one"


def test_server_still_answers_after_bad_requests(server):
    assert server.healthy()
    _, req = make_request()
    assert post(server, wire.encode_request(req)).status_code == 200


def _worker_pid(url: str, warm: bool) -> int:
    """The rollout process's pid: once it answers (a body it refuses), or as soon as it
    is started (it is still importing)."""
    if warm:
        resp = httpx.post(url + "/v1/rollout", content=b"\xc1", headers=AUTH, timeout=60)
        assert resp.status_code == 400, resp.text
    deadline = time.time() + 30
    while (pid := httpx.get(url + "/healthz").json()["worker"]["pid"]) is None and time.time() < deadline:
        time.sleep(0.05)
    return pid


@pytest.mark.parametrize("sig,warm,code", [
    (signal.SIGINT, True, 130),  # Ctrl-C in a terminal, sent to the whole foreground group
    (signal.SIGTERM, False, 0),  # a platform stopping an instance whose worker still starts
], ids=["ctrl-c", "sigterm"])
def test_serve_says_where_it_listens_and_stops_cleanly(sig, warm, code):
    """One line once it accepts connections; on SIGINT or SIGTERM one line more, no
    traceback from the server or its rollout process, which is gone; 130 after Ctrl-C."""
    s = Server("serve.allowed_envs=[CartPole-v1]")
    try:
        assert s.ready_line == f"serving on {s.url} (envs: CartPole-v1; auth: bearer token)"
        worker = _worker_pid(s.url, warm)
        (os.killpg if sig == signal.SIGINT else os.kill)(s.proc.pid, sig)
        out = s.startup_output + s.proc.communicate(timeout=60)[0].decode()
    finally:
        s.stop()
    assert s.proc.returncode == code, out
    assert "Traceback" not in out and out.splitlines()[-1] == f"stopped ({sig.name})", out
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)


# ---------------------------------------------------------------------------
# The HTTP backend against real servers: retries, timeouts, every endpoint down.
# ---------------------------------------------------------------------------

def tiny(run_dir, urls, **backend):
    return from_dict({
        "algo": {"total_timesteps": 4 * 16 * 2 * 4, "num_steps": 16, "num_minibatches": 2,
                 "update_epochs": 2},
        "trainer": "sync", "backend": {"name": "http", "urls": urls, "token": TOKEN, "envs_per_shard": 4,
                    "max_shards": 4, **backend},
        "scheduler": {"num_shards": 2},
        "run": {"dir": str(run_dir), "progress": False, "tensorboard": False, "compile_cache": False},
    })


def started_backend(cfg, run_id: str, suite: str = "gymnax") -> tuple:
    """`(backend, params)`: an http backend started on `cfg`'s shard program, and the
    initial params of that program's learner."""
    from jaxrl_dist.backends import Job
    from jaxrl_dist.backends.http import HttpBackend
    from jaxrl_dist.backends.shard import ShardProgram, spec_from_config
    from jaxrl_dist.core.learner import init_train
    from jaxrl_dist.trainers.rounds import shard_learner

    program = ShardProgram(spec_from_config(cfg, suite, False))
    params = init_train(shard_learner(cfg, program, 2.0), 0).params
    backend = HttpBackend(cfg.backend)
    backend.start(Job(program.spec, 0, run_id, program))
    return backend, params


@pytest.fixture(scope="module")
def local_digest(tmp_path_factory):
    from jaxrl_dist.trainers.runner import train

    cfg = tiny(tmp_path_factory.mktemp("local"), ["http://127.0.0.1:1"])
    http_only = ("urls", "token", "token_file", "compression")  # the http backend's own keys
    cfg = from_dict({**json.loads(json.dumps(_plain(cfg))), "backend": {
        **{k: v for k, v in _plain(cfg)["backend"].items() if k not in http_only}, "name": "local"}})
    return train(cfg)["params_sha256"]


def _plain(cfg):
    from jaxrl_dist.config import to_dict

    return to_dict(cfg)


class SilentServer:
    """Accepts connections on loopback and never answers: a hung function."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        for c in self.conns:
            c.close()
        self.sock.close()


def test_dead_and_hung_endpoints_are_retried_elsewhere(server, tmp_path, local_digest):
    from jaxrl_dist.trainers.runner import train

    dead = f"http://127.0.0.1:{free_port()}"
    hung = SilentServer()
    try:
        # slot 0 tries the dead endpoint first, slot 1 the hung one; both retry on the live one
        cfg = tiny(tmp_path, [dead, hung.url, server.url], shard_timeout=2.0, max_retries=2)
        summary = train(cfg)
    finally:
        hung.close()
    assert summary["retries"] >= 4  # 2 shards x 2 rounds (at least) went elsewhere
    assert summary["params_sha256"] == local_digest
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["retries"] >= 2 and r["num_shards"] == 2 for r in records)
    assert_phases_add_up(records)  # the retries' waits are in the round's `wait`


# under slow: dead and hung endpoints retried elsewhere stay in the default suite
@pytest.mark.slow
def test_every_endpoint_down_stops_cleanly_and_resumes(tmp_path):
    """Kill the only function mid-run: the run stops with one line after its
    retries (left in FAILED), its last checkpoint is intact, and resuming it against a
    new instance at a new address ends with the very parameters an uninterrupted run
    gets (and no FAILED)."""
    from jaxrl_dist.trainers.runner import train
    from test_cli import command

    port = free_port()
    live = Server(port=port)
    overrides = [f"backend.urls=[{live.url}]", "backend.max_retries=1",
                 "backend.envs_per_shard=4", "backend.max_shards=4", "scheduler=fixed",
                 "scheduler.num_shards=2", "algo.num_steps=16", "algo.minibatch_size=null", "algo.num_minibatches=2", "algo.update_epochs=2",
                 "algo.total_timesteps=12800", "run.checkpoint_every=2",
                 "run.progress=false", "run.tensorboard=false"]
    run_dir = tmp_path / "http"
    env = dict(os.environ, JAXRL_DIST_TOKEN=TOKEN)  # the CLI takes no token as an override
    proc = subprocess.Popen(command() + ["train", "backend=http", f"run.dir={run_dir}"] + overrides,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 5):
        time.sleep(0.1)
    live.stop()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: shard slot") and f"run.resume={run_dir}" in line
    steps = saved_steps(run_dir)
    assert steps and steps[-1] >= 4 and steps[-1] % 2 == 0 and steps[-1] < 100
    assert (run_dir / "FAILED").read_text().startswith("3 error: shard slot")

    live = Server(port=free_port())  # the instance came back elsewhere
    try:
        out = subprocess.run(command() + ["train", f"run.resume={run_dir}", f"backend.urls=[{live.url}]",
                                          "run.progress=false"], capture_output=True, text=True, timeout=300, env=env)
    finally:
        live.stop()
    assert out.returncode == 0, out.stderr
    assert not (run_dir / "FAILED").exists()
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["rounds"] == 100 and resumed["resumed_at_update"] == steps[-1]

    from jaxrl_dist.cli.compose import load_config

    same = [o for o in overrides if not o.startswith("backend.urls=")]  # the local backend takes no urls
    local = load_config(["backend=local", f"run.dir={tmp_path / 'local'}"] + same)
    assert train(local)["params_sha256"] == resumed["params_sha256"]


def test_envpool_slots_stick_to_their_instance_and_a_lost_one_resets(tmp_path):
    """envpool keeps a slot's envs on the instance that runs it: slot s goes to
    endpoint s % 2. Same params as the local backend; when an instance dies its
    slot moves to the other one, which resets that slot's envs and says so."""
    from jaxrl_dist.backends import ShardTask
    from jaxrl_dist.cli.compose import load_config
    from jaxrl_dist.trainers.runner import train
    from jaxrl_dist.backends.shard import round_keys

    a, b = Server(), Server()
    try:
        over = ["env.id=CartPole-v1", "env.suite=envpool", "backend.envs_per_shard=4",
                "backend.max_shards=2", "scheduler=fixed", "scheduler.num_shards=2",
                "algo.num_steps=16", "algo.minibatch_size=null", "algo.num_minibatches=2", "algo.update_epochs=2", "algo.total_timesteps=640",
                "run.progress=false", "run.tensorboard=false", "run.compile_cache=false"]
        http = train(load_config(["backend=http", f"backend.urls=[{a.url},{b.url}]",
                                  f"backend.token={TOKEN}", f"run.dir={tmp_path / 'h'}"] + over))
        local = train(load_config(["backend=local", f"run.dir={tmp_path / 'l'}"] + over))
        assert http["params_sha256"] == local["params_sha256"] and http["slot_resets"] == 0

        cfg = load_config(["backend=http", f"backend.urls=[{a.url},{b.url}]", f"backend.token={TOKEN}",
                           "backend.shard_timeout=10"] + over)
        backend, params = started_backend(cfg, "sticky", "envpool")
        try:
            for r in range(3):
                if r == 2:
                    b.stop()
                keys, _ = round_keys(0, r, np.arange(2))
                result = backend.run_round(r, params, [ShardTask(s, keys[s]) for s in range(2)], None)
                info = {s.slot: s for s in result.shards}
                assert info[0].worker.startswith(a.url) and not info[0].reset == (r > 0)
                if r < 2:
                    assert info[1].worker.startswith(b.url) and info[1].reset == (r == 0)
            assert info[1].worker.startswith(a.url) and info[1].reset and info[1].retries == 1
        finally:
            backend.close()
    finally:
        a.stop()
        b.stop()


def test_a_failed_round_leaves_no_shard_still_posting(tmp_path):
    """Slot 0 fails at once (nothing listens), slot 1 hangs until its timeout:
    the round raises only after both are done, so no request is left running
    to report its own error after the run has stopped."""
    from jaxrl_dist.backends import BackendError, ShardTask
    from jaxrl_dist.backends.shard import round_keys

    hung = SilentServer()
    cfg = tiny(tmp_path, [f"http://127.0.0.1:{free_port()}", hung.url], shard_timeout=1.5, max_retries=0)
    backend, params = started_backend(cfg, "failed")
    try:
        keys, _ = round_keys(0, 0, np.arange(2))
        t0 = time.time()
        with pytest.raises(BackendError, match="shard slot 0 failed after 1 try"):
            backend.run_round(0, params, [ShardTask(s, keys[s]) for s in range(2)], None)
        assert time.time() - t0 >= 1.4  # it waited for the hung slot's timeout
        assert backend._call(_pending()) == 0
    finally:
        backend.close()
        hung.close()


async def _pending():
    import asyncio

    return len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])


def test_a_token_comes_from_a_file_or_the_environment_and_is_never_saved(tmp_path):
    """`backend.token_file` (or $JAXRL_DIST_TOKEN) feeds the bearer header; a token the
    library was given does not reach config.yaml; the CLI refuses one as an override."""
    from jaxrl_dist.backends.http import bearer_token
    from jaxrl_dist.trainers.checkpoint import save_run_config
    from jaxrl_dist.config import to_dict
    from test_cli import run_cli

    (tmp_path / "token").write_text(TOKEN + "\n")
    cfg = from_dict({"trainer": "sync", "backend": {"name": "http", "urls": ["http://127.0.0.1:1"],
                                                    "token_file": str(tmp_path / "token")}})
    assert bearer_token(cfg.backend) == TOKEN
    given = from_dict({"trainer": "sync", "backend": {"name": "http", "urls": ["http://127.0.0.1:1"], "token": TOKEN}})
    save_run_config(tmp_path, to_dict(given))
    assert TOKEN not in (tmp_path / "config.yaml").read_text()
    out = run_cli("train", "backend=http", f"backend.token={TOKEN}", timeout=60)
    assert out.returncode == 2 and TOKEN not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: backend.token: a token is not taken on the command line (it would be saved in "
        ".hydra/ and the shell's history); set $JAXRL_DIST_TOKEN or backend.token_file=PATH"]


@pytest.mark.slow
def test_busy_answers_are_retried_after_their_retry_after(tmp_path, local_digest):
    """One instance that takes one request at a time (serve.max_concurrent=1) and two
    shards a round: the second is answered 503 + Retry-After, the backend waits and
    retries, and the run ends with the local backend's params."""
    from jaxrl_dist.trainers.runner import train

    busy = Server("serve.max_concurrent=1", "serve.allowed_envs=[CartPole-v1]")
    try:
        summary = train(tiny(tmp_path, [busy.url], max_retries=6))
        health = httpx.get(busy.url + "/healthz").json()
    finally:
        busy.stop()
    assert summary["params_sha256"] == local_digest
    assert health["busy"] >= 1 and summary["retries"] >= health["busy"]


def test_a_refused_token_says_where_the_token_goes(server, tmp_path):
    """A 401 is final (another try cannot help) and its line says which keys hold the token."""
    from jaxrl_dist.backends import BackendError, ShardTask
    from jaxrl_dist.backends.http import TOKEN_HINT
    from jaxrl_dist.backends.shard import round_keys

    cfg = tiny(tmp_path, [server.url], token="wrong", max_retries=2)
    backend, params = started_backend(cfg, "refused")
    try:
        keys, _ = round_keys(0, 0, np.arange(1))
        with pytest.raises(BackendError, match=r"after 1 try: .*HTTP 401 .*" + re.escape(f"({TOKEN_HINT})")):
            backend.run_round(0, params, [ShardTask(0, keys[0])], None)
    finally:
        backend.close()

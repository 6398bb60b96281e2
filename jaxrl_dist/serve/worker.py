"""The actor function's rollout process: decodes, checks, runs and encodes shards that the
server (`serve.app`, through `serve.supervisor`) passes over a pipe. The server never
imports this module, so it answers health checks before JAX loads; a native crash here is
the supervisor's to restart."""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from jaxrl_dist.backends import wire
from jaxrl_dist.backends.shard import ShardWorker, Timings
from jaxrl_dist.config import ConfigError
from jaxrl_dist.platform import use_unrolled_threefry
from jaxrl_dist.serve.pipe import HEAD, REPLY, billed, json_bytes, one_line


def worker_entry(fd: int) -> None:
    """The rollout process's entry: its setup, then requests, on the pipe at `fd`."""
    _exit_with_parent(os.getppid())
    conn = Connection(fd)
    try:
        setup = conn.recv_bytes()
    except (EOFError, OSError):  # the server is gone before it sent the setup
        return
    _worker_main(conn, setup)


def _exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    """End this process once the server that started it is gone, even if it was killed
    while this one runs (or hangs in) a shard: in a process group of its own, nothing else
    would stop it. An idle worker already ends at its pipe's end of file."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker_main(conn, setup: bytes) -> None:
    """The rollout process: answer requests from the server's pipe until it closes."""
    opts = json.loads(setup)
    if opts["unrolled_threefry"]:
        use_unrolled_threefry()
    worker = ShardWorker(opts["name"], opts["max_programs"], opts["max_pools"])
    policy = wire.RequestPolicy(frozenset(opts["allowed_envs"]), opts["allowed_env_kwargs"],
                                opts["max_slot"], max_envs=opts["max_envs"],
                                max_rollout_mb=opts["max_rollout_mb"])
    conn.send_bytes(b"ready")
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):  # the server is gone
            return
        status, payload = _answer(worker, policy, opts["max_bytes"], message)
        stats = json.dumps(worker.stats()).encode()
        try:
            conn.send_bytes(REPLY.pack(status, len(stats)) + stats + payload)
        except OSError:  # the server went away while this shard ran
            return


def _answer(worker, policy, max_bytes: int, message: bytes) -> tuple:
    """`(status, payload)`: the msgpack response, or a JSON error naming the field."""
    flags, received = HEAD.unpack_from(message)
    try:
        return 200, _rollout(worker, policy, max_bytes, message[HEAD.size:], flags, received)
    except wire.BodyTooLarge as err:
        status, text = 413, str(err)
    except wire.MalformedBody as err:
        status, text = 400, str(err)
    except (wire.ShardError, ConfigError) as err:
        status, text = 422, " ".join(str(err).split())[:500]
    except Exception as err:  # a bug: one line back, the traceback in the log
        traceback.print_exc(file=sys.stderr)
        status, text = 500, f"internal error: {one_line(err)}"
    return status, json_bytes({"error": text})


def _rollout(worker, policy, max_bytes: int, body: bytes, flags: int, received: float) -> bytes:
    """Decode, check, run and encode one shard (in the worker process)."""
    spec, data = wire.decode_request_head(body, bool(flags & 1), max_bytes, policy)
    req = wire.decode_request_for(worker, spec, data)
    wire.check_rollout_size(spec, worker.program(spec, req.slot, req.seed).env.spec, policy)
    out, t, reset = worker.run(spec, req.params, req.actor, req.key, req.slot,
                               req.run_id, req.seed, received)
    finished = time.time()
    timings = Timings(t.received, t.started, finished, billed(t.received, finished))
    return wire.encode_response(req.slot, out, timings, reset, worker.name, bool(flags & 2))

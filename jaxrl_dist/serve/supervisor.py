"""The actor function's worker supervisor: `RolloutWorker` starts the rollout process
(`serve.worker`, a fresh interpreter that shares nothing with the server but a pipe of
bytes), sends it requests, and starts it again when it dies or hangs.

The server imports this module, never `serve.worker`: it names the worker's module in
the child's command line only, so the server answers health checks before JAX loads."""
from __future__ import annotations

import json
import sys
import threading

from jaxrl_dist.serve.pipe import REPLY


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
                "from jaxrl_dist.serve.worker import worker_entry; worker_entry(int(sys.argv[2]))")


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

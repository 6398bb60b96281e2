"""A real `jaxrl-dist serve` on a loopback port, for tools, tests, benchmarks and
experiments on one machine (`LocalServer`), and a free port to put one on (`free_port`).
Light: it starts the server as a subprocess and imports neither uvicorn nor JAX."""
from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

from jaxrl_dist.serve.protocol import READY_PREFIX


def free_port(host: str = "127.0.0.1") -> int:
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
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=timeout) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()

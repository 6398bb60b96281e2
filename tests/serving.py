"""A real `jaxrl-dist serve` in a subprocess on a loopback port, for the tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TOKEN = "test-token-7f3a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command() -> list:
    script = Path(sys.executable).with_name("jaxrl-dist")
    return [str(script)] if script.exists() else [sys.executable, "-m", "jaxrl_dist.cli"]


class Server:
    """`jaxrl-dist serve` on 127.0.0.1; `stop()` kills it."""

    def __init__(self, *overrides: str, token: str = TOKEN, port: int = 0, env: dict = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = _command() + ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--token", token] if token is not None else []
        self.proc = subprocess.Popen(cmd + list(overrides), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=dict(os.environ, **(env or {})))
        self.wait_ready()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {self.proc.stdout.read().decode()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"serve on {self.url} did not answer /healthz")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

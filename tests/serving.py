"""Test defaults for `jaxrl_dist.serve.local.LocalServer`: a real `jaxrl-dist serve`
subprocess on a loopback port, with a known token."""
from __future__ import annotations

from jaxrl_dist.serve.local import LocalServer, free_port

TOKEN = "test-token-7f3a"

__all__ = ["Server", "TOKEN", "free_port"]


class Server(LocalServer):
    def __init__(self, *overrides: str, token: str = TOKEN, **kwargs):
        super().__init__(*overrides, token=token, **kwargs)

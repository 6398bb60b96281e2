"""How the actor function's app meets uvicorn: the HTTP connection protocol that closes
a connection whose request headers come late (`header_timeout_protocol`), the server
class that prints the ready line once it accepts connections (`ready_server_class`,
`READY_PREFIX`, which `serve.local` waits for), and the note of the signal that stopped
it (`StopSignal`). uvicorn is imported inside the functions that build these classes, so
importing this module (as `serve.local` does) loads neither uvicorn nor JAX.

The bytes the server and its rollout process pass over their pipe are not here but in
`serve.pipe`: the rollout process imports that format and nothing of uvicorn's, and it
is a different protocol from this one (and from `backends.wire`, the request and response
bodies)."""
from __future__ import annotations

from jaxrl_dist.serve.pipe import json_bytes

READY_PREFIX = "serving on "  # the line `serve` prints once it accepts connections


class StopSignal:
    """The signal that stopped a uvicorn server, noted while in a `with` block. uvicorn
    handles SIGINT and SIGTERM itself (a graceful shutdown, in which the app stops its
    worker) and, once stopped, raises the signal again to the handlers it found: these
    note it, in place of Python's KeyboardInterrupt traceback or a death by SIGTERM.
    One that arrives before uvicorn's own handlers are in place stops the server too."""

    def __init__(self, server):
        self.server, self.signal, self._previous = server, None, {}

    def _note(self, signum: int, frame) -> None:
        self.signal = self.signal or signum
        self.server.should_exit = True

    def __enter__(self) -> "StopSignal":
        import signal

        self._previous = {sig: signal.signal(sig, self._note) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def ready_server_class():
    """uvicorn's `Server`, printing one line with its URL once it accepts connections
    (after the app's startup and the socket's bind)."""
    import uvicorn

    class ReadyServer(uvicorn.Server):
        def __init__(self, config, detail: str):
            super().__init__(config)
            self.detail = detail

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
                print(f"{READY_PREFIX}{url} ({self.detail})", flush=True)

    return ReadyServer


_TIMEOUT_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


def _close_late(proto, timeout_s: float) -> None:
    """Close `proto`'s connection whose request headers are late (408 if it began one)."""
    if proto.cycle is not None and not proto.cycle.response_complete:
        return  # headers are in; the app's body timeout takes over
    if not proto.transport.is_closing():
        if proto._started:  # a request begun and never finished is told why
            why = f"headers: not received within serve.header_timeout_s={timeout_s:g} s"
            body = json_bytes({"error": why})
            proto.transport.write(_TIMEOUT_408 % (len(body), body))
        proto.transport.close()


def header_timeout_protocol(timeout_s: float):
    """uvicorn's h11 protocol, closing a connection whose request headers are not all in
    within `timeout_s` of it opening or of its last response (uvicorn's own keep-alive
    timer stops at the first byte, so a client trickling headers would hold it forever)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutH11(H11Protocol):
        _header_timer = None

        def _arm(self) -> None:
            self._disarm()
            self._started = False  # no byte of the next request yet: an idle keep-alive
            self._header_timer = self.loop.call_later(timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            _close_late(self, timeout_s)

        def data_received(self, data: bytes) -> None:
            self._started = True
            super().data_received(data)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutH11

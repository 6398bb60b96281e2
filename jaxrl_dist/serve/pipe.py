"""What the actor function's server and its rollout process say to each other over their
pipe: a request is `HEAD` (flags, arrival time) and the wire body; a reply is `REPLY`
(status, length of the worker's stats JSON), the stats, then the body. Light: the server
imports it without JAX, and `serve.worker` is the other end.

Kept apart from `serve.protocol` (the HTTP connection under uvicorn), which the rollout
process has no use for: this module is all that both processes share."""
from __future__ import annotations

import json
import math
import struct

HEAD = struct.Struct("!Bd")  # to the worker: flags (1 inflate, 2 deflate the answer), received
REPLY = struct.Struct("!HI")  # from the worker: status, length of its stats JSON


def billed(received: float, finished: float) -> float:
    return math.ceil((finished - received) * 1000.0) / 1000.0


def one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"[:300]


def json_bytes(data: dict) -> bytes:
    return json.dumps(data).encode()

"""Backends that fault a share of first attempts, registered as plugins through the
backend registry (the package has no fault flag): `faulty_local` wraps the local
backend, `faulty_ray` the Ray backend. Which shards are hit, and how, comes from
`faultproxy.fault_for(seed, round, slot)`, the HTTP fault proxy's own choice, so
every backend is hit on the same shards with the same seed.

Retries are never faulted, so a retry always has a healthy path:

- `faulty_local`: a round (or an async chunk) with a chosen shard fails its first
  try with an error before any work; the backend's retry policy runs it again.
- `faulty_ray`: the actor itself misbehaves on a chosen shard's first attempt:
  `delay` sleeps past `backend.shard_timeout` (the driver kills and replaces it),
  `error` raises, `exit` ends its process. A first attempt is told from a retry by a
  marker file per shard, made with O_EXCL in `dir` (replaced actors start with no
  memory); the marker holds the fault, so a test reads what was injected.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tools.faultproxy import fault_for

from jaxrl_dist.backends import BACKENDS
from jaxrl_dist.backends.local import LocalBackend


@dataclass(frozen=True)
class FaultOptions:
    share: float = 0.1  # of first attempts faulted
    seed: int = 0
    dir: str = ""  # faulty_ray: where the per-shard markers go
    delay_s: float = 5.0  # faulty_ray: a `delay` fault's sleep


class FaultyLocal(LocalBackend):
    """The local backend with a share of first tries failing."""

    name = "faulty_local"
    Options = FaultOptions

    def __init__(self, cfg, opts: FaultOptions):
        super().__init__(cfg)
        # the shard each thread is running (the async trainer's actors share this backend)
        self.opts, self.injected, self._now = opts, [], threading.local()

    def run_round(self, round_: int, params, tasks, table):
        self._now.shard = (round_, [t.slot for t in tasks])
        return super().run_round(round_, params, tasks, table)

    def run_shard(self, index: int, params, task, state):
        self._now.shard = (index, [task.slot])
        return super().run_shard(index, params, task, state)

    def _attempt(self, fn):
        if not hasattr(self._now, "shard"):  # the warm-up's call (`LocalBackend.warm`): no round, no fault
            return super()._attempt(fn)
        round_, slots = self._now.shard
        hit = [s for s in slots if fault_for(self.opts.seed, str(round_), str(s), self.opts.share, ("error",))]
        tries = []

        def faulty():
            tries.append(1)
            if hit and len(tries) == 1:
                self.injected.append((round_, tuple(hit)))
                raise RuntimeError(f"injected fault: round {round_} slots {hit}")
            return fn()

        return super()._attempt(faulty)


def _ray_backend():
    """`FaultyRay`, made when first asked for (Ray is imported lazily)."""
    from jaxrl_dist.backends.ray_backend import MAX_BODY, RayBackend, ShardActor
    from jaxrl_dist.backends import wire
    from jaxrl_dist.config import RayBackendConfig

    class FaultyActor(ShardActor):
        def __init__(self, setup: dict):
            super().__init__(setup)
            self.faults = setup["faults"]

        def run(self, params_body: bytes, request_body: bytes) -> bytes:
            f = self.faults
            _, data = wire.decode_request_head(request_body, False, MAX_BODY)
            fault = fault_for(f["seed"], str(data["round"]), str(data["slot"]), f["share"],
                              ("delay", "error", "exit"))
            if fault is not None and _first(Path(f["dir"]), data, fault):
                if fault == "delay":
                    time.sleep(f["delay_s"])
                elif fault == "error":
                    raise RuntimeError(f"injected fault: round {data['round']} slot {data['slot']}")
                else:
                    os._exit(1)
            return super().run(params_body, request_body)

    class FaultyRay(RayBackend):
        name = "faulty_ray"
        actor_class = FaultyActor
        Options = FaultOptions

        def __init__(self, cfg, opts: FaultOptions):
            # a plugin gets the keys every backend has; Ray's own take their defaults
            super().__init__(RayBackendConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}))
            self.opts = opts

        def start(self, job):
            super().start(job)
            o = self.opts
            self._setup["faults"] = {"share": o.share, "seed": o.seed, "dir": o.dir, "delay_s": o.delay_s}

    return FaultyRay


def _first(root: Path, data: dict, fault: str) -> bool:
    """Whether this is the shard's first attempt (its marker made now, holding `fault`)."""
    path = root / f"{data['run_id']}-{data['round']}-{data['slot']}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(fault)
    return True


class _Lazy:
    """A registry entry that builds `FaultyRay` on first use."""

    Options = FaultOptions

    def __call__(self, cfg, opts):
        return _ray_backend()(cfg, opts)


def injected_markers(root: Path) -> dict:
    """`{(round, slot): fault}` of the faults `faulty_ray` actors injected under `root`."""
    out = {}
    for p in Path(root).iterdir():
        _, round_, slot = p.name.rsplit("-", 2)
        out[(int(round_), int(slot))] = p.read_text()
    return out


def register() -> None:
    BACKENDS.register("faulty_local", FaultyLocal)
    BACKENDS.register("faulty_ray", _Lazy())

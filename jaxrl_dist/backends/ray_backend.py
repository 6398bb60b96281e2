"""Ray backend: one persistent actor per slot, spread over a Ray cluster's nodes.

`backend.address` joins a running cluster (`"auto"`, `"host:port"`,
`"ray://host:port"`); left null, the backend starts a single-node runtime
bound to a loopback address and shuts it down on `close()`. A runtime that
was already initialised in this process is reused and left running.

Slot `s` runs on its own actor (`ShardActor`, a `shard.ShardWorker`), made
the first time a round needs `s`; a round's new actors start together, so
their imports and compiles overlap. An envpool slot's C++ state stays on its
actor across rounds.

Ray carries only opaque bytes in the `wire` format, never pickled objects of
ours: each round the params are packed once; up to `INLINE_BYTES` they go
inside each shard's call (a round trip through the object store costs more
than the copy), larger ones are put in the object store once (every shard
gets the same reference). Each shard gets its own request (spec,
slot, key, the slot's state for gymnax) and answers with a response body the
driver checks against the learner's templates. The actor checks the request
against its own program's templates the same way.

A shard that raises, or has not answered after `backend.shard_timeout`
seconds, is run again with the same keys under the backends' retry policy
(`retry.py`: up to `backend.max_retries` times, after a backoff);
an actor that died (or timed out, and is killed) is replaced for its slot
(an envpool slot's episodes restart there: the shard reports `reset`). A
round whose shard still fails raises `BackendError` naming the slot.

Before the first round the backend checks that the cluster can hold every
actor the run may need at once (the trainer's most shards x `backend.num_cpus`,
and `backend.memory_mb` when set), node by node, and fails at once with one
line naming the keys to change. A shard's timeout counts from when its actor
is ready (it answers a ping once placed and its process is up, then compiles
the run's rollout); an actor not placed within `start_timeout_s` is reported
as pending, with the CPUs the cluster has free, and is not waited on again when
the cluster has no room for it.

With `backend.keep_actors` (the CLI sets it for a multirun's jobs) `close()` leaves
the runtime and the actors up, and the next run of the process with the same actor
size takes them over slot by slot: JAX is imported there already, and a run with
the same spec finds its rollout compiled (a new spec compiles in the start-up, as
on a new actor). An envpool slot's envs restart for the new run (its run id differs).
"""
from __future__ import annotations

import ipaddress
import math
import os
import socket
import time
import warnings
from typing import List, NamedTuple, Optional

import numpy as np
import ray

from jaxrl_dist.backends import (BackendError, Capabilities, RoundStats, Job, RoundResult, ShardInfo, ShardTask,
                                 SlotTable, Stacker, bucket)
from jaxrl_dist.backends import wire
from jaxrl_dist.backends.retry import Failure, RetryPolicy
from jaxrl_dist.backends.shard import ShardSpec, ShardWorker, slot_init_key
from jaxrl_dist.config import ConfigError
from jaxrl_dist.platform import logs_through_logging, quiet_ray_start, unrolled_threefry, use_unrolled_threefry

LOOPBACK_IP = "127.0.0.2"  # Ray rewrites 127.0.0.1 to the host's interface address
MAX_BODY = 1 << 31
START_TIMEOUT_S = 60.0  # an actor not started after this long (or shard_timeout, if longer) is pending
MB = 1 << 20
_KEPT: dict = {}  # `RayBackend._pool_key()` -> {slot: actor}: actors kept warm for this process's next run
INLINE_BYTES = 100 * 1024  # Ray's own limit for passing an argument inside the call (`max_direct_call_object_size`)


class ActorSize(NamedTuple):
    """What one actor reserves on its node."""

    num_cpus: float
    memory: float = 0.0  # bytes; 0: none reserved

    @classmethod
    def of(cls, cfg) -> "ActorSize":
        return cls(float(cfg.num_cpus), float(cfg.memory_mb or 0) * MB)


def actors_fit(nodes: list, size: ActorSize) -> float:
    """How many actors of `size` the nodes (their resource dicts, as `ray.nodes()`
    reports them) hold at once: an actor lives on one node, so each node counts alone."""
    total = 0.0
    for res in nodes:
        caps = [res.get("CPU", 0.0) / size.num_cpus] if size.num_cpus > 0 else []
        if size.memory:
            caps.append(res.get("memory", 0.0) / size.memory)
        if not caps:  # nothing reserved: any number fits
            return math.inf
        total += math.floor(min(caps) + 1e-9)
    return total


def resource_error(nodes: list, size: ActorSize, n: int, key: str) -> Optional[str]:
    """One line naming the keys when `n` actors of `size` do not fit on `nodes`; else None."""
    fit = actors_fit(nodes, size)
    if fit >= n:
        return None
    needs, lower = [], []
    if size.num_cpus > 0:
        cpus = sum(r.get("CPU", 0.0) for r in nodes)
        needs.append(f"backend.num_cpus={size.num_cpus:g} x {n} shards needs {n * size.num_cpus:g} CPUs; "
                     f"the Ray cluster has {cpus:g}")
        lower.append("backend.num_cpus (fractions are allowed)")
    if size.memory:
        mem = sum(r.get("memory", 0.0) for r in nodes) / MB
        needs.append(f"backend.memory_mb={size.memory / MB:g} x {n} shards needs {n * size.memory / MB:g} MB; "
                     f"the Ray cluster has {mem:.0f} MB")
        lower.append("backend.memory_mb")
    return (f"{'; '.join(needs)} (its {len(nodes)} node(s) hold {fit:g} such actors at once): "
            f"lower {' or '.join(lower)} or {key}")


def _one_line(err: BaseException) -> str:
    """A failure as one short line (Ray's task errors carry the remote traceback)."""
    cause = getattr(err, "cause", None)
    if type(cause) is RuntimeError:  # raised by `ShardActor.run`: the line is the message
        return " ".join(str(cause).split())[:400]
    if isinstance(cause, BaseException):
        err = cause
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"


def on_this_host(address: Optional[str]) -> bool:
    """Whether every node of the cluster at `address` runs on this machine: a runtime
    the backend starts (None), or a cluster addressed on loopback (127.0.0.0/8)."""
    if not address:
        return True
    host = address.split("://", 1)[-1].rsplit(":", 1)[0]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name ("auto", a host name): its nodes may be anywhere
        return host == "localhost"


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """The cluster's head answers at `address` ("host:port", "ray://host:port"): where
    nothing listens, `ray.init` retries for minutes before it gives up."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return  # "auto": Ray looks the cluster up itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise BackendError(f"ray: cannot join the cluster at {address}: nothing answers at {host}:{port} "
                           f"({err.strerror or type(err).__name__}): start its head node (`ray start --head`) or fix the address") from None


def settle_jax() -> None:
    """Wait for the computations this process's JAX has in flight, before `ray.init`.

    Ray starts its runtime's processes with a `preexec_fn`, so CPython forks with
    `fork()` and the process's fork handlers run. OpenBLAS's (the LAPACK that XLA:CPU's
    QR calls, as the orthogonal initialisers do) stops its worker threads; a QR running
    on XLA's threads at that moment waits forever, spinning, for work it handed them,
    and the process's later dispatches block behind it. A large enough matrix
    splits over those threads (Knapsack's 150-wide first layer does, CartPole's 4-wide
    one does not), and the learner's params are still being initialised when the
    backend starts. The wait covers every computation with a live result."""
    import sys

    jax = sys.modules.get("jax")
    if jax is None:
        return
    platforms = {jax.default_backend(), "cpu"}
    arrays = [a for platform in platforms for a in jax.live_arrays(platform)]
    jax.block_until_ready([a for a in arrays if not a.is_deleted()])


def _actor_setup(same_host: bool) -> dict:
    """What an actor process sets before its JAX starts: CPU only, the driver's
    XLA flags (less its CPU device count: an actor runs one shard on one
    device), its threefry lowering and, on the driver's own host, its
    persistent compile cache."""
    import sys

    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if "xla_force_host_platform_device_count" not in f]
    setup = {"env": {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(flags)}, "config": {},
             "unrolled_threefry": unrolled_threefry()}
    jax = sys.modules.get("jax")
    if same_host and jax is not None and jax.config.jax_compilation_cache_dir:
        setup["config"] = {name: getattr(jax.config, name) for name in (
            "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")}
    return setup


class ShardActor:
    """The worker side: a `ShardWorker` behind bytes in, bytes out."""

    def __init__(self, setup: dict):
        # Ray passes the driver's setup as plain data; this process has not started JAX yet
        os.environ.update(setup["env"])
        import jax

        jax.config.update("jax_platforms", "cpu")
        for name, value in setup["config"].items():
            jax.config.update(name, value)
        if setup.get("unrolled_threefry"):
            use_unrolled_threefry()
        ctx = ray.get_runtime_context()
        self.name = (f"{ray.util.get_node_ip_address()}/node-{ctx.get_node_id()[:12]}"
                     f"/actor-{ctx.get_actor_id()[:12]}")
        self.worker = ShardWorker(self.name)

    def warm(self, spec_dict: dict) -> str:
        """Compile the run's rollout before the first shard, so a shard's timeout
        (counted from this call's answer) never includes a new actor's compile. A
        stateless spec only: a sticky one's rollout would step the slot's envs."""
        import jax

        try:
            spec = ShardSpec.from_dict(spec_dict)
            if spec.sticky:
                return self.name
            prog = self.worker.program(spec)
            params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), prog.params_template())
            jax.block_until_ready(prog.run_one(params, prog.init_slot(slot_init_key(0, 0)),
                                               np.zeros(2, np.uint32)))
        except Exception:  # noqa: BLE001 - the first shard meets the same error and reports it
            pass
        return self.name

    def ping(self) -> str:
        return self.name

    def run(self, params_body: bytes, request_body: bytes) -> bytes:
        """Decode (and check) a shard request plus the round's params, run it, encode the reply.

        A failure goes back as a builtin `RuntimeError` carrying one line, so
        the driver unpickles none of this package's types.
        """
        try:
            return self._run(params_body, request_body)
        except Exception as err:
            line = " ".join(str(err).split())[:300]
            raise RuntimeError(f"{type(err).__name__}: {line}") from None

    def _run(self, params_body: bytes, request_body: bytes) -> bytes:
        received = time.time()
        spec, data = wire.decode_request_head(request_body, False, MAX_BODY)
        data["params"] = wire.decode_params(params_body, MAX_BODY)
        req = wire.decode_request_for(self.worker, spec, data)
        out, timings, reset = self.worker.run(spec, req.params, req.actor, req.key, req.slot,
                                              req.run_id, req.seed, received)
        return wire.encode_response(req.slot, out, timings, reset, self.name)


class Startup:
    """An actor's start, in two answers: its ping (placed on a node, its process up)
    and its warm-up (the run's rollout compiled: ready for shards), with when each
    was seen (`perf_counter`). A failed answer counts as seen: the shard reports it."""

    def __init__(self, ping, warm):
        self.refs = {"placed": ping, "ready": warm}
        self.at: dict = {}

    def seen(self, stage: str) -> Optional[float]:
        if stage not in self.at and ray.wait([self.refs[stage]], timeout=0)[0]:
            self.at[stage] = time.perf_counter()
        return self.at.get(stage)

    def waiting(self) -> dict:
        """Ref -> stage, for the answers not seen yet."""
        return {ref: stage for stage, ref in self.refs.items() if stage not in self.at}


class RayBackend:
    name = "ray"
    capabilities = Capabilities(warms=True, prepares=True)
    actor_class = ShardActor  # what each slot's actor runs (a subclass may override)
    start_timeout_s = START_TIMEOUT_S

    def __init__(self, cfg):
        self.cfg = cfg
        self.retry = RetryPolicy.from_config(cfg)
        self._actors: dict = {}  # slot -> actor handle
        self._life: dict = {}  # slot -> its actor's `Startup`
        self.size = ActorSize.of(cfg)
        self._owns_runtime = False
        self.job: Optional[Job] = None

    # -- lifecycle ---------------------------------------------------------

    def start(self, job: Job) -> None:
        self.job = job
        self._templates = wire.output_templates(job.program)
        self._connect()
        self._check_resources(job.max_shards or self.cfg.max_shards, job.shards_key)
        self._remote = ray.remote(self.actor_class)
        self._setup = _actor_setup(same_host=on_this_host(self.cfg.address))
        self._spec = job.spec.to_dict()  # plain data: each actor compiles it as it starts
        self._encoder = wire.RequestEncoder(None, False)  # the params go apart (`encode_params`)
        self._ahead: dict = {}  # slot -> (the table's data it was packed from, the packed state)

    def _check_resources(self, n: int, key: str) -> None:
        """`ConfigError` (one line) when `n` actors cannot all be placed at once."""
        nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        line = resource_error(nodes, self.size, n, key)
        if line is not None:
            self.close()  # a runtime this backend started goes with it
            raise ConfigError(line)

    def _connect(self) -> None:
        if ray.is_initialized():
            return
        cfg = self.cfg
        settle_jax()  # no QR of ours may be running when Ray forks its processes
        logs_through_logging("ray")  # its start-up warnings: above the progress bar, and in the job log
        with warnings.catch_warnings():
            # JAX warns about fork; Ray's fork is a subprocess's fork + exec
            warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
            if cfg.address:
                warnings.filterwarnings("ignore", "Ray Client connection timed out", UserWarning)  # said below
                check_reachable(cfg.address)
                try:
                    ray.init(address=cfg.address, logging_level="warning")
                except (ConnectionError, RuntimeError, ray.exceptions.RayError) as err:
                    # `ray start` turns token authentication on (Ray >= 2.5x), and a process without
                    # RAY_AUTH_MODE=token times out or is refused without saying why
                    hint = ("" if os.environ.get("RAY_AUTH_MODE") else " (a cluster started with token "
                            "authentication, `ray start`'s default, is joined with RAY_AUTH_MODE=token and its "
                            "token: ~/.ray/auth_token on its host, else RAY_AUTH_TOKEN)")
                    raise BackendError(f"ray: cannot join the cluster at {cfg.address}: {_one_line(err)}{hint}") from err
            else:
                quiet_ray_start()
                cpus = max(os.cpu_count() or 1, math.ceil(cfg.max_shards * cfg.num_cpus - 1e-9))
                # "local": a new runtime, never one that `ray start` or RAY_ADDRESS names;
                # actors at the driver's priority (Ray's default niceness 15 starves
                # them whenever anything else wants the CPUs)
                ray.init(address="local", _node_ip_address=LOOPBACK_IP, include_dashboard=False,
                         num_cpus=cpus, logging_level="warning",
                         _system_config={"worker_niceness": 0})
        self._owns_runtime = True

    def close(self) -> None:
        if self.cfg.keep_actors and self._actors and ray.is_initialized():
            # warm for the next run of this process; Ray ends them with it (they are not detached)
            _KEPT.setdefault(self._pool_key(), {}).update(self._actors)
        elif ray.is_initialized():
            for actor in self._actors.values():
                ray.kill(actor, no_restart=True)
            if self._owns_runtime:
                ray.shutdown()
        self._actors.clear()
        self._life.clear()
        self._owns_runtime = False

    def _pool_key(self) -> tuple:
        """What a kept actor must share with the run that takes it over: the runtime, its
        size and its process set-up (the run's spec it compiles when taken over)."""
        return (ray.get_runtime_context().gcs_address, self.size, repr(sorted(self._setup.items())))

    # -- actors ------------------------------------------------------------

    def _new_actor(self, slot: int, reuse: bool = True):
        """Slot `slot`'s actor: one an earlier run of this process kept (`keep_actors`), or
        a new one; either compiles this run's rollout before its first shard."""
        actor = _KEPT.get(self._pool_key(), {}).pop(slot, None) if reuse else None
        if actor is None:
            memory = {"memory": int(self.size.memory)} if self.size.memory else {}
            actor = self._remote.options(num_cpus=self.size.num_cpus, scheduling_strategy="SPREAD",
                                         max_restarts=0, max_task_retries=0, **memory).remote(self._setup)
        self._actors[slot] = actor
        self._life[slot] = Startup(actor.ping.remote(), actor.warm.remote(self._spec))
        return actor

    def started(self, slot: int) -> Optional[float]:
        """When slot `slot`'s actor was seen ready for shards (`perf_counter`); None while
        it is pending or compiling."""
        life = self._life.get(slot)
        return None if life is None else life.seen("ready")

    def placed(self, slot: int) -> Optional[float]:
        """When slot `slot`'s actor was seen running (placed, its process up); None while pending."""
        life = self._life.get(slot)
        return None if life is None else life.seen("placed")

    def pending_line(self, slot: int, waited: float) -> tuple:
        """`(one line, whether the cluster has room for it now)` for an actor not started."""
        free, total = ray.available_resources(), ray.cluster_resources()
        room = actors_fit([free], self.size) >= 1
        size = f"backend.num_cpus={self.size.num_cpus:g}" + (
            f", backend.memory_mb={self.size.memory / MB:g}" if self.size.memory else "")
        return (f"the actor for slot {slot} is pending: not started after {waited:.0f} s ({size}; "
                f"the Ray cluster has {free.get('CPU', 0.0):g} of {total.get('CPU', 0.0):g} CPUs free)"), room

    def _actor(self, slot: int):
        actor = self._actors.get(slot)
        return actor if actor is not None else self._new_actor(slot)

    def _replace(self, slot: int):
        old = self._actors.pop(slot, None)
        if old is not None:
            ray.kill(old, no_restart=True)
        return self._new_actor(slot, reuse=False)

    def actors(self) -> dict:
        """Slot -> actor handle of the actors made so far."""
        return dict(self._actors)

    # -- rounds ------------------------------------------------------------

    def warm(self, tasks: List[ShardTask], params, table: Optional[SlotTable]) -> None:
        """Start the actors of `tasks`' slots side by side and wait until each has
        compiled the run's rollout (at most `start_timeout_s`, or `backend.shard_timeout`
        if longer); one that is not ready by then is left to the first round, which
        waits for it and reports it."""
        for t in tasks:  # new actors start side by side (imports, compiles)
            self._actor(t.slot)
        lives = [self._life[t.slot] for t in tasks]
        refs = [life.refs["ready"] for life in lives]
        ray.wait(refs, num_returns=len(refs), timeout=max(self.cfg.shard_timeout, self.start_timeout_s))
        for life in lives:  # their answers start the shards' clocks
            life.seen("placed")
            life.seen("ready")

    def prepare(self, slots: List[int], table: Optional[SlotTable]) -> None:
        """Pack these slots' states for the next round's requests (most of their encoding)
        now, while the learner's update runs; a round whose table has changed since packs
        them again."""
        if table is not None:
            self._ahead = {s: (table.data, wire.pack_actor(table.get(s))) for s in slots}

    def _actor_state(self, slot: int, table: Optional[SlotTable]):
        """Slot `slot`'s state for its request: packed ahead (`prepare`) when still current."""
        if table is None:
            return None
        data, packed = self._ahead.pop(slot, (None, None))  # a one-shard table (async) has no `data`
        return packed if packed is not None and data is getattr(table, "data", None) else table.get(slot)

    def run_round(self, round_: int, params, tasks: List[ShardTask],
                  table: Optional[SlotTable]) -> RoundResult:
        job, t0 = self.job, time.perf_counter()
        for t in tasks:  # new actors start side by side (imports, compiles)
            self._actor(t.slot)
        params_body = wire.encode_params(params)
        rnd = _Round(self, tasks, params_body)
        for i, t in enumerate(tasks):  # each shard goes as soon as its request is encoded
            actor = None if job.spec.sticky else self._actor_state(t.slot, table)
            rnd.bodies[i] = self._encoder.encode(wire.ShardRequest(
                job.spec, t.slot, t.key, None, actor, job.run_id, job.seed, round_))
            rnd.submit(i)
        self._ahead.clear()
        t1 = time.perf_counter()
        rnd.gather()  # each answer is decoded and stacked as it comes
        t2 = time.perf_counter()
        if not job.spec.sticky:
            table.put([t.slot for t in tasks], [r.output.actor for r in rnd.replies])
        shards = [ShardInfo(t.slot, r.timings, r.reset, rnd.tries[i], r.worker)
                  for i, (t, r) in enumerate(zip(tasks, rnd.replies))]
        stats = RoundStats(t1 - t0, rnd.transfer, t2 - t1 - rnd.transfer - rnd.stack, rnd.sent, rnd.received,
                           rnd.stack + time.perf_counter() - t2)
        return RoundResult(*rnd.stacker.result(), shards, stats)


class _Round:
    """One round's shards in flight on the Ray backend: submitted, answered, failed
    (retried under the backend's policy, a dead actor replaced) or timed out."""

    def __init__(self, backend: RayBackend, tasks: List[ShardTask], params_body: bytes):
        self.backend, self.tasks = backend, tasks
        # small params go inline with each call (Ray copies arguments this small into the
        # call itself); larger ones once into the object store, every shard getting its ref
        inline = len(params_body) <= INLINE_BYTES
        self.params_arg = params_body if inline else ray.put(params_body)
        self.params_cost = len(params_body) if inline else 0  # bytes each call carries
        n = len(tasks)
        self.bodies, self.replies, self.tries = [None] * n, [None] * n, [0] * n
        self.pending, self.submitted = {}, {}  # ref -> task index; task index -> when it went
        self.later = {}  # task index -> when it goes again (a failed shard waiting out its backoff)
        self.sent, self.received = 0 if inline else len(params_body), 0
        self.transfer = 0.0  # driver time decoding results (encoding counts as dispatch)
        self.stacker, self.stack = Stacker(bucket(n, backend.cfg.max_shards)), 0.0  # and stacking them

    def submit(self, i: int) -> None:
        ref = self.backend._actor(self.tasks[i].slot).run.remote(self.params_arg, self.bodies[i])
        self.pending[ref] = i
        self.submitted[i] = time.perf_counter()
        self.sent += len(self.bodies[i]) + self.params_cost

    def due(self, i: int, now: float) -> float:
        """When shard `i` is next looked at: its timeout counts from when it went or
        its actor started, whichever is later; a pending actor is looked at often."""
        backend, went = self.backend, self.submitted[i]
        timeout = backend.cfg.shard_timeout
        slot, limit = self.tasks[i].slot, max(timeout, backend.start_timeout_s)
        up = backend.started(slot)
        if up is not None:
            return max(went, up) + timeout
        placed = backend.placed(slot)  # compiling: bounded from when it was placed
        return min((went if placed is None else max(went, placed)) + limit, now + 0.25)

    def failed(self, i: int, why: str, dead: bool, retryable: bool = True) -> None:
        """The retry policy decides, as for every backend; the wait is served by the
        polling loop, so the other shards' answers are taken meanwhile."""
        slot, error, retry = self.tasks[i].slot, Failure(why, retryable), self.backend.retry
        if not retry.allows(self.tries[i] + 1, error):
            count = f"{self.tries[i] + 1} {'try' if self.tries[i] == 0 else 'tries'}"
            raise BackendError(f"ray shard for slot {slot} failed after {count}: {why}")
        self.tries[i] += 1
        if dead:  # the replacement starts during the wait
            self.backend._replace(slot)
        self.later[i] = time.perf_counter() + retry.wait_s(self.tries[i], error)

    def _submit_due(self) -> Optional[float]:
        """Submit the shards whose wait is over; seconds to the next event (None: none)."""
        now = time.perf_counter()
        for i in [i for i, due in self.later.items() if due <= now]:
            del self.later[i]
            self.submit(i)
        times = [self.due(i, now) for i in self.pending.values()] + list(self.later.values())
        return max(0.0, min(times) - now) if times else None

    def gather(self) -> None:
        """Poll until every shard has answered (or the policy gives up on one)."""
        while (wait := self._submit_due()) is not None:
            refs = list(self.pending)
            if not refs:  # every shard left is waiting out its backoff
                time.sleep(wait)
                continue
            starting = self._starting()  # their answers start their shards' clocks
            ready, _ = ray.wait(refs + list(starting), num_returns=1, timeout=wait)
            for ref in ready:
                if ref in starting:
                    starting[ref][0].seen(starting[ref][1])
                else:
                    self._take(ref)
            self._expire()

    def _starting(self) -> dict:
        """Ref -> (`Startup`, stage), for the start answers of the pending shards' actors
        not seen yet."""
        lives = [self.backend._life.get(self.tasks[i].slot) for i in self.pending.values()]
        return {ref: (life, stage) for life in lives if life is not None
                for ref, stage in life.waiting().items()}

    def _take(self, ref) -> None:
        i = self.pending.pop(ref)
        try:
            body = ray.get(ref)
        except ray.exceptions.RayActorError as err:
            return self.failed(i, _one_line(err), dead=True)
        except ray.exceptions.RayError as err:
            return self.failed(i, _one_line(err), dead=False)
        td = time.perf_counter()
        try:
            reply = wire.decode_response(body, False, self.backend._templates)
            if reply.slot != self.tasks[i].slot:
                raise wire.ShardError(f"slot: expected {self.tasks[i].slot}, got {reply.slot}")
        except wire.ShardError as err:
            return self.failed(i, f"bad response: {err}", dead=False)
        finally:
            self.transfer += time.perf_counter() - td
        self.replies[i], self.received = reply, self.received + len(body)
        ts = time.perf_counter()
        self.stacker.put(i, reply.output)
        self.stack += time.perf_counter() - ts

    def _expire(self) -> None:
        now, backend = time.perf_counter(), self.backend
        for ref, i in list(self.pending.items()):
            if self.due(i, now) > now:
                continue
            del self.pending[ref]  # its actor is killed; a late answer is dropped
            slot = self.tasks[i].slot
            if backend.started(slot) is not None:
                self.failed(i, f"no answer after {backend.cfg.shard_timeout:g} s", dead=True)
            elif backend.placed(slot) is not None:
                waited = now - max(self.submitted[i], backend.placed(slot))
                self.failed(i, f"the actor for slot {slot} did not finish starting (importing, "
                               f"compiling) in {waited:.0f} s", dead=True)
            else:  # never placed: a new actor helps only if the cluster has room for one
                line, room = backend.pending_line(slot, now - self.submitted[i])
                self.failed(i, line, dead=True, retryable=room)

"""Seconds a process spends making JAX programs, read from JAX's own monitoring events.

The fused trainer compiles its chunk ahead of time and times that call. The round
and async trainers cannot: their programs (the learner's update, the local shards'
rollouts, the round keys) compile on first use, in the first rounds and in several
threads at once. JAX reports every trace, lowering and backend compile as a duration
event, so summing those events while the trainer is built and runs gives the compile
seconds of this process, whichever thread compiled. Concurrent compiles add up, so
the figure can exceed the wall time they took. Workers of the ray and http backends
compile in their own processes: their compiles show in the first rounds' shard
times, not here.
"""
from __future__ import annotations

import threading

# tracing to a jaxpr, lowering to MLIR, and XLA's compile (a persistent-cache hit
# replaces the last with a load, which is what it then costs)
COMPILE_EVENTS = frozenset({
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
})


class CompileClock:
    """A context manager that sums JAX's compile-event durations (`.seconds`) while open."""

    def __init__(self):
        self.seconds = 0.0
        self._lock = threading.Lock()

    def __call__(self, event: str, duration: float, **_metadata) -> None:
        if event in COMPILE_EVENTS:
            with self._lock:
                self.seconds += duration

    def __enter__(self) -> "CompileClock":
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc) -> None:
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self)

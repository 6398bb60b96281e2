"""The discrete-event model of sync and async training (`tools.simulate`):
its invariants, figures worked out by hand, and a calibration that finds the
parameters simulated data was made with."""
from __future__ import annotations

import math

import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxrl_dist.tools.simulate import (Machine, Measured, Point, SharedCores, Workload, calibrate,
                                       simulate, update_seconds)

EXACT = Machine(compute_s=0.004, update_s_per_chunk=0.0025, update_s_fixed=3e-4, compute_cv=0.0, update_cv=0.0)
FEW = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def test_shared_cores_share_by_hand():
    """Processor sharing: two 1 s jobs on one core end together at 2 s; a job that
    joins half-way slows the first one down from then on."""
    env = simpy.Environment()
    cpu = SharedCores(env, 1.0)
    ends = {}

    def job(name, at, work):
        yield env.timeout(at)
        yield cpu.run(work)
        ends[name] = env.now

    for name, at in (("a", 0.0), ("b", 0.5)):
        env.process(job(name, at, 1.0))
    env.run()
    assert ends == pytest.approx({"a": 1.5, "b": 2.0})
    env, ends = simpy.Environment(), {}
    cpu = SharedCores(env, 2.0)
    for name in "xyz":
        env.process(job(name, 0.0, 1.0))
    env.run()
    assert ends == pytest.approx({k: 1.5 for k in "xyz"})  # 3 jobs on 2 cores: 2/3 of a core each


def test_sync_one_actor_without_latency_is_compute_plus_update():
    w = Workload(mode="sync", actors=1, updates=20, steps_per_chunk=512)
    r = simulate(w, EXACT)
    period = EXACT.compute_s + update_seconds(EXACT, 1)
    assert r.env_steps_per_s == pytest.approx(512 / period, rel=1e-9)
    assert r.updates_per_s == pytest.approx(1 / period, rel=1e-9)
    assert r.learner_idle == pytest.approx(EXACT.compute_s / period, rel=1e-9)
    assert (r.staleness_max, r.dropped) == (0, 0)


def test_sync_round_waits_for_latency_and_overhead_both_ways():
    m = EXACT._replace(overhead_s=0.002)
    w = Workload(mode="sync", actors=4, latency_s=0.01, updates=20)
    period = 0.002 + 2 * 0.01 + m.compute_s + update_seconds(m, 4)
    assert simulate(w, m).env_steps_per_s == pytest.approx(4 * 512 / period, rel=1e-9)


def test_learner_side_overheads_by_hand():
    """The round trainer's own work adds to every round; an async actor's own work per
    chunk adds to its cycle but not to the request's round trip."""
    m = EXACT._replace(overhead_s=0.002, round_overhead_s=0.005, chunk_overhead_s=0.003)
    w = Workload(mode="sync", actors=4, latency_s=0.01, updates=20)
    period = 0.002 + 2 * 0.01 + m.compute_s + 0.005 + update_seconds(m, 4)
    assert simulate(w, m).env_steps_per_s == pytest.approx(4 * 512 / period, rel=1e-9)
    one = Workload(mode="async", actors=1, batch_chunks=1, max_staleness=4, latency_s=0.01, updates=20)
    r = simulate(one, m)
    trip = 0.002 + 2 * 0.01 + m.compute_s
    assert r.chunk_roundtrip_s_median == pytest.approx(trip, rel=1e-9)
    assert r.env_steps_per_s == pytest.approx(512 / (trip + 0.003), rel=1e-9)  # one actor sets the pace


def test_async_with_many_actors_runs_at_the_learners_rate():
    w = Workload(mode="async", actors=32, batch_chunks=4, max_staleness=2, latency_s=0.002, updates=80)
    r = simulate(w, EXACT)
    assert r.updates_per_s == pytest.approx(1 / update_seconds(EXACT, 4), rel=1e-9)
    assert r.env_steps_per_s == pytest.approx(4 * 512 / update_seconds(EXACT, 4), rel=1e-9)
    assert r.learner_idle < 1e-9 and r.staleness_max <= 2


@pytest.mark.parametrize("cores", [None, 2.0])
def test_async_at_staleness_zero_is_the_sync_round(cores):
    """As in the trainers: with `K` actors and staleness 0 every version's `K` chunks
    start together once it is published, so the pipeline is the round, draw for draw."""
    w = Workload(mode="sync", actors=4, batch_chunks=4, latency_s=0.02, jitter_s=0.01, straggler_share=0.2,
                 straggler_factor=5.0, updates=20)
    m = Machine(compute_cv=0.3, update_cv=0.1, overhead_s=1e-3, cores=cores)
    sync, asyn = simulate(w, m), simulate(w._replace(mode="async", max_staleness=0), m)
    assert asyn.wall_s == pytest.approx(sync.wall_s, rel=1e-12)
    assert asyn.env_steps_per_s == pytest.approx(sync.env_steps_per_s, rel=1e-12)


@pytest.mark.parametrize("S", [0, 1, 4])
def test_the_staleness_bound_caps_async_at_s_plus_one_versions_a_round_trip(S):
    """With a long round trip the gate, not the actors or the learner, sets the pace:
    `(S + 1) * K` chunks may be under way ahead of the published version, and a
    version is published a round trip plus an update after its chunks started
    (the updates come in bursts of `S + 1`, so a window not a whole number of
    bursts long is off by a little)."""
    w = Workload(mode="async", actors=32, batch_chunks=4, max_staleness=S, latency_s=0.05, updates=60)
    r = simulate(w, EXACT)
    trip = 2 * 0.05 + EXACT.compute_s
    assert r.updates_per_s == pytest.approx((S + 1) / (trip + update_seconds(EXACT, 4)), rel=0.02)


@FEW
@given(S=st.integers(0, 3), K=st.integers(1, 6), actors=st.integers(1, 10), lat=st.floats(0.0, 0.05),
       share=st.floats(0.0, 0.5), factor=st.floats(1.0, 10.0), balance=st.booleans(), seed=st.integers(0, 99),
       cores=st.sampled_from([None, 1.0, 2.0]))
def test_staleness_never_exceeds_the_bound(S, K, actors, lat, share, factor, balance, seed, cores):
    w = Workload(mode="async", actors=actors, batch_chunks=K, max_staleness=S, latency_s=lat, jitter_s=lat / 2,
                 straggler_share=share, straggler_factor=factor, balance=balance, max_actors=10, balance_every=2,
                 updates=24)
    r = simulate(w, EXACT._replace(compute_cv=0.5, cores=cores), seed)
    assert 0 <= r.staleness_mean <= r.staleness_max <= S
    assert r.env_steps_per_s > 0 and 0.0 <= r.learner_idle <= 1.0


@FEW
@given(lat=st.floats(0.0, 0.05), more=st.floats(0.0, 0.05), jitter=st.floats(0.0, 0.02),
       share=st.floats(0.0, 0.3), actors=st.integers(1, 8), seed=st.integers(0, 99))
def test_more_latency_never_raises_sync_throughput(lat, more, jitter, share, actors, seed):
    w = Workload(mode="sync", actors=actors, latency_s=lat, jitter_s=jitter, straggler_share=share,
                 straggler_factor=4.0, updates=12)
    m = EXACT._replace(compute_cv=0.3, update_cv=0.1, overhead_s=1e-3)
    slower = simulate(w._replace(latency_s=lat + more), m, seed)
    assert slower.env_steps_per_s <= simulate(w, m, seed).env_steps_per_s * (1 + 1e-12)


def test_a_run_is_determined_by_its_seed():
    w = Workload(mode="async", actors=6, latency_s=0.02, jitter_s=0.01, straggler_share=0.2,
                 straggler_factor=5.0, balance=True, max_actors=8, updates=40)
    m = Machine(cores=2.0, overhead_s=1e-3)
    assert simulate(w, m, 3) == simulate(w, m, 3)
    assert simulate(w, m, 3) != simulate(w, m, 4)


def test_injected_stragglers_slow_a_batched_sync_round():
    """The local backend's round is one call: with one slot in 4 slowed 3x, every round
    after the first waits for 3x the call (`trainers.sync.straggle`)."""
    w = Workload(mode="sync", actors=4, batched=True, slowdown=3.0, slow_every=4, updates=10)
    r = simulate(w, EXACT)
    period = 3 * 4 * EXACT.compute_s + update_seconds(EXACT, 4)
    assert r.env_steps_per_s == pytest.approx(4 * 512 / period, rel=1e-9)


@pytest.mark.parametrize("field, value, word", [("mode", "rounds", "mode"), ("actors", 0, "actors"),
                                                ("straggler_share", 1.5, "straggler_share"),
                                                ("latency_s", -0.01, "latency_s"), ("jitter_s", float("nan"), "jitter_s"),
                                                ("slowdown", 0.5, "slowdown")])
def test_bad_workloads_are_named(field, value, word):
    with pytest.raises(ValueError, match=word):
        simulate(Workload(**{field: value}), Machine())


def test_calibration_recovers_the_parameters_of_simulated_runs():
    """Data made with a known per-request overhead and share of cores (another seed,
    so the draws differ), fitted from a wrong start."""
    true = Machine(compute_s=0.004, overhead_s=0.003, cores=1.6)
    works = [Workload(mode=mode, actors=4, latency_s=lat, jitter_s=lat / 4, updates=30)
             for mode, lat in (("sync", 0.0), ("async", 0.0), ("async", 0.02))]
    points = []
    for i, w in enumerate(works):
        r = simulate(w, true, seed=7)
        points.append(Point(str(i), w, Measured(r.env_steps_per_s, r.chunk_compute_s_median,
                                                r.chunk_roundtrip_s_median, r.update_s_median)))
    fit = calibrate(points, true._replace(overhead_s=0.001, cores=2.5), ("overhead_s", "cores"), max_evals=40)
    assert fit.machine.overhead_s == pytest.approx(0.003, rel=0.1)
    assert fit.machine.cores == pytest.approx(1.6, rel=0.1)
    assert math.isfinite(fit.loss) and fit.evaluations <= 45


def test_the_bench_reads_remote_runs_with_optional_fields_missing(tmp_path):
    """`bench/simulate.py`'s loader: seeds of one setting make one point, a missing
    optional figure is None (not an error), and the split follows the latency."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    try:
        spec = importlib.util.spec_from_file_location("bench_simulate", bench / "simulate.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(bench))
    base = {"mode": "async", "max_staleness": 2, "instances": 4, "actors_start": 8, "batch_chunks": 4,
            "latency_ms": 20.0, "jitter_ms": 5.0, "straggler_share": 0.1, "straggler_factor": 5.0,
            "steps_per_chunk": 512}
    runs = [{**base, "seed": 0, "env_steps_per_s": 100.0, "chunk_compute_s_median": 0.01, "updates": 40},
            {**base, "seed": 1, "env_steps_per_s": 120.0, "chunk_compute_s_median": None},
            {**base, "mode": "sync", "max_staleness": 0, "latency_ms": 50.0, "seed": 0, "env_steps_per_s": 50.0}]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"meta": {"args": {"max_actors": 16}}, "runs": runs}))
    points, _ = mod.load_remote(path)
    by = {t.point.work.mode: t for t in points}
    assert len(points) == 2 and by["async"].split == "held-out" and by["sync"].split == "calibration"
    asyn = by["async"].point
    assert asyn.measured.env_steps_per_s == 110.0 and asyn.measured.chunk_compute_s_median == 0.01
    assert asyn.measured.chunk_roundtrip_s_median is None and asyn.measured.update_s_median is None
    assert (asyn.work.balance, asyn.work.max_actors, asyn.work.instances, asyn.work.latency_s) == (True, 16, 4, 0.02)
    assert by["sync"].point.work.max_staleness == 0 and not by["sync"].point.work.balance

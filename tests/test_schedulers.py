"""Schedulers: each one's n sequence on hand-made histories, clipping, config
errors naming the key, round features, and one tiny local run per scheduler
whose logged shard counts follow it while compiles stay per bucket."""
from __future__ import annotations

import contextlib
import json
import logging
import math

import jax
import pytest

from jaxrl_dist.backends import bucket
from jaxrl_dist.scheduling.records import Record
from jaxrl_dist.config import BackendConfig, ConfigError, SchedulerConfig, from_dict, schema
from jaxrl_dist.scheduling.schedulers import Scheduler, make_scheduler

SHARD_STEPS = 4 * 16  # envs_per_shard * num_steps in `config`


def sched(name: str, backend_max: int = 8, **keys):
    return make_scheduler(schema("scheduler", name)(name=name, **keys), BackendConfig(max_shards=backend_max))


def returns(*values) -> list:
    """A history of round records with these returns."""
    return [Record(update=i + 1, env_steps=0, ret=v, losses={}, sps=None, episode_return_sum=(0.0,), episodes=(0.0,),
                   num_shards=1) for i, v in enumerate(values)]


def sequence(s, rounds: int, history=()) -> list:
    return [s.num_shards(r, list(history)) for r in range(rounds)]


def config(run_dir, scheduler: dict, rounds_of_steps: int = 10, **over):
    """Local backend, 4 slots of 4 envs x 16 steps; `rounds_of_steps` shards' steps in all."""
    return from_dict({
        "algo": {"total_timesteps": SHARD_STEPS * rounds_of_steps, "num_steps": 16,
                 "num_minibatches": 2, "update_epochs": 1},
        "trainer": "sync", "backend": {"name": "local", "envs_per_shard": 4, "max_shards": 4},
        "scheduler": scheduler,
        "run": {"dir": str(run_dir), "progress": False, "tensorboard": False, "compile_cache": False},
        **over,
    })


# --- n sequences -------------------------------------------------------------

def test_fixed_and_max():
    assert sequence(sched("fixed", num_shards=3), 4) == [3, 3, 3, 3]
    assert sched("fixed", num_shards=3).expected_shards() == 3.0
    assert sequence(sched("max"), 3) == [8, 8, 8]  # null: backend.max_shards
    assert sequence(sched("max", max_shards=6), 3, returns(500.0)) == [6, 6, 6]
    assert sched("max", max_shards=6).expected_shards() == 6.0


def test_ramp_adds_step_every_k_rounds_up_to_max():
    s = sched("ramp", backend_max=16, min_shards=2, max_shards=10, step=3, every=2)
    assert sequence(s, 9) == [2, 2, 5, 5, 8, 8, 10, 10, 10]  # 11 clipped to 10


def test_adapt_grows_with_the_windowed_return_ratio():
    s = sched("adapt", backend_max=16, min_shards=1, max_shards=9, min_return=0.0, max_return=100.0, window=2)
    h = returns(0.0, 50.0, None, 100.0, 150.0, -50.0)
    # ratios 0, .5, (no episode), 1, 1 (clipped), 0 (clipped); n = 1 + 8 * mean of the last two
    got = [s.num_shards(r, h[:r]) for r in range(len(h) + 1)]
    assert got == [1, 1, 3, 3, 7, 9, 5]


def test_adapt_with_running_min_max():
    s = sched("adapt", min_shards=1, max_shards=5, window=1)
    assert s.num_shards(1, returns(10.0)) == 1  # one value: no range yet
    assert s.num_shards(2, returns(10.0, 30.0)) == 5
    assert s.num_shards(3, returns(10.0, 30.0, 20.0)) == 3
    fixed_top = sched("adapt", min_shards=1, max_shards=5, max_return=100.0, window=1)
    assert fixed_top.num_shards(2, returns(150.0, 200.0)) == 5  # all above the fixed max


def test_rounding_is_half_up_and_nan_returns_are_skipped():
    s = sched("adapt", min_shards=2, max_shards=3, min_return=0.0, max_return=100.0, window=1)
    assert s.num_shards(1, returns(50.0)) == 3  # 2.5 -> 3 (Python's round gives 2)
    assert s.num_shards(2, returns(100.0, float("nan"))) == 3


def test_base_clips_to_the_bounds():
    class Wild(Scheduler):
        def propose(self, round_, history):
            return [-5, 0.4, 3.2, 100][round_]

    s = Wild(SchedulerConfig(min_shards=2, max_shards=6), BackendConfig(max_shards=8))
    assert sequence(s, 4) == [2, 2, 3, 6]


def test_expected_shards_follows_the_run(tmp_path):
    """Ramp 1, 2, 3, 4, 4 over 14 shards' steps: 5 rounds, 2.8 shards on average."""
    cfg = config(tmp_path, {"name": "ramp", "every": 1}, rounds_of_steps=14)
    s = make_scheduler(cfg.scheduler, cfg.backend, cfg)
    assert s.expected_shards() == pytest.approx(14 / 5)
    adapt = make_scheduler(SchedulerConfig(name="adapt"), cfg.backend, cfg)
    # modeled as a return rising linearly in steps, n = 1 + 3 * shards done / 14:
    # 1, 1, 1, 2 (3/14 -> 1.64), 2, 3 (7/14 -> 2.5), 3, 4: 17 shards in 8 rounds
    assert adapt.expected_shards() == pytest.approx(17 / 8)
    # without the full config: the middle of the bounds
    assert make_scheduler(cfg.scheduler, cfg.backend).expected_shards() == 2.5


# --- config errors -------------------------------------------------------------

@pytest.mark.parametrize("keys, named", [
    ({"max_shards": 0}, "scheduler.max_shards"),
    ({"min_shards": 0}, "scheduler.min_shards"),
    ({"window": 0}, "scheduler.window"),
    ({"step": 0}, "scheduler.step"),
    ({"every": 0}, "scheduler.every"),
    ({"min_shards": 5, "max_shards": 3}, "scheduler.min_shards"),
    ({"min_return": 10.0, "max_return": 5.0}, "scheduler.min_return"),
    ({"min_return": "low"}, "scheduler.min_return"),
    ({"colour": "red"}, "scheduler.colour"),
])
def test_bad_keys_are_named(keys, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        from_dict({"scheduler": {"name": "adapt", **keys}})


def test_bounds_against_the_backend_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"scheduler\.max_shards=64 exceeds backend\.max_shards=32"):
        sched("max", backend_max=32, max_shards=64)
    with pytest.raises(ConfigError, match=r"scheduler\.min_shards"):
        sched("ramp", backend_max=4, min_shards=5)
    with pytest.raises(ConfigError, match=r"scheduler\.name: unknown scheduler 'nope'"):
        sched("nope")
    from jaxrl_dist.trainers.runner import train

    with pytest.raises(ConfigError, match=r"scheduler\.max_shards"):  # before any round runs
        train(config(tmp_path / "run", {"name": "max", "max_shards": 8}))


# --- end to end -------------------------------------------------------------------

@contextlib.contextmanager
def compile_log(events: list):
    """Appends ("compile", message) to `events` for every XLA compile."""

    class Compiles(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Compiling"):
                events.append(("compile", record.getMessage()[:80]))

    handler, logger = Compiles(), logging.getLogger("jax")
    logger.addHandler(handler)
    old_level, old_propagate = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    jax.config.update("jax_log_compiles", True)
    try:
        yield
    finally:
        jax.config.update("jax_log_compiles", False)
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate


def round_spans(events: list) -> dict:
    """Compiles per round, a round running from its scheduler call to its log call."""
    spans, current = {}, None
    for kind, value in events:
        if kind == "start":
            current = value
            spans[current] = 0
        elif kind == "end":
            current = None
        elif current is not None:
            spans[current] += 1
    return spans


E2E = {
    "fixed": ({"name": "fixed", "num_shards": 3}, 12),
    "max": ({"name": "max"}, 12),
    "ramp": ({"name": "ramp", "every": 1}, 14),
    # CartPole's first returns are ~10-40: a 0..40 range makes n move within a few rounds
    "adapt": ({"name": "adapt", "min_return": 0.0, "max_return": 40.0, "window": 1}, 12),
}


# max and ramp follow the same path as fixed and adapt (the schedulers' own tests check
# their choices): they run with `-m slow`, to keep the default suite in its time
@pytest.mark.parametrize("name", [n if n in ("fixed", "adapt") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in E2E])
def test_local_run_follows_the_scheduler(name, tmp_path, monkeypatch):
    import jaxrl_dist.trainers.sync as rounds
    from jaxrl_dist.trainers.runner import train

    events: list = []
    real_make = rounds.make_scheduler

    class Marked:
        """The run's scheduler, marking where each round starts."""

        sees_limits = False

        def __init__(self, *args):
            self.inner = real_make(*args)

        def most_shards(self):
            return self.inner.most_shards()

        def num_shards(self, round_, history):
            events.append(("start", round_))
            return self.inner.num_shards(round_, history)

        def expected_shards(self):
            return self.inner.expected_shards()

    from jaxrl_dist.trainers import rundir

    class MarkedLogger(rundir.MetricsLogger):
        def log(self, records):
            super().log(records)
            events.extend(("end", r.update - 1) for r in records)

    monkeypatch.setattr(rounds, "make_scheduler", Marked)
    monkeypatch.setattr(rundir, "MetricsLogger", MarkedLogger)  # what open_logs builds
    keys, shard_steps = E2E[name]
    cfg = config(tmp_path / name, keys, rounds_of_steps=shard_steps)
    with compile_log(events):
        summary = train(cfg)
    records = [Record.from_json(json.loads(line))
               for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    ns = [rec.num_shards for rec in records]
    check = make_scheduler(cfg.scheduler, cfg.backend, cfg)
    assert ns == [check.num_shards(r, records[:r]) for r in range(len(records))]
    assert summary["env_steps"] == sum(ns) * SHARD_STEPS >= cfg.algo.total_timesteps
    if name == "ramp":
        assert ns == [1, 2, 3, 4, 4]
    if name == "fixed":
        assert ns == [3, 3, 3, 3]
    if name == "max":
        assert ns == [4, 4, 4]
    spans, seen = round_spans(events), set()
    assert sorted(spans) == list(range(len(records)))
    for r, n in enumerate(ns):
        if bucket(n, 4) in seen:  # a shape compiled before: nothing new to compile
            assert spans[r] == 0, (name, r, ns)
        seen.add(bucket(n, 4))
    assert len(seen) <= math.ceil(math.log2(4)) + 1


def test_the_comparison_bench_bounds_what_any_schedule_can_reach(tmp_path):
    """`bench/schedulers.py`'s `joint_bound`: from rounds billed `a + b n` it recovers
    `a` and `b`, finds that no fixed count is within 5% of both oracles here, that a
    policy spending 5 shards for 10 rounds is, and how far the fast fixed count is off.
    (A fresh process: the bench configures JAX's CPU and RNG for itself.)"""
    import subprocess
    import sys
    from pathlib import Path

    def run(n: int, rounds: int) -> dict:
        usd = [(0.001 + 0.0003 * n) * (i + 1) for i in range(rounds)]
        secs = [20.0 * (i + 1) for i in range(rounds)]
        return {"time_to_target_s": secs[-1], "cost_to_target_usd": usd[-1],
                "series": {"shards": [n] * rounds, "cum_usd": usd, "cum_s": secs, "return_recent": [None] * rounds}}
    runs = {"fixed1": [run(1, 40)], "fixed4": [run(4, 20)], "fixed16": [run(16, 10)], "learned": [run(5, 10)]}
    warm = json.loads(json.dumps(runs))  # a first round 10x as long (a cold start, then warm)
    warm["fixed4"][0]["series"]["cum_s"] = [s + 180.0 for s in warm["fixed4"][0]["series"]["cum_s"]]
    (tmp_path / "runs.json").write_text(json.dumps([runs, warm]))
    bench = Path(__file__).resolve().parents[1] / "bench"
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import schedulers; "
            "agg = lambda r: {p: schedulers.aggregate(rs, 'none') for p, rs in r.items()}; "
            "print(json.dumps([schedulers.joint_bound(r, agg(r)) for r in json.load(open(sys.argv[2]))]))")
    out = subprocess.run([sys.executable, "-c", code, str(bench), str(tmp_path / "runs.json")],
                         capture_output=True, text=True, timeout=120, check=True)
    b, off = json.loads(out.stdout.strip().splitlines()[-1])
    assert not off["applies"] and "not billed a + b n at one duration" in off["why"]
    assert b["applies"]
    assert b["usd_per_round"] == pytest.approx(0.001) and b["usd_per_shard_round"] == pytest.approx(0.0003)
    assert b["round_s"] == pytest.approx(20.0) and b["rounds_max"] == pytest.approx(10.5)
    assert b["fixed_within"] == [] and b["policies"]["learned"]["within"]
    # fixed16 is fast enough (10 rounds) but used 160 shard-rounds where $0.0462 pays for 120.7
    assert b["fast_fixed_over_allowed"] == pytest.approx(160 / ((1.05 * 0.044 - 0.01) / 0.0003))


def test_a_scheduler_without_the_round_contract_is_one_line(monkeypatch):
    """The round trainer relies on `RoundScheduler` (`most_shards`, `sees_limits` ...): a
    registered scheduler without it is refused before any round, naming the key."""
    from jaxrl_dist.scheduling import schedulers

    class Loose:
        def __init__(self, cfg, backend_cfg, full=None):
            pass

        def num_shards(self, round_, history):
            return 1

    monkeypatch.setitem(schedulers.BUILTIN, "loose", Loose)
    monkeypatch.setattr(schedulers, "SCHEDULERS", schedulers.Registry("scheduler", "scheduler.name",
                                                                      schedulers.GROUP, schedulers.BUILTIN))
    with pytest.raises(ConfigError, match="scheduler.name: 'loose' made a Loose, which lacks expected_shards, most_shards, sees_limits"):
        schedulers.make_scheduler(SchedulerConfig(name="loose"), BackendConfig())


def test_a_scheduler_s_bad_answer_is_one_line_naming_it():
    """A plugin's `propose` that gives no number, a subclass without `propose`, and a
    `num_shards` (not clipped) outside 1..backend.max_shards: one line naming the
    scheduler, not an error deep inside the round."""
    from types import SimpleNamespace

    from jaxrl_dist.trainers.sync import RoundTrainer

    class Nothing(Scheduler):
        def propose(self, round_, history):
            return None

    cfg = SchedulerConfig(name="mine")
    with pytest.raises(ConfigError, match=r"^scheduler.name=mine: propose returned None; it gives a number of shards"):
        Nothing(cfg, BackendConfig()).num_shards(0, [])
    with pytest.raises(ConfigError, match=r"^scheduler.name=mine: Scheduler does not define propose"):
        Scheduler(cfg, BackendConfig()).num_shards(0, [])
    for answer in (0, 1000, 2.0, None):
        me = SimpleNamespace(scheduler=SimpleNamespace(sees_limits=False, num_shards=lambda r, h, a=answer: a),
                             cfg=from_dict({"trainer": "sync", "scheduler": {"name": "fixed"}}))
        with pytest.raises(ConfigError, match=rf"^scheduler.name=fixed: num_shards returned {answer!r} for round 1; "
                           r"a scheduler gives a whole number of shards in 1..32"):
            RoundTrainer._ask(me, 0, [])

"""Where a round's wall goes: every round record's phases add up to its wall, the
start-up is its own phase, and a run that gives up exits with its code, not a native
abort from a compile still running in a thread."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from jaxrl_dist.backends import BackendError
from jaxrl_dist.config import from_dict
from jaxrl_dist.scheduling.records import ASYNC_PHASES, ROUND_PHASES, STARTUP_PHASES, Record
from jaxrl_dist.trainers.checkpoint import saved_steps
from jaxrl_dist.trainers.runner import train

STEPS, ENVS, SHARDS = 16, 4, 4
QUIET = {"progress": False, "tensorboard": False, "compile_cache": False}


def config(run_dir: Path, trainer: str = "sync", rounds: int = 12, **backend) -> object:
    return from_dict({
        "trainer": trainer,
        "backend": {"max_shards": SHARDS, "envs_per_shard": ENVS, **backend},
        **({"scheduler": {"name": "fixed", "num_shards": SHARDS}} if trainer == "sync" else
           {"asynchronous": {"batch_chunks": SHARDS, "actors": SHARDS, "balance": False}}),
        "algo": {"total_timesteps": rounds * SHARDS * ENVS * STEPS, "num_steps": STEPS,
                 "num_minibatches": 2, "update_epochs": 2},
        "run": {"dir": str(run_dir), "checkpoint_every": 4, **QUIET},
    })


def records(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def phases_of(rec: dict) -> dict:
    return {k[len("phase_"):-2]: v for k, v in rec.items() if k.startswith("phase_")}


def assert_phases_add_up(recs: list, wall_key: str = "round_s", names=ROUND_PHASES) -> None:
    """Every record's phases are known ones and sum to its wall (what a measured part
    misses is charged to a phase, not left as a gap)."""
    for rec in recs:
        phases = phases_of(rec)
        assert phases and set(phases) <= set(names), phases
        assert all(v >= 0 for v in phases.values()), phases
        assert sum(phases.values()) == pytest.approx(rec[wall_key], rel=1e-6), (rec["round"], phases)


def test_a_rounds_phases_add_up_to_its_wall_and_the_start_up_is_apart(tmp_path):
    summary = train(config(tmp_path), launch_s=2.0)  # as if the process had started 2 s before
    recs = records(tmp_path)
    # the measured clock counts from the process's start, as wall_seconds does
    assert summary["phase_seconds"]["startup_launch"] == 2.0
    assert summary["startup_seconds"] < recs[0]["cum_wall_s"] < recs[-1]["cum_wall_s"] <= summary["wall_seconds"]
    assert len(recs) == 12
    assert_phases_add_up(recs)
    assert {"schedule", "rollout", "learn", "record"} <= set(phases_of(recs[0]))
    assert {"log", "checkpoint"} <= set(phases_of(recs[1]))  # the previous round's, before this one
    totals = summary["phase_seconds"]
    assert {f"startup_{k}" for k in STARTUP_PHASES} <= set(totals)
    assert summary["startup_seconds"] == pytest.approx(sum(v for k, v in totals.items() if k.startswith("startup_")))
    # training time is the rounds' walls and what followed the last (its log and checkpoint,
    # the final save): no time falls outside the phases
    after = sum(v for k, v in totals.items() if not k.startswith("startup_"))
    assert after >= 0.95 * (sum(r["round_s"] for r in recs) + totals["finish"])
    assert summary["train_seconds"] == pytest.approx(after, rel=0.05)
    # the rounds' own compiles (a new shard bucket's) are left out, as the fused trainer's compile is
    in_rounds = sum(r["compile_s"] for r in recs)
    assert summary["sps"] == pytest.approx(summary["env_steps"] / (summary["train_seconds"] - in_rounds))
    assert summary["shards_mean"] == pytest.approx(sum(r["num_shards"] for r in recs) / len(recs))
    # each round says what this process compiled in it, which the modeled learner time leaves out
    assert all(r["compile_s"] >= 0 and r["modeled_learn_s"] <= r["learn_s"] + 1e-9 for r in recs)
    # a record read back keeps its phases
    assert Record.from_json(recs[3]).phases == phases_of(recs[3])


@pytest.mark.slow  # ~14 s: the phase accounting is the round test's above; this is async's loop
def test_an_async_updates_phases_add_up_to_its_learner_loop(tmp_path):
    summary = train(config(tmp_path, "async", rounds=8))
    recs = records(tmp_path)
    assert_phases_add_up(recs, "loop_s", ASYNC_PHASES)
    assert {f"startup_{k}" for k in STARTUP_PHASES} <= set(summary["phase_seconds"])
    # the modeled clock's parts add up to it: the learner's wait for chunks, its updates, a cluster's start
    assert summary["modeled_wait_s"] + summary["modeled_learn_s"] + summary["modeled_setup_s"] == pytest.approx(
        summary["modeled_seconds"], rel=1e-6)
    # as if killed after its next-to-last checkpoint: the resumed run's summary counts the
    # whole run's chunks (each learned or dropped), not only the resumed process's
    *_, previous, newest = saved_steps(tmp_path)
    shutil.rmtree(tmp_path / "checkpoints" / str(newest))
    (tmp_path / "summary.json").unlink()
    resumed = train(from_dict({"run": {"resume": str(tmp_path), "progress": False, "compile_cache": False}}))
    assert resumed["resumed_at_update"] == previous
    for run, recs in ((summary, recs), (resumed, records(tmp_path))):  # each update learns SHARDS chunks
        assert sum(run["staleness_histogram"].values()) == run["rounds"] * SHARDS
        assert sum(run["staleness_histogram"].values()) + run["dropped_chunks"] == sum(r["num_shards"] for r in recs)


def test_a_give_up_in_the_first_round_leaves_no_compile_running(tmp_path):
    """Every endpoint unreachable from the first shard: the run raises its one-line error
    only after the learner's warm-up compile is done (a thread still compiling at exit
    aborts the process natively)."""
    cfg = config(tmp_path, name="http", urls=["http://127.0.0.1:9"], shard_timeout=2.0, max_retries=0)
    with pytest.raises(BackendError, match="127.0.0.1:9"):
        train(cfg)
    assert not [t for t in threading.enumerate() if t.name == "jaxrl-dist-warm"]


def test_the_cli_exits_3_when_every_endpoint_is_unreachable_from_the_start(tmp_path):
    from test_cli import command

    out = subprocess.run(command() + ["train", "backend=http", "backend.urls=[http://127.0.0.1:9]",
                                      "backend.shard_timeout=2", "backend.max_retries=0", "scheduler=fixed",
                                      "scheduler.num_shards=1", f"run.dir={tmp_path / 'run'}",
                                      "run.progress=false"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 3, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith("error: shard slot 0 failed")
    assert "terminate called" not in out.stderr and "FATAL" not in out.stderr

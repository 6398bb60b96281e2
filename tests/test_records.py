"""Typed records: what a trainer hands the logger round-trips through metrics.jsonl,
and a resumed run takes its cost clock from the checkpoint."""
from __future__ import annotations

import json

import numpy as np
import pytest

from jaxrl_dist.config import from_dict
from jaxrl_dist.scheduling.records import Record
from jaxrl_dist.trainers.runner import train
from jaxrl_dist.trainers.accounting import CLOCK_FIELDS
from jaxrl_dist.trainers.sync import RoundTrainer


def config(run_dir, trainer="sync"):
    return from_dict({
        "trainer": trainer, "algo": {"total_timesteps": 3 * 2 * 4 * 16, "num_steps": 16,
                                     "num_minibatches": 2, "update_epochs": 1},
        "backend": {"name": "local", "envs_per_shard": 4, "max_shards": 2},
        # the other trainer's keys would be an error (each reads only its own)
        **({"scheduler": {"name": "fixed", "num_shards": 2}} if trainer == "sync" else
           {"asynchronous": {"batch_chunks": 2, "actors": 2, "balance": False, "max_staleness": 0}}),
        "run": {"dir": str(run_dir), "progress": False, "tensorboard": False, "compile_cache": False},
    })


@pytest.mark.parametrize("trainer", ["sync", "async"])
def test_records_round_trip_and_the_checkpoint_holds_the_clock(tmp_path, trainer):
    summary = train(config(tmp_path, trainer))
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3
    for line in lines:
        rec = Record.from_json(line)
        assert rec.to_json() == line and rec.cost is not None and rec.num_shards == 2
    # what a resumed run reads: the checkpoint's clock is the last record's totals
    state = RoundTrainer(config(tmp_path), tmp_path, resuming=True).state if trainer == "sync" else None
    if state is not None:
        clock = dict(zip(CLOCK_FIELDS, np.asarray(state.clock)))
        assert clock["cum_modeled_s"] == pytest.approx(lines[-1]["cum_modeled_s"])
        assert clock["cum_usd"] == pytest.approx(lines[-1]["cum_cost_usd"])
        assert clock["cum_wall_s"] >= lines[-1]["cum_wall_s"]
    assert summary["cost_usd"] == pytest.approx(lines[-1]["cum_cost_usd"])


def test_a_resumed_runs_table_says_which_times_count_from_the_runs_start():
    """Its wall and training seconds are this process's; the measured time to target
    counts from the run's start (`cum_wall_s` carries on across resumes). An async
    run's table counts updates and the chunks each took, not rounds of shards."""
    from rich.console import Console

    from jaxrl_dist.trainers.logger import summary_table

    def shown(summary):
        console = Console(width=200, record=True)
        console.print(summary_table(summary))
        return console.export_text()

    row = {"wall_seconds": 19.7, "wall_to_target_s": 23.4}
    assert "measured time to target (s, whole run)" in shown({**row, "resumed_at_update": 62})
    assert "measured time to target (s) " in shown(row)
    rounds = {"num_updates": 24, "rounds": 24, "shards_mean": 4.08}  # an async update is its round
    assert "shards a round (mean)" in shown(rounds) and "rounds " in shown(rounds)
    text = shown({**rounds, "trainer": "async"})
    assert "chunks an update (mean)" in text and "rounds " not in text and "updates" in text

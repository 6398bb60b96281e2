"""Experiment trackers beside `metrics.jsonl` and TensorBoard: Weights & Biases
(`logger.wandb=true`) gets the config, every numeric field of every record (against
`env_steps`) and the summary. W&B is imported only when it is asked for.

W&B hands each `log` call to its own service process; the fused runner logs a
chunk of records while the device runs the next chunk, so the calls stay off the
hot path (`bench/wandb_overhead.py`). A resumed run continues the same W&B run
(its id is kept in `RUN_DIR/wandb_id`).
"""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Optional

from jaxrl_dist.config import LoggerConfig, needs

WANDB_ID_FILE = "wandb_id"


def numeric(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def thin(lines: list, at_most: int) -> list:
    """At most `at_most` of `lines` (all when 0), evenly spaced, ending with the last."""
    if not at_most or len(lines) <= at_most:
        return lines
    step = len(lines) / at_most
    return [lines[len(lines) - 1 - int(i * step)] for i in reversed(range(at_most))]


class WandbTracker:
    """One W&B run for one training run."""

    def __init__(self, lg: LoggerConfig, config: dict, run_dir: Path):
        """`lg`: the run's `logger.*` keys; `config`: the run's whole config as a nested
        dict, its secrets left out (`config.without_secrets`): a secret never leaves the
        machine."""
        wandb = needs("wandb", "wandb", "logger.wandb=true")
        id_file = Path(run_dir) / WANDB_ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        self.run = wandb.init(project=lg.wandb_project, entity=lg.wandb_entity, group=lg.wandb_group,
                              mode=lg.wandb_mode, dir=str(run_dir), id=run_id, resume="allow",
                              name=Path(run_dir).name, config=config, reinit="create_new",
                              # quiet: the run's own table says enough. Console capture, system
                              # sampling and the machine survey at start-up run beside the
                              # learner on the same cores: with them the fused CartPole run was
                              # 0.94-0.95x as fast, without them 1.02x (bench/RESULTS.md)
                              settings=wandb.Settings(quiet=True, console="off", x_disable_stats=True,
                                                      x_disable_meta=True, x_disable_machine_info=True))
        id_file.write_text(run_id + "\n")
        self.per_chunk = lg.wandb_per_chunk
        self.run.define_metric("*", step_metric="env_steps")

    def log(self, lines: list) -> None:
        """Every numeric field of a log point's records (`logger.wandb_per_chunk` of them)."""
        for line in thin(lines, self.per_chunk):
            self.run.log(numeric(line))

    def finish(self, summary: Optional[dict]) -> None:
        if summary:  # all of it, as summary.json has it: the digest, the stop reason and the phases too
            self.run.summary.update(dict(summary))
        self.run.finish()


def open_tracker(lg: LoggerConfig, config: dict, run_dir: Path) -> Optional[WandbTracker]:
    """The tracker the `logger.*` keys `lg` ask for, or None (`config` as `WandbTracker` takes it)."""
    return WandbTracker(lg, config, run_dir) if lg.wandb else None

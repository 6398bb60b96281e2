"""Trackers: Weights & Biases (offline, read back from its run file) and TensorBoard's
hyperparameter table."""
from __future__ import annotations

import json
import struct
import subprocess

import pytest

from test_cli import cli_env, command
from test_runner import read_events



def wandb_records(path) -> list:
    """The protobuf records of a W&B run file (`run-ID.wandb`): a 7-byte header, then
    32 KiB blocks of chunks, each `crc32 (4) | length (2) | type (1) | data`, a record
    being one FULL chunk or FIRST, MIDDLE..., LAST."""
    from wandb.proto import wandb_internal_pb2

    data, at, part, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while at + 7 <= len(data):
        room = 32768 - at % 32768
        if room < 7:  # a block's tail too short for a chunk header is padding
            at += room
            continue
        _, length, kind = struct.unpack("<IHB", data[at:at + 7])
        if kind == 0:
            at += room
            continue
        part += data[at + 7:at + 7 + length]
        at += 7 + length
        if kind in (1, 4):  # FULL, LAST
            out.append(wandb_internal_pb2.Record.FromString(part))
            part = b""
    return out


def test_wandb_gets_the_config_every_metric_and_the_summary(tmp_path):
    run = tmp_path / "run"
    env = cli_env(WANDB_MODE="offline")
    out = subprocess.run(command() + ["train", "trainer=fused", "algo.total_timesteps=10240", "algo.lr=7e-4",
                                      f"run.dir={run}", "run.progress=false", "logger.wandb=true",
                                      "logger.wandb_per_chunk=0"],  # every record
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1 and files[0].name == f"run-{(run / 'wandb_id').read_text().strip()}.wandb"
    recs = wandb_records(files[0])
    config = {i.key: json.loads(i.value_json) for r in recs if r.HasField("run") for i in r.run.config.update}
    config = {k: v.get("value", v) if isinstance(v, dict) else v for k, v in config.items()}
    assert config["algo"]["lr"] == 7e-4 and config["trainer"]["name"] == "fused"
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in recs if r.HasField("history")]
    assert len(history) == len(records) == summary["num_updates"]
    for got, rec in zip(history, records):
        for key in ("env_steps", "loss", "approx_kl", "sps"):
            assert got[key] == pytest.approx(rec[key]), key
    final = {}
    for r in recs:
        if r.HasField("summary"):
            final.update({i.key: json.loads(i.value_json) for i in r.summary.update if i.key})
    assert final["final_return"] == pytest.approx(summary["final_return"])
    assert final["sps"] == pytest.approx(summary["sps"])
    assert final["params_sha256"] == summary["params_sha256"] and final["env_id"] == summary["env_id"]
    check_hparams(run, lr=7e-4)


def check_hparams(run, lr: float) -> None:
    """TensorBoard's hyperparameter table holds the run's config against its return."""
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    events = read_events(next((run / "tensorboard").glob("events.out.tfevents.*")))
    data = [HParamsPluginData.FromString(v.metadata.plugin_data.content) for e in events
            for v in e.summary.value if v.metadata.plugin_data.plugin_name == "hparams"]
    start = next(d.session_start_info for d in data if d.HasField("session_start_info"))
    assert start.hparams["algo.lr"].number_value == pytest.approx(lr)
    assert start.hparams["trainer.name"].string_value == "fused"
    experiment = next(d.experiment for d in data if d.HasField("experiment"))
    assert [m.name.tag for m in experiment.metric_infos] == ["charts/episodic_return"]


def test_a_log_point_sends_at_most_wandb_per_chunk_records_ending_with_the_last():
    from jaxrl_dist.trainers.tracking import thin

    assert thin(list(range(61)), 4) == [15, 30, 45, 60]
    assert thin(list(range(3)), 4) == [0, 1, 2] and thin(list(range(5)), 0) == list(range(5))



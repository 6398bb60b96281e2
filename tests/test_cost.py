"""The cost model: hand-computed rounds for each kind, numpy and jax.numpy agreeing
(jitted, with a traced shard count), and the round trainer's clocks, dollars and
stop conditions end to end on the local backend."""
from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_dist.scheduling import cost
from jaxrl_dist.config import ConfigError, CostConfig, from_dict

# round numbers: 2 vCPU x $0.01 + 4 GB x $0.001 = $0.024 per billed second;
# the learner $0.01 per second; 1000 bytes/s
SERVERLESS = CostConfig(name="t", kind="serverless", vcpu_second_usd=0.01, gb_second_usd=0.001,
                        request_usd=0.5, vcpus_per_shard=2.0, gb_per_shard=4.0,
                        billing_granularity_s=0.5, min_billed_s=1.0, start_billed=True,
                        cold_start_s=3.0, warm_start_s=0.25, invoke_s=0.1, keep_warm_s=10.0,
                        transfer_bytes_per_s=1000.0, learner_hour_usd=36.0)
# 4 nodes at $0.001 per second each, the learner $0.001 per second
CLUSTER = CostConfig(name="c", kind="cluster", vcpu_second_usd=0.0, gb_second_usd=0.0,
                     cold_start_s=2.0, warm_start_s=0.0, invoke_s=0.01, keep_warm_s=86400.0,
                     transfer_bytes_per_s=1000.0, learner_hour_usd=3.6, cluster_nodes=4,
                     cluster_node_hour_usd=3.6, cluster_start_s=100.0)

# slots 0, 1 real (slot 0 cold, slot 1 warm), slot 2 padding that must not count
SHARDS, COLD = [0.2, 1.3, 9.9], [True, False, True]


def test_serverless_round_by_hand():
    rc = cost.round_cost(SERVERLESS, 2, np.array(SHARDS), 500.0, 0.4, np.array(COLD))
    c = rc.components
    # invoke 0.1 + slowest start (cold) 3 + slowest shard 1.3 + 500 B / 1000 B/s + learn 0.4
    assert (c["invoke_s"], c["start_s"], c["actor_s"], c["transfer_s"], c["learn_s"]) == \
        pytest.approx((0.1, 3.0, 1.3, 0.5, 0.4))
    assert rc.modeled_s == pytest.approx(5.3)
    # billed: 0.2 + 3 (cold start) -> 3.5 (0.5 s units); 1.3 + 0.25 (warm) -> 2.0; plus 2 requests
    assert c["shard_usd"] == pytest.approx((3.5 + 2.0) * 0.024 + 2 * 0.5)
    assert c["learner_usd"] == pytest.approx(5.3 * 0.01)
    assert rc.usd == pytest.approx(1.132 + 0.053)


def test_serverless_minimum_and_unbilled_start():
    cfg = dataclasses.replace(SERVERLESS, start_billed=False)
    rc = cost.round_cost(cfg, 2, np.array(SHARDS), 0.0, 0.0, np.array(COLD))
    # 0.2 s -> 0.5 -> the 1 s minimum; 1.3 s -> 1.5
    assert rc.components["shard_usd"] == pytest.approx((1.0 + 1.5) * 0.024 + 2 * 0.5)
    assert rc.modeled_s == pytest.approx(0.1 + 3.0 + 1.3)


def test_billing_rounds_up_without_float_error():
    per_100ms = CostConfig(billing_granularity_s=0.1, min_billed_s=0.0)
    assert cost.billed_seconds(per_100ms, 0.1 * 3) == pytest.approx(0.3)  # 0.30000000000000004
    assert cost.billed_seconds(per_100ms, 0.3001) == pytest.approx(0.4)
    per_ms = CostConfig(billing_granularity_s=0.001, min_billed_s=0.001)
    assert cost.billed_seconds(per_ms, np.array([0.0, 0.0104])) == pytest.approx([0.001, 0.011])


def test_cold_and_warm_slots_on_the_modeled_clock():
    account = cost.CostAccount(SERVERLESS, 4)
    rc, cold = account.charge(2, [0.2, 1.3], 500.0, 0.4)
    assert cold == 2 and rc.components["start_s"] == 3.0  # first run: cold
    # slots 0, 1 finished at 0.1 + 3 + 1.3 = 4.4; the next round starts at 5.3 (idle 0.9 s < 10)
    assert account.clock.now == pytest.approx(5.3)
    assert list(cost.cold_slots(SERVERLESS, account.clock)) == [False, False, True, True]
    rc, cold = account.charge(3, [0.2, 0.2, 0.2], 0.0, 20.0)  # slot 2 is new; a 20 s update
    assert cold == 1 and rc.components["start_s"] == 3.0
    rc, cold = account.charge(1, [0.2], 0.0, 0.0)  # idle 20 s + transfer > keep_warm_s: cold again
    assert cold == 1
    always_cold = cost.CostAccount(CostConfig(), 2)  # azure_aci: released after every shard
    assert [always_cold.charge(2, [0.1, 0.1], 0.0, 0.0)[1] for _ in range(3)] == [2, 2, 2]


def test_cluster_bills_idle_time_and_start_up():
    rc = cost.round_cost(CLUSTER, 2, np.array([1.0, 3.0]), 0.0, 2.0, False)
    assert rc.modeled_s == pytest.approx(0.01 + 3.0 + 2.0)
    assert rc.components["shard_usd"] == pytest.approx(5.01 * 4 * 0.001)  # all nodes, learner phase too
    assert rc.usd == pytest.approx(5.01 * 5 * 0.001)
    fewer = cost.round_cost(CLUSTER, 1, np.array([3.0, 0.0]), 0.0, 2.0, False)
    assert fewer.usd == pytest.approx(rc.usd)  # idle nodes cost the same
    setup = cost.setup_cost(CLUSTER)
    assert (setup.modeled_s, setup.usd, setup.components["setup_s"]) == pytest.approx((100.0, 0.5, 100.0))
    assert cost.setup_cost(SERVERLESS).usd == 0.0
    account = cost.CostAccount(CLUSTER, 2)
    first, cold = account.charge(2, [1.0, 3.0], 0.0, 2.0)  # start-up billed with the first round
    assert cold == 2 and first.components["setup_s"] == 100.0
    assert first.modeled_s == pytest.approx(100.0 + 0.01 + 2.0 + 3.0 + 2.0)
    second, cold = account.charge(2, [1.0, 3.0], 0.0, 2.0)
    assert cold == 0 and second.components["setup_s"] == 0.0
    assert account.usd == pytest.approx(first.usd + second.usd)


@pytest.mark.parametrize("cfg", [SERVERLESS, CLUSTER], ids=["serverless", "cluster"])
def test_jax_numpy_agree_and_n_can_be_traced(cfg):
    args = (np.array(SHARDS, np.float32), np.float32(500.0), np.float32(0.4), np.array(COLD))
    f = jax.jit(lambda n, *a: cost.round_cost(cfg, n, *a))
    for n in (1, 2, 3):
        ref = cost.round_cost(cfg, n, *args)
        out = f(jnp.int32(n), *map(jnp.asarray, args))
        assert float(out.usd) == pytest.approx(float(ref.usd), rel=1e-5)
        assert float(out.modeled_s) == pytest.approx(float(ref.modeled_s), rel=1e-5)
        for k, v in ref.components.items():
            assert float(out.components[k]) == pytest.approx(float(v), rel=1e-5, abs=1e-7), k
    assert f._cache_size() == 1  # one compile serves every n


def test_slot_clock_runs_under_jit():
    def step(clock, n, shard_s):
        cold = cost.cold_slots(SERVERLESS, clock)
        rc = cost.round_cost(SERVERLESS, n, shard_s, 0.0, 0.5, cold)
        return cost.advance(clock, n, rc), rc

    clock = cost.new_clock(4)
    jclock = cost.new_clock(4, xp=jnp)
    jstep = jax.jit(step)
    for n in (2, 3, 1):
        shard_s = np.full((4,), 0.5, np.float32)
        clock, rc = step(clock, n, shard_s)
        jclock, jrc = jstep(jclock, jnp.int32(n), jnp.asarray(shard_s))
        assert float(jrc.usd) == pytest.approx(float(rc.usd), rel=1e-5)
        np.testing.assert_allclose(np.asarray(jclock.last_end), clock.last_end, rtol=1e-5)
    assert jstep._cache_size() == 1


def test_stop_keys_and_cost_keys_are_validated():
    bad = [({"run": {"budget_usd": -1}}, "run.budget_usd"), ({"run": {"max_rounds": 0}}, "run.max_rounds"),
           ({"run": {"budget_usd": 0}}, "run.budget_usd"), ({"run": {"deadline_s": 0}}, "run.deadline_s"),
           ({"run": {"deadline_s": -5.0}}, "run.deadline_s"), ({"run": {"deadline_s": "soon"}}, "run.deadline_s"),
           ({"run": {"target_return": "high"}}, "run.target_return"),
           ({"cost": {"kind": "spot"}}, "cost.kind"), ({"cost": {"vcpu_second_usd": -1.0}}, "cost.vcpu_second_usd"),
           ({"cost": {"kind": "cluster"}}, "cost.cluster_nodes"),
           ({"cost": {"transfer_bytes_per_s": 0.0}}, "cost.transfer_bytes_per_s")]
    for over, key in bad:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            from_dict(over)
    # the fused trainer ignores the stop keys, but takes them
    cfg = from_dict({"trainer": "sync", "run": {"target_return": 475, "budget_usd": 1.5, "max_rounds": 3, "stop_at_target": True}})
    assert cfg.trainer.name == "sync" and cfg.run.max_rounds == 3


def test_a_limit_that_is_not_positive_is_one_line_exit_2(tmp_path, capsys):
    from jaxrl_dist import cli

    for key in ("run.budget_usd", "run.deadline_s"):
        code = cli.main(["train", "trainer=sync", "run.progress=false", f"run.dir={tmp_path}", f"{key}=0"])
        out = capsys.readouterr()
        lines = [x for x in (out.out + out.err).splitlines() if x.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {key}"), lines


def test_presets_compose():
    from jaxrl_dist.cli import compose as cli

    presets = {p: from_dict(cli.compose([f"cost={p}"]), ()).cost
               for p in ("azure_aci", "aws_lambda", "gcp_cloud_run", "vm_cluster")}
    assert presets["azure_aci"] == CostConfig()  # the dataclass defaults are the default preset
    assert {p: c.kind for p, c in presets.items()} == {"azure_aci": "serverless", "aws_lambda": "serverless",
                                                       "gcp_cloud_run": "serverless", "vm_cluster": "cluster"}
    assert all(c.name == p for p, c in presets.items())


# ---- end to end: the round trainer on the local backend ----

def _train(tmp_path, name, **over):
    """3 shards of 4 envs x 16 steps per round, at most 6 rounds."""
    from jaxrl_dist.trainers.runner import train

    run = {"dir": str(tmp_path / name), "progress": False, "tensorboard": False, "compile_cache": False,
           **over.pop("run", {})}
    cfg = from_dict({"algo": {"total_timesteps": 3 * 4 * 16 * 6, "num_steps": 16, "num_minibatches": 2,
                              "update_epochs": 2},
                     "trainer": "sync", "backend": {"name": "local", "envs_per_shard": 4, "max_shards": 4},
                     "scheduler": {"num_shards": 3}, "run": run, **over})
    summary = train(cfg)
    from jaxrl_dist.trainers.logger import read_records

    return summary, read_records(tmp_path / name / "metrics.jsonl")  # none: no round ran, no file


def test_records_and_summary_carry_both_clocks_and_reach_the_target(tmp_path):
    summary, records = _train(tmp_path, "target", run={"target_return": 1.0, "stop_at_target": True})
    hit = next(i for i, r in enumerate(records) if r["return"] is not None and r["return"] >= 1.0)
    assert summary["stop_reason"] == "target" and summary["rounds"] == hit + 1 == len(records)
    for key in ("time_to_target_s", "wall_to_target_s", "cost_to_target_usd"):
        assert summary[key] is not None and summary[key] > 0
    assert summary["time_to_target_s"] == records[hit]["cum_modeled_s"]
    assert summary["cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in records))
    assert summary["modeled_seconds"] == pytest.approx(sum(r["modeled_s"] for r in records))
    assert summary["modeled_start_s"] == pytest.approx(20.0 * len(records))  # azure_aci: cold every round
    wall = [r["cum_wall_s"] for r in records]
    assert wall == sorted(wall) and wall[-1] <= summary["wall_seconds"]
    for r in records:
        parts = sum(r[f"modeled_{k}"] for k in cost.TIME_KEYS)
        assert r["modeled_s"] == pytest.approx(parts) and r["cost_usd"] == pytest.approx(r["shard_usd"] + r["learner_usd"])
        assert r["cold_shards"] == 3 and r["modeled_transfer_s"] > 0  # local moves no bytes: modeled ones
    summary_file = json.loads((tmp_path / "target" / "summary.json").read_text())
    assert summary_file["cost_to_target_usd"] == summary["cost_to_target_usd"]


def test_budget_stops_before_the_round_that_would_exceed_it(tmp_path):
    # azure_aci: about $0.0019 a round (3 cold 20 s shards, the learner for 20 s)
    summary, records = _train(tmp_path, "budget", run={"budget_usd": 0.005})
    assert summary["stop_reason"] == "budget_usd" and 1 <= summary["rounds"] < 6
    assert records[-1]["cum_cost_usd"] == summary["cost_usd"] <= 0.005
    assert json.loads((tmp_path / "budget" / "summary.json").read_text())["stop_reason"] == "budget_usd"


def test_a_budget_below_one_round_says_so_in_one_line(tmp_path, capsys):
    # $0.0005 against about $0.0019 for the first round: nothing runs, and the run says why
    summary, records = _train(tmp_path, "tiny", run={"budget_usd": 0.0005})
    assert summary["rounds"] == 0 and records == [] and summary["stop_reason"] == "budget_usd"
    note = summary["stop_note"]
    assert note.startswith("run.budget_usd=0.0005 does not pay for one round: 3 shards under cost=azure_aci")
    assert f"warning: {note}" in capsys.readouterr().err.splitlines()
    assert json.loads((tmp_path / "tiny" / "summary.json").read_text())["stop_note"] == note


def test_limits_are_checked_before_the_round_that_would_pass_them():
    from jaxrl_dist.config import RunConfig
    from jaxrl_dist.trainers.sync import over_limit

    account = cost.CostAccount(CostConfig(), 4)
    account.charge(2, np.full((2,), 5.0), 1e6, 2.0)
    seconds, usd = account.estimate(2)
    assert seconds > 0 and usd > 0
    now, spent = float(account.clock.now), account.usd
    assert over_limit(RunConfig(), account, 2) is None
    assert over_limit(RunConfig(budget_usd=spent + 1.01 * usd), account, 2) is None
    assert over_limit(RunConfig(budget_usd=spent + 0.99 * usd), account, 2) == "budget_usd"
    assert over_limit(RunConfig(deadline_s=now + 1.01 * seconds), account, 2) is None
    assert over_limit(RunConfig(deadline_s=now + 0.99 * seconds), account, 2) == "deadline_s"
    # the shares left, then the dollars and seconds left (what `budget_rounds` reads)
    assert tuple(cost.run_left(RunConfig(budget_usd=4 * spent, deadline_s=2 * now), now, spent)) == \
        pytest.approx((0.75, 0.5, 3 * spent, now))
    assert cost.run_left(RunConfig(), now, spent) == cost.Left(1.0, 1.0, np.inf, np.inf)  # no limits: all left
    over = cost.run_left(RunConfig(budget_usd=spent / 2), now, spent)
    assert (over.budget, over.usd) == (0.0, 0.0)  # clipped


@pytest.mark.slow
def test_deadline_stops_before_the_round_that_would_pass_it(tmp_path):
    # azure_aci: about 41 modeled seconds a round (a 20 s cold start, the shards, the learner)
    summary, records = _train(tmp_path, "deadline", run={"deadline_s": 100.0})
    assert summary["stop_reason"] == "deadline_s" and 1 <= summary["rounds"] < 6
    assert records[-1]["cum_modeled_s"] == summary["modeled_seconds"] <= 100.0
    assert json.loads((tmp_path / "deadline" / "summary.json").read_text())["stop_reason"] == "deadline_s"


def test_max_rounds_and_a_cluster_start_up(tmp_path):
    summary, records = _train(tmp_path, "rounds", cost={"kind": "cluster", "cluster_nodes": 2,
                                                        "cluster_node_hour_usd": 0.384, "cluster_start_s": 300.0},
                              run={"max_rounds": 2, "target_return": 1e9})
    assert summary["stop_reason"] == "max_rounds" and summary["rounds"] == len(records) == 2
    assert summary["time_to_target_s"] is None and summary["cost_to_target_usd"] is None
    assert [r["modeled_setup_s"] for r in records] == [300.0, 0.0]
    assert summary["modeled_seconds"] > 300.0


def test_cost_name_of_a_preset_loads_its_prices():
    """`cost.name=aws_lambda` is what `cost=aws_lambda` is: a label alone would price the
    run at the default preset's rates under another preset's name."""
    from jaxrl_dist.cli.compose import load_config

    by_name, by_preset = load_config(["cost.name=aws_lambda"]), load_config(["cost=aws_lambda"])
    assert by_name.cost == by_preset.cost and by_name.cost.name == "aws_lambda"
    assert by_name.cost.vcpu_second_usd != load_config([]).cost.vcpu_second_usd
    assert load_config(["cost.name=my_cloud"]).cost.name == "my_cloud"  # a name of one's own labels prices one sets


def test_shard_seconds_share_a_batch_and_leave_this_process_s_compile_out():
    """The local backend runs its shards as one jitted batch: each is billed a share of it,
    and the compile of a new shard bucket inside it is not compute the model charges."""
    from types import SimpleNamespace as NS

    from jaxrl_dist.trainers.accounting import shard_seconds

    batch = [NS(worker="w", timings=NS(started=1.0, finished=3.0, billed=2.0)) for _ in range(4)]
    assert shard_seconds(batch) == [0.5] * 4
    assert shard_seconds(batch, billed=True) == [0.5] * 4  # not 4 x the batch
    assert shard_seconds(batch, less=1.2) == pytest.approx([0.2] * 4)
    assert shard_seconds(batch, less=9.0) == [0.0] * 4
    apart = [NS(worker=f"w{i}", timings=NS(started=0.0, finished=1.0 + i, billed=2.0)) for i in range(2)]
    assert shard_seconds(apart) == [1.0, 2.0] and shard_seconds(apart, billed=True) == [2.0, 2.0]

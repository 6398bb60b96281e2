"""`jaxrl-dist bench` through the console script: the outputs and their device metadata,
the budget that no run outlasts, and the pure pieces that turn a run into figures."""
from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest

from jaxrl_dist.tools import benchmark
from test_cli import run_cli

MACHINE_KEYS = {"platform", "device_kind", "device_count", "devices", "cpu_model", "cpu_count", "jax_version",
                "commit", "library_hash", "xla_flags", "date"}


@pytest.fixture(scope="module")
def quick_cartpole(tmp_path_factory):
    """One small case through the real CLI: `(process, out dir, seconds)`."""
    out = tmp_path_factory.mktemp("bench") / "out"
    t0 = time.monotonic()
    proc = run_cli("bench", "--quick", "--cases", "cartpole_1", "--out", str(out), timeout=120)
    return proc, out, time.monotonic() - t0


@pytest.mark.slow  # a CLI run of the quick CartPole case: 26-60 s here
def test_bench_writes_json_markdown_png_with_the_device(quick_cartpole):
    proc, out, _ = quick_cartpole
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((out / "bench.json").read_text())
    assert MACHINE_KEYS <= set(data["machine"]), data["machine"]
    assert data["machine"]["platform"] == "cpu" and data["machine"]["device_count"] >= 1
    assert data["quick"] is True and list(data["cases"]) == ["cartpole_1"]
    case = data["cases"]["cartpole_1"]
    assert case["status"] == "ok", case
    fig = case["figures"]
    # compile time apart from the training time; steps/s from the run's own summary
    assert fig["compile_seconds"] > 0 and fig["train_seconds"] > 0 and fig["sps"] > 0
    assert fig["wall_seconds"] >= fig["compile_seconds"] + fig["train_seconds"]
    assert fig["process_seconds"] > fig["wall_seconds"]
    assert fig["total_env_steps"] == 8192 and fig["num_seeds"] == 1 and fig["sps_steady"] > 0
    assert (out / "runs" / "cartpole_1" / "summary.json").is_file()
    md = (out / "bench.md").read_text()
    assert "| cartpole_1 | ok |" in md and data["machine"]["cpu_model"] in md
    assert "PureJaxRL" not in md and "Not at --quick sizes" in md  # smoke runs beside full published runs mislead
    png = (out / "bench_sps.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and (out / "bench_time.png").stat().st_size > 1000
    assert "Against published figures" in proc.stdout  # the comparison's section is printed too


@pytest.mark.slow  # needs the quick CartPole run above
def test_budget_is_never_outrun_and_finished_cases_are_kept(quick_cartpole, tmp_path):
    """A second call resumes the first's output under a budget that may be too short for
    Breakout: cartpole_1 is kept from the JSON, Breakout is skipped, killed or run, and the
    command records that it kept to the budget (what the clock read is in bench.json,
    not asserted: a busy machine stretches it)."""
    _, first, _ = quick_cartpole
    out = tmp_path / "out"
    shutil.copytree(first, out)
    budget = 12.0
    proc = run_cli("bench", "--quick", "--resume", "--cases", "cartpole_1,minatar_breakout",
                   "--budget-s", str(budget), "--out", str(out), timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads((out / "bench.json").read_text())
    assert data["cases"]["cartpole_1"]["status"] == "ok"  # kept, not run again
    assert "kept from" in proc.stdout
    breakout = data["cases"]["minatar_breakout"]
    assert breakout["status"] in ("skipped", "killed", "ok"), breakout
    if breakout["status"] != "ok":  # cut by the budget, not by its own cap
        assert breakout["limit"] == "budget" and "budget" in breakout["reason"], breakout
    assert data["budget_s"] == budget and data["elapsed_s"] > 0


def test_bad_flags_are_one_line_and_exit_2(tmp_path):
    for args, key in ((["--cases", "cartpole_3"], "--cases"), (["--profile", "scaling"], "--profile"),
                      (["--budget-s", "1"], "--budget-s")):
        proc = run_cli("bench", *args, "--out", str(tmp_path), timeout=60)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and key in proc.stderr, proc.stderr


def _rec(update, steps, ret, sps, seeds=2):
    return {"update": update, "env_steps": steps, "return": ret, "sps": sps, "episode_return_sum": [0.0] * seeds}


def test_chunk_rates_and_time_to_score_from_records():
    # two chunks of two updates: 100 steps per seed per update, 2 seeds
    recs = [_rec(1, 100, -21.0, 100.0), _rec(2, 200, -19.0, 100.0), _rec(3, 300, -12.0, 400.0),
            _rec(4, 400, -5.0, 400.0)]
    assert benchmark.chunk_rates(recs) == [(400, 100.0), (400, 400.0)]
    reached = benchmark.time_to_scores(recs, scores=(-20.0, -15.0), window=2)
    # mean of the last two returns: -20 at update 2 (4 s), -15.5 at 3, -8.5 at 4 (5 s)
    assert reached == [{"score": -20.0, "train_seconds": 4.0, "env_steps": 400},
                       {"score": -15.0, "train_seconds": 5.0, "env_steps": 800}]
    killed = benchmark.Outcome("killed", "killed", 9.0, None, recs)
    fig = benchmark.figures(killed)
    assert fig["total_env_steps"] == 800 and fig["train_seconds"] == 5.0 and fig["sps_steady"] == 400.0
    assert fig["best_return"] == -5.0 and fig["num_seeds"] == 2


def test_published_figures_sit_beside_full_size_runs_only():
    data = {"machine": {"platform": "cpu", "device_count": 2, "device_kind": "cpu", "cpu_model": "Some CPU",
                        "cpu_count": 2}, "elapsed_s": 10.0, "budget_s": 90.0, "cases": {}}
    full, quick = benchmark.markdown(data), benchmark.markdown({**data, "quick": True})
    assert "PureJaxRL" in full and "Not at --quick sizes" not in full
    assert "PureJaxRL" not in quick and "Not at --quick sizes" in quick


def test_resume_keeps_what_was_measured_and_reruns_the_rest():
    assert benchmark.done_before({"status": "ok"}) and benchmark.done_before({"status": "failed"})
    assert benchmark.done_before({"status": "killed", "figures": {"sps": 1e6}})
    assert not benchmark.done_before({"status": "killed", "figures": {"process_seconds": 9.0}})
    assert not benchmark.done_before({"status": "skipped", "reason": "budget"})
    assert benchmark.device_counts(8) == [1, 2, 4, 8] and benchmark.device_counts(6) == [1, 2, 4, 6]


@pytest.mark.slow
def test_quick_suite_records_every_case_under_its_budget(tmp_path):
    """The whole `--quick` suite with a profile, under its 90 s budget: every case
    recorded (ok, or skipped/killed with a one-line reason), the trace loadable."""
    proc = run_cli("bench", "--quick", "--profile", "cartpole_1", "--out", str(tmp_path), timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert list(data["cases"]) == list(benchmark.ORDER)
    for name, case in data["cases"].items():
        assert case["status"] in ("ok", "skipped", "killed"), (name, case)
        assert case["status"] == "ok" or (case["reason"] and "\n" not in case["reason"]), (name, case)
    assert any(case["status"] == "ok" for case in data["cases"].values()), data["cases"]
    profile = data["profile"]
    if profile["status"] == "ok":  # the budget may leave no time for it on a busy machine
        assert profile["events"] > 0 and any(f.endswith(".xplane.pb") for f in profile["files"])


def test_write_json_writes_a_run_summary_as_its_mapping(tmp_path):
    """A bench script puts `train()`'s `RunSummary` into its JSON as the mapping it reads as."""
    from jaxrl_dist.tools.files import write_json

    class Summary:  # what `write_json` relies on: `RunSummary.to_json`
        def to_json(self):
            return {"final_return": 500.0}

    path = write_json(tmp_path / "out.json", {"summary": Summary(), "x": np.float32(1.5)})
    assert json.loads(path.read_text()) == {"summary": {"final_return": 500.0}, "x": 1.5}

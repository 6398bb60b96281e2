"""`jaxrl-dist report`: PNGs from real round and fused runs and from synthetic
records carrying the cost fields; figures whose keys are missing are skipped
and named; a path that is not a run directory is one line and exit code 2."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from jaxrl_dist.tools import report
from jaxrl_dist.config import from_dict
from test_cli import cli_env, command

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_PLOTS = {"return_vs_steps.png", "return_vs_modeled_time.png", "return_vs_wall_time.png",
             "shards_per_round.png", "cost.png", "time_breakdown.png", "phases.png"}
# what a round record has without a cost model
ROUND_PLOTS = {"return_vs_steps.png", "return_vs_wall_time.png", "shards_per_round.png",
               "time_breakdown.png", "phases.png"}
QUIET = {"progress": False, "tensorboard": False, "compile_cache": False}


def assert_png(path: Path) -> None:
    from PIL import Image

    data = path.read_bytes()
    assert len(data) > len(PNG_MAGIC) and data.startswith(PNG_MAGIC), path
    with Image.open(path) as image:
        image.verify()
        assert image.size[0] > 100 and image.size[1] > 100


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(command() + list(args), capture_output=True, text=True, timeout=120,
                          env=cli_env(MPLBACKEND="Agg"))


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """A 4-round local round-trainer run (2 shards of 4 envs x 16 steps) and a
    10-update fused run; both tiny."""
    from jaxrl_dist.trainers.runner import train

    root = tmp_path_factory.mktemp("runs")
    algo = {"num_steps": 16, "num_minibatches": 2, "update_epochs": 1}
    train(from_dict({
        "algo": {**algo, "total_timesteps": 2 * 4 * 16 * 4},
        "trainer": "sync", "backend": {"name": "local", "envs_per_shard": 4, "max_shards": 2},
        "scheduler": {"num_shards": 2}, "run": {"dir": str(root / "round"), **QUIET}}))
    train(from_dict({"env": {"num_envs": 4}, "algo": {**algo, "total_timesteps": 4 * 16 * 10},
                     "run": {"dir": str(root / "fused"), **QUIET}}))
    return root / "round", root / "fused"


def synthetic(rounds: int = 6, cost: bool = True) -> list:
    """Round records as the round trainer writes them, plus the cost model's fields."""
    records, cum = [], {"modeled": 0.0, "cost": 0.0, "wall": 0.0}
    for r in range(1, rounds + 1):
        n = 2 ** (r % 3)
        rec = {"round": r, "update": r, "env_steps": 64 * r, "num_shards": n, "return": 10.0 * r,
               "dispatch_s": 0.01, "wait_s": 0.2, "transfer_s": 0.02, "learn_s": 0.1, "round_s": 0.4,
               # the round's phases, adding up to its wall
               "phase_schedule_s": 0.01, "phase_dispatch_s": 0.01, "phase_rollout_s": 0.15, "phase_wait_s": 0.05,
               "phase_decode_s": 0.02, "phase_learn_s": 0.1, "phase_record_s": 0.01, "phase_log_s": 0.05}
        if cost:
            modeled, usd = 0.5 + 0.1 * n, 1e-4 * n
            cum = {"modeled": cum["modeled"] + modeled, "cost": cum["cost"] + usd,
                   "wall": cum["wall"] + 0.4}
            rec.update({"modeled_s": modeled, "cost_usd": usd, "cum_modeled_s": cum["modeled"],
                        "cum_cost_usd": cum["cost"], "cum_wall_s": cum["wall"],
                        "modeled_invoke_s": 0.05, "modeled_start_s": 0.1, "modeled_actor_s": 0.3,
                        "modeled_transfer_s": 0.02, "modeled_learn_s": 0.1,
                        "modeled_setup_s": 2.0 if r == 1 else 0.0, "shard_usd": 0.8 * usd,
                        "learner_usd": 0.2 * usd})
        records.append(rec)
    return records


def write_run(path: Path, records: list, summary=None, config=None) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    if config is not None:
        (path / "config.yaml").write_text(config)
    return path


def test_cli_plots_a_round_and_a_fused_run_together(real_runs, tmp_path):
    round_dir, fused_dir = real_runs
    out = run_cli("report", str(round_dir), str(fused_dir))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("round (local/fixed): final return ") and "rounds 4" in lines[0]
    assert lines[1].startswith("fused (fused): final return ") and "updates 10" in lines[1]
    records = report.read_metrics(round_dir / "metrics.jsonl")
    expected = set(ROUND_PLOTS)
    if report._has(records, "cum_modeled_s") or report._has(records, "modeled_s"):
        expected.add("return_vs_modeled_time.png")
    if report._has(records, "cost_usd") or report._has(records, "cum_cost_usd"):
        expected.add("cost.png")
    written = {p.name for p in round_dir.glob("*.png")}
    assert written == expected
    for name in written:
        assert_png(round_dir / name)
        assert f"wrote {round_dir / name}" in lines
    # the fused run has no per-round keys: named as left out of those figures
    assert any(line.startswith("shards_per_round.png: left out fused (fused) (no num_shards)")
               for line in lines)
    for name in ALL_PLOTS - expected:
        assert any(line.startswith(f"{name}: skipped") for line in lines), (name, lines)
    assert not list(fused_dir.glob("*.png"))
    alone = run_cli("report", str(round_dir))  # one bar beside a tall legend: laid out without a warning
    assert alone.returncode == 0 and "Warning" not in alone.stderr, alone.stderr


def test_plot_runs_in_process_with_cost_fields(tmp_path):
    runs = {"max": synthetic(), "adapt": synthetic(report.MAX_BARS + 1)}  # bars, and steps
    paths = report.plot_runs(runs, tmp_path / "plots")
    assert {p.name for p in paths} == ALL_PLOTS
    for p in paths:
        assert p.parent == tmp_path / "plots"
        assert_png(p)


def test_missing_keys_are_skipped_and_named(tmp_path):
    bare = [{"update": u, "env_steps": 32 * u, "return": float(u)} for u in range(1, 5)]
    no_return = [{"update": 1, "env_steps": 32, "return": None, "num_shards": 2}]
    runs = {"bare": bare, "no-return": no_return, "empty": []}
    paths, notes = report.make_plots(runs, tmp_path)
    assert [p.name for p in paths] == ["return_vs_steps.png", "shards_per_round.png"]
    assert_png(paths[0])
    text = "\n".join(notes)
    assert "return_vs_steps.png: left out no-return (no return); empty (no records)" in text
    assert "shards_per_round.png: left out bare (no num_shards); empty (no records)" in text
    for name in ("return_vs_modeled_time.png", "return_vs_wall_time.png", "cost.png",
                 "time_breakdown.png", "phases.png"):
        assert f"{name}: skipped" in text and not (tmp_path / name).exists()


def test_derived_series_from_partial_keys():
    records = [{"round": 1, "cost_usd": 0.5, "round_s": 2.0, "learn_s": 0.5, "wait_s": 1.0},
               {"round": 2, "cost_usd": 0.25, "round_s": 1.0, "learn_s": 0.5, "wait_s": 0.25}]
    assert report.cumulative(records, "cum_cost_usd", "cost_usd") == [0.5, 0.75]
    assert report.cumulative(records, "cum_wall_s", "round_s") == [2.0, 3.0]
    assert report.cumulative(records, "cum_modeled_s", "modeled_s") is None
    cum_only = [{"cum_cost_usd": 0.5}, {"cum_cost_usd": 0.75}]
    assert report.per_round_cost(cum_only) == [0.5, 0.25]
    parts = report.measured_components(records)
    assert parts == {"wait": [1.0, 0.25], "learn": [0.5, 0.5], "other": [0.5, 0.25]}
    assert report.modeled_components(records) == {}
    modeled = report.modeled_components(synthetic(2))
    assert list(modeled) == ["setup", "invoke", "start", "actor", "transfer", "learn"]
    assert modeled["setup"] == [2.0, 0.0]
    # bare names that no measured key has count as modeled; bare learn_s stays measured
    bare = [{"round": 1, "actor_s": 0.3, "invoke_s": 0.1, "learn_s": 0.2, "modeled_queue_s": 0.4}]
    assert report.modeled_components(bare) == {"invoke": [0.1], "actor": [0.3], "queue": [0.4]}


def test_cli_out_dir_labels_and_summary_lines(tmp_path):
    cfg = "backend:\n  name: local\nscheduler:\n  name: adapt\n"
    a = write_run(tmp_path / "seed0" / "run", synthetic(),
                  {"final_return": 60.0, "rounds": 6, "cost_usd": 0.0012, "modeled_seconds": 4.5,
                   "wall_seconds": 2.4}, cfg)
    b = write_run(tmp_path / "seed1" / "run", synthetic(4), None, cfg)
    # a run still writing: its last line is cut off
    with open(b / "metrics.jsonl", "a") as f:
        f.write('{"round": 5, "ret')
    out = run_cli("report", str(a), str(b), "--out", str(tmp_path / "figs"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == ("seed0/run (local/adapt): final return 60.0, rounds 6, cost $0.0012, "
                        "modeled 4.5 s, wall 2.4 s")
    assert lines[1].startswith("seed1/run (local/adapt): final return 40.0, rounds 4, cost $")
    assert lines[1].endswith("(no summary.json)")
    assert {p.name for p in (tmp_path / "figs").glob("*.png")} == ALL_PLOTS
    assert not list(a.glob("*.png"))


@pytest.mark.parametrize("kind", ["missing", "no-metrics", "bad-line"])
def test_cli_bad_path_is_one_line_and_exit_2(tmp_path, kind):
    good = write_run(tmp_path / "good", synthetic())
    bad = tmp_path / "bad"
    if kind == "no-metrics":
        bad.mkdir()
    elif kind == "bad-line":
        write_run(bad, [])
        (bad / "metrics.jsonl").write_text('{"round": 1}\nnot json\n{"round": 2}\n')
    out = run_cli("report", str(good), str(bad))
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and str(bad) in out.stderr
    if kind == "missing":  # the words `eval` says it in too
        assert out.stderr.strip() == f"error: {bad}: not a run directory (does not exist)"
    assert not list(good.glob("*.png"))  # every path is checked before anything is drawn


# ---------------------------------------------------------------- sweeps (synthetic)


def fused_records(updates: int, sps: float, start: float = 20.0) -> list:
    """A fused run's records: steps, return and the chunk's steps per second, no clock."""
    return [{"update": u, "env_steps": 128 * u, "return": start + u, "sps": sps} for u in range(1, updates + 1)]


def test_job_curves_start_at_each_jobs_own_training_clock():
    """A job that compiled (6 s) and one that loaded from the compile cache (0.5 s) both
    start at 0 on the wall-time axis, so their curves overlap instead of meeting at a point."""
    from jaxrl_dist.tools.sweep_report import job_curve, mean_band, training_clock

    def fused(compile_s):
        records = fused_records(8, sps=1280.0)
        summary = {"compile_seconds": compile_s, "final_return": 28.0}
        return report.Run(Path("f"), report.with_wall_clock(records, summary, None), summary, None)

    cold, warm = fused(6.0), fused(0.5)
    for run in (cold, warm):
        x, y = job_curve(run, "wall")
        assert x[0] == 0.0 and list(y) == [21.0 + u for u in range(8)]
        np.testing.assert_allclose(np.diff(x), 0.1)  # 128 steps at 1280 steps/s apart
    assert report.wall_clock(cold)[0] > report.wall_clock(warm)[0]  # the run's own clock keeps it
    # a round trainer's clock (`cum_wall_s`) starts at its first round, which holds the compile
    rounds = [{"round": r, "env_steps": 64 * r, "return": float(r), "cum_wall_s": 3.0 + 0.5 * r}
              for r in range(1, 5)]
    assert training_clock(report.Run(Path("r"), rounds, None, None)) == [0.0, 0.5, 1.0, 1.5]
    grid, mean, _, _ = mean_band([job_curve(cold, "wall"), job_curve(warm, "wall")], np.random.default_rng(0))
    assert len(grid) > 1 and grid[0] == 0.0
    # a record without a return is left out; one without a clock leaves the job out
    no_clock = report.Run(Path("n"), [{"update": 1, "return": 1.0}], None, None)
    assert job_curve(no_clock, "wall") is None and job_curve(no_clock, "env_steps") is None


def write_sweep(root: Path, sizes: dict) -> Path:
    """A multirun directory: `{lr: seeds}` jobs of synthetic fused runs."""
    import yaml

    root.mkdir()
    (root / "multirun.yaml").write_text("hydra: {}\n")
    job = 0
    for lr, seeds in sizes.items():
        for seed in range(seeds):
            run = write_run(root / str(job), fused_records(6, 1000.0 + seed, start=10.0 * lr + seed),
                            {"final_return": 10.0 * lr + seed + 6, "env_id": "CartPole-v1",
                             "wall_seconds": 2.0, "compile_seconds": 1.5})
            (run / ".hydra").mkdir()
            (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"algo.lr={lr}", f"seed={seed}"]))
            job += 1
    return root


@pytest.fixture
def few_reps(monkeypatch):
    """rliable's bootstraps with fewer resamples: the figures and notes, not the intervals."""
    from jaxrl_dist.tools import sweep_report

    monkeypatch.setattr(sweep_report, "BOOTSTRAP_REPS", 100)
    return sweep_report.sweep_report


def test_a_sweep_of_few_runs_a_group_skips_the_performance_profile_in_one_line(tmp_path, few_reps):
    """(The CLI prints these notes: test_sweeps' report of a real sweep checks it.)"""
    sweep = write_sweep(tmp_path / "sweep", {1: 2, 2: 3})
    _, written, notes = few_reps(sweep)
    note = "performance profile skipped: groups have 2-3 runs, it needs at least 5"
    assert notes == [note]
    assert f"- {note}" in (sweep / "sweep.md").read_text().splitlines()
    assert not (sweep / "sweep_performance_profile.png").exists()
    assert_png(sweep / "sweep_return_vs_wall_time.png")
    (sweep / "1" / "summary.json").unlink()  # a job stopped before its end has records, no summary
    assert few_reps(sweep)[2][0] == ("jobs without summary.json (interrupted, or still running), drawn from "
                                     "their records: 1; one continues with jaxrl-dist train run.resume=DIR")


def test_jobs_a_stopped_sweep_never_ran_are_named(tmp_path, few_reps):
    """A multirun stopped during its 3rd of 2 x 3 jobs (Ctrl-C, SIGTERM) has no directory for
    the last 3: the aggregate says so rather than looking whole."""
    import yaml

    from jaxrl_dist.tools.sweep_report import planned_jobs

    sweep = write_sweep(tmp_path / "sweep", {1: 3})
    planned = {"hydra": {"sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                                      "params": {"algo.lr": "1,2"}},
                         "overrides": {"task": ["seed=0,1,2", "trainer=fused"]}}}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(planned))
    assert planned_jobs(sweep) == 6
    assert few_reps(sweep)[2][0] == ("jobs the sweep planned that never ran (no directory): 3, 4, 5 of 6; "
                                     "the figures and the table leave them out")
    planned["hydra"]["sweeper"] = {"_target_": "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"}
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(planned))
    assert planned_jobs(sweep) is None  # sampled trials: no count to miss


def test_a_performance_profile_draws_the_groups_of_five_runs_or_more(tmp_path, few_reps):
    sweep = write_sweep(tmp_path / "sweep", {1: 5, 2: 2})
    lines, written, notes = few_reps(sweep)
    assert sweep / "sweep_performance_profile.png" in written
    assert_png(sweep / "sweep_performance_profile.png")
    assert notes == ["performance profile: left out algo.lr=2 (2 runs, it needs at least 5)"]
    assert lines[0].endswith("| wall (s, mean) | compile (s, mean) |") and lines[2].endswith("| 2.0 | 1.5 |")


def test_a_job_left_alone_in_its_sweep_is_named_by_its_overrides():
    """The other jobs failed (no records): the one left is named by what it set, not "all jobs"."""
    from types import SimpleNamespace

    from jaxrl_dist.tools.sweep_report import _grouped

    run = SimpleNamespace(summary={"env_id": "CartPole-v1"}, config={})
    groups = _grouped([(run, frozenset({"algo.lr=0.001", "algo.gamma=0.99"}))])
    assert [g.label for g in groups] == ["algo.gamma=0.99 algo.lr=0.001"]
    two = _grouped([(run, frozenset({"algo.lr=0.001", "env=cartpole"})), (run, frozenset({"algo.lr=0.01", "env=cartpole"}))])
    assert [g.label for g in two] == ["algo.lr=0.001", "algo.lr=0.01"]

"""Runs that survive damage: a damaged newest checkpoint falls back to the newest intact
one (one line each), a damaged config.yaml or an unusable run dir or URL is one line and
exit 2 before anything compiles, and runs killed with SIGKILL at random points resume to
their uninterrupted twin's parameters (the async trainer above staleness 0: the bound
held, every chunk learned or dropped exactly once)."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxrl_dist.config import ConfigError, from_dict, to_dict
from jaxrl_dist.trainers import checkpoint
from jaxrl_dist.trainers.runner import train
from conftest import runs_once
from test_async import assert_every_chunk_once
from test_checkpoint import cli_env, command, finished_steps

QUIET = {"progress": False, "tensorboard": False}
FUSED = {"trainer": "fused", "env": {"num_envs": 4},
         "algo": {"num_steps": 16, "total_timesteps": 64 * 30}}
SYNC = {"trainer": "sync", "algo": {"num_steps": 16, "total_timesteps": 2 * 64 * 6, "minibatch_size": 32},
        "backend": {"name": "local", "max_shards": 2, "envs_per_shard": 4},
        "scheduler": {"name": "fixed", "num_shards": 2}}
ASYNC = {**{k: v for k, v in SYNC.items() if k != "scheduler"}, "trainer": "async",
         "asynchronous": {"batch_chunks": 2, "actors": 2, "balance": False, "max_staleness": 0}}
TRAINERS = {"fused": (FUSED, 10), "sync": (SYNC, 2), "async": (ASYNC, 2)}  # config, run.checkpoint_every
KINDS = ["truncate", "overwrite", "garbage", "delete", "empty", "unverified"]


def _largest_file(step: Path) -> Path:
    files = [p for p in step.rglob("*") if p.is_file() and p.name != checkpoint.MANIFEST]
    return max(files, key=lambda p: p.stat().st_size)


def damage(step: Path, kind: str) -> None:
    """Damage one checkpoint step the way a full disk, a stray write or a hand would."""
    if kind == "truncate":  # the largest file (parameters): orbax may read it without an error
        f = _largest_file(step)
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif kind == "overwrite":  # the same length of random bytes: no size tells
        f = _largest_file(step)
        f.write_bytes(os.urandom(f.stat().st_size))
    elif kind == "garbage":  # orbax's metadata overwritten
        f = step / checkpoint.ITEM / "_METADATA"
        f.write_bytes(os.urandom(f.stat().st_size))
    elif kind == "delete":
        _largest_file(step).unlink()
    elif kind == "empty":
        shutil.rmtree(step)
        step.mkdir()
    elif kind == "unverified":  # no manifest: only the failed restore tells
        (step / checkpoint.MANIFEST).unlink()
        (step / checkpoint.ITEM / "_METADATA").write_text('{"tree_metadata": {')
    else:
        raise AssertionError(kind)


def _tree(step: int) -> dict:
    """A small state pytree whose values say which step it was saved at."""
    return {"w": np.full((64, 64), float(step), np.float32), "b": np.arange(64, dtype=np.float32) + step,
            "update": np.array(step, np.int32)}


def _saved_run(run_dir: Path, steps=(10, 20, 30)) -> None:
    ckpt = checkpoint.Checkpointer(run_dir)
    for step in steps:
        ckpt.save(_tree(step), step=step)
    ckpt.close()


@pytest.mark.parametrize("kind", KINDS)
def test_restore_latest_skips_a_damaged_newest_step(tmp_path, kind):
    """The one restore path of all trainers: the damaged newest step is reported in one
    line naming its step and path, set aside, and the next one restored (one line)."""
    _saved_run(tmp_path)
    damage(tmp_path / "checkpoints" / "30", kind)
    said = []
    ckpt = checkpoint.Checkpointer(tmp_path)
    restored = ckpt.restore_latest(_tree(0), say=said.append)
    assert int(restored["update"]) == 20 and float(restored["w"][0, 0]) == 20.0
    assert len(said) == 2, said
    assert said[0].startswith("warning: checkpoint 30 is damaged") and str(tmp_path / "checkpoints" / "30") in said[0]
    assert said[1].startswith("resuming from checkpoint 20")
    assert ckpt.latest_step() == 20 and (tmp_path / checkpoint.DAMAGED_SUBDIR / "30").is_dir()
    ckpt.save(_tree(30), step=30)  # the step can be written again
    assert ckpt.latest_step() == 30 and checkpoint.manifest_problem(tmp_path / "checkpoints" / "30") is None
    ckpt.close()


def test_restore_latest_without_an_intact_step_moves_nothing(tmp_path):
    _saved_run(tmp_path)
    for step in (10, 20, 30):
        damage(tmp_path / "checkpoints" / str(step), "truncate")
    said = []
    ckpt = checkpoint.Checkpointer(tmp_path)
    with pytest.raises(ConfigError, match=r"run.resume: no intact checkpoint in .* \(damaged: 30, 20, 10\)"):
        ckpt.restore_latest(_tree(0), say=said.append)
    ckpt.close()
    assert len(said) == 3 and finished_steps(tmp_path) == [10, 20, 30]
    assert not (tmp_path / checkpoint.DAMAGED_SUBDIR).exists()


def test_a_step_whose_manifest_is_unreadable_is_restored_with_a_warning(tmp_path):
    """Its files may be whole (they restore), but nothing checked them: one line says so."""
    _saved_run(tmp_path)
    manifest = tmp_path / "checkpoints" / "30" / checkpoint.MANIFEST
    manifest.write_text(manifest.read_text()[:40])
    said = []
    ckpt = checkpoint.Checkpointer(tmp_path)
    assert int(ckpt.restore_latest(_tree(0), say=said.append)["update"]) == 30
    ckpt.close()
    assert len(said) == 1 and said[0].startswith("warning: checkpoint 30's sha256.json is unreadable"), said


def test_an_intact_newest_step_is_restored_without_a_word(tmp_path):
    _saved_run(tmp_path)
    said = []
    ckpt = checkpoint.Checkpointer(tmp_path)
    assert int(ckpt.restore_latest(_tree(0), say=said.append)["update"]) == 30 and said == []
    ckpt.close()


@pytest.fixture(scope="module", params=list(TRAINERS))
def finished_run(request, tmp_path_factory):
    """A whole run with three checkpoints kept: `(trainer, run dir, summary)`."""
    name = request.param
    data, every = TRAINERS[name]
    run_dir = tmp_path_factory.mktemp(f"whole-{name}")
    summary = train(from_dict({**data, "run": {"dir": str(run_dir), "checkpoint_every": every, **QUIET}}))
    return name, run_dir, summary


@pytest.mark.slow  # a run and a resume per case; test_restore_latest_* cover the path itself
@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_newest_checkpoint_falls_back_to_the_intact_one(finished_run, kind, tmp_path, capsys):
    name, whole, summary = finished_run
    run_dir = tmp_path / "run"
    shutil.copytree(whole, run_dir)  # its config.yaml names `whole`: a resume takes its own dir
    (run_dir / "summary.json").unlink()  # as if killed after its last checkpoint: a finished run is not resumed
    steps = finished_steps(run_dir)
    newest, previous = steps[-1], steps[-2]
    damage(run_dir / "checkpoints" / str(newest), kind)
    capsys.readouterr()

    resumed = train(from_dict({"run": {"resume": str(run_dir), "progress": False, "compile_cache": True}}))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert resumed["resumed_at_update"] == previous
    assert resumed["params_sha256"] == summary["params_sha256"]  # the fallback loses nothing
    assert len(err) == 2, err  # one line for the damaged step, one for the fallback
    assert err[0].startswith(f"warning: checkpoint {newest} is damaged")
    assert str(run_dir / "checkpoints" / str(newest)) in err[0]
    assert err[1].startswith(f"resuming from checkpoint {previous}")
    # the damaged step is kept aside, and the resumed run wrote that step again
    assert (run_dir / checkpoint.DAMAGED_SUBDIR / str(newest)).is_dir()
    assert finished_steps(run_dir)[-1] == newest
    assert checkpoint.manifest_problem(run_dir / "checkpoints" / str(newest)) is None


def test_a_resumed_run_takes_the_new_addresses_of_its_actors(tmp_path):
    """Instances that came back elsewhere: `backend.urls` beside `run.resume` composes
    against the saved run's backend and replaces its endpoints, nothing else."""
    from jaxrl_dist.cli.compose import load_config
    from jaxrl_dist.trainers.rundir import prepare_run

    saved = from_dict({"trainer": "sync", "backend": {"name": "http", "urls": ["http://127.0.0.1:9"],
                                                      "max_retries": 5}})
    checkpoint.save_run_config(tmp_path, to_dict(saved))
    given = load_config([f"run.resume={tmp_path}", "backend.urls=[http://127.0.0.1:10,http://127.0.0.1:11]"])
    resumed, _, resuming = prepare_run(given)
    assert resuming and resumed.backend.urls == ["http://127.0.0.1:10", "http://127.0.0.1:11"]
    assert to_dict(resumed)["backend"] == {**to_dict(saved)["backend"], "urls": resumed.backend.urls}
    # a resume that names no backend key keeps the saved one whole
    assert prepare_run(load_config([f"run.resume={tmp_path}"]))[0].backend == saved.backend


# --- bad config.yaml, run dir, URL: exit 2, one line, before anything compiles --------------


def _bad_inputs(root: Path) -> list:
    """`(overrides, what the line must name)` for each kind of bad input, made under `root`."""
    for name, text in (("notyaml", "env: [1,\n  x: {"), ("list", "- 1\n- 2\n"),
                       ("unknown", "env:\n  id: CartPole-v1\nbogus: 3\n")):
        (root / name).mkdir(parents=True)
        (root / name / "config.yaml").write_text(text)
    (root / "file").write_text("not a directory")
    (root / "saved").mkdir()
    checkpoint.save_run_config(root / "saved", to_dict(from_dict({"trainer": "fused"})))
    shutil.copytree(root / "saved", root / "finished")  # its last update checkpointed, its summary written
    (root / "finished" / checkpoint.CHECKPOINT_SUBDIR / "30").mkdir(parents=True)
    (root / "finished" / "summary.json").write_text(json.dumps({"num_updates": 30, "env_steps": 1920,
                                                                "stop_reason": "total_timesteps"}))
    cases = [([f"run.resume={root / n}"], str(root / n / "config.yaml")) for n in ("notyaml", "list", "unknown")]
    cases += [([f"run.dir={root / 'file'}"], str(root / "file")),
              ([f"run.dir={root / 'file' / 'sub'}"], str(root / "file" / "sub")),
              (["run.dir=/proc/jaxrl-dist-run"], "/proc/jaxrl-dist-run"),  # nothing can be made there
              (["run.resume=/proc/self"], "run.resume"),  # not a run dir
              (["trainer=sync", "backend=http", "backend.urls=[not-a-url]"], "backend.urls[0]"),
              (["trainer=sync", "backend=http", "backend.urls=[http://127.0.0.1:8000,http://h:99999]"],
               "backend.urls[1]"),
              # a resumed run trains its saved config: a key beside run.resume is not dropped silently
              ([f"run.resume={root / 'saved'}", "algo.lr=0.1"], "algo.lr: run.resume="),
              ([f"run.resume={root / 'saved'}", f"run.dir={root / 'other'}"], "a resumed run stays in its own"),
              # a finished run: a resume would train nothing and write a summary of nothing over its own
              ([f"run.resume={root / 'finished'}"], "that run has finished (stopped by total_timesteps after 1,920"),
              # a wrapper's options without the wrapper: the run would see the whole observation
              ([f"run.dir={root / 'wrap'}", "env.wrapper_options.indices=[1]"], "env.wrapper_options.indices: no env.wrapper"),
              # a key only `scheduler train` reads
              ([f"run.dir={root / 'init'}", "scheduler.init_from=x.msgpack"], "scheduler.init_from: only"),
              # a misspelt plugin name, before a run dir is written
              ([f"run.dir={root / 'sched'}", "trainer=sync", "scheduler.name=adpt"], "(did you mean 'adapt'?)"),
              ([f"run.dir={root / 'learned'}", "trainer=sync", "scheduler=learned", "scheduler.max_shards=31"],
               "scheduler.max_shards=31: the scheduler in "),
              ([f"run.dir={root / 'token'}", "trainer=sync", "backend=http", "backend.urls=[http://127.0.0.1:9]",
                f"backend.token_file={root}"], f"backend.token_file: cannot read {root} (Is a directory)")]
    return cases


# every case through the same `main` the console script runs, in one process: Hydra sets up
# logging for a run, which closes the handler absl made on the stream of its import, and
# under pytest's capture that stream is pytest's
_EACH_CASE = """
import contextlib, io, json, sys
from jaxrl_dist import cli
out = []
for overrides in json.loads(sys.argv[1]):
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = cli.main(["train", "run.progress=false", *overrides])
    out.append([code, said.getvalue()])
print(json.dumps(out))
"""


def test_bad_run_dirs_config_files_and_urls_are_one_line_exit_2(tmp_path):
    """Fast, every case: one process runs them all (nothing is compiled)."""
    cases = _bad_inputs(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _EACH_CASE, json.dumps([o for o, _ in cases])],
                          capture_output=True, text=True, timeout=300, env=cli_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    for (overrides, named), (code, said) in zip(cases, json.loads(proc.stdout.splitlines()[-1])):
        lines = [x for x in said.splitlines() if x.strip()]
        assert code == 2, (overrides, lines)
        assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], (overrides, lines)
    assert not list(tmp_path.glob("**/.hydra")) and not list(tmp_path.glob("**/metrics.jsonl"))


@pytest.mark.slow  # a CLI process per case; the in-process test above checks every case too
def test_the_cli_process_says_one_line_and_exits_2(tmp_path):
    cases = _bad_inputs(tmp_path)
    procs = [subprocess.Popen(command() + ["train", "run.progress=false", *o], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=cli_env()) for o, _ in cases]
    for proc, (overrides, named) in zip(procs, cases):
        out, err = proc.communicate(timeout=300)
        lines = [x for x in (out + err).splitlines() if x.strip()]
        assert proc.returncode == 2, (overrides, lines)
        assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], (overrides, lines)
    assert not list(tmp_path.glob("**/.hydra")) and not list(tmp_path.glob("**/metrics.jsonl"))


# --- SIGKILL at random points ---------------------------------------------------------------

KILL_POINTS = 10
_Q = ["run.progress=false", "run.tensorboard=false", "run.checkpoint_every_s=1"]  # time-based ones too
KILLED = {  # overrides, updates in the whole run
    "fused": (["trainer=fused", "algo.num_steps=32", "algo.total_timesteps=64000", "run.checkpoint_every=50",
               *_Q], 500),
    "sync": (["trainer=sync", "scheduler=fixed", "scheduler.num_shards=2", "backend.max_shards=2",
              "algo.num_steps=32", "algo.total_timesteps=10240", "run.checkpoint_every=5", *_Q], 40),
    "sync_gru": (["trainer=sync", "scheduler=fixed", "scheduler.num_shards=2", "backend.max_shards=2",
                  "algo.network=gru", "algo.network_options.hidden_size=16", "algo.num_steps=32",
                  "algo.minibatch_size=null", "algo.total_timesteps=10240", "run.checkpoint_every=5", *_Q], 40),
    "fused_gru": (["trainer=fused", "algo.network=gru", "algo.network_options.hidden_size=16", "algo.num_steps=32",
                   "algo.minibatch_size=null", "algo.total_timesteps=32000", "run.checkpoint_every=25", *_Q], 250),
    "async0": (["trainer=async", "asynchronous.max_staleness=0", "asynchronous.balance=false", "asynchronous.batch_chunks=2",
                "asynchronous.actors=2", "backend.max_shards=2", "algo.num_steps=32", "algo.total_timesteps=10240",
                "run.checkpoint_every=5", *_Q], 40),
    "async2": (["trainer=async", "asynchronous.max_staleness=2", "asynchronous.balance=false", "asynchronous.batch_chunks=2",
                "asynchronous.actors=3", "backend.max_shards=3", "algo.num_steps=32", "algo.total_timesteps=10240",
                "run.checkpoint_every=5", *_Q], 40),
}


def records_in(run_dir: Path) -> list:
    path = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def kill_at(run_dir: Path, overrides: list, records: int, delay: float, timeout: float = 300) -> bool:
    """Start a CLI run and SIGKILL it `delay` s after its metrics hold `records` lines;
    whether it was still running when killed."""
    proc = subprocess.Popen(command() + ["train", f"run.dir={run_dir}", *overrides],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=cli_env())
    deadline, metrics = time.monotonic() + timeout, run_dir / "metrics.jsonl"
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if metrics.exists() and metrics.read_bytes().count(b"\n") >= records:
                break
            time.sleep(0.005)
        time.sleep(delay)
        alive = proc.poll() is None
        assert alive or proc.returncode == 0, proc.stderr.read().decode()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        return alive
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """The uninterrupted run of each `KILLED` config, made on first use."""
    from jaxrl_dist.cli.compose import load_config

    return runs_once(tmp_path_factory, "twin-", lambda name, run_dir: train(
        load_config(KILLED[name][0] + [f"run.dir={run_dir}"])))


@pytest.mark.slow  # 10 points x 4 configs, a killed CLI run and a resume each
@pytest.mark.parametrize("point", range(KILL_POINTS))
@pytest.mark.parametrize("name", list(KILLED))
def test_a_run_killed_at_a_random_point_resumes_exactly(name, point, tmp_path, twins):
    overrides, updates = KILLED[name]
    rng = random.Random(f"{name}-{point}")
    run_dir = tmp_path / "killed"
    records, delay = rng.randint(1, int(updates * 0.8)), rng.uniform(0.0, 0.3)
    while True:  # a busy machine may let a fast run reach its end before the kill lands: earlier then
        killed = kill_at(run_dir, overrides, records, delay)
        if not (run_dir / "summary.json").exists() or records == 1:
            break
        shutil.rmtree(run_dir)
        records, delay = max(1, records // 2), 0.0
    assert killed and not (run_dir / "summary.json").exists()
    steps = finished_steps(run_dir)
    resumed = train(from_dict({"run": {"resume": str(run_dir), "progress": False}}))
    assert resumed["resumed_at_update"] == (steps[-1] if steps else 0)
    recs = records_in(run_dir)
    assert [r["update"] for r in recs] == list(range(1, resumed["num_updates"] + 1))  # none lost, none twice
    if name == "async2":  # not bit-reproducible above staleness 0: the bound and the chunk ledger
        # (dropped chunks count as steps made, so it may take fewer updates)
        assert 0 < resumed["num_updates"] <= updates and resumed["env_steps"] >= 10240
        assert all(0 <= r["staleness_max"] <= 2 for r in recs)
        assert max(int(k) for k in resumed["staleness_histogram"]) <= 2
        assert_every_chunk_once(recs)
        return
    assert resumed["num_updates"] == updates
    assert resumed["params_sha256"] == twins(name)["params_sha256"]
    if name.startswith("async"):
        assert_every_chunk_once(recs)


def test_the_async_ledger_only_moves_forward():
    """An update that learns a slot's chunk 9 and drops its older chunk 8: the checkpoint
    counts 10 chunks made on that slot, with the state after chunk 9 (a resumed run that
    restarted at chunk 9 would learn it twice)."""
    from jaxrl_dist.trainers.asynchronous import Chunk, advance_ledger

    def chunk(slot, index):
        return Chunk(slot, index, 0, type("Out", (), {"actor": f"after {slot}/{index}"})(), None, {}, 1.0, 0.0)

    states, counts = {}, [0, 0, 9]
    advance_ledger(states, counts, [chunk(0, 0), chunk(2, 9), chunk(2, 8)])
    assert counts == [1, 0, 10] and states == {0: "after 0/0", 2: "after 2/9"}

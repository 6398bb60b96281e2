"""`jaxrl-dist calibrate` for real at a tiny size, profile files, and the scheduler picking them up."""
from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest

from jaxrl_dist import cli
from jaxrl_dist.tools import calibrate
from jaxrl_dist.scheduling import learned
from jaxrl_dist import scheduler_training
from jaxrl_dist.scheduling import profile as prof

# 4 envs x 32 steps: 128 samples, which any minibatch setting of the cartpole preset divides
TINY = ["env=cartpole", "backend.envs_per_shard=4", "algo.num_steps=32"]
# K = 1, 2, 4, 8 (four sizes to fit a line to), medians of 5; no test asserts what the
# times are (bench/calibrate_fit.py reports how well the line fits them)
FAST = ["--rounds", "3", "--learner-shards", "8", "--repeats", "5"]


def run_calibrate(tmp_path, capsys, *args):
    out = tmp_path / "profile.json"
    assert cli.main(["calibrate", *TINY, *args, *FAST, "--out", str(out)]) == 0
    return out, capsys.readouterr().out


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """One local calibration shared by the tests that read it: `(path, printed summary)`."""
    out = tmp_path_factory.mktemp("cal") / "profile.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(["calibrate", *TINY, "backend=local", *FAST, "--out", str(out)]) == 0
    return out, printed.getvalue()


def check_profile(p: prof.Profile) -> None:
    """Every field finite and of its sign. The learner line's two terms are each >= 0
    (`fit_line` zeroes a negative one; which, if any, depends on the times measured),
    and never both 0 for positive times."""
    values = p._asdict()
    assert all(math.isfinite(v) for v in values.values()), values
    for name in ("step_s", "bytes_per_shard", "cold_start_s"):
        assert values[name] > 0, name
    assert p.learn_s_fixed >= 0 and p.learn_s_per_sample >= 0 and p.learn_s_fixed + p.learn_s_per_sample > 0
    assert p.jitter_cv >= 0 and p.transfer_s_per_byte >= 0


def test_local_profile_is_measured_and_complete(local):
    path, printed = local
    profile = prof.load_profile(path)
    check_profile(profile)
    assert profile.transfer_s_per_byte == 0.0  # the local backend moves nothing
    meta = json.loads(path.read_text())["meta"]
    assert (meta["env_id"], meta["backend"], meta["shards_per_round"]) == ("CartPole-v1", "local", 1)
    assert meta["machine"]["cpu_count"] >= 1 and meta["machine"]["cpu_model"] and meta["jax_version"]
    assert meta["samples"] == {"step_s": 2, "bytes_per_shard": 2, "learn": 20, "jitter_cv": 2,
                               "cold_start_s": 1}
    assert any("not a cloud platform's" in n for n in meta["notes"])
    assert f"wrote {path}" in printed and "step_s" in printed


def test_learner_fit_is_the_line_through_the_recorded_times(local):
    """The recorded fit is `fit_line` of the recorded samples and times, and `fit_s` that
    line at each K: arithmetic on the file's numbers. How close the line comes to the
    times is a property of the machine's load, reported by `bench/calibrate_fit.py`."""
    profile = prof.load_profile(local[0])
    fit = json.loads(local[0].read_text())["meta"]["fits"]["learn"]
    assert fit["shards"] == [1, 2, 4, 8] and fit["samples"] == [128, 256, 512, 1024]
    measured = np.asarray(fit["measured_s"])
    assert measured.shape == (4,) and np.isfinite(measured).all() and (measured > 0).all(), measured
    assert calibrate.fit_line(fit["samples"], measured) == pytest.approx(
        (profile.learn_s_fixed, profile.learn_s_per_sample), rel=1e-12, abs=0.0)
    line = profile.learn_s_fixed + profile.learn_s_per_sample * np.asarray(fit["samples"])
    np.testing.assert_allclose(line, fit["fit_s"], rtol=1e-12)


def test_profile_json_round_trips(local, tmp_path):
    profile = prof.load_profile(local[0])
    again = prof.save_profile(profile, tmp_path / "again.json", {"note": "copy"})
    assert prof.load_profile(again) == profile
    assert json.loads(again.read_text())["meta"] == {"note": "copy"}


def test_files_without_the_newer_fields_keep_the_defaults(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"step_s": 2e-5, "jitter_cv": 0.2}))
    assert prof.load_profile(old) == prof.Profile(step_s=2e-5, jitter_cv=0.2)


@pytest.mark.parametrize("body, named", [({"step_s": "fast"}, "step_s"), ({"step_s": 0}, "step_s"),
                                         ({"jitter_cv": -1}, "jitter_cv"), ({"speed": 1}, "'speed'"),
                                         ([1, 2], "JSON object")])
def test_bad_profile_files_name_the_field(tmp_path, body, named):
    from jaxrl_dist.config import ConfigError

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(body))
    with pytest.raises(ConfigError, match=named):
        prof.load_profile(bad)


@pytest.mark.slow  # ~13 s: a serve process and its compile; the profile's fields are the local test's
def test_http_calibration_spawns_a_loopback_function(tmp_path, capsys):
    out, printed = run_calibrate(tmp_path, capsys, "backend=http", "--shards", "2")
    profile = prof.load_profile(out)
    check_profile(profile)
    assert profile.transfer_s_per_byte > 0  # bytes went over loopback HTTP
    meta = json.loads(out.read_text())["meta"]
    assert meta["backend"] == "http" and meta["fits"]["jitter"]["method"] == "within rounds"
    assert meta["samples"]["jitter_cv"] == 4  # 2 warm rounds x 2 shards


def scheduler_train(monkeypatch, capsys, tmp_path, task: str, *flags: str) -> tuple:
    """`jaxrl-dist scheduler train` up to the training itself (stubbed): the file's meta."""
    monkeypatch.setattr(scheduler_training, "train_scheduler", lambda envs, *a, **k: learned.Trained(
        {}, scheduler_training._meta(envs, scheduler_training.scheduler_config(envs[0], 2, 2, 1))))
    out = tmp_path / "s.msgpack"
    assert cli.main(["scheduler", "train", task, "run.target_return=100", "scheduler.max_shards=2",
                     "backend.envs_per_shard=4", "algo.num_steps=32", "--episodes", "2",
                     "--out", str(out), *flags]) == 0
    return learned.load(out).meta, capsys.readouterr().out


def test_scheduler_train_uses_the_given_profile(local, monkeypatch, capsys, tmp_path):
    meta, printed = scheduler_train(monkeypatch, capsys, tmp_path, "env=cartpole", "--profile", str(local[0]))
    assert meta["profile"] == prof.load_profile(local[0])._asdict()
    assert f"profile {local[0]}" in printed


def test_scheduler_train_falls_back_to_the_shipped_profile_then_defaults(monkeypatch, capsys, tmp_path):
    meta, printed = scheduler_train(monkeypatch, capsys, tmp_path, "env=cartpole")
    shipped = prof.PROFILES / "CartPole-v1.json"
    assert meta["profile"] == prof.load_profile(shipped)._asdict() and str(shipped) in printed
    meta, printed = scheduler_train(monkeypatch, capsys, tmp_path, "env.id=Acrobot-v1")
    assert meta["profile"] == prof.Profile()._asdict() and "Profile() defaults" in printed


def test_shipped_profiles_load_and_name_their_env():
    shipped = sorted(prof.PROFILES.glob("*.json"))
    assert {p.stem for p in shipped} >= {"CartPole-v1", "Hopper-v3", "SpaceInvaders-v5"}
    for path in shipped:
        check_profile(prof.load_profile(path))
        assert json.loads(path.read_text())["meta"]["env_id"] == path.stem


@pytest.mark.parametrize("args, named", [
    (["calibrate", "backend=local", "--rounds", "1"], "--rounds"),
    (["calibrate", "backend=local", "--learner-shards", "1"], "--learner-shards"),
    (["calibrate", "trainer=fused"], "trainer"),
    (["scheduler", "train", "run.target_return=1", "--profile", "/nonexistent/p.json", "--out", "x"],
     "--profile"),
])
def test_bad_flags_give_one_line_naming_them(capsys, args, named):
    assert cli.main(args) == cli.EXIT_CONFIG_ERROR
    err = capsys.readouterr().err.strip()
    assert named in err and len(err.splitlines()) == 1, err


def test_fit_line_keeps_both_terms_non_negative():
    x = np.array([1.0, 2.0, 4.0])
    assert calibrate.fit_line(x, 0.5 + 2 * x) == pytest.approx((0.5, 2.0))
    assert calibrate.fit_line(x, 3 * x - 0.3)[0] == 0.0  # through the origin instead
    assert calibrate.fit_line(x, np.array([3.0, 2.9, 2.8])) == pytest.approx((2.9, 0.0))
    assert calibrate.batch_sizes(6) == [1, 2, 4, 6] and calibrate.batch_sizes(2) == [1, 2]


def test_a_file_of_the_wrong_kind_or_place_is_one_line(tmp_path):
    """A profile given as a scheduler file, a scheduler file as a profile, and an output
    path that is a directory are refused naming the path, before any work."""
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.trainers.rundir import writable_file

    (tmp_path / "p.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"p\.json: not a scheduler file"):
        learned.load(tmp_path / "p.json")
    with pytest.raises(ConfigError, match=r"not JSON \(a binary file\)"):
        prof.load_profile(learned.preset_path(learned.DEFAULT))
    with pytest.raises(ConfigError, match="--out .*: a directory"):
        writable_file(tmp_path, "--out")
    assert writable_file(tmp_path / "new" / "p.json", "--out").parent.is_dir()


def test_the_profile_describes_a_plugin_network_by_its_name():
    """A plugin network has no `torso` (the built-in's mlp or cnn): the profile records
    the `algo.network` it was measured with."""
    from types import SimpleNamespace

    from jaxrl_dist.config import Config

    cfg = Config()
    cfg.algo.network = "twotower"
    trainer = SimpleNamespace(spec=SimpleNamespace(suite="gymnax"), program=SimpleNamespace(network=object()))
    rounds = [SimpleNamespace(result=SimpleNamespace(shards=[0, 1]))]
    meta = calibrate.describe(cfg, trainer, {}, rounds)
    assert meta["task"]["network"] == "twotower" and meta["shards_per_round"] == 2


def test_a_rough_profile_is_said_to_be_rough():
    """Written all the same, with a note for each figure that rests on too little."""
    from jaxrl_dist.tools.calibrate import _weak

    assert _weak(0.1, 5) == []
    notes = _weak(0.64, 1)
    assert [n.split(":")[0] for n in notes] == ["note", "note"]
    assert "misses a measured time by 64%" in notes[0] and "rests on 1 sample(s)" in notes[1]

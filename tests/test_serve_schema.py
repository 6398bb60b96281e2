"""The wire schema, fuzzed in-process (hypothesis): every field of a request's spec and
head, alone or together, out of range, mistyped or missing. A request is either refused
with a `ShardError` (400/413/422 on the server) whose message names the field, or it is
accepted and every value in it is within its bounds; nothing else is ever raised.

A few hundred examples in the default run, 10,000 under `slow`."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import hostile
from jaxrl_dist.backends import wire
from jaxrl_dist.backends.shard import ACTIVATIONS, MAX_LAYERS, ShardError, ShardWorker

POLICY = wire.RequestPolicy(frozenset({hostile.ENV_ID}),
                            {hostile.ENV_ID: {"max_steps_in_episode": {"min": 1, "max": 500}}}, 1024,
                            max_envs=256)
MAX_BYTES = 1 << 20
PATHS = sorted({path for path, _ in hostile.field_cases()})


@pytest.fixture(scope="module")
def base():
    return hostile.valid_request()[1]


@pytest.fixture(scope="module")
def worker():
    return ShardWorker("schema", max_programs=2)


def decode(data, worker):
    """The server's checks, short of running the shard: head, policy, then the arrays."""
    spec, data = wire.decode_request_head(hostile.pack(data), False, MAX_BYTES, POLICY)
    return spec, wire.decode_request_for(worker, spec, data)


INT = st.integers(-2**63, 2**64 - 1)  # what msgpack can carry
ANY = st.one_of(st.none(), st.booleans(), INT, st.floats(), st.text(max_size=40),
                st.binary(max_size=16), st.lists(st.integers(-5, 5000), max_size=12),
                st.dictionaries(st.text(max_size=6), INT, max_size=3),
                st.sampled_from([v for _, v in hostile.field_cases() if not isinstance(v, np.ndarray)]))
# values inside each bound, so that accepted requests are generated too
INSIDE = {
    ("spec", "gamma"): st.floats(0.0, 1.0), ("spec", "clip_obs"): st.floats(1e-6, 1e6),
    ("spec", "clip_reward"): st.floats(1e-6, 1e6), ("spec", "activation"): st.sampled_from(ACTIVATIONS),
    ("spec", "network"): st.sampled_from(["auto", "mlp"]), ("spec", "normalize_obs"): st.booleans(),
    ("spec", "env_kwargs"): st.builds(lambda n: f'{{"max_steps_in_episode": {n}}}', st.integers(-10, 600)),
    ("slot",): st.integers(-2, 1100), ("seed",): st.integers(-2, 2**31 + 2),
    ("round",): st.integers(-2, 2**31 + 2), ("run_id",): st.text(max_size=140),
}
MUTATION = st.one_of(
    st.tuples(st.sampled_from(PATHS), ANY),
    st.sampled_from(list(INSIDE)).flatmap(lambda p: st.tuples(st.just(p), INSIDE[p])),
    st.tuples(st.sampled_from(PATHS), st.just(...)),
)


def check_accepted(spec, req) -> None:
    """What an accepted request holds, whatever was sent."""
    assert spec.env_id in POLICY.allowed_envs and spec.activation in ACTIVATIONS
    assert math.isfinite(spec.gamma) and 0.0 <= spec.gamma <= 1.0
    assert all(math.isfinite(c) and 0 < c <= 1e6 for c in (spec.clip_obs, spec.clip_reward))
    assert 0 < spec.num_envs <= POLICY.max_envs and 0 < spec.num_steps <= 4096 and 0 <= spec.num_threads <= 64
    assert 0 < len(spec.hidden_sizes) <= MAX_LAYERS and all(0 < h <= 4096 for h in spec.hidden_sizes)
    assert 0 <= req.slot < POLICY.max_slot and 0 <= req.seed < 2**31 and 0 <= req.round < 2**31
    assert isinstance(req.run_id, str) and len(req.run_id) <= 128
    assert req.key.shape == (2,) and req.key.dtype == np.uint32


def fuzz(base, worker, mutations) -> None:
    data = base
    for path, value in mutations:
        data = hostile.mutate(data, path, value)
    try:
        spec, req = decode(data, worker)
    except ShardError as err:
        line = str(err)
        assert "\n" not in line and len(line) < 600
        named = {".".join(p) for p, _ in mutations} | {"v", "spec", "body", "params", "actor"}
        assert any(line.startswith(n) for n in named), (line, mutations)
        return
    check_accepted(spec, req)


def test_every_listed_bad_value_is_refused_naming_its_field(base, worker):
    """The table in tests/hostile.py, one field at a time (the values seen to get a 500,
    or to be accepted, before the schema): all refused, the field named first."""
    for path, value in hostile.field_cases():
        data = hostile.mutate(base, path, value)
        if path == ("spec", "network") and value == "cnn":
            continue  # a known network name; the env's observations refuse it (tests/test_serve_hostile.py)
        with pytest.raises(ShardError) as info:
            decode(data, worker)
        assert str(info.value).startswith(".".join(path) if path != ("v",) else "v:"), (path, value, info.value)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(MUTATION, min_size=1, max_size=4))
def test_fuzzed_requests_are_refused_by_field_or_within_bounds(base, worker, mutations):
    fuzz(base, worker, mutations)


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(MUTATION, min_size=1, max_size=6))
def test_ten_thousand_fuzzed_requests(base, worker, mutations):
    fuzz(base, worker, mutations)


def test_env_kwargs_follow_the_servers_rules_and_never_name_a_path():
    """By default no env kwarg is taken (the Pong-v5 `base_path` that made envpool abort
    is refused naming it); a rule allows a typed, bounded value; a rule for a path-like
    kwarg is a config error."""
    from jaxrl_dist.config import ConfigError, ServeConfig

    with pytest.raises(ShardError, match=r"^spec\.env_kwargs\.base_path: not allowed for Pong-v5"):
        wire.check_env_kwargs("Pong-v5", {"base_path": "/nonexistent"}, {})
    rules = {"Pong-v5": {"img_height": {"min": 36, "max": 210}, "episodic_life": "bool",
                         "reward_clip": {"choices": [True]}}}
    wire.check_env_kwargs("Pong-v5", {"img_height": 84, "episodic_life": False, "reward_clip": True}, rules)
    for bad in ({"img_height": 1024}, {"img_height": 84.0}, {"episodic_life": 1}, {"reward_clip": 1}):
        with pytest.raises(ShardError, match=rf"^spec\.env_kwargs\.{next(iter(bad))}: "):
            wire.check_env_kwargs("Pong-v5", bad, rules)
    for rule in ({"base_path": {"choices": ["x"]}}, {"rom_file": "bool"}, {"mode": {"choices": ["/etc"]}},
                 {"img_height": {"min": 1}}):
        with pytest.raises(ConfigError, match=r"^serve\.allowed_env_kwargs\.Pong-v5\."):
            ServeConfig(allowed_env_kwargs={"Pong-v5": rule}).check()
    for key in ("allowed_envs", "allowed_env_kwargs"):  # a misspelt id would refuse every real request
        with pytest.raises(ConfigError, match=rf"^serve\.{key}: 'CartPol-v1' is not an env id \(did you mean 'CartPole-v1'\?\)$"):
            ServeConfig(**{key: {"CartPol-v1": {}} if key == "allowed_env_kwargs" else ["CartPol-v1"]}).check()
    ServeConfig(allowed_envs=["Catch-bsuite", "Pong-v5"]).check()  # ids beyond the presets' are fine
    for port in (-1, 65536, 99999):  # uvicorn would bind 99999 as 34463
        with pytest.raises(ConfigError, match=rf"^serve\.port must be in 0\.\.65535 .*got {port}$"):
            ServeConfig(port=port).check()


def test_serve_on_a_taken_port_is_one_line_before_it_starts():
    """The address is tried before the worker starts: a taken port (or another machine's
    address) is one line naming the keys, exit 2, not uvicorn's own line and exit 3."""
    import socket
    import subprocess

    from test_cli import command

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        out = subprocess.run(command() + ["serve", "--port", str(port), "--token", "t"], capture_output=True,
                             text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip() == (
        f"error: serve.host/serve.port: cannot listen on 127.0.0.1:{port} (Address already in use); "
        "pick another --port (or --host)")

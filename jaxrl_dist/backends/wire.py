"""The shard wire format: msgpack (flax.serialization), optionally deflated. Never pickle.

A request carries the spec, the slot, its key, the policy params and (for
stateless specs) the slot's state; a response carries the trajectory, the
slot's new state, the bootstrap values and the worker's timings. Decoding
checks every array against a template built from the spec, so a body with a
wrong structure, shape or dtype is a `ShardError` naming the field.
"""
from __future__ import annotations

import math
import zlib
from typing import Any, Mapping, NamedTuple, Optional

import jax
import numpy as np

from jaxrl_dist.backends.shard import ShardError, ShardOutput, ShardSpec, Timings, field_name, json_object

VERSION = 2  # 2: recurrent carries, reset flags and action masks in the slot state and trajectory


class MalformedBody(ShardError):
    """A body that is not a wire document at all (bad deflate, not msgpack, wrong version)."""


class BodyTooLarge(ShardError):
    """A body over the size limit (compressed or once inflated)."""


# Compressed bodies are raw deflate streams (RFC 1951, no zlib wrapper): a
# round's params are deflated once and spliced after each shard's own header
# (both pieces end on a sync flush, so the concatenation is one valid stream).
_RAW = -15
_FINAL_EMPTY_BLOCK = b"\x03\x00"


_PROBE = 1 << 16


def _level(data: bytes) -> int:
    """1 (fast deflate), or 0 (stored blocks, a copy) for data that does not
    compress, such as large float params: deflating them costs ~15 ms/MB for
    nothing."""
    if len(data) <= 4 * _PROBE:
        return 1
    probe = data[len(data) // 2:len(data) // 2 + _PROBE]
    return 1 if len(zlib.compress(probe, 1)) < 0.8 * len(probe) else 0


def deflate_piece(data: bytes) -> bytes:
    """`data` as non-final raw deflate blocks ending on a byte boundary."""
    c = zlib.compressobj(_level(data), zlib.DEFLATED, _RAW)
    return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)


def deflate(data: bytes) -> bytes:
    return deflate_piece(data) + _FINAL_EMPTY_BLOCK


class ShardRequest(NamedTuple):
    spec: ShardSpec
    slot: int
    key: np.ndarray  # raw uint32[2]
    params: Any
    actor: Any  # ActorState, or None for sticky specs
    run_id: str = ""
    seed: int = 0
    round: int = 0


def _to_host(tree):
    from flax import serialization

    return serialization.to_state_dict(jax.tree.map(np.asarray, jax.device_get(tree)))


def _pack(data: dict, compress: bool) -> bytes:
    from flax import serialization

    raw = serialization.msgpack_serialize(data)
    return deflate(raw) if compress else raw


def _unpack(body: bytes, compressed: bool, max_bytes: int) -> dict:
    from flax import serialization

    if len(body) > max_bytes:
        raise BodyTooLarge(f"body: {len(body)} bytes is over the limit of {max_bytes}")
    if compressed:
        inflater = zlib.decompressobj(_RAW)
        try:
            body = inflater.decompress(body, max_bytes)
        except zlib.error as err:
            raise MalformedBody(f"body: not valid deflate data ({err})") from err
        if inflater.unconsumed_tail:
            raise BodyTooLarge(f"body: inflates past the limit of {max_bytes} bytes")
    try:
        data = serialization.msgpack_restore(body)
    except Exception as err:  # msgpack raises several types on garbage
        raise MalformedBody(f"body: not a msgpack document ({type(err).__name__})") from err
    if not isinstance(data, dict):
        raise MalformedBody("body: expected a msgpack mapping")
    return data


def _field(data: dict, name: str, kind):
    if name not in data:
        raise ShardError(f"{name}: missing")
    value = data[name]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ShardError(f"{name}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _no_extra_keys(want, got, name: str) -> None:
    """Refuse keys the template lacks (flax would drop them silently); the walk follows
    the template, so its depth is the template's."""
    if not isinstance(want, dict) or not isinstance(got, dict):
        return
    for key in got:
        if key not in want:
            raise ShardError(f"{name}.{field_name(key)}: unknown field")
        _no_extra_keys(want[key], got[key], f"{name}.{key}")


_TEMPLATES: dict = {}  # id(template) -> (template, its state dict, its leaves' paths and specs)


def _template(template) -> tuple:
    """`(state dict, [(path, spec)])` of a template, worked out once per template object
    (a backend checks every answer against the same ones)."""
    from flax import serialization

    hit = _TEMPLATES.get(id(template))
    if hit is None or hit[0] is not template:
        leaves, _ = jax.tree_util.tree_flatten_with_path(template)
        hit = (template, serialization.to_state_dict(template),
               [(jax.tree_util.keystr(path), spec) for path, spec in leaves])
        if len(_TEMPLATES) > 64:  # templates of finished runs
            _TEMPLATES.clear()
        _TEMPLATES[id(template)] = hit
    return hit[1], hit[2]


def restore(template, data, name: str):
    """`data` (a state dict from the wire) as `template`'s pytree, every leaf checked."""
    from flax import serialization

    state, want = _template(template)
    _no_extra_keys(state, data, name)
    try:
        tree = serialization.from_state_dict(template, data)
    except Exception as err:
        raise ShardError(f"{name}: structure does not match ({' '.join(str(err).split())[:200]})") from err
    got = jax.tree.leaves(tree)
    if len(got) != len(want):
        raise ShardError(f"{name}: expected {len(want)} arrays, got {len(got)}")
    for (path, spec), leaf in zip(want, got):
        if not isinstance(leaf, np.ndarray):
            raise ShardError(f"{name}{path}: expected an array, got {type(leaf).__name__}")
        if leaf.shape != tuple(spec.shape) or leaf.dtype != spec.dtype:
            raise ShardError(f"{name}{path}: expected {spec.dtype}{list(spec.shape)}, "
                             f"got {leaf.dtype}{list(leaf.shape)}")
    return tree


def _pairs(**entries) -> bytes:
    """Entries of a msgpack map without its header: a map is its header then each key
    and value packed in turn, so pieces packed apart concatenate into one map."""
    from flax import serialization

    return b"".join(serialization.msgpack_serialize(x) for kv in entries.items() for x in kv)


_ACTOR = b"\xa5actor"  # the packed key "actor"


class Packed(bytes):
    """A value already packed (`pack_actor`): spliced into a body as it is."""


def pack_actor(actor) -> Packed:
    """A slot's state as the request's `actor` value (None for sticky specs). Packing it
    is most of a request's encoding; a backend may pack it ahead, while the learner runs."""
    from flax import serialization

    return Packed(serialization.msgpack_serialize(None if actor is None else _to_host(actor)))


def encode_request(req: ShardRequest, compress: bool = False) -> bytes:
    return RequestEncoder(req.params, compress).encode(req)


class RequestEncoder:
    """Encodes a run's requests, packing the shared params once and a spec once.

    A request is a msgpack map of `HEAD_FIELDS`, `params` last: the map header, the
    shard's own entries, the spec's (packed once per spec object) and the pre-packed
    `"params": ...` pair. The head's keys go in sorted order, as packing the whole map
    (a pytree) at once would put them: the bytes are the same.
    """

    def __init__(self, params, compress: bool):
        from flax import serialization

        self.compress = compress
        self._tail = (serialization.msgpack_serialize("params")
                      + serialization.msgpack_serialize(_to_host(params)))
        self._tail_z = deflate_piece(self._tail) if compress else None
        self._spec = (None, b"")  # (spec, its packed entries): the reference keeps `is` sound

    @property
    def params_bytes(self) -> int:
        return len(self._tail_z if self.compress else self._tail)

    def _spec_entries(self, spec: ShardSpec) -> bytes:
        if self._spec[0] is not spec:
            self._spec = (spec, _pairs(spec=spec.to_dict(), v=VERSION))
        return self._spec[1]

    def encode(self, req: ShardRequest) -> bytes:
        """`req`'s body; its `actor` may be `Packed` already (`pack_actor`)."""
        actor = req.actor if isinstance(req.actor, Packed) else pack_actor(req.actor)
        head = (bytes([0x80 | len(HEAD_FIELDS)]) + _ACTOR + actor
                + _pairs(key=np.asarray(req.key, np.uint32), round=req.round, run_id=req.run_id,
                         seed=req.seed, slot=req.slot) + self._spec_entries(req.spec))
        if not self.compress:
            return head + self._tail
        return deflate_piece(head) + self._tail_z + _FINAL_EMPTY_BLOCK


class RequestPolicy(NamedTuple):
    """What a worker accepts beyond the schema itself: env ids (None: any), per env the
    env_kwargs keys and the values each may take (`serve.allowed_env_kwargs`), slots."""

    allowed_envs: Optional[frozenset] = None
    allowed_env_kwargs: Mapping = {}
    max_slot: int = 1 << 20
    max_run_id: int = 128
    max_envs: int = 4096  # envs a shard may ask for (an envpool pool holds one emulator each)
    max_rollout_mb: float = float("inf")  # a shard's trajectory, estimated from its env's spaces


HEAD_FIELDS = ("v", "spec", "slot", "run_id", "seed", "round", "key", "actor", "params")
_INT_RANGES = {"seed": (0, 2**31 - 1), "round": (0, 2**31 - 1)}


def _short(value) -> str:
    return repr(value)[:64] if isinstance(value, (int, float, str, bool, type(None))) \
        else type(value).__name__


def decode_request_head(body: bytes, compressed: bool, max_bytes: int,
                        policy: RequestPolicy = RequestPolicy()):
    """The untrusted body as `(spec, data)`: the spec and every plain field checked
    against the schema and `policy`, the arrays not yet (they need the program's templates)."""
    data = _unpack(body, compressed, max_bytes)
    v = data.get("v")
    if type(v) is not int or v != VERSION:  # True == 1, so the type is checked too
        raise MalformedBody(f"v: expected wire version {VERSION}, got {_short(v)}")
    unknown = [k for k in data if k not in HEAD_FIELDS]
    if unknown:
        raise ShardError(f"{field_name(unknown[0])}: unknown field")
    spec = ShardSpec.from_dict(data.get("spec"))
    check_policy(spec, data, policy)
    return spec, data


def check_policy(spec: ShardSpec, data: dict, policy: RequestPolicy) -> None:
    """Env id, env_kwargs, slot, seed, round and run_id against the worker's policy."""
    if policy.allowed_envs is not None and spec.env_id not in policy.allowed_envs:
        raise ShardError(f"spec.env_id: {spec.env_id[:64]!r} is not in serve.allowed_envs")
    check_env_kwargs(spec.env_id, json_object(spec.env_kwargs, "spec.env_kwargs"),
                     policy.allowed_env_kwargs)
    if spec.num_envs > policy.max_envs:
        raise ShardError(f"spec.num_envs: over serve.max_envs={policy.max_envs}: {spec.num_envs}")
    slot = _field(data, "slot", int)
    if not 0 <= slot < policy.max_slot:
        raise ShardError(f"slot: out of range 0..{policy.max_slot - 1}: {slot}")
    for name, (low, high) in _INT_RANGES.items():
        value = _field(data, name, int)
        if not low <= value <= high:
            raise ShardError(f"{name}: out of range {low}..{high}: {value}")
    run_id = _field(data, "run_id", str)
    if len(run_id) > policy.max_run_id:
        raise ShardError(f"run_id: over {policy.max_run_id} characters")
    _key(data)
    if spec.sticky and data.get("actor") is not None:
        raise ShardError("actor: must be null for an envpool spec (the worker keeps it)")
    if not spec.sticky:
        _field(data, "actor", dict)


def check_rollout_size(spec: ShardSpec, env_spec, policy: RequestPolicy) -> None:
    """A shard's `[T, B]` trajectory (observations and a few scalars per step) must fit in
    `policy.max_rollout_mb`: checked once the env's spaces are known, before any compile."""
    per_step = int(np.prod(env_spec.obs_shape)) * np.dtype(env_spec.obs_dtype).itemsize + 64
    mb = spec.num_steps * spec.num_envs * per_step / 2**20
    if mb > policy.max_rollout_mb:
        raise ShardError(f"spec.num_steps: {spec.num_steps} steps x {spec.num_envs} envs is "
                         f"~{mb:.0f} MB of trajectory, over serve.max_rollout_mb={policy.max_rollout_mb:g}")


def check_env_kwargs(env_id: str, kwargs: dict, rules: Mapping) -> None:
    """Each key must be allowed for `env_id` by the server's rules, its value of the rule's
    type and within its bounds: `"bool"`, `{min, max}` or `{choices: [...]}`."""
    allowed = rules.get(env_id) or {}
    for key, value in kwargs.items():
        name = f"spec.env_kwargs.{key[:64]}"
        rule = allowed.get(key)
        if rule is None:
            raise ShardError(f"{name}: not allowed for {env_id[:64]} (serve.allowed_env_kwargs)")
        if rule == "bool":
            if not isinstance(value, bool):
                raise ShardError(f"{name}: expected a bool, got {_short(value)}")
        elif "choices" in rule:
            if not any(type(value) is type(c) and value == c for c in rule["choices"]):
                raise ShardError(f"{name}: expected one of {list(rule['choices'])}, got {_short(value)}")
        else:
            _check_bounded(value, rule, name)


def _check_bounded(value, rule: Mapping, name: str) -> None:
    low, high = rule["min"], rule["max"]
    integral = isinstance(low, int) and isinstance(high, int)
    kinds = (int,) if integral else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ShardError(f"{name}: expected {'an int' if integral else 'a number'}, got {_short(value)}")
    if not (math.isfinite(value) and low <= value <= high):
        raise ShardError(f"{name}: must be in [{low}, {high}], got {_short(value)}")


def decode_request(spec: ShardSpec, data: dict, params_template, actor_template) -> ShardRequest:
    """The rest of a request, checked against the program's templates."""
    slot = _field(data, "slot", int)
    if not 0 <= slot < 1 << 20:
        raise ShardError(f"slot: out of range: {slot}")
    key = _key(data)
    params = restore(params_template, _field(data, "params", dict), "params")
    actor = data.get("actor")
    if spec.sticky:
        if actor is not None:
            raise ShardError("actor: must be null for an envpool spec (the worker keeps it)")
    else:
        actor = restore(actor_template, _field(data, "actor", dict), "actor")
    return ShardRequest(spec, slot, key, params, actor, str(data.get("run_id", ""))[:128],
                        _field(data, "seed", int), _field(data, "round", int))


def decode_request_for(worker, spec: ShardSpec, data: dict) -> ShardRequest:
    """The rest of a request, checked against `worker`'s templates for `spec`. The key is
    checked first, and a sticky spec's env pool is built only once the arrays have passed
    (`ShardWorker.templates` builds one program per spec for its shapes)."""
    _key(data)
    _field(data, "params", dict)
    slot = data.get("slot") if isinstance(data.get("slot"), int) else 0
    seed = data.get("seed") if isinstance(data.get("seed"), int) else 0
    params_t, actor_t = worker.templates(spec, slot, seed)
    return decode_request(spec, data, params_t, actor_t)


def _key(data: dict) -> np.ndarray:
    key = _field(data, "key", np.ndarray)
    if key.shape != (2,) or key.dtype != np.uint32:
        raise ShardError(f"key: expected uint32[2], got {key.dtype}{list(key.shape)}")
    return key


def encode_params(params) -> bytes:
    """A round's params as one msgpack body that every shard shares (the Ray object store)."""
    return _pack({"v": VERSION, "params": _to_host(params)}, False)


def decode_params(body: bytes, max_bytes: int):
    """`encode_params`'s body back as a state dict (checked later, with the request)."""
    shared = _unpack(body, False, max_bytes)
    if shared.get("v") != VERSION:
        raise MalformedBody(f"params.v: expected wire version {VERSION}, got {shared.get('v')!r}")
    return shared.get("params")


def encode_response(slot: int, out: ShardOutput, timings: Timings, reset: bool, worker: str,
                    compress: bool = False) -> bytes:
    data = {"v": VERSION, "slot": slot, "traj": _to_host(out.traj),
            "actor": None if out.actor is None else _to_host(out.actor),
            "bootstrap": np.asarray(out.bootstrap), "timings": timings._asdict(),
            "reset": reset, "worker": worker}
    return _pack(data, compress)


class ShardReply(NamedTuple):
    slot: int
    output: ShardOutput
    timings: Timings
    reset: bool
    worker: str


def decode_response(body: bytes, compressed: bool, templates: ShardOutput,
                    max_bytes: int = 1 << 34) -> ShardReply:
    """A worker's response checked against the learner's `ShardOutput` templates."""
    data = _unpack(body, compressed, max_bytes)
    traj = restore(templates.traj, _field(data, "traj", dict), "traj")
    actor = None
    if templates.actor is not None:
        actor = restore(templates.actor, _field(data, "actor", dict), "actor")
    boot = restore(templates.bootstrap, _field(data, "bootstrap", np.ndarray), "bootstrap")
    t = _field(data, "timings", dict)
    timings = Timings(*(float(t.get(f, 0.0)) for f in Timings._fields))
    return ShardReply(_field(data, "slot", int), ShardOutput(traj, actor, boot), timings,
                      bool(data.get("reset", False)), str(data.get("worker", "")))


def output_templates(program, sticky: Optional[bool] = None) -> ShardOutput:
    """Shapes and dtypes of a shard's output, for checking responses."""
    params = program.params_template()
    # a sticky program's slot state is only traced here, never initialised
    actor = jax.eval_shape(program.init_slot, jax.random.key(0)) if program.spec.sticky \
        else program.actor_template()
    out = jax.eval_shape(program.run_one, params, actor, np.zeros(2, np.uint32))
    sticky = program.spec.sticky if sticky is None else sticky
    return out._replace(actor=None if sticky else out.actor)

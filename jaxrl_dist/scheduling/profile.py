"""Latency profiles: the seconds and bytes the scheduling MDP's modeled clock charges
(`jaxrl-dist calibrate` measures them; one ships per calibrated env under
`presets/profiles/`, and `Profile()`'s defaults stand in elsewhere)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple, Optional

from jaxrl_dist.config import ConfigError

PROFILES = Path(__file__).resolve().parents[1] / "presets" / "profiles"


class Profile(NamedTuple):
    """Latency profile for the modeled clock (seconds, bytes); see `calibrate`."""

    step_s: float = 7e-6  # one env step of one shard's envs, policy included
    learn_s_fixed: float = 1e-3
    learn_s_per_sample: float = 5e-6
    bytes_per_shard: float = 48e3
    jitter_cv: float = 0.1  # stragglers: shard time x lognormal(0, cv)
    # Measured on the calibrating machine and kept for reading only (None: not measured);
    # the modeled clock takes transfer rates and start-up from the cost preset, whose
    # figures are the platform's, not this machine's loopback or process start.
    transfer_s_per_byte: Optional[float] = None
    cold_start_s: Optional[float] = None

def profile_file(env_id: str, path=None) -> Optional[Path]:
    """The profile file a task's scheduling MDP uses: `path`, else the one shipped for
    `env_id`; None where neither is (the MDP then uses `Profile()`)."""
    if path is not None:
        return Path(path)
    shipped = PROFILES / f"{env_id}.json"
    return shipped if shipped.is_file() else None

def save_profile(profile: Profile, path, meta: Optional[dict] = None) -> Path:
    """JSON: the `Profile` fields at the top level, how they were measured under `meta`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**profile._asdict(), "meta": meta or {}}, indent=2) + "\n")
    return path

def load_profile(path) -> Profile:
    """A profile file (`save_profile`'s). Fields it lacks keep `Profile`'s defaults, so
    files from before a field existed still load; `ConfigError` names a bad field."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"profile {path}: cannot read it ({err.strerror or err})") from err
    except json.JSONDecodeError as err:
        raise ConfigError(f"profile {path}: not JSON ({err.msg} at line {err.lineno})") from err
    except UnicodeDecodeError:  # a binary file (a scheduler's msgpack, say)
        raise ConfigError(f"profile {path}: not JSON (a binary file)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"profile {path}: expected a JSON object of Profile fields")
    unknown = sorted(set(data) - set(Profile._fields) - {"meta"})
    if unknown:
        raise ConfigError(f"profile {path}: unknown field {unknown[0]!r} "
                          f"(fields: {', '.join(Profile._fields)}, meta)")
    return Profile(**{k: _profile_value(v, k, path) for k, v in data.items() if k != "meta"})


def measured_on(path) -> Optional[str]:
    """The env id a profile file says it was measured on (its `meta.env_id`), if any."""
    try:
        meta = json.loads(Path(path).read_text()).get("meta")
        return str(meta["env_id"]) if isinstance(meta, dict) and meta.get("env_id") else None
    except (OSError, ValueError, AttributeError):
        return None

def _profile_value(value, name: str, path):
    """A field's number: finite, >= 0 (`step_s` > 0); None only where the default is None."""
    if value is None and Profile._field_defaults[name] is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not number or value < 0 or (name == "step_s" and value == 0):
        least = "> 0" if name == "step_s" else ">= 0"
        raise ConfigError(f"profile {path}: {name} must be a finite number {least}, got {value!r}")
    return float(value)

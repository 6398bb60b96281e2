"""The packaged Hydra configs and the overrides every command takes: composing them
with the dataclasses' defaults, checking them, and the one-line errors.

Hydra is imported inside these functions, so a command answers `--help` and
rejects a bad override without loading it or JAX before it must.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

# inside the package, so a plain (non-editable) install finds them from any directory
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


class CliConfigError(Exception):
    """A config problem, already phrased as the one line to print."""


def one_line(err: Exception) -> str:
    """An error's message on one line (whitespace runs, newlines included, made one space)."""
    return " ".join(str(err).split())


def presets(group: str = "env") -> list:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


# open mappings: their keys are the env maker's or a plugin's, not the schema's
_OPEN = ("env.kwargs", "algo.network_options", "algo.loss_options", "backend.options", "scheduler.options",
         "serve.allowed_env_kwargs")


def normalise(overrides: Sequence[str]) -> list:
    """Let `env.kwargs.x=1` (and the plugin option mappings) add keys without Hydra's
    `++` (the composed config is otherwise closed); refuse the old `backend=fused`."""
    from jaxrl_dist.config import FUSED_IS_A_TRAINER

    for o in overrides:  # the preset `backend/fused` is gone: Hydra would not reach the config check
        if o.replace(" ", "") in ("backend=fused", "backend.name=fused"):
            raise CliConfigError(f"{o}: {FUSED_IS_A_TRAINER}")
    return [f"++{o}" if o.startswith(tuple(f"{k}{c}" for k in _OPEN for c in ".=")) else o
            for o in overrides]


def env_presets() -> dict:
    """`{env.id: preset name}` of the packaged env presets (the `auto_*` ones name no id)."""
    import yaml

    out = {}
    for path in sorted((CONFIG_DIR / "env").glob("*.yaml")):
        env_id = ((yaml.safe_load(path.read_text()) or {}).get("env") or {}).get("id")
        if env_id:
            out.setdefault(env_id, path.stem)
    return out


def task_preset(overrides: Sequence[str]) -> list:
    """`overrides` with the env preset that fits an `env.id=X` given without `env=`: the
    packaged preset of X, else `env=auto_<family>` by X's spaces and suite
    (`envs.task_family`), so X never inherits CartPole's target return or return range.
    Unchanged for a sweep of ids or an unknown id (the config check names it)."""
    keys = override_keys(overrides)
    if "env" in keys or "env.id" not in keys:
        return list(overrides)
    given = dict(o.lstrip("+").split("=", 1) for o in overrides if "=" in o)
    env_id, suite = given["env.id"].strip("'\""), given.get("env.suite", "auto")
    if any(c in env_id for c in ",()[]"):
        return list(overrides)
    preset = env_presets().get(env_id)
    if preset is None:
        from jaxrl_dist.envs import EnvMakeError, make_env, task_family

        try:
            preset = f"auto_{task_family(make_env(env_id, 1, suite).spec)}"
        except EnvMakeError:
            return list(overrides)
    return [f"env={preset}", *overrides]


def override_keys(overrides: Sequence[str]) -> list:
    """The config keys a user's overrides set (`a.b=1` -> `a.b`; `env=pong` -> `env`)."""
    return [o.split("=", 1)[0].lstrip("+~") for o in overrides]


def store_defaults() -> None:
    """The dataclasses' defaults as the node `config.yaml` starts from."""
    from hydra.core.config_store import ConfigStore

    from jaxrl_dist.config import Config, to_dict

    ConfigStore.instance().store(name="jaxrl_dist_defaults", node=to_dict(Config()))


def hydra_message(err: Exception) -> str:
    """One line for a Hydra/OmegaConf error, naming the key where it can be found."""
    from hydra.errors import OverrideParseException

    if isinstance(err, OverrideParseException):
        reason = str(err).split("\n")[0]  # drop Hydra's link to the grammar docs
        return f"bad override '{err.override}': {reason}"
    text = one_line(err)
    match = re.search(r"Could not override '([^']+)'", text)
    if match:
        cause = " ".join(str(err.__cause__ or "").split())
        if "not in struct" in cause:  # OmegaConf's wording for a key the config lacks
            return f"unknown config key '{match.group(1)}'"
        return f"bad value for '{match.group(1)}': {cause or text}"
    match = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if match:
        group, option = match.groups()
        return f"unknown {group} preset '{option}' (choose from: {', '.join(presets(group))})"
    return text


def compose(overrides: Sequence[str], config_dirs: Sequence[str] = (), config_name: str = "config") -> dict:
    """The composed config as plain nested dicts; `CliConfigError` on Hydra errors.

    `config_dirs` are searched before the package's configs (`--config-dir`).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    store_defaults()
    extra = [f"hydra.searchpath=[{','.join('file://' + str(Path(d).resolve()) for d in config_dirs)}]"
             ] if config_dirs else []
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3",
                                   job_name="jaxrl-dist"):
            cfg = hydra_compose(config_name, overrides=normalise(task_preset(overrides)) + extra)
        return OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise CliConfigError(hydra_message(err)) from err


def validated(data: dict, user_keys: Sequence[str]):
    """The `Config` of a composed config whose env id exists (`ConfigError`/`EnvMakeError`
    otherwise); `user_keys` are the keys the user set (see `config.from_dict`)."""
    from jaxrl_dist.config import from_dict
    from jaxrl_dist.envs import resolve_suite

    cfg = from_dict(data, user_keys=user_keys)
    if not cfg.run.resume:  # a resumed run checks the config saved with it
        resolve_suite(cfg.env.id, cfg.env.suite)
    return cfg


def load_config(overrides: Sequence[str], config_dirs: Sequence[str] = (), config_name: str = "config"):
    """A validated `Config` whose env id exists; `CliConfigError` otherwise."""
    from jaxrl_dist.config import ConfigError
    from jaxrl_dist.envs import EnvMakeError

    try:
        return validated(compose(overrides, config_dirs, config_name), override_keys(overrides))
    except (ConfigError, EnvMakeError) as err:
        raise CliConfigError(one_line(err)) from err

"""The packaged Hydra configs, the schemas Hydra composes them against, and the one-line
errors every command prints.

The dataclasses of `jaxrl_dist.config` are stored in Hydra's ConfigStore: the defaults
node, and the backend and scheduler presets (each built-in's own schema), so Hydra and
OmegaConf do the typed merge and the unknown-key error. The YAML files only pick
presets and set values.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from jaxrl_dist.config import (ENTRY_POINTS, RESUMED_BACKEND, SCHEMAS, Config, ConfigError, FUSED_IS_A_TRAINER, config_keys, did_you_mean,
                               from_dict, omegaconf_message, require, schema, to_dict, typed, unknown_key)
from jaxrl_dist.registry import plugin_names

NAMED_PRESETS = ("cost", "backend", "scheduler")  # groups whose `name` key names the preset
# inside the package, so a plain (non-editable) install finds them from any directory
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
# open mappings: their keys are the env maker's or a plugin's, not the schema's
OPEN = ("env.kwargs", "env.wrapper_options", "algo.network_options", "algo.loss_options", "backend.options",
        "scheduler.options")


def one_line(err: Exception) -> str:
    """An error's message on one line (whitespace runs, newlines included, made one space)."""
    return " ".join(str(err).split())


# Hydra's launcher and sweeper plugins that the `sweep` extra installs
SWEEP_EXTRA = "the joblib and ray launchers and the optuna sweeper come with pip install 'jaxrl-dist[sweep]'"


def parse_args(parser, argv: Sequence[str]):
    """`parser.parse_args(argv)` taking its `overrides` (KEY=VALUE) wherever they stand
    among the options: argparse takes a `nargs='*'` positional in one run only, and
    calls the rest "unrecognized" as if the keys were wrong."""
    args, rest = parser.parse_known_args(argv)
    stray = [a for a in rest if a.startswith("-") or "=" not in a]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    args.overrides = [*args.overrides, *rest]
    return args


def presets(group: str = "env", config_dirs: Sequence[str] = ()) -> list:
    """The options of a config group: packaged YAML, the ConfigStore's, a user's --config-dir
    (for `hydra/launcher` and `hydra/sweeper`: the installed plugins')."""
    found = {p.stem for d in (CONFIG_DIR, *map(Path, config_dirs)) for p in (d / group).glob("*.yaml")}
    return sorted(found | set(SCHEMAS.get(group, ())) | _stored(group))


def _stored(group: str) -> set:
    if not group.startswith("hydra/"):
        return set()
    try:
        return {name[:-len(".yaml")] for name in ConfigStore.instance().list(group) if name.endswith(".yaml")}
    except OSError:  # no such group
        return set()


def store_schemas(overrides: Sequence[str] = ()) -> None:
    """The dataclasses as Hydra's schema: the defaults node `config.yaml` starts from, and
    one node per built-in backend and scheduler (its subclass, named by its preset). A
    plugin's name that `overrides` pick as a preset (`scheduler=NAME`) gets its group's
    base node too; the entry points are read (~0.2 s) only for a name no preset has."""
    store = ConfigStore.instance()
    store.store(name="jaxrl_dist_defaults", node=Config)
    for group, schemas in SCHEMAS.items():
        for name, cls in schemas.items():
            store.store(group=group, name=name, node=cls(name=name))
    for override in overrides:
        group, _, names = override.lstrip("+").partition("=")
        for name in names.split(",") if group in SCHEMAS else ():  # a sweep: a,b
            if name not in presets(group) and name in plugin_names(ENTRY_POINTS[group]):
                store.store(group=group, name=name, node=schema(group, name)(name=name))


def known_keys() -> list:
    """Every key of the schema, the built-ins' own keys included (for "did you mean")."""
    keys = config_keys(to_dict(Config()))
    for group, schemas in SCHEMAS.items():
        keys += [k for cls in schemas.values() for k in config_keys(to_dict(cls()), f"{group}.")]
    return sorted(set(keys))


def override_keys(overrides: Sequence[str]) -> list:
    """The config keys a user's overrides set (`a.b=1` -> `a.b`; `env=pong` -> `env`)."""
    return [o.split("=", 1)[0].lstrip("+~") for o in overrides]


def normalise(overrides: Sequence[str]) -> list:
    """Let `env.kwargs.x=1` (and the plugin option mappings) add keys without Hydra's `++`
    (the composed config is otherwise closed); write a whole number in exponent form
    (`algo.total_timesteps=1e6`) as an integer, which an integer key takes (OmegaConf
    takes no float there) and a float key reads the same; refuse the old `backend=fused`;
    `GROUP.name=PRESET` (cost, backend, scheduler) picks that preset as `GROUP=PRESET`
    does: its prices, or its own keys (the name alone kept the default preset's)."""
    out, keys = [], override_keys(overrides)
    for o in overrides:
        if o.replace(" ", "") in ("backend=fused", "backend.name=fused"):
            raise ConfigError(f"{o}: {FUSED_IS_A_TRAINER}")
        key, eq, value = o.partition("=")
        group = key[:-len(".name")] if key.endswith(".name") else None
        choices = presets(group) if group in NAMED_PRESETS else ()
        if choices and value and all(v in choices for v in value.split(",")) \
                and group not in keys:  # a sweep of them too: a,b
            key, o = group, f"{group}={value}"
        elif group == "cost" and not any(k.startswith("cost.") and k != key for k in keys):
            near = did_you_mean(value, choices, 0.8)  # a label of one's own sets prices beside it
            require(not near, f"cost.name={value}: no such cost preset{near}; a name of your own labels the "
                    "prices you set beside it (cost.vcpu_second_usd=...)")
        if key.startswith("+") and not key.startswith(("++", "+hydra")) and "/" not in key \
                and key[1:] not in known_keys() and not key[1:].startswith(OPEN):
            raise ConfigError(unknown_key(key[1:], known_keys()))  # `+` would add it to the typed config
        if eq and not key.lstrip("+").startswith(OPEN):  # an env maker's own values stay as given
            o = f"{key}={EXPONENT.sub(_whole, value)}"
        out.append(f"++{o}" if o.startswith(tuple(f"{k}{c}" for k in OPEN for c in ".=")) else o)
    return out


EXPONENT = re.compile(r"(?<![\w.])\d+(\.\d*)?[eE]\+?\d+(?![\w.])")  # 1e6, 2.5e5 (not 1e-3)


def _whole(number: re.Match) -> str:
    return str(int(float(number[0]))) if float(number[0]).is_integer() else number[0]


def saved_backend(run_dir: str) -> dict:
    """The `backend` mapping of the config saved in `run_dir` ({} when it cannot be read:
    the resumed run's own check names the file)."""
    try:
        return dict((yaml.safe_load((Path(run_dir) / "config.yaml").read_text()) or {}).get("backend") or {})
    except (OSError, yaml.YAMLError, AttributeError, TypeError, ValueError):
        return {}


def resumed_backend(overrides: Sequence[str]) -> list:
    """`overrides` of a `run.resume` that sets a backend key of `RESUMED_BACKEND` (new
    endpoints, a token file, a cluster address), with the saved run's backend preset and
    its saved values of the keys not given, so that they compose and check against the
    backend the run trains with (the default preset may not take them)."""
    keys = override_keys(overrides)
    given = dict(o.lstrip("+").split("=", 1) for o in overrides if "=" in o)
    if not given.get("run.resume") or "backend" in keys or not any(k.startswith("backend.") for k in keys):
        return list(overrides)
    saved = saved_backend(given["run.resume"])
    if saved.get("name") not in presets("backend"):
        return list(overrides)
    kept = [f"backend.{k}={json.dumps(saved[k])}" for k in RESUMED_BACKEND
            if saved.get(k) not in (None, []) and f"backend.{k}" not in keys]
    return [f"backend={saved['name']}", *kept, *overrides]


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
    by_id = {}
    for path in sorted((CONFIG_DIR / "env").glob("*.yaml")):
        by_id.setdefault(((yaml.safe_load(path.read_text()) or {}).get("env") or {}).get("id"), path.stem)
    preset = by_id.get(env_id)
    if preset is None:
        from jaxrl_dist.envs import EnvMakeError, make_env, task_family  # imports JAX: only for such ids

        try:
            preset = f"auto_{task_family(make_env(env_id, 1, suite).spec)}"
        except EnvMakeError:
            return list(overrides)
    return [f"env={preset}", *overrides]


def unknown_preset(group: str, option: str, config_dirs: Sequence[str] = ()) -> str:
    """The one line for a preset `group` lacks, with the closest one and every choice."""
    choices = sorted(set(presets(group, config_dirs)) | set(
        plugin_names(ENTRY_POINTS[group]) if group in ENTRY_POINTS else ()))
    plugins = f"; {SWEEP_EXTRA}" if group in ("hydra/launcher", "hydra/sweeper") else ""
    return (f"unknown {group} preset '{option}'{did_you_mean(option, choices, 0.6)} "
            f"(choose from: {', '.join(choices)}){plugins}")


# what composing a config raises for a user's bad input (a user's own YAML preset too)
COMPOSE_ERRORS = (HydraException, OmegaConfBaseException, yaml.YAMLError)


def hydra_message(err: Exception, config_dirs: Sequence[str] = ()) -> str:
    """One line for a Hydra/OmegaConf error, naming the key and the closest known name."""
    if isinstance(err, yaml.YAMLError):  # a --config-dir preset's file
        mark = getattr(err, "problem_mark", None)
        where = f"{mark.name}:{mark.line + 1}:{mark.column + 1}" if mark else "a config file"
        return f"{where}: not readable YAML ({getattr(err, 'problem', None) or one_line(err)})"
    if isinstance(err, OverrideParseException):
        if "=" not in err.override and not err.override.startswith("~"):  # `trainer fused`
            return f"bad override '{err.override}': an override is KEY=VALUE ({err.override}=...)"
        return f"bad override '{err.override}': {str(err).splitlines()[0]}"  # without the grammar link
    text, cause = one_line(err), err.__cause__ or err
    match = re.search(r"Could not (?:override|append to config\. An item is already at) '([^']+)'", text)
    match = match or re.search(r"Error merging override (\S+?)=", text)
    if match:
        if isinstance(cause, OmegaConfBaseException):
            cause.full_key = match.group(1).lstrip("+~")  # as the user wrote it (OmegaConf's may be a prefix)
        return omegaconf_message(cause, _known_near(cause)) if isinstance(cause, OmegaConfBaseException) else text
    match = re.search(r"Could not (?:find|load) '((?:hydra/)?[^/']+)/([^']+)'", text)
    if match:
        return unknown_preset(*match.groups(), config_dirs)
    if isinstance(err, OmegaConfBaseException):
        return omegaconf_message(err, known_keys())
    return text


def _known_near(err: OmegaConfBaseException) -> list:
    """The keys to suggest for `err`'s key: the schema's, or for a `hydra.` key (a
    launcher's or sweeper's own options) its siblings in the composed node."""
    key, parent = getattr(err, "full_key", "") or "", getattr(err, "parent_node", None)
    if not key.startswith("hydra.") or parent is None or not OmegaConf.is_dict(parent):
        return known_keys()
    head = key.rpartition(".")[0]
    return [f"{head}.{k}" for k in parent.keys() if not str(k).startswith("_")]


def compose(overrides: Sequence[str], config_dirs: Sequence[str] = ()) -> dict:
    """The composed config as plain nested dicts (a non-train command's one compose);
    `ConfigError` on Hydra's errors. `config_dirs` are searched before the package's."""
    store_schemas(overrides)
    extra = [f"hydra.searchpath=[{','.join('file://' + str(Path(d).resolve()) for d in config_dirs)}]"
             ] if config_dirs else []
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="jaxrl-dist"):
            cfg = hydra_compose("config", overrides=normalise(task_preset(resumed_backend(overrides))) + extra)
        return OmegaConf.to_container(cfg, resolve=True)
    except COMPOSE_ERRORS as err:
        raise ConfigError(hydra_message(err, config_dirs)) from None


def load_config(overrides: Sequence[str], config_dirs: Sequence[str] = ()) -> Config:
    """The checked `Config` of `overrides`; `ConfigError` names what is wrong."""
    keys = override_keys(overrides)
    return from_dict(_named_schemas(compose(overrides, config_dirs), keys), keys)


def _named_schemas(data: dict, user_keys: Sequence[str]) -> dict:
    """`data` without the keys a preset gave a backend or scheduler that its `name` now
    names another schema without (`scheduler.name=PLUGIN` over the default preset's
    `scheduler.path`); a key the user set stays, for the check to name."""
    for group in SCHEMAS:
        part = data.get(group)
        if isinstance(part, dict) and isinstance(part.get("name"), str):
            fields = schema(group, part["name"]).__dataclass_fields__
            data[group] = {k: v for k, v in part.items() if k in fields or f"{group}.{k}" in user_keys}
    return data


def options(cls, overrides: Sequence[str], group: str):
    """`cls` from `GROUP.KEY=VALUE` overrides (eval, serve: configs apart from training's)."""
    bad = [o for o in overrides if not o.lstrip("+").startswith(f"{group}.") or "=" not in o]
    if bad:
        raise ConfigError(f"bad override '{bad[0]}': this command takes {group}.KEY=VALUE")
    given = OmegaConf.from_dotlist([o.lstrip("+")[len(group) + 1:] for o in overrides])
    return typed(cls, given, f"{group}.")

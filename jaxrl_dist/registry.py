"""Named extension points: the built-ins plus plugins found under an entry-point group.

A research fork adds a loss, a network, an env suite, a backend or a scheduler
without editing the package: its distribution declares, for example,

    [project.entry-points."jaxrl_dist.losses"]
    clipped_plus = "my_fork.losses:clipped_plus"

and `algo.loss=clipped_plus` picks it. The library API takes objects too
(`Registry.register`, or `make_train(cfg, env, network=..., loss=...)`).

A plugin with options declares them as a dataclass in its `Options` attribute;
`options(target, mapping, key)` builds it, so a misspelt or mistyped option is
a one-line `ConfigError` naming `<group key>.<option>`. A plugin without
`Options` takes none.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import sys
from importlib.metadata import entry_points
from typing import Any, Dict, Mapping, Union

from jaxrl_dist.config import ConfigError, did_you_mean, typed


@functools.lru_cache(maxsize=64)
def _entry_points(group: str, path: tuple) -> tuple:
    """The entry points of `group` among the distributions on `path` (the search path, so
    a changed `sys.path` searches again): reading every distribution's metadata costs
    ~30 ms, which a sweep's checks paid per job."""
    return tuple(entry_points(group=group))


def plugin_names(group: str) -> list:
    """The names the installed distributions register under entry-point `group`."""
    return sorted(ep.name for ep in _entry_points(group, tuple(sys.path)))


class Registry:
    """Names of one extension point -> objects (or "module:attr" strings, loaded on use)."""

    def __init__(self, what: str, key: str, group: str, builtin: Mapping[str, Union[str, Any]]):
        self.what, self.key, self.group = what, key, group
        self._builtin: Dict[str, Any] = dict(builtin)  # the package's, then what a caller registers
        self._own = frozenset(builtin)
        self._here: set = set()  # the names `register` set: other processes do not see them

    def register(self, name: str, target: Any) -> Any:
        """Add (or replace) `name` for this process; returns `target` (usable as a decorator's body)."""
        self._builtin[name] = target
        self._here.add(name)
        return target

    def registered_here(self, name: str) -> bool:
        """Whether `name` is one `register` set in this process (other processes lack it)."""
        return name in self._here and name in self._builtin

    def check_elsewhere(self, name: str, where: str) -> None:
        """`name` means the same in another process (`where`, say `backend=ray`'s actors):
        one registered in this process only is a `ConfigError`, not a shard that fails
        in each of its tries there."""
        if self.registered_here(name):
            raise ConfigError(f"{self.key}={name}: registered in this process only; {where} run in other "
                              f"processes, which find a plugin by its entry point ({self.group}); declare it "
                              "in a distribution's entry points (README: Extending), or use backend=local")

    def _plugins(self) -> dict:
        return {ep.name: ep for ep in _entry_points(self.group, tuple(sys.path))}

    def names(self) -> list:
        return sorted(set(self._builtin) | set(self._plugins()))

    def get(self, name: str) -> Any:
        """The object registered as `name`; `ConfigError` (one line) for an unknown name
        or a plugin that fails to import (naming its distribution)."""
        if name in self._builtin:
            target = self._builtin[name]
            return _load(target) if isinstance(target, str) else target
        ep = self._plugins().get(name)
        if ep is None:
            raise ConfigError(f"{self.key}: unknown {self.what} {name!r}{did_you_mean(name, self.names(), 0.6)} "
                              f"(registered: {', '.join(self.names())})")
        try:
            return ep.load()
        except Exception as err:  # a broken plugin must not take the run down with a traceback
            dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
            raise ConfigError(f"{self.key}: {self.what} {name!r} from distribution {dist} "
                              f"failed to import: {type(err).__name__}: {err}") from err

    def check(self, name: str, given: Mapping, key: str) -> None:
        """A plugin's name and its options (`key`), checked before a run writes anything;
        a built-in is taken as named (its keys are its schema's, already checked), and
        options given to it are an error: only a plugin reads them."""
        if name not in self._own:
            options(self.get(name), given, key)
        elif given:
            group = self.key.rpartition(".")[0]
            raise ConfigError(f"{key}.{sorted(given)[0]}: {group}={name} is built in and takes no {key}; "
                              f"its keys are {group}.* (jaxrl-dist train --print-config {group}={name})")


def check_call(what: str, target: Any, *args, **kwargs) -> None:
    """`ConfigError(f"{what} ({why})")` where `target` cannot be called with these arguments
    (a plugin of another signature: one line before the call, not a traceback inside it)."""
    try:
        inspect.signature(target).bind(*args, **kwargs)
    except TypeError as err:
        raise ConfigError(f"{what} ({err})") from None
    except ValueError:  # no signature to read (a builtin): the call says
        pass


def made(key: str, name: str, target: Any, contract: str, needs: tuple, *args, **kwargs) -> Any:
    """`target(*args, **kwargs)`, a plugin's object; a target that cannot be called so,
    or an object without the attributes `needs`, is one line naming `key` and the contract
    (not a traceback at its first use, or in a clean-up that calls what it lacks)."""
    check_call(f"{key}: {name!r} cannot be called as {contract}", target, *args, **kwargs)
    obj = target(*args, **kwargs)
    missing = [m for m in needs if not hasattr(obj, m)]
    if missing:
        raise ConfigError(f"{key}: {name!r} made a {type(obj).__name__}, which lacks {', '.join(missing)} "
                          f"({contract})")
    return obj


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def options(target: Any, given: Mapping, key: str) -> Any:
    """`target.Options` filled from `given` by OmegaConf's typed merge (the same merge the
    config itself goes through); None when the plugin declares no `Options` and `given`
    is empty. An unknown option, a wrong type or the plugin's own check is one line."""
    cls = getattr(target, "Options", None)
    given = dict(given or {})
    if cls is None:
        if given:
            raise ConfigError(f"{key}.{sorted(given)[0]}: {getattr(target, '__name__', 'it')} takes no options")
        return None
    who = getattr(target, "__name__", type(target).__name__)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        what = "a plain class" if isinstance(cls, type) else f"a {type(cls).__name__}"
        raise ConfigError(f"{key}: {who}.Options is {what}, not a dataclass (a plugin declares its options as "
                          "a dataclass)")
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:  # the plugin's own declaration: a field type OmegaConf cannot hold, a default of the wrong type
        OmegaConf.structured(cls)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{key}: {who}.Options cannot be read as a config ({' '.join(str(err).split())}): "
                          "a plugin's mistake, not the options given") from None
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: unknown option (options: {', '.join(names) or 'none'})")
    try:
        return typed(cls, given, f"{key}.")
    except (TypeError, ValueError) as err:  # the plugin's own checks (__post_init__)
        raise err if isinstance(err, ConfigError) else ConfigError(f"{key}: {err}") from err

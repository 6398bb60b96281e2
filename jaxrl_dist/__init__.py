"""jaxrl-dist: PPO in JAX with a fused single-process trainer and distributed actors.

The public names below are imported on first use (module `__getattr__`), so
`import jaxrl_dist` stays light: it loads neither JAX nor any optional
backend (envpool, ray, the HTTP stack) nor Hydra.

    from jaxrl_dist import from_dict, train
    summary = train(from_dict({"env": {"id": "CartPole-v1"}}))
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

try:
    from importlib.metadata import PackageNotFoundError, version

    __version__ = version("jaxrl-dist")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

# public name -> (submodule, attribute)
_EXPORTS = {
    "Config": ("config", "Config"),
    "EnvConfig": ("config", "EnvConfig"),
    "AlgoConfig": ("config", "AlgoConfig"),
    "RunConfig": ("config", "RunConfig"),
    "from_dict": ("config", "from_dict"),
    "load_config": ("cli.compose", "load_config"),
    "train": ("trainers.runner", "train"),
    "make_env": ("envs", "make_env"),
    "make_network": ("core.networks", "make_network"),
    "make_update": ("core.ppo", "make_update"),
    "make_train": ("trainers.fused", "make_train"),
    "gae": ("core.ppo", "gae"),
    "load_policy": ("evaluation", "load_policy"),
    "evaluate": ("evaluation", "evaluate"),
    "EvalConfig": ("config", "EvalConfig"),
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'jaxrl_dist' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(f"jaxrl_dist.{module}"), attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # static analysers see the real objects ("X as X": a re-export)
    from jaxrl_dist.config import AlgoConfig as AlgoConfig, Config as Config, EnvConfig as EnvConfig
    from jaxrl_dist.config import EvalConfig as EvalConfig, RunConfig as RunConfig, from_dict as from_dict
    from jaxrl_dist.cli.compose import load_config as load_config
    from jaxrl_dist.core.networks import make_network as make_network
    from jaxrl_dist.core.ppo import gae as gae, make_update as make_update
    from jaxrl_dist.envs import make_env as make_env
    from jaxrl_dist.evaluation import evaluate as evaluate, load_policy as load_policy
    from jaxrl_dist.trainers.fused import make_train as make_train
    from jaxrl_dist.trainers.runner import train as train

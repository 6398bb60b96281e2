"""The named parts a run is built from, checked before the run writes anything: the env
suite that has `env.id` (and a built-in recurrent network's fit to it), the env wrapper,
the network and the loss, and for a shard trainer a plugin backend or scheduler, each
with its options (the learned scheduler: its file; the http backend: its token file);
and the summary number that `run.objective` names. A bad one is a `ConfigError` naming its key."""
from __future__ import annotations

from jaxrl_dist.backends import BACKENDS, capabilities
from jaxrl_dist.backends.http import read_token_file
from jaxrl_dist.config import Config, check_recurrent
from jaxrl_dist.core.networks import NETWORKS
from jaxrl_dist.core.ppo import check_plugins
from jaxrl_dist.envs import SUITES, check_wrapper, resolve_suite
from jaxrl_dist.envs.wrappers import WRAPPERS
from jaxrl_dist.scheduling.learned import checked_file, has_scale, scale_for
from jaxrl_dist.scheduling.schedulers import SCHEDULERS
from jaxrl_dist.trainers.summary import check_objective


def check_parts(config: Config) -> None:
    check_objective(config.run.objective, config.trainer.name)
    suite = resolve_suite(config.env.id, config.env.suite)
    if config.algo.recurrent:  # a built-in recurrent network: refused before its env is made
        check_recurrent(config, suite)
    check_wrapper(config.env.wrapper, config.env.wrapper_options)  # its name and options; its fit, once made
    check_plugins(config.algo)
    if config.trainer.name != "fused":  # the fused trainer runs no backend or scheduler ...
        BACKENDS.check(config.backend.name, config.backend.options, "backend.options")
        _check_shard_parts(config, suite)
    if config.trainer.name == "sync":  # ... and the async trainer no scheduler (its balancer sizes it)
        SCHEDULERS.check(config.scheduler.name, config.scheduler.options, "scheduler.options")
        if config.scheduler.name == "learned":  # its file, the shard range it was trained for, the return range
            trained = checked_file(config.scheduler, config.backend)[1]
            if has_scale(trained, config):
                scale_for(trained, config)
    if config.trainer.name != "fused" and getattr(config.backend, "token_file", None):  # the http backend's
        read_token_file(config.backend.token_file)


def _check_shard_parts(config: Config, suite: str) -> None:
    """What a shard builds (the env suite, its wrapper, the network) means the same where a
    backend that runs shards in other processes runs them: not a name registered here only.
    The backend's class (a built-in's module: Ray, httpx) is loaded only where one is."""
    parts = [(SUITES, suite), (NETWORKS, config.algo.network)] + (
        [(WRAPPERS, config.env.wrapper)] if config.env.wrapper else [])
    here = [(registry, name) for registry, name in parts if registry.registered_here(name)]
    if not here or capabilities(BACKENDS.get(config.backend.name)).in_process:
        return
    for registry, name in here:
        registry.check_elsewhere(name, f"backend={config.backend.name}'s shards")

"""`hydra/launcher=vmap`, found by Hydra's plugin scan of the `hydra_plugins` namespace.

This module imports no JAX (Hydra imports every plugin at start-up); the launching
lives in `jaxrl_dist.cli.vmap`, imported when a sweep is launched.
"""
from dataclasses import dataclass
from typing import Any, Sequence

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher


@dataclass
class VmapLauncherConf:
    _target_: str = "hydra_plugins.jaxrl_dist_vmap.vmap_launcher.VmapLauncher"
    # members (a job's seeds, summed over its group's jobs) in one program at most: a
    # bigger group trains in several programs one after another, whole jobs each
    max_members: int = 1024


ConfigStore.instance().store(group="hydra/launcher", name="vmap", node=VmapLauncherConf, provider="jaxrl-dist")


class VmapLauncher(Launcher):
    def __init__(self, max_members: int = 1024) -> None:
        if isinstance(max_members, bool) or not isinstance(max_members, int) or max_members < 1:
            import sys

            print(f"error: hydra.launcher.max_members must be a positive integer, got {max_members!r}",
                  file=sys.stderr, flush=True)
            raise SystemExit(2)  # Hydra turns other exceptions at instantiation into its own report
        self.max_members = max_members
        self.config: Any = None
        self.hydra_context: Any = None
        self.task_function: Any = None
        self.composer: Any = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        from jaxrl_dist.cli.vmap import Composer

        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        # one compose per kind of job, for the sweeper's check and the launcher alike
        self.composer = Composer.install(hydra_context.config_loader)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
        from jaxrl_dist.cli.vmap import launch

        return launch(self, job_overrides, initial_job_idx)

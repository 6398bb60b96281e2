"""Device meshes for data-parallel learning: a `seeds` x `data` grid of devices.

The fused trainer's programs are the one-device programs, jitted with the state's
leaves placed on the mesh (the seed axis over `seeds`, each seed's envs over `data`,
params and optimiser state replicated over `data`); XLA partitions them. PPO then
pins each minibatch's sample axis to `data` (`PPOOptions.batch_sharding`), so every
device takes the gradient of its part and the gradients are averaged by an
all-reduce. The arithmetic is the one-device arithmetic: only the order of the
reductions differs, so a data-parallel run's params follow one device's to float
rounding (a test states the tolerance).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_dist.config import ConfigError, requested_devices

SEEDS, DATA = "seeds", "data"


class MeshShape(NamedTuple):
    seeds: int
    data: int

    @property
    def devices(self) -> int:
        return self.seeds * self.data


def mesh_shape(trainer, present: int) -> Optional[MeshShape]:
    """The `seeds x data` shape `trainer.devices` / `trainer.seed_axis` ask for out of
    `present` devices; None for one device (no mesh). Raises `ConfigError` naming the
    keys and the counts."""
    count = requested_devices(trainer)
    count = present if count is None else count
    if count > present:
        cpu = jax.default_backend() == "cpu"  # the CLI makes one device a core; XLA can make more
        hint = f"; on CPU, XLA_FLAGS=--xla_force_host_platform_device_count={count} makes {count}" if cpu else ""
        raise ConfigError(f"trainer.devices={trainer.devices}: only {present} device(s) present "
                          f"({jax.default_backend()}){hint}")
    if count != present and jax.process_count() > 1:  # a process without a device of the mesh has no part
        raise ConfigError(f"trainer.devices={trainer.devices}: a run over {jax.process_count()} processes "
                          f"spans all their {present} devices; set trainer.devices=all")
    if count % trainer.seed_axis:
        raise ConfigError(f"trainer.seed_axis={trainer.seed_axis} does not divide the "
                          f"{count} device(s) of trainer.devices={trainer.devices}")
    if count == 1:
        return None
    return MeshShape(trainer.seed_axis, count // trainer.seed_axis)


def check_divisible(shape: Optional[MeshShape], count: int, key: str) -> None:
    """`count` (of `key`) splits evenly over the data axis: a config error otherwise."""
    if shape is not None and count % shape.data:
        raise ConfigError(f"{key}={count} is not divisible by the data axis: {shape.data} device(s) "
                          f"(trainer.devices / trainer.seed_axis)")


def data_mesh(trainer, count: int, key: str) -> Optional[Mesh]:
    """The mesh `trainer.devices` asks for over the devices present (None for one device),
    with `count` (of `key`: the envs or samples split over the data axis) checked to divide
    evenly; a `ConfigError` naming the keys and counts otherwise."""
    shape = mesh_shape(trainer, jax.device_count())
    check_divisible(shape, count, key)
    return None if shape is None else make_mesh(shape)


def make_mesh(shape: MeshShape) -> Mesh:
    """A `seeds x data` mesh over the first devices (every process's, in a multi-process run)."""
    devices = np.array(jax.devices()[: shape.devices]).reshape(shape.seeds, shape.data)
    return Mesh(devices, (SEEDS, DATA))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def samples(mesh: Mesh) -> NamedSharding:
    """A minibatch's leading (sample) axis over `data`."""
    return NamedSharding(mesh, P(DATA))

"""Host arrays: the members' axis sharded over every device of every process, and the whole of it on each host."""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def member_sharding(num_members: int) -> tuple[NamedSharding, int]:
    """A sharding of the member axis over every visible device, and the member count padded to fit it."""
    devices = np.array(jax.devices())
    padded = -(-num_members // len(devices)) * len(devices)
    return NamedSharding(Mesh(devices, ("members",)), PartitionSpec("members")), padded


def host_array(array: jax.Array) -> np.ndarray:
    """The whole of a member-sharded array on this host (gathered from the other processes if there are any)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))

"""Memory budgets: a state or a compiled program refused, before anything is allocated, where it would not fit."""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def device_limits() -> list[int] | None:
    """Each local device's memory as JAX reports it (a GPU's: its allocator's limit); None where a device reports
    none (a CPU)."""
    limits = [(device.memory_stats() or {}).get("bytes_limit") for device in jax.local_devices()]
    known = [int(limit) for limit in limits if limit]
    return known if len(known) == len(limits) else None


def memory_available() -> int:
    """Bytes this process's share of the members may take: its devices' memory where JAX reports it (GPUs),
    else the host's RAM."""
    limits = device_limits()
    if limits is not None:
        return sum(limits)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def state_bytes(spec: Any) -> int:
    """Bytes of a state's arrays, from its shapes (`jax.eval_shape`: nothing allocated); keys not counted."""
    return sum(
        leaf.size * np.dtype(leaf.dtype).itemsize
        for leaf in jax.tree.leaves(spec)
        if not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    )


def check_state_memory(needed: int, what: str, remedy: str, share: float = 0.5) -> None:
    """Refuses, before allocating anything, a state of `needed` bytes (`what` it holds) above `share` of the memory
    here (the program needs room for its temporaries too), naming the flags that would shrink it."""
    available = memory_available()
    if needed > share * available:
        raise ValueError(
            f"the run's state needs {needed / 2**30:,.1f} GiB ({what}), more than {share:.0%} of the "
            f"{available / 2**30:,.1f} GiB here; {remedy}."
        )


def check_working_memory(
    stats: Any,
    what: str = "one evaluation period",
    remedy: str = "use smaller J, K, B or fewer seeds or grid points",
    *,
    holds: str = "the members' state, the episodes played, the elites gathered per update",
    devices: int = 1,
    share: float = 0.8,
) -> None:
    """Refuses, before running it, a compiled program (`what` it does) whose arguments, outputs and temporaries
    (XLA's own count; a donated argument counted once) exceed `share` of the memory here: large J·K, B or T make
    the update's working arrays big, and many members a state that is held twice while a new one is made.
    `devices`: how many devices run the program (XLA counts one device's share), against the memory of all."""
    if stats is None:
        return
    per_device = (
        stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes + stats.temp_size_in_bytes
    )
    needed, available = per_device * devices, memory_available()
    if needed > share * available:
        raise ValueError(
            f"{what} needs {needed / 2**30:,.1f} GiB of working memory (XLA's count: {holds}), more than "
            f"{share:.0%} of the {available / 2**30:,.1f} GiB here; {remedy}."
        )

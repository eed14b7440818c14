"""The FIFO pool: a frozen pytree ring buffer of fixed-length trajectories.

Capacity N and trajectory length T are static (they are array shapes); the write position, the fill level
and the add counter are arrays, so `add` is pure, jittable, never retraces, and its input pool can be
donated (`jax.jit(pool.add, donate_argnums=0)`) to update the buffers in place. A pool may use only its
first n <= N slots (`slots_in_use`, an array): it then holds exactly what a pool of capacity n would, so the
members of one compiled sweep can differ in pool capacity.

Axis legend: N pool entries, B new trajectories, T steps.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax.core.checks import check_positive_int


class Trajectory(flax.struct.PyTreeNode):
    """One fixed-length trajectory record (leading axes [N] or [B] when stacked).

    `observation` is any pytree whose leaves have a leading [T] axis (states, token ids, ...).
    """

    observation: Any  # pytree, leaves [T, ...]
    action: jax.Array  # [T] int32
    mask: jax.Array  # [T] bool: the policy's own steps; padding and injected tokens are False
    behaviour_logp: jax.Array  # [T] float32: log-prob of the action under the policy that acted
    behaviour_version: jax.Array  # [T] int32: the policy version (update count) that acted
    episode_return: jax.Array  # [] float32: terminal return, used for ranking
    reward: jax.Array  # [T] float32: the reward of each step (0 after the episode's end)
    alive: jax.Array  # [T] bool: steps before the episode's end, the policy's and the environment's


class Pool(flax.struct.PyTreeNode):
    """A ring buffer of N trajectories; the oldest is overwritten first."""

    trajectories: Trajectory  # leaves [N, T, ...]
    added_at: jax.Array  # [N] int32: the add call (0, 1, ...) that wrote each entry; -1 if never written
    insert_index: jax.Array  # [] int32: where the next trajectory goes
    size: jax.Array  # [] int32: number of valid entries, min(total added, slots in use)
    num_adds: jax.Array  # [] int32: number of add calls so far
    slots_in_use: jax.Array  # [] int32: n <= N, the ring's length (the slots after it stay empty)

    @property
    def capacity(self) -> int:
        return self.added_at.shape[0]


_RECORD_DTYPES = {
    "action": np.dtype(np.int32),
    "mask": np.dtype(np.bool_),
    "behaviour_logp": np.dtype(np.float32),
    "behaviour_version": np.dtype(np.int32),
    "episode_return": np.dtype(np.float32),
    "reward": np.dtype(np.float32),
    "alive": np.dtype(np.bool_),
}


def _check_record(record: Trajectory, leading: tuple[int, ...], what: str) -> int:
    """Checks field shapes and dtypes below `leading` axes; returns T."""
    if not isinstance(record, Trajectory):
        raise ValueError(f"{what} must be a ftw_jax.Trajectory, got {type(record).__name__}.")
    action_shape = np.shape(record.action)
    if len(action_shape) != len(leading) + 1 or tuple(action_shape[: len(leading)]) != leading:
        raise ValueError(f"{what}.action must have shape {leading + ('T',)}, got {action_shape}.")
    num_steps = action_shape[-1]
    for name, dtype in _RECORD_DTYPES.items():
        value = getattr(record, name)
        expected = leading + (() if name == "episode_return" else (num_steps,))
        if np.shape(value) != expected:
            raise ValueError(f"{what}.{name} must have shape {expected}, got {np.shape(value)}.")
        if jnp.result_type(value) != dtype:
            raise ValueError(f"{what}.{name} must have dtype {dtype.name}, got {jnp.result_type(value)}.")
    for path, leaf in jax.tree_util.tree_leaves_with_path(record.observation):
        if np.shape(leaf)[: len(leading) + 1] != leading + (num_steps,):
            raise ValueError(
                f"{what}.observation{jax.tree_util.keystr(path)} must have leading shape "
                f"{leading + (num_steps,)}, got {np.shape(leaf)}."
            )
    return num_steps


def init(capacity: int, example: Trajectory, slots_in_use: int | jax.Array | None = None) -> Pool:
    """An empty pool of `capacity` entries shaped like `example` (one trajectory, no leading axis).

    `slots_in_use` (default: all) makes it behave as a pool of that capacity; it may be a traced array,
    which is not checked: keep it in [B, N] where B is the size of the batches added.
    """
    check_positive_int("capacity", capacity)
    if isinstance(slots_in_use, (int, np.integer)) and not 1 <= slots_in_use <= capacity:
        raise ValueError(f"slots_in_use must be in [1, capacity={capacity}], got {slots_in_use}.")
    _check_record(example, (), "example")
    trajectories = jax.tree.map(lambda leaf: jnp.zeros((capacity,) + jnp.shape(leaf), jnp.result_type(leaf)), example)
    return Pool(
        trajectories=trajectories,
        added_at=jnp.full((capacity,), -1, jnp.int32),
        insert_index=jnp.zeros((), jnp.int32),
        size=jnp.zeros((), jnp.int32),
        num_adds=jnp.zeros((), jnp.int32),
        slots_in_use=jnp.asarray(capacity if slots_in_use is None else slots_in_use, jnp.int32),
    )


def add(pool: Pool, batch: Trajectory) -> Pool:
    """Writes B <= N trajectories (leaves [B, ...]) at the insert position, wrapping around.

    The B oldest entries are overwritten once the pool is full (its slots in use all hold trajectories).
    Shapes and dtypes must match the pool's.
    """
    capacity = pool.capacity
    batch_size = np.shape(batch.action)[0] if isinstance(batch, Trajectory) and np.ndim(batch.action) else None
    if batch_size is None:
        raise ValueError("batch must be a ftw_jax.Trajectory with a leading batch axis [B, T].")
    if batch_size > capacity:
        raise ValueError(f"cannot add B={batch_size} trajectories to a pool of capacity N={capacity} (need B <= N).")
    _check_record(batch, (batch_size,), "batch")
    pool_structure = jax.tree.structure(pool.trajectories)
    if jax.tree.structure(batch) != pool_structure:
        raise ValueError(f"batch structure {jax.tree.structure(batch)} differs from the pool's {pool_structure}.")
    for (path, stored), new in zip(jax.tree_util.tree_leaves_with_path(pool.trajectories), jax.tree.leaves(batch)):
        if np.shape(new)[1:] != stored.shape[1:] or jnp.result_type(new) != stored.dtype:
            raise ValueError(
                f"batch{jax.tree_util.keystr(path)} has shape {np.shape(new)} and dtype {jnp.result_type(new)}; "
                f"the pool expects [B, {', '.join(map(str, stored.shape[1:]))}] {stored.dtype}."
            )
    ring = pool.slots_in_use
    slots = (pool.insert_index + jnp.arange(batch_size, dtype=jnp.int32)) % ring
    return pool.replace(
        trajectories=jax.tree.map(lambda stored, new: stored.at[slots].set(new), pool.trajectories, batch),
        added_at=pool.added_at.at[slots].set(pool.num_adds),
        insert_index=(pool.insert_index + batch_size) % ring,
        size=jnp.minimum(pool.size + batch_size, ring),
        num_adds=pool.num_adds + 1,
    )


def valid_mask(pool: Pool) -> jax.Array:
    """[N] bool: entries that hold a trajectory (the ring fills slots 0..N−1 in order)."""
    return jnp.arange(pool.capacity) < pool.size

"""Argument checks shared by configs and functions: fail early, name the bad value and what was expected."""

from __future__ import annotations

import numpy as np


def check_positive_int(name: str, value: object) -> None:
    """Raises ValueError unless `value` is an int >= 1 (Python or NumPy; bool is not an int here)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}.")


def check_non_negative(name: str, value: object) -> None:
    """Raises ValueError unless `value` is a number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}.")


def check_sizes(pool_size: int, batch_size: int, num_elites: int) -> None:
    """Raises ValueError unless 1 <= num_elites (K) <= batch_size (C) <= pool_size (N)."""
    for name, value in (("pool_size", pool_size), ("batch_size", batch_size), ("num_elites", num_elites)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be a Python int, got {value!r} ({type(value).__name__}).")
    if num_elites < 1:
        raise ValueError(f"num_elites (K) must be >= 1, got {num_elites}.")
    if batch_size < num_elites:
        raise ValueError(f"num_elites (K={num_elites}) must be <= batch_size (C={batch_size}).")
    if pool_size < batch_size:
        raise ValueError(f"batch_size (C={batch_size}) must be <= pool_size (N={pool_size}).")


# Seeds become PRNG keys: non-negative int32 values work on every backend.
MAX_SEED = 2**31 - 1


def check_seed(name: str, value: object) -> None:
    """Raises ValueError unless `value` is an int in [0, MAX_SEED] (a larger one overflows `jax.random.key`)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_SEED:
        raise ValueError(f"{name} must be an int in [0, {MAX_SEED}], got {value!r}.")

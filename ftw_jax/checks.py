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


# Seeds become PRNG keys: non-negative int32 values work on every backend.
MAX_SEED = 2**31 - 1


def check_seed(name: str, value: object) -> None:
    """Raises ValueError unless `value` is an int in [0, MAX_SEED] (a larger one overflows `jax.random.key`)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_SEED:
        raise ValueError(f"{name} must be an int in [0, {MAX_SEED}], got {value!r}.")

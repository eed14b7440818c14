"""ftw_jax: Follow the Winners, a critic-free policy-improvement method, in JAX."""

from typing import TYPE_CHECKING

from ftw_jax.core import losses, pool
from ftw_jax.core.occupancy import (
    expected_failure_share,
    expected_selection_counts,
    rank_occupancy,
    rank_occupancy_jax,
    tied_occupancy,
)
from ftw_jax.core.pool import Pool, Trajectory
from ftw_jax.core.selection import select_elites, select_elites_masked
from ftw_jax.core.state import PolicyState
from ftw_jax.core.update import Sizes, UpdateConfig, make_update

__version__ = "0.7.0"  # the one place it is declared: pyproject.toml reads it, CHANGELOG.md says what it holds

if TYPE_CHECKING:  # for type checkers; at run time `ftw_jax.lm` is imported on first use, below
    from ftw_jax import lm


def __getattr__(name: str):
    """`ftw_jax.lm` on first use: the LM (Flax, safetensors) costs nothing to those who never touch it."""
    if name == "lm":
        import importlib

        return importlib.import_module("ftw_jax.lm")
    raise AttributeError(f"module 'ftw_jax' has no attribute {name!r}")


__all__ = [
    "PolicyState",
    "Sizes",
    "Pool",
    "Trajectory",
    "UpdateConfig",
    "expected_failure_share",
    "expected_selection_counts",
    "lm",
    "losses",
    "make_update",
    "pool",
    "rank_occupancy",
    "rank_occupancy_jax",
    "select_elites",
    "select_elites_masked",
    "tied_occupancy",
]

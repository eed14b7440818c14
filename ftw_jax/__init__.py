"""ftw_jax: Follow the Winners, a critic-free policy-improvement method, in JAX.

Its names are imported on first use: `import ftw_jax` (the command line's first step) costs no JAX import, so the
command can take its stop signals before anything heavy runs.
"""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.7.0"  # the one place it is declared: pyproject.toml reads it, CHANGELOG.md says what it holds

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first use, below
    from ftw_jax import lm
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

_MODULES = {"lm": "ftw_jax.lm", "losses": "ftw_jax.core.losses", "pool": "ftw_jax.core.pool"}
_NAMES = {
    **dict.fromkeys(
        (
            "expected_failure_share",
            "expected_selection_counts",
            "rank_occupancy",
            "rank_occupancy_jax",
            "tied_occupancy",
        ),
        "ftw_jax.core.occupancy",
    ),
    **dict.fromkeys(("Pool", "Trajectory"), "ftw_jax.core.pool"),
    **dict.fromkeys(("select_elites", "select_elites_masked"), "ftw_jax.core.selection"),
    "PolicyState": "ftw_jax.core.state",
    **dict.fromkeys(("Sizes", "UpdateConfig", "make_update"), "ftw_jax.core.update"),
}


def __getattr__(name: str):
    """A public name on first use (the LM, Flax and safetensors too cost nothing to those who never touch them)."""
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    else:
        raise AttributeError(f"module 'ftw_jax' has no attribute {name!r}")
    globals()[name] = value  # imported once
    return value


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

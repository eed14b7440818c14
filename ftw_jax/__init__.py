"""ftw_jax: Follow the Winners, a critic-free policy-improvement method, in JAX.

The public API (docs/api.md): the FTW core (the exact occupancy, the pool, the selection, the update), the lab
(`TrainConfig`, `make_train`, `make_sweep`, `compare`: FTW and its baselines on JAX environments, one jitted
program) and the agent (`LearnConfig`, `EpisodeLearner`, `learn_from_file`, `RetrievalTrainConfig`,
`train_retrieval_qa`: an LLM learned from an engine's episodes or on retrieval QA), and the LM library `lm`.

Its names are imported on first use: `import ftw_jax` (the command line's first step) costs no JAX import, so the
command can take its stop signals before anything heavy runs.
"""

import importlib
from typing import TYPE_CHECKING

__version__ = "0.8.0"  # the one place it is declared: pyproject.toml reads it, CHANGELOG.md says what it holds

if TYPE_CHECKING:  # for type checkers; at run time each name is imported on first use, below
    from ftw_jax import lm
    from ftw_jax.agent.learner import EpisodeLearner, LearnConfig
    from ftw_jax.agent.lm_learn import learn_from_file
    from ftw_jax.agent.retrieval_qa.learner import RetrievalTrainConfig, train_retrieval_qa
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
    from ftw_jax.lab.compare import Comparison, compare
    from ftw_jax.lab.sweep import Sweep, make_sweep
    from ftw_jax.lab.train import TrainConfig, Trainer, make_train

_HOMES = {  # public name: the module it lives in
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
    **dict.fromkeys(("TrainConfig", "Trainer", "make_train"), "ftw_jax.lab.train"),
    **dict.fromkeys(("Sweep", "make_sweep"), "ftw_jax.lab.sweep"),
    **dict.fromkeys(("Comparison", "compare"), "ftw_jax.lab.compare"),
    **dict.fromkeys(("EpisodeLearner", "LearnConfig"), "ftw_jax.agent.learner"),
    "learn_from_file": "ftw_jax.agent.lm_learn",
    **dict.fromkeys(("RetrievalTrainConfig", "train_retrieval_qa"), "ftw_jax.agent.retrieval_qa.learner"),
}


def __getattr__(name: str):
    """A public name on first use (the LM, Flax and safetensors too cost nothing to those who never touch them)."""
    if name == "lm":
        value = importlib.import_module("ftw_jax.lm")
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module 'ftw_jax' has no attribute {name!r}")
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    """The public names alone (a notebook's completion shows what to use, not how the package is built)."""
    return sorted([*__all__, "__version__"])


__all__ = [
    "Comparison",
    "EpisodeLearner",
    "LearnConfig",
    "PolicyState",
    "Pool",
    "RetrievalTrainConfig",
    "Sizes",
    "Sweep",
    "TrainConfig",
    "Trainer",
    "Trajectory",
    "UpdateConfig",
    "compare",
    "expected_failure_share",
    "expected_selection_counts",
    "learn_from_file",
    "lm",
    "make_sweep",
    "make_train",
    "make_update",
    "rank_occupancy",
    "rank_occupancy_jax",
    "select_elites",
    "select_elites_masked",
    "tied_occupancy",
    "train_retrieval_qa",
]

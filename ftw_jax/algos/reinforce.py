"""REINFORCE with a mean baseline: A_i = R_i − mean(R) over the batch, U steps per batch, + β·KL (exact).

Its surrogate −A·log π has no ratio to the behaviour policy, so steps after the first on one batch are
off-policy; U = 1 (the default) is REINFORCE as written, U > 1 gives it as many steps as the others take.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax

from ftw_jax.algos.base import Algorithm, Context, Learner, updates_per_iteration_setting
from ftw_jax.algos.policy_gradient import (
    ENTROPY_COEFS,
    entropy_coef_setting,
    make_policy_gradient_update,
    mean_baseline_advantages,
    repeated_steps_learner,
)
from ftw_jax.core.checks import check_non_negative, check_positive_int
from ftw_jax.core.pool import Trajectory
from ftw_jax.core.settings import check_settings
from ftw_jax.core.state import PolicyState


@dataclasses.dataclass(frozen=True)
class ReinforceConfig:
    updates_per_iteration: int = updates_per_iteration_setting()
    entropy_coef: float = entropy_coef_setting()

    def __post_init__(self):
        check_settings(self)
        check_positive_int("updates_per_iteration", self.updates_per_iteration)
        check_non_negative("entropy_coef", self.entropy_coef)


def make_step(
    config: ReinforceConfig, apply_fn: Callable[[Any, Any], jax.Array]
) -> Callable[[PolicyState, Trajectory, jax.Array], tuple[PolicyState, dict]]:
    """REINFORCE's step: −A·log π + β·KL(π ‖ π_ref), exact, − the entropy bonus."""
    return make_policy_gradient_update(apply_fn, entropy_coef=config.entropy_coef)


def advantages(config: ReinforceConfig, returns: jax.Array) -> jax.Array:
    return mean_baseline_advantages(returns)


def make_learner(config: ReinforceConfig, context: Context) -> Learner:
    return repeated_steps_learner(
        context,
        make_step(config, context.policy.apply),
        functools.partial(advantages, config),
        config.updates_per_iteration,
    )


def check(config: ReinforceConfig, episodes_per_iteration: int) -> None:
    if episodes_per_iteration < 2:  # R − mean(R) of one episode is 0: nothing would ever be learned
        raise ValueError(
            f"REINFORCE's mean baseline needs episodes_per_iteration (B) >= 2, got {episodes_per_iteration}."
        )


ALGORITHM = Algorithm(
    name="reinforce",
    config=ReinforceConfig,
    make_learner=make_learner,
    check=check,
    search_space={"updates_per_iteration": (1, 4), "entropy_coef": ENTROPY_COEFS},
)

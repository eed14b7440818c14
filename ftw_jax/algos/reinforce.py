"""REINFORCE with a mean baseline: A_i = R_i − mean(R) over the batch, or over the other episodes of its group
(RLOO, Ahmadian et al. 2024, with `group_size` G), U steps per batch, + β·KL (exact).

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
    group_advantages,
    make_policy_gradient_update,
    mean_baseline_advantages,
    repeated_steps_learner,
)
from ftw_jax.core.checks import check_non_negative, check_positive_int
from ftw_jax.core.losses import ChunkedLogits
from ftw_jax.core.pool import Trajectory
from ftw_jax.core.settings import check_settings, setting
from ftw_jax.core.state import PolicyState


@dataclasses.dataclass(frozen=True)
class ReinforceConfig:
    updates_per_iteration: int = updates_per_iteration_setting()
    entropy_coef: float = entropy_coef_setting()
    leave_one_out: int | None = setting(
        None,
        "REINFORCE: G, the baseline of each episode is the mean return of the G - 1 others of its group (RLOO: "
        "G episodes per start state, B a multiple of G); None: the batch's mean return",
    )

    def __post_init__(self):
        check_settings(self)
        check_positive_int("updates_per_iteration", self.updates_per_iteration)
        check_non_negative("entropy_coef", self.entropy_coef)
        if self.leave_one_out is not None and not (
            isinstance(self.leave_one_out, int) and not isinstance(self.leave_one_out, bool) and self.leave_one_out >= 2
        ):
            raise ValueError(f"leave_one_out must be None or an int >= 2 (G), got {self.leave_one_out!r}.")


def make_step(
    config: ReinforceConfig,
    apply_fn: Callable[[Any, Any], jax.Array],
    chunked: ChunkedLogits | None = None,
    markov: bool = False,
) -> Callable[[PolicyState, Trajectory, jax.Array], tuple[PolicyState, dict]]:
    """REINFORCE's step: −A·log π + β·KL(π ‖ π_ref), exact, − the entropy bonus."""
    return make_policy_gradient_update(apply_fn, entropy_coef=config.entropy_coef, chunked=chunked, markov=markov)


def leave_one_out_advantages(returns: jax.Array, group_size: int) -> jax.Array:
    """R_i − the mean of the other G − 1 returns of its group = G/(G − 1)·(R_i − the group's mean). Groups are
    consecutive. [B] -> [B]."""
    return group_size / (group_size - 1) * group_advantages(returns, group_size, normalise=False)


def advantages(config: ReinforceConfig, returns: jax.Array) -> jax.Array:
    if config.leave_one_out is None:
        return mean_baseline_advantages(returns)
    return leave_one_out_advantages(returns, config.leave_one_out)


def make_learner(config: ReinforceConfig, context: Context) -> Learner:
    return repeated_steps_learner(
        context,
        make_step(config, context.policy.apply, context.policy.chunked_logits(), context.policy.markov),
        functools.partial(advantages, config),
        config.updates_per_iteration,
        group_size=config.leave_one_out or 1,
    )


def check(config: ReinforceConfig, episodes_per_iteration: int) -> None:
    if episodes_per_iteration < 2:  # R − mean(R) of one episode is 0: nothing would ever be learned
        raise ValueError(
            f"REINFORCE's mean baseline needs episodes_per_iteration (B) >= 2, got {episodes_per_iteration}."
        )
    if config.leave_one_out is not None and episodes_per_iteration % config.leave_one_out:
        raise ValueError(
            f"episodes_per_iteration (B={episodes_per_iteration}) must be a multiple of leave_one_out "
            f"(G={config.leave_one_out}) for REINFORCE's leave-one-out baseline."
        )


ALGORITHM = Algorithm(
    name="reinforce",
    config=ReinforceConfig,
    make_learner=make_learner,
    check=check,
    search_space={
        "updates_per_iteration": (1, 4),
        "entropy_coef": ENTROPY_COEFS,
        "leave_one_out": (None, 2, 4, 8),  # the batch's mean as the baseline, or RLOO's over G episodes
    },
    # TRL's RLOOTrainer: G 2 (the others' mean as each episode's baseline), one step per batch, β 0.05
    # throughout, no entropy bonus.
    reference={
        "kl_coef": 0.05,
        "kl_decay_fraction": None,
        "updates_per_iteration": 1,
        "entropy_coef": 0.0,
        "leave_one_out": 2,
    },
)

"""GRPO: groups of G episodes sharing a start state, group-relative advantages, U clipped steps + β·KL.

A_i = (R_i − mean of its group) / (sd of its group + ε), or un-normalised R_i − mean of its group; the
surrogate is PPO's clipped ratio to the behaviour policy. The KL term is the k3 estimate at the sampled
actions as TRL's GRPOTrainer computes it (the default; its gradient follows KL(π_ref ‖ π), see
`policy_gradient.k3_kl`), or the exact KL(π ‖ π_ref) from the logits that every other method here uses.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal

import jax

from ftw_jax.algos.base import Algorithm, Context, Learner, updates_per_iteration_setting
from ftw_jax.algos.policy_gradient import (
    ENTROPY_COEFS,
    clip_epsilon_setting,
    entropy_coef_setting,
    group_advantages,
    make_policy_gradient_update,
    repeated_steps_learner,
)
from ftw_jax.core.checks import check_non_negative, check_positive_int
from ftw_jax.core.losses import ChunkedLogits
from ftw_jax.core.pool import Trajectory
from ftw_jax.core.settings import check_settings, setting
from ftw_jax.core.state import PolicyState


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    updates_per_iteration: int = updates_per_iteration_setting()
    group_size: int = setting(8, "GRPO: G episodes per start state (B a multiple of G)")
    normalise_advantages: bool = setting(True, "GRPO: divide advantages by the group's sd")
    clip_epsilon: float = clip_epsilon_setting()
    kl_estimate: Literal["k3", "exact"] = setting(
        "k3",
        "GRPO's KL term: k3 at the sampled actions as TRL (its gradient follows KL(ref || pi)), or the exact "
        "KL(pi || ref) the other methods use",
    )
    entropy_coef: float = entropy_coef_setting()

    def __post_init__(self):
        check_settings(self)
        check_positive_int("updates_per_iteration", self.updates_per_iteration)
        check_non_negative("entropy_coef", self.entropy_coef)
        if not (isinstance(self.group_size, int) and self.group_size >= 2):
            raise ValueError(f"group_size must be an int >= 2, got {self.group_size!r}.")
        if not 0 < self.clip_epsilon < 1:
            raise ValueError(f"clip_epsilon must be in (0, 1), got {self.clip_epsilon!r}.")


def make_step(
    config: GRPOConfig,
    apply_fn: Callable[[Any, Any], jax.Array],
    chunked: ChunkedLogits | None = None,
    markov: bool = False,
) -> Callable[[PolicyState, Trajectory, jax.Array], tuple[PolicyState, dict]]:
    """GRPO's step: the clipped ratio to the behaviour policy + β·KL (k3 or exact) − the entropy bonus."""
    return make_policy_gradient_update(
        apply_fn,
        clip_epsilon=config.clip_epsilon,
        kl_estimate=config.kl_estimate,
        entropy_coef=config.entropy_coef,
        chunked=chunked,
        markov=markov,
    )


def advantages(config: GRPOConfig, returns: jax.Array) -> jax.Array:
    """Group-relative advantages of B returns in group order."""
    return group_advantages(returns, config.group_size, normalise=config.normalise_advantages)


def make_learner(config: GRPOConfig, context: Context) -> Learner:
    return repeated_steps_learner(
        context,
        make_step(config, context.policy.apply, context.policy.chunked_logits(), context.policy.markov),
        functools.partial(advantages, config),
        config.updates_per_iteration,
        group_size=config.group_size,
    )


def check(config: GRPOConfig, episodes_per_iteration: int) -> None:
    if episodes_per_iteration % config.group_size:
        raise ValueError(
            f"episodes_per_iteration (B={episodes_per_iteration}) must be a multiple of "
            f"group_size (G={config.group_size}) for GRPO."
        )


ALGORITHM = Algorithm(
    name="grpo",
    config=GRPOConfig,
    make_learner=make_learner,
    check=check,
    search_space={
        "kl_coef": (0.0, 0.04, 0.1, 0.3, 0.5, 1.0),  # TRL's 0.04 beside the values every algorithm tries
        "group_size": (4, 8, 16),
        "updates_per_iteration": (1, 4),  # TRL's default: one step per batch
        "entropy_coef": ENTROPY_COEFS,
        "clip_epsilon": (0.1, 0.2, 0.3),
        "normalise_advantages": (True, False),  # Dr. GRPO drops the group's sd
    },
    # TRL's GRPOTrainer: G 8, one step per batch, ε 0.2, advantages over the group's sd, no entropy bonus, and
    # DeepSeekMath's β 0.04 throughout (TRL's default until 0.19; 0 since, which the drawn β values hold).
    reference={
        "kl_coef": 0.04,
        "kl_decay_fraction": None,
        "group_size": 8,
        "updates_per_iteration": 1,
        "entropy_coef": 0.0,
        "clip_epsilon": 0.2,
        "normalise_advantages": True,
    },
)

"""REINFORCE with a mean baseline: A_i = R_i − mean(R) over the batch, one step per batch, + β·KL (exact)."""

from __future__ import annotations

import dataclasses

from ftw_jax.algos.base import Algorithm, Context, Learner
from ftw_jax.algos.policy_gradient import (
    BatchLearnerState,
    make_policy_gradient_update,
    mean_baseline_advantages,
    repeated_steps,
)


@dataclasses.dataclass(frozen=True)
class ReinforceConfig:
    """REINFORCE has no settings of its own (the learning rate and β are the run's)."""


def make_step(config: ReinforceConfig, apply_fn):
    """REINFORCE's step: −A·log π + β·KL(π ‖ π_ref), exact."""
    return make_policy_gradient_update(apply_fn)


def advantages(config: ReinforceConfig, returns):
    return mean_baseline_advantages(returns)


def make_learner(config: ReinforceConfig, context: Context) -> Learner:
    update = make_step(config, context.policy.apply)

    def init(key, observation, hyperparameters):
        return BatchLearnerState(policy=context.init_policy(key, observation, hyperparameters))

    def learn(state, batch, key, hyperparameters):
        return repeated_steps(update, state, batch, advantages(config, batch.episode_return), steps=1)

    return Learner(init=init, learn=learn)


def check(config: ReinforceConfig, episodes_per_iteration: int) -> None:
    if episodes_per_iteration < 2:  # R − mean(R) of one episode is 0: nothing would ever be learned
        raise ValueError(f"REINFORCE's mean baseline needs episodes_per_iteration (B) >= 2, got {episodes_per_iteration}.")


ALGORITHM = Algorithm(name="reinforce", config=ReinforceConfig, make_learner=make_learner, check=check)

"""What every program that learns from batches of episodes sets (B, the KL penalty, the optimizer), and the
Optax optimizer made from it: the training program's `TrainConfig` and the LM learner's `LearnConfig` both
extend `LearnerSettings`.

    optimizer = make_optimizer(config)     # Adam or SGD, its learning rate injected, clipped if asked
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax.numpy as jnp
import optax

from ftw_jax import algos
from ftw_jax.algos.base import Hyperparameters
from ftw_jax.core.checks import check_positive_int
from ftw_jax.core.settings import setting


@dataclasses.dataclass(frozen=True)
class LearnerSettings:
    """What every program that learns from batches of episodes sets: B, the KL penalty and the optimizer
    (`TrainConfig`, and the LM learner's `ftw_jax.agent.learner.LearnConfig`)."""

    episodes_per_iteration: int = setting(16, "B, episodes per iteration (rolled out, or read from a file)")
    kl_coef: float = setting(0.0, "beta, the KL penalty's weight (at the start)", axis="kl")
    optimizer: Literal["adam", "sgd"] = setting("adam", "the Optax optimizer")
    learning_rate: float = setting(3e-3, "the optimizer's learning rate", axis="lr")
    max_grad_norm: float | None = setting(
        None,
        "clip every gradient to this global norm before the optimizer, for every algorithm (None: no clipping; "
        "PPO's references: 0.5)",
    )
    stop_after_skipped: int | None = setting(
        None,
        "stop the run (exit 3, resumable) when a member has applied none of its last N ready updates, non-finite or "
        "with nothing kept; checked after each evaluation period (lm learn: each iteration). None: a whole "
        "period's (iteration's) updates; 0: never",
    )

    def check_learner_settings(self) -> None:
        check_positive_int("episodes_per_iteration", self.episodes_per_iteration)
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}.")
        if not self.kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef!r}.")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm!r}.")
        if self.stop_after_skipped is not None and not (
            isinstance(self.stop_after_skipped, int)
            and not isinstance(self.stop_after_skipped, bool)
            and self.stop_after_skipped >= 0
        ):
            raise ValueError(f"stop_after_skipped must be an int >= 0 or None, got {self.stop_after_skipped!r}.")

    def member_hyperparameters(self, algorithm: str, algorithm_config: Any) -> Hyperparameters:
        """β, the learning rate and `algorithm`'s sweepable values of `algorithm_config` (FTW: N, J, C, K) as
        arrays: one member's."""
        return Hyperparameters(
            kl_coef=jnp.asarray(self.kl_coef, jnp.float32),
            learning_rate=jnp.asarray(self.learning_rate, jnp.float32),
            algorithm=algos.get(algorithm).hyperparameters(algorithm_config),
        )


def make_optimizer(config: LearnerSettings) -> optax.GradientTransformation:
    """The run's Optax optimizer, its learning rate a state array (`optax.inject_hyperparams`) so that members of
    a sweep can differ in it and a schedule can set it; after global-norm clipping when `max_grad_norm` is set.
    Its hyperparameters are float32 whatever the parameters' dtype (in bfloat16 Adam's b2 = 0.999 is 1.0, and
    its first step divides by zero), and its state keeps the dtypes `init` gave it."""
    optimizer = optax.inject_hyperparams(getattr(optax, config.optimizer), hyperparam_dtype=jnp.float32)(
        learning_rate=config.learning_rate
    )
    optimizer = _state_dtypes_kept(optimizer)
    if config.max_grad_norm is None:
        return optimizer
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optimizer)


def _state_dtypes_kept(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optimizer` with every state leaf cast back to the dtype it had: float32 hyperparameters would otherwise
    promote bfloat16 moments, and a training loop's carry must keep its types."""

    def update(updates, state, params=None):
        updates, new_state = optimizer.update(updates, state, params)
        return updates, optax.tree_utils.tree_cast_like(new_state, state)

    return optax.GradientTransformation(optimizer.init, update)

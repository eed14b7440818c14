"""Imitation: a policy fitted by cross-entropy to given trajectories, the supervised warm start before RL.

LLM-agent pipelines fine-tune the model on demonstrations of the tool format before reinforcement, and take the
result as the KL's reference. The lab's environments write their demonstrations on the device
(`ftw_jax.lab.warm_start`); an LLM task's come from a file (`ftw_jax.agent.retrieval_qa`). Either way they are
fitted here: `steps` Adam steps of cross-entropy on their model-written steps (the environment's own tokens
masked out, as in RL), each on `batch_size` of them drawn with replacement. One jittable function, so seeds vmap
over it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import optax

from ftw_jax.algos.base import Policy
from ftw_jax.core import losses

if TYPE_CHECKING:
    from ftw_jax.core.pool import Trajectory


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """The warm start's sizes (a run's come from its `TrainConfig`'s warm_start_* settings)."""

    demonstrations: int  # D
    steps: int
    learning_rate: float
    batch_size: int = 64


def imitation_loss(policy: Policy, params: Any, trajectories: Trajectory) -> jax.Array:
    """Mean cross-entropy over the model-written steps of trajectories [M, T, ...]."""
    log_likelihood = jax.vmap(
        lambda trajectory: losses.log_likelihood(
            policy.apply(params, trajectory.observation), trajectory.action, trajectory.mask
        )
    )(trajectories)
    return -jnp.sum(log_likelihood) / jnp.maximum(jnp.sum(trajectories.mask), 1)


def fit_trajectories(
    key: jax.Array, policy: Policy, params: Any, demos: Trajectory, config: WarmStart
) -> tuple[Any, jax.Array]:
    """(params fitted to demonstrations [D, T, ...] given (an LLM task's, written on the host), the imitation loss
    of each step [steps]): `steps` Adam steps, each on `batch_size` of them drawn with replacement."""
    optimizer = optax.adam(config.learning_rate)
    count = jax.tree.leaves(demos)[0].shape[0]

    def step(carry, key):
        params, opt_state = carry
        drawn = jax.random.randint(key, (config.batch_size,), 0, count)  # once: the same rows of every field
        batch = jax.tree.map(lambda leaf: leaf[drawn], demos)
        loss, grads = jax.value_and_grad(lambda p: imitation_loss(policy, p, batch))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    (params, _), step_losses = jax.lax.scan(step, (params, optimizer.init(params)), jax.random.split(key, config.steps))
    return params, step_losses

"""A supervised warm start: the fresh policy fitted to the environment's demonstrations before reinforcement.

LLM-agent pipelines fine-tune the model on demonstrations of the tool format before RL, and take the result as
the KL's reference; so does a run with `warm_start_demonstrations` > 0:

    params, losses = fit_demonstrations(key, env, env_params, policy, params, WarmStart(2048, steps=300,
                                                                                          learning_rate=1e-3))

D episodes are written by the environment's demonstrator (`rollout.demonstration`), then `steps` Adam steps
of cross-entropy on their model-written steps (the environment's own tokens are masked out, as in RL), each on
`batch_size` demonstrations drawn with replacement. It is one jittable function, so seeds vmap over it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import optax

from ftw_jax.algos.base import Policy
from ftw_jax.core import losses
from ftw_jax.envs.base import Environment
from ftw_jax.rollout import demonstration

if TYPE_CHECKING:
    from ftw_jax.core.pool import Trajectory


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """The warm start's sizes (a run's come from its `TrainConfig`'s warm_start_* settings)."""

    demonstrations: int  # D
    steps: int
    learning_rate: float
    batch_size: int = 64


def demonstrations(
    key: jax.Array, env: Environment, env_params: Any, num_episodes: int
) -> tuple[Trajectory, jax.Array]:
    """(trajectories [D, T, ...], success [D]) written by the environment's demonstrator."""
    if not env.has_expert:
        raise ValueError(f"{type(env).__name__} has no demonstrator, so it cannot give a supervised warm start.")
    return jax.vmap(demonstration, in_axes=(0, None, None))(jax.random.split(key, num_episodes), env, env_params)


def imitation_loss(policy: Policy, params: Any, trajectories: Trajectory) -> jax.Array:
    """Mean cross-entropy over the model-written steps of trajectories [M, T, ...]."""
    log_likelihood = jax.vmap(
        lambda trajectory: losses.log_likelihood(
            policy.apply(params, trajectory.observation), trajectory.action, trajectory.mask
        )
    )(trajectories)
    return -jnp.sum(log_likelihood) / jnp.maximum(jnp.sum(trajectories.mask), 1)


def fit_demonstrations(
    key: jax.Array, env: Environment, env_params: Any, policy: Policy, params: Any, config: WarmStart
) -> tuple[Any, jax.Array]:
    """(params fitted to D fresh demonstrations, the imitation loss of each step [steps])."""
    demo_key, fit_key = jax.random.split(key)
    demos, _ = demonstrations(demo_key, env, env_params, config.demonstrations)
    return fit_trajectories(fit_key, policy, params, demos, config)


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

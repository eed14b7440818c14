"""A supervised warm start from the environment's demonstrator, before reinforcement:

    params, losses = fit_demonstrations(key, env, env_params, policy, params, WarmStart(2048, steps=300,
                                                                                          learning_rate=1e-3))

D episodes are written by the environment's demonstrator (`rollout.demonstration`), then fitted by
`ftw_jax.algos.imitation.fit_trajectories`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax

from ftw_jax.algos.base import Policy
from ftw_jax.algos.imitation import WarmStart, fit_trajectories
from ftw_jax.envs.base import Environment
from ftw_jax.lab.rollout import demonstration

if TYPE_CHECKING:
    from ftw_jax.core.pool import Trajectory

__all__ = ["WarmStart", "demonstrations", "fit_demonstrations"]


def demonstrations(
    key: jax.Array, env: Environment, env_params: Any, num_episodes: int
) -> tuple[Trajectory, jax.Array]:
    """(trajectories [D, T, ...], success [D]) written by the environment's demonstrator."""
    if not env.has_expert:
        raise ValueError(f"{type(env).__name__} has no demonstrator, so it cannot give a supervised warm start.")
    return jax.vmap(demonstration, in_axes=(0, None, None))(jax.random.split(key, num_episodes), env, env_params)


def fit_demonstrations(
    key: jax.Array, env: Environment, env_params: Any, policy: Policy, params: Any, config: WarmStart
) -> tuple[Any, jax.Array]:
    """(params fitted to D fresh demonstrations, the imitation loss of each step [steps])."""
    demo_key, fit_key = jax.random.split(key)
    demos, _ = demonstrations(demo_key, env, env_params, config.demonstrations)
    return fit_trajectories(fit_key, policy, params, demos, config)

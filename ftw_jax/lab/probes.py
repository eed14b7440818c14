"""Probe-based task filtering: train on the tasks the current policy solves sometimes, not always or never.

A task is whatever an environment's reset draws from its key (a Sokoban level, a question and its
knowledge base), so a task is named by its reset key: episodes reset from the same key face the same task.
Each of M candidate tasks gets n probe episodes with the current policy; a task is kept when
0 < successes < n. For independent probes that each succeed with probability p, that happens with
probability 1 − pⁿ − (1 − p)ⁿ (`informative_probability`). Tasks always or never solved give FTW's
selection only ties (and a policy-gradient method zero advantage); filtering spends probe episodes to avoid them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from ftw_jax.lab.rollout import Player, rollout

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


def informative_probability(success_probability: ArrayLike, num_probes: int) -> jax.Array:
    """Pr(0 < S < n) for S ~ Binomial(n, p): 1 − pⁿ − (1 − p)ⁿ (elementwise in p)."""
    p = jnp.asarray(success_probability, jnp.float32)
    return 1.0 - p**num_probes - (1.0 - p) ** num_probes


def probe(key: jax.Array, player: Player, task_keys: jax.Array, num_probes: int) -> tuple[jax.Array, jax.Array]:
    """Plays `num_probes` episodes of each task with the player's (current) policy.

    Args:
      task_keys: [M] reset keys, one per task.

    Returns:
      (successes [M] int32, env steps [] int32 that the probes took).
    """
    num_tasks = task_keys.shape[0]
    reset_keys = jnp.repeat(task_keys, num_probes, axis=0)  # [M · n], task by task
    episodes, solved = jax.vmap(rollout, in_axes=(0, None, 0))(
        jax.random.split(key, num_tasks * num_probes), player, reset_keys
    )
    successes = jnp.sum(solved.reshape(num_tasks, num_probes), axis=1, dtype=jnp.int32)
    return successes, jnp.sum(episodes.alive, dtype=jnp.int32)


def keep_informative(successes: jax.Array, num_probes: int) -> jax.Array:
    """[M] bool: tasks solved by some but not all of their probes."""
    return (successes > 0) & (successes < num_probes)


def draw_tasks(key: jax.Array, task_keys: jax.Array, kept: jax.Array, num_episodes: int) -> jax.Array:
    """`num_episodes` reset keys drawn uniformly (with replacement) from the kept tasks; from all if none is kept."""
    weights = jnp.where(jnp.any(kept), kept, True).astype(jnp.float32)
    chosen = jax.random.choice(key, task_keys.shape[0], (num_episodes,), p=weights / jnp.sum(weights))
    return task_keys[chosen]

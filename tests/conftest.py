"""Shared test set-up: key-reuse checking on, and small shared helpers."""

import jax
import jax.numpy as jnp
import pytest

from ftw_jax import Trajectory

jax.config.update("jax_debug_key_reuse", True)


def make_trajectories(batch, num_steps, *, returns=None, observation_size=3, seed=0):
    """B random trajectories [B, T] with every step masked in; returns default to 0..B-1."""
    key_observation, key_action = jax.random.split(jax.random.key(seed))
    if returns is None:
        returns = jnp.arange(batch, dtype=jnp.float32)
    return Trajectory(
        observation=jax.random.normal(key_observation, (batch, num_steps, observation_size)),
        action=jax.random.randint(key_action, (batch, num_steps), 0, 2),
        mask=jnp.ones((batch, num_steps), bool),
        behaviour_logp=jnp.full((batch, num_steps), -0.5, jnp.float32),
        behaviour_version=jnp.zeros((batch, num_steps), jnp.int32),
        episode_return=jnp.asarray(returns, jnp.float32),
        reward=jnp.zeros((batch, num_steps), jnp.float32).at[:, -1].set(jnp.asarray(returns, jnp.float32)),
        alive=jnp.ones((batch, num_steps), bool),
    )


@pytest.fixture
def unchecked_key_reuse():
    """Turns the key-reuse checker off for one test.

    jax's experimental checker rejects any scan over split keys inside vmap, a false positive:
    `vmap(lambda k: scan(f, 0, split(k, 5)))` alone trips it. Tests of vmapped programs use this;
    `tests/test_bandit.py::test_one_seed_reuses_no_key` checks the same kind of program without vmap.
    """
    with jax.debug_key_reuse(False):
        yield

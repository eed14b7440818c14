"""Elite selection: J minibatches of C pool entries drawn without replacement, the top K of each kept.

Axis legend: N pool entries, J minibatches, C candidates per minibatch, K elites per minibatch.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax.occupancy import check_sizes


def select_elites(
    key: jax.Array,
    returns: jax.Array,
    valid: jax.Array,
    *,
    num_batches: int,
    batch_size: int,
    num_elites: int,
) -> jax.Array:
    """Pool indices of the K best returns in each of J uniformly drawn C-subsets of the valid entries.

    Each minibatch gives every valid entry an independent uniform key and takes the C largest (invalid
    entries get the lowest key, so they come last): a uniform C-subset without replacement. Candidates arrive in
    random order, so a stable sort by return breaks ties uniformly at random. NaN returns rank below
    every non-NaN return (−inf included); invalid entries rank below everything and are never returned:
    if fewer than K entries are valid, the unfilled slots hold −1. Minibatches are independent, so the
    same entry can be kept by several of them (repeats count in the loss). The key is consumed.

    Args:
      key: a JAX PRNG key.
      returns: [N] float returns of the pool entries.
      valid: [N] bool, which entries hold trajectories.
      num_batches: J (static).
      batch_size: C (static), 1 <= C <= N.
      num_elites: K (static), 1 <= K <= C.

    Returns:
      int32 [J, K] pool indices, best first within each minibatch.
    """
    pool_size = np.shape(returns)[0] if np.ndim(returns) == 1 else None
    if pool_size is None:
        raise ValueError(f"returns must have shape [N], got shape {np.shape(returns)}.")
    check_sizes(pool_size, batch_size, num_elites)
    if isinstance(num_batches, bool) or not isinstance(num_batches, (int, np.integer)) or num_batches < 1:
        raise ValueError(f"num_batches (J) must be an int >= 1, got {num_batches!r}.")
    if not jnp.issubdtype(jnp.result_type(returns), jnp.floating):
        raise ValueError(f"returns must be floating point, got dtype {jnp.result_type(returns)}.")
    if np.shape(valid) != (pool_size,) or jnp.result_type(valid) != jnp.bool_:
        raise ValueError(f"valid must be bool of shape ({pool_size},), got {jnp.result_type(valid)} {np.shape(valid)}.")

    def one_minibatch(minibatch_key: jax.Array) -> jax.Array:
        # 31 random bits (ties between valid entries are then rare enough not to bias the subset);
        # invalid entries get 0 and are drawn only when fewer than C entries are valid.
        draw = jax.random.bits(minibatch_key, (pool_size,), jnp.uint32) >> 1
        draw = jnp.where(valid, draw.astype(jnp.int32) + 1, 0)
        _, candidates = jax.lax.top_k(draw, batch_size)  # [C], in random order
        candidate_returns = returns[candidates]
        is_nan = jnp.isnan(candidate_returns)
        # Lexicographic, stable: valid first, then non-NaN, then higher return; equal keys keep draw order.
        _, _, _, ranked = jax.lax.sort(
            (~valid[candidates], is_nan, -jnp.where(is_nan, 0.0, candidate_returns), candidates),
            num_keys=3,
            is_stable=True,
        )
        elites = ranked[:num_elites]
        return jnp.where(valid[elites], elites, -1).astype(jnp.int32)

    elites = jax.vmap(one_minibatch)(jax.random.split(key, num_batches))
    chex.assert_shape(elites, (num_batches, num_elites))
    return elites

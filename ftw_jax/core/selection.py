"""Elite selection: J minibatches of C pool entries drawn without replacement, the top K of each kept.

Axis legend: N pool entries, J minibatches, C candidates per minibatch, K elites per minibatch.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax.core.checks import check_positive_int, check_sizes

# "top_k": the K best of each minibatch; "beat_minimum": those of them above the minibatch's lowest return.
ELITE_RULES = ("top_k", "beat_minimum")


def select_elites(
    key: jax.Array,
    returns: jax.Array,
    valid: jax.Array,
    *,
    num_batches: int,
    batch_size: int,
    num_elites: int,
    rule: str = "top_k",
) -> jax.Array:
    """Pool indices of the K best returns in each of J uniformly drawn C-subsets of the valid entries.

    Each minibatch is a uniform C-subset of the valid entries, without replacement: by Floyd's algorithm
    when C² <= N (cost independent of N), otherwise as the C largest of N random keys. Ties in return are
    broken by an independent random key, so uniformly at random. NaN returns rank below
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
      rule: "top_k" (default): keep the K best. "beat_minimum" (tie-aware): keep those of the K best whose
        return is strictly above the minibatch's lowest, so a minibatch of equal returns keeps nothing and,
        with binary rewards, failures are never kept; the freed slots hold −1.

    Returns:
      int32 [J, K] pool indices, best first within each minibatch.
    """
    return select_elites_masked(
        key,
        returns,
        valid,
        (num_batches, batch_size, num_elites),
        max_batches=num_batches,
        max_batch_size=batch_size,
        max_elites=num_elites,
        rule=rule,
    )


def select_elites_masked(
    key: jax.Array,
    returns: jax.Array,
    valid: jax.Array,
    sizes: tuple[int | jax.Array, int | jax.Array, int | jax.Array],
    *,
    max_batches: int,
    max_batch_size: int,
    max_elites: int,
    rule: str = "top_k",
) -> jax.Array:
    """`select_elites` with (J, C, K) traced inside static maxima, so one program serves a grid of sizes.

    The shapes follow the maxima; minibatch j draws a uniform C-subset (the first C of its C_max candidates,
    or Floyd's algorithm run for C of its C_max steps) and keeps its K best. Slots with j >= J or k >= K hold
    −1, as do slots no valid entry can fill, so the distribution of what is kept is exactly that of
    `select_elites` with static (J, C, K); at the maxima it draws the very same indices. Sizes outside
    1 <= K <= C <= C_max, 1 <= J <= J_max are not checked inside jit: keep them in range.

    Args:
      key: a JAX PRNG key (consumed).
      returns: [N] float returns of the pool entries.
      valid: [N] bool, which entries hold trajectories.
      sizes: (J, C, K) as ints or int arrays (traced under jit).
      max_batches, max_batch_size, max_elites: J_max, C_max, K_max (static), K_max <= C_max <= N.
      rule: "top_k" or "beat_minimum" (static), as in `select_elites`.

    Returns:
      int32 [J_max, K_max] pool indices, best first within each minibatch, −1 where nothing is kept.
    """
    pool_size = np.shape(returns)[0] if np.ndim(returns) == 1 else None
    if pool_size is None:
        raise ValueError(f"returns must have shape [N], got shape {np.shape(returns)}.")
    check_sizes(pool_size, max_batch_size, max_elites)
    check_positive_int("num_batches (J)", max_batches)
    if rule not in ELITE_RULES:
        raise ValueError(f"rule must be one of {ELITE_RULES}, got {rule!r}.")
    if not jnp.issubdtype(jnp.result_type(returns), jnp.floating):
        raise ValueError(f"returns must be floating point, got dtype {jnp.result_type(returns)}.")
    if np.shape(valid) != (pool_size,) or jnp.result_type(valid) != jnp.bool_:
        raise ValueError(f"valid must be bool of shape ({pool_size},), got {jnp.result_type(valid)} {np.shape(valid)}.")
    num_batches, batch_size, num_elites = (jnp.asarray(size, jnp.int32) for size in sizes)

    if uses_floyd(pool_size, max_batch_size):
        # O(C²) per minibatch, independent of N: the positions of the valid entries are found once.
        (valid_index,) = jnp.nonzero(valid, size=pool_size, fill_value=0)
        num_valid = jnp.sum(valid, dtype=jnp.int32)
        draw_subset = functools.partial(
            _subset_by_floyd,
            valid_index=valid_index,
            num_valid=num_valid,
            batch_size=batch_size,
            max_batch_size=max_batch_size,
        )
    else:
        draw_subset = functools.partial(
            _subset_by_random_keys, valid=valid, batch_size=batch_size, max_batch_size=max_batch_size
        )

    def one_minibatch(minibatch_key: jax.Array) -> jax.Array:
        subset_key, tie_key = jax.random.split(minibatch_key)
        candidates, candidate_valid = draw_subset(subset_key)  # [C_max], [C_max]
        candidate_returns = returns[candidates]
        is_nan = jnp.isnan(candidate_returns)
        tie_break = jax.random.bits(tie_key, (max_batch_size,), jnp.uint32)
        # Lexicographic: valid first, then non-NaN, then higher return, then a random tie-break.
        invalid, _, _, _, ranked = jax.lax.sort(
            (~candidate_valid, is_nan, -jnp.where(is_nan, 0.0, candidate_returns), tie_break, candidates),
            num_keys=4,
        )
        unkept = invalid[:max_elites] | (jnp.arange(max_elites) >= num_elites)
        if rule == "beat_minimum":  # NaN counts as the lowest return and never beats anything
            lowest = jnp.min(jnp.where(candidate_valid, jnp.where(is_nan, -jnp.inf, candidate_returns), jnp.inf))
            unkept = unkept | ~(returns[ranked[:max_elites]] > lowest)
        return jnp.where(unkept, -1, ranked[:max_elites]).astype(jnp.int32)

    elites = jax.vmap(one_minibatch)(jax.random.split(key, max_batches))
    elites = jnp.where(jnp.arange(max_batches)[:, None] < num_batches, elites, -1)
    chex.assert_shape(elites, (max_batches, max_elites))
    return elites


def uses_floyd(pool_size: int, batch_size: int) -> bool:
    """Whether subsets come from Floyd's algorithm (O(C²)) rather than N random keys (O(N))."""
    return batch_size * batch_size <= pool_size


# Bit pattern of the smallest positive normal float32 (2^-126).
_SMALLEST_NORMAL_BITS = 0x00800000


def _subset_by_random_keys(
    key: jax.Array, valid: jax.Array, batch_size: jax.Array, max_batch_size: int
) -> tuple[jax.Array, jax.Array]:
    """The C largest of N iid random keys, invalid entries keyed lowest: (indices [C_max], valid [C_max]). O(N).

    The keys are 30 random bits read as positive normal float32s (invalid entries get +0.0): positive floats
    order like their bit patterns, and `top_k` on float32 is far faster than on integers on CPU. `top_k`
    returns the C_max largest in order, so the first C of them are the C largest; the rest are flagged.
    """
    bits = (jax.random.bits(key, valid.shape, jnp.uint32) >> 2).astype(jnp.int32)
    draw = jax.lax.bitcast_convert_type(jnp.where(valid, bits + _SMALLEST_NORMAL_BITS, 0), jnp.float32)
    _, candidates = jax.lax.top_k(draw, max_batch_size)
    return candidates, valid[candidates] & (jnp.arange(max_batch_size) < batch_size)


def _subset_by_floyd(
    key: jax.Array, valid_index: jax.Array, num_valid: jax.Array, batch_size: jax.Array, max_batch_size: int
) -> tuple[jax.Array, jax.Array]:
    """C distinct positions among the valid entries by Floyd's algorithm: (indices [C_max], valid [C_max]).

    For i = 0..C−1, with top = n − C + i: draw t uniformly in [0, top]; keep t unless already kept, then
    keep top. Every C-subset of [0, n) is equally likely. O(C_max²). With fewer than C valid entries
    (n = C), the positions beyond them are flagged invalid, as are the C_max − C unused steps.
    """
    n = jnp.maximum(num_valid, batch_size)
    steps = jnp.arange(max_batch_size, dtype=jnp.int32)
    used = steps < batch_size
    tops = jnp.where(used, n - batch_size + steps, 0)  # [C_max]
    draws = jax.random.randint(key, (max_batch_size,), 0, tops + 1)  # [C_max], draws[i] uniform in [0, tops[i]]

    def keep(i, kept):
        position = jnp.where(jnp.any(kept == draws[i]), tops[i], draws[i])
        return kept.at[i].set(jnp.where(used[i], position, -1))

    kept = jax.lax.fori_loop(0, max_batch_size, keep, jnp.full((max_batch_size,), -1, jnp.int32))
    is_valid = used & (kept < num_valid)
    return valid_index[jnp.where(is_valid, kept, 0)], is_valid

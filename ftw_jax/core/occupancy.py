"""The maths of selection: which pool ranks FTW keeps, exactly (Eq. 5 of the paper).

An update draws a C-subset of the N pool entries uniformly without replacement and keeps its K best.
The probability that one kept slot holds the entry of rank r (r = 1 is the best return) is

    P(r | N, C, K) = 1 / (K · binom(N, C)) · Σ_{k=1..K} binom(r − 1, k − 1) · binom(N − r, C − k),

the k-th term counting the subsets in which r is the k-th best. K = C is uniform sampling (P = 1/N);
C = N is full-pool CEM (P = 1/K on the top K). Ranks r > N − C + K are never kept.

Everything is computed in log space. The log-binomials come from a Stirling form written so that no
two large numbers are subtracted (`log n!` alone is ~1e6 at n = 1e5, and its rounding would cost 1e-10
of relative accuracy); the result is exact to ~1e-12 relative for N up to 100,000.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from ftw_jax.core.checks import check_positive_int, check_sizes

if TYPE_CHECKING:
    import jax
    from numpy.typing import ArrayLike

# Stirling series of log n! − (n log n − n + ½ log 2πn): B_2m / (2m (2m − 1) n^(2m − 1)), m = 1..7.
# At n >= 10 the first omitted term is below 1e-18.
_STIRLING_COEFFICIENTS = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156)
_SERIES_FROM = 10
# The same correction for n = 0..9 from exact factorials (index 0 is never used).
_SMALL_CORRECTIONS = (0.0,) + tuple(
    math.log(math.factorial(n)) - (n * math.log(n) - n + 0.5 * math.log(2 * math.pi * n))
    for n in range(1, _SERIES_FROM)
)
_LOG_2PI = math.log(2 * math.pi)
# Above this many (rank, k) pairs the numpy path sums over k in chunks to bound memory.
_MAX_BLOCK = 1 << 22


def _stirling_correction(n, xp):
    """log n! − (n log n − n + ½ log 2πn) for integer-valued n >= 1 (a small positive number)."""
    table = xp.asarray(_SMALL_CORRECTIONS, dtype=n.dtype)
    small = table[xp.clip(n, 0, _SERIES_FROM - 1).astype(np.int32)]
    inverse = 1.0 / xp.maximum(n, _SERIES_FROM)
    inverse_squared = inverse * inverse
    series = xp.zeros_like(n)
    for coefficient in reversed(_STIRLING_COEFFICIENTS):
        series = series * inverse_squared + coefficient
    return xp.where(n < _SERIES_FROM, small, series * inverse)


def _log_binomial(n, k, xp):
    """log binom(n, k) elementwise for integer-valued float arrays; −inf where k < 0 or k > n.

    With j = min(k, n − k) and m = n − j, log n! − log j! − log m! is
    j log(n / j) − m log1p(−j / n) + ½ log(n / (2π j m)) + corrections, every term well conditioned.
    """
    n, k = xp.broadcast_arrays(n, k)
    inside = (k >= 0) & (k <= n)
    j = xp.where(inside, xp.minimum(k, n - k), 0.0)
    interior = j >= 1
    # Dummy values where the Stirling form does not apply keep the unused branch finite.
    n_ = xp.where(interior, n, 2.0)
    j_ = xp.where(interior, j, 1.0)
    m_ = n_ - j_
    value = (
        j_ * xp.log(n_ / j_)
        - m_ * xp.log1p(-j_ / n_)
        + 0.5 * (xp.log(n_ / (j_ * m_)) - _LOG_2PI)
        + _stirling_correction(n_, xp)
        - _stirling_correction(j_, xp)
        - _stirling_correction(m_, xp)
    )
    return xp.where(inside, xp.where(interior, value, 0.0), -xp.inf)


def _log_subset_counts(pool_size, batch_size, ranks, ks, xp):
    """log[binom(r − 1, k − 1) · binom(N − r, C − k)]: subsets in which rank r is the k-th best."""
    return _log_binomial(ranks - 1, ks - 1, xp) + _log_binomial(pool_size - ranks, batch_size - ks, xp)


def rank_occupancy(pool_size: int, batch_size: int, num_elites: int) -> np.ndarray:
    """Exact probability that a kept slot holds rank r, for r = 1..N (Eq. 5).

    Args:
      pool_size: N, the number of (valid) pool entries.
      batch_size: C, the size of each uniformly drawn subset.
      num_elites: K, how many of each subset are kept.

    Returns:
      float64 array [N]; index 0 is rank 1 (the best return). Sums to 1. Exactly 1/N everywhere when
      K = C, exactly 1/K on the top K when C = N, exactly 0 beyond rank N − C + K.
    """
    check_sizes(pool_size, batch_size, num_elites)
    n, c, k_max = pool_size, batch_size, num_elites
    if k_max == c:  # Vandermonde: the sum is binom(N − 1, C − 1), so P = 1/N.
        return np.full(n, 1.0 / n)
    if c == n:  # the subset is the whole pool: the top K, each once.
        return np.where(np.arange(n) < k_max, 1.0 / k_max, 0.0)
    ranks = np.arange(1, n + 1, dtype=np.float64)[:, None]
    log_sum = np.full(n, -np.inf)
    chunk = max(1, _MAX_BLOCK // n)
    for start in range(1, k_max + 1, chunk):
        ks = np.arange(start, min(start + chunk, k_max + 1), dtype=np.float64)[None, :]
        terms = _log_subset_counts(float(n), float(c), ranks, ks, np)
        log_sum = np.logaddexp(log_sum, _logsumexp_rows(terms))
    log_total = _log_binomial(np.float64(n), np.float64(c), np) + math.log(k_max)
    return np.exp(log_sum - log_total)


def _logsumexp_rows(terms: np.ndarray) -> np.ndarray:
    peak = terms.max(axis=1)
    safe_peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore"):
        return safe_peak + np.log(np.exp(terms - safe_peak[:, None]).sum(axis=1))


def rank_occupancy_jax(
    pool_size: int, batch_size: int | jax.Array, num_elites: int | jax.Array, *, max_num_elites: int | None = None
) -> jax.Array:
    """Eq. 5 in JAX, jittable, with C and K possibly traced (e.g. swept inside one program).

    Accuracy follows the default float dtype (enable x64 for the numpy version's precision).

    Args:
      pool_size: N, a static Python int (it is the output's shape).
      batch_size: C, int or traced integer scalar, 1 <= C <= N.
      num_elites: K, int or traced integer scalar, 1 <= K <= C.
      max_num_elites: static upper bound on K; defaults to `num_elites`, which must then be an int.

    Returns:
      [N] float array of P(r), index 0 is rank 1.
    """
    if max_num_elites is None:
        if not isinstance(num_elites, int):
            raise ValueError("rank_occupancy_jax needs max_num_elites when num_elites is traced.")
        max_num_elites = num_elites
    dtype = jnp.result_type(float)
    ranks = jnp.arange(1, pool_size + 1, dtype=dtype)[:, None]
    ks = jnp.arange(1, max_num_elites + 1, dtype=dtype)[None, :]
    c = jnp.asarray(batch_size, dtype)
    k_max = jnp.asarray(num_elites, dtype)
    terms = _log_subset_counts(jnp.asarray(pool_size, dtype), c, ranks, ks, jnp)
    terms = jnp.where(ks <= k_max, terms, -jnp.inf)
    log_total = _log_binomial(jnp.asarray(pool_size, dtype), c, jnp) + jnp.log(k_max)
    return jnp.exp(logsumexp(terms, axis=1) - log_total)


def expected_selection_counts(pool_size: int, batch_size: int, num_elites: int, num_batches: int) -> np.ndarray:
    """Expected number of times rank r is kept by one update of J minibatches: J · K · P(r). [N]."""
    check_positive_int("num_batches (J)", num_batches)
    return num_batches * num_elites * rank_occupancy(pool_size, batch_size, num_elites)


def tied_occupancy(returns: ArrayLike, batch_size: int, num_elites: int, valid: ArrayLike | None = None) -> np.ndarray:
    """Probability that a kept slot holds each pool entry when returns may tie.

    Selection breaks ties uniformly at random, so every entry of a block of equal returns gets the mean of
    its block's rank occupancies. NaN returns rank below every other return (and tie with each other);
    invalid entries get 0 and do not count towards N.

    Args:
      returns: [N] returns, in pool order.
      batch_size: C.
      num_elites: K.
      valid: optional [N] bool; defaults to all valid.

    Returns:
      float64 [N] in the order of `returns`.
    """
    returns = np.asarray(returns, dtype=np.float64)
    if returns.ndim != 1:
        raise ValueError(f"returns must have shape [N], got shape {returns.shape}.")
    valid = np.ones(returns.shape, bool) if valid is None else np.asarray(valid)
    if valid.shape != returns.shape or valid.dtype != np.bool_:
        raise ValueError(f"valid must be a bool array of shape {returns.shape}, got {valid.dtype} {valid.shape}.")
    entries = np.flatnonzero(valid)
    values = returns[entries]
    is_nan = np.isnan(values)
    order = np.lexsort((-np.where(is_nan, 0.0, values), is_nan))  # best first, NaN last
    sorted_values = values[order]
    occupancy = rank_occupancy(len(entries), batch_size, num_elites)
    # A new block starts where the value changes (NaNs form one block).
    same = (sorted_values[1:] == sorted_values[:-1]) | (np.isnan(sorted_values[1:]) & np.isnan(sorted_values[:-1]))
    starts = np.flatnonzero(np.concatenate([[True], ~same]))
    block_sizes = np.diff(np.append(starts, len(order)))
    block_means = np.add.reduceat(occupancy, starts) / block_sizes
    result = np.zeros(returns.shape)
    result[entries[order]] = np.repeat(block_means, block_sizes)
    return result


def expected_failure_share(pool_size: int, num_successes: ArrayLike, batch_size: int, num_elites: int) -> np.ndarray:
    """Expected share of failures among the K kept of a C-subset when returns are binary: E[max(0, K − S)] / K.

    S, the successes in the minibatch, is Hypergeometric(N, m successes in the pool, C). With top-K
    selection a minibatch with S < K successes keeps K − S failures (tied at the bottom, chosen at random):
    the mechanism by which FTW imitates failures when successes are rare.

    Args:
      pool_size: N.
      num_successes: m, an int or an array of ints in [0, N].
      batch_size: C.
      num_elites: K.

    Returns:
      float64 array shaped like `num_successes`.
    """
    check_sizes(pool_size, batch_size, num_elites)
    successes = np.asarray(num_successes)
    if not np.issubdtype(successes.dtype, np.integer) or np.any((successes < 0) | (successes > pool_size)):
        raise ValueError(f"num_successes must be integers in [0, N={pool_size}], got {num_successes!r}.")
    m = successes.astype(np.float64)[..., None]
    s = np.arange(min(batch_size, num_elites) + 1, dtype=np.float64)  # only S < K leaves failures
    log_probability = (
        _log_binomial(m, s, np)
        + _log_binomial(pool_size - m, batch_size - s, np)
        - _log_binomial(np.float64(pool_size), np.float64(batch_size), np)
    )
    shortfall = np.maximum(num_elites - s, 0.0) / num_elites
    return np.sum(np.exp(log_probability) * shortfall, axis=-1)

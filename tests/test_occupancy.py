"""Eq. 5 against exact rational arithmetic, its limits, and the tied and expected-count variants."""

import math
from fractions import Fraction

import jax.numpy as jnp
import numpy as np
import pytest

import ftw_jax
from ftw_jax.core.occupancy import _log_binomial


def exact_occupancy(pool_size, batch_size, num_elites, rank):
    subsets = sum(
        math.comb(rank - 1, k - 1) * math.comb(pool_size - rank, batch_size - k) for k in range(1, num_elites + 1)
    )
    return Fraction(subsets, num_elites * math.comb(pool_size, batch_size))


@pytest.mark.parametrize("sizes", [(7, 3, 2), (12, 5, 1), (20, 6, 4), (40, 39, 2), (60, 10, 3)])
def test_matches_exact_fractions_small(sizes):
    n, c, k = sizes
    occupancy = ftw_jax.rank_occupancy(n, c, k)
    assert occupancy.dtype == np.float64 and occupancy.shape == (n,)
    expected = np.array([float(exact_occupancy(n, c, k, r)) for r in range(1, n + 1)])
    np.testing.assert_allclose(occupancy, expected, rtol=1e-13, atol=0)


def test_hand_computed_case():
    # N=4, C=2, K=1: rank r is kept iff paired with a worse entry: (4 - r) / (1 * binom(4, 2)).
    np.testing.assert_allclose(ftw_jax.rank_occupancy(4, 2, 1), [3 / 6, 2 / 6, 1 / 6, 0.0], rtol=1e-15)


@pytest.mark.parametrize(
    ("sizes", "rtol"), [((100_000, 5, 2), 1e-13), ((100_000, 64, 8), 1e-12), ((100_000, 1000, 10), 5e-12)]
)
def test_exact_to_1e12_relative_at_large_n(sizes, rtol):
    n, c, k = sizes
    occupancy = ftw_jax.rank_occupancy(n, c, k)
    ranks = [1, 2, k, k + 1, 17, 1000, n // 3, n // 2, n - c, n - c + k]
    for rank in ranks:
        exact = exact_occupancy(n, c, k, rank)
        if exact > Fraction(1, 10**290):  # below that the float64 answer underflows to 0
            assert abs(occupancy[rank - 1] - float(exact)) <= rtol * float(exact), rank
    assert abs(occupancy.sum() - 1.0) < 1e-11


def test_textbook_lgamma_formula_fails_that_tolerance():
    """The tolerance above is discriminating: log-binomials from lgamma differences are ~1e-10 off."""

    def naive_log_binomial(n, k):
        return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)

    n, c, k = 100_000, 5, 2
    occupancy = ftw_jax.rank_occupancy(n, c, k)
    errors = []
    for rank in range(n // 3, n // 3 + 50):
        terms = [naive_log_binomial(rank - 1, j - 1) + naive_log_binomial(n - rank, c - j) for j in range(1, k + 1)]
        naive = math.exp(max(terms)) * sum(math.exp(t - max(terms)) for t in terms)
        naive /= math.exp(naive_log_binomial(n, c)) * k
        exact = float(exact_occupancy(n, c, k, rank))
        errors.append(abs(naive - exact) / exact)
        assert abs(occupancy[rank - 1] - exact) <= 1e-13 * exact
    assert max(errors) > 1e-11


@pytest.mark.parametrize("sizes", [(10, 4, 4), (1000, 37, 37), (50, 1, 1)])
def test_uniform_when_k_equals_c(sizes):
    n, c, k = sizes
    assert np.all(ftw_jax.rank_occupancy(n, c, k) == 1.0 / n)


@pytest.mark.parametrize("sizes", [(10, 10, 3), (500, 500, 7), (5, 5, 5)])
def test_full_pool_cem_when_c_equals_n(sizes):
    n, c, k = sizes
    occupancy = ftw_jax.rank_occupancy(n, c, k)
    assert np.all(occupancy[:k] == 1.0 / k) and np.all(occupancy[k:] == 0.0)


@pytest.mark.parametrize("sizes", [(30, 8, 3), (2000, 50, 5), (100_000, 300, 20)])
def test_zero_beyond_last_reachable_rank_and_sums_to_one(sizes):
    n, c, k = sizes
    occupancy = ftw_jax.rank_occupancy(n, c, k)
    assert np.all(occupancy[n - c + k :] == 0.0)
    assert occupancy[n - c + k - 1] > 0.0 or n > 1000  # the last reachable rank may underflow at large N
    assert np.all(np.diff(occupancy) <= 1e-15)  # better ranks are never less likely
    assert abs(occupancy.sum() - 1.0) < 1e-11


def test_log_binomial_matches_exact_integers():
    n = np.array([0, 1, 5, 10, 11, 30, 200, 1234, 99_999], dtype=np.float64)
    for k_fraction in (0.0, 0.1, 0.5, 0.9, 1.0):
        k = np.floor(n * k_fraction)
        expected = np.array([math.log(math.comb(int(a), int(b))) for a, b in zip(n, k)])
        np.testing.assert_allclose(_log_binomial(n, k, np), expected, rtol=1e-14, atol=1e-14)
    assert _log_binomial(np.float64(3), np.float64(4), np) == -np.inf


def test_expected_selection_counts():
    counts = ftw_jax.expected_selection_counts(20, 6, 2, num_batches=4)
    np.testing.assert_allclose(counts, 4 * 2 * ftw_jax.rank_occupancy(20, 6, 2))
    assert abs(counts.sum() - 8) < 1e-12


def test_tied_occupancy_averages_blocks_and_puts_nan_last():
    occupancy = ftw_jax.rank_occupancy(6, 3, 1)
    returns = [2.0, 5.0, 2.0, np.nan, 1.0, 2.0]  # ranks: 5.0 -> 1; 2.0 x3 -> 2..4; 1.0 -> 5; NaN -> 6
    tied = ftw_jax.tied_occupancy(returns, 3, 1)
    block = occupancy[1:4].mean()
    np.testing.assert_allclose(tied, [block, occupancy[0], block, occupancy[5], occupancy[4], block], rtol=1e-15)
    assert abs(tied.sum() - 1) < 1e-14


def test_tied_occupancy_ignores_invalid_entries():
    tied = ftw_jax.tied_occupancy([3.0, 9.0, 1.0, 2.0], 2, 1, valid=np.array([True, False, True, True]))
    np.testing.assert_allclose(
        tied, np.r_[ftw_jax.rank_occupancy(3, 2, 1)[[0]], 0.0, ftw_jax.rank_occupancy(3, 2, 1)[[2, 1]]]
    )


def test_all_tied_is_uniform():
    np.testing.assert_allclose(ftw_jax.tied_occupancy(np.zeros(9), 4, 2), np.full(9, 1 / 9), rtol=1e-14)


def test_jax_version_matches_numpy_with_traced_sizes():
    import jax

    occupancy = jax.jit(lambda c, k: ftw_jax.rank_occupancy_jax(40, c, k, max_num_elites=6))(jnp.int32(9), jnp.int32(3))
    np.testing.assert_allclose(np.asarray(occupancy), ftw_jax.rank_occupancy(40, 9, 3), rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((10, 3, 4), "num_elites"),
        ((10, 11, 2), "batch_size"),
        ((10, 3, 0), "num_elites"),
        ((0, 1, 1), "batch_size"),
        ((10.0, 3, 1), "pool_size"),
        ((10, 3, True), "num_elites"),
    ],
)
def test_bad_sizes_raise_value_error(args, message):
    with pytest.raises(ValueError, match=message):
        ftw_jax.rank_occupancy(*args)


def test_expected_failure_share_is_the_hypergeometric_expectation():
    from math import comb

    def exact(n, m, c, k):
        return sum(comb(m, s) * comb(n - m, c - s) * max(0, k - s) for s in range(c + 1)) / (comb(n, c) * k)

    for n, m, c, k in [
        (10, 3, 5, 3),
        (64, 0, 5, 3),
        (64, 64, 5, 3),
        (512, 100, 5, 3),
        (512, 100, 4, 1),
        (20, 19, 20, 20),
    ]:
        np.testing.assert_allclose(
            ftw_jax.expected_failure_share(n, m, c, k), exact(n, m, c, k), rtol=1e-12, atol=1e-15
        )
    shares = ftw_jax.expected_failure_share(64, np.arange(65), 5, 3)
    assert shares.shape == (65,) and shares[0] == 1.0 and shares[-1] == 0.0 and np.all(np.diff(shares) <= 0)
    with pytest.raises(ValueError, match="num_successes must be integers in \\[0, N=64\\]"):
        ftw_jax.expected_failure_share(64, 65, 5, 3)

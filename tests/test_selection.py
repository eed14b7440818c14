"""Elite selection: frequencies match Eq. 5, ties are random, NaN and invalid entries are handled."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ftw_jax
from ftw_jax.core.selection import uses_floyd


def select(key, returns, valid, *, jit=True, **sizes):
    fn = functools.partial(ftw_jax.select_elites, **sizes)
    return np.asarray((jax.jit(fn) if jit else fn)(key, jnp.asarray(returns, jnp.float32), jnp.asarray(valid)))


def max_z_score(elites, expected_per_slot, num_batches, num_elites):
    """Largest |z| over entries of the kept counts; each minibatch keeps entry i with prob K·P(i)."""
    counts = np.bincount(elites.ravel(), minlength=len(expected_per_slot))
    keep_probability = num_elites * np.asarray(expected_per_slot)
    mean = num_batches * keep_probability
    sd = np.sqrt(num_batches * keep_probability * (1 - keep_probability))
    z = np.where(sd > 0, (counts - mean) / np.where(sd > 0, sd, 1), np.where(counts == mean, 0.0, np.inf))
    return np.max(np.abs(z))


# Both ways of drawing a subset: N random keys (C² > N) and Floyd's algorithm (C² <= N).
KEYS_AND_FLOYD = pytest.mark.parametrize("floyd", [False, True], ids=["random_keys", "floyd"])


@KEYS_AND_FLOYD
@pytest.mark.parametrize("jit", [True, False])
def test_frequencies_match_rank_occupancy(jit, floyd):
    n, c, k, j = (40 if floyd else 12), 5, 2, 40_000
    assert uses_floyd(n, c) == floyd
    returns = np.random.default_rng(0).permutation(n).astype(np.float32)  # distinct, shuffled
    elites = select(jax.random.key(1), returns, np.ones(n, bool), jit=jit, num_batches=j, batch_size=c, num_elites=k)
    assert elites.shape == (j, k) and elites.dtype == np.int32
    rank_of_entry = np.argsort(np.argsort(-returns))  # 0 = best
    expected = ftw_jax.rank_occupancy(n, c, k)[rank_of_entry]
    assert max_z_score(elites, expected, j, k) < 5
    # The same counts are far outside that tolerance for the neighbouring sizes, so it cannot pass by accident.
    for wrong in (ftw_jax.rank_occupancy(n, c + 1, k), ftw_jax.rank_occupancy(n, c, k + 1) * (k + 1) / k):
        assert max_z_score(elites, wrong[rank_of_entry], j, k) > 20


@KEYS_AND_FLOYD
def test_masked_sizes_inside_larger_maxima_select_with_the_unmasked_distribution(floyd):
    n, (j, c, k), (j_max, c_max, k_max) = 64, (20_000, 5, 2), (25_000, 8 if floyd else 16, 4)
    assert uses_floyd(n, c_max) == floyd
    returns = np.random.default_rng(5).permutation(n).astype(np.float32)
    select_masked = jax.jit(
        functools.partial(ftw_jax.select_elites_masked, max_batches=j_max, max_batch_size=c_max, max_elites=k_max)
    )
    elites = np.asarray(select_masked(jax.random.key(6), jnp.asarray(returns), jnp.ones(n, bool), jnp.array([j, c, k])))
    assert elites.shape == (j_max, k_max)
    assert (elites[j:] == -1).all() and (elites[:, k:] == -1).all() and (elites[:j, :k] >= 0).all()
    kept = elites[:j, :k]
    assert all(row[0] != row[1] for row in kept.tolist())
    rank_of_entry = np.argsort(np.argsort(-returns))
    assert max_z_score(kept, ftw_jax.rank_occupancy(n, c, k)[rank_of_entry], j, k) < 5
    assert max_z_score(kept, ftw_jax.rank_occupancy(n, c_max, k)[rank_of_entry], j, k) > 20  # not C_max's
    # Other sizes run in the same compiled program.
    other = np.asarray(
        select_masked(jax.random.key(7), jnp.asarray(returns), jnp.ones(n, bool), jnp.array([3, 8 if floyd else 16, 4]))
    )
    assert (other[:3] >= 0).all() and (other[3:] == -1).all()
    assert select_masked._cache_size() == 1


def test_masked_selection_at_the_maxima_is_select_elites_and_respects_valid():
    returns = jnp.asarray(np.random.default_rng(8).normal(size=30), jnp.float32)
    valid = jnp.arange(30) < 7
    sizes = dict(num_batches=50, batch_size=10, num_elites=4)
    masked = ftw_jax.select_elites_masked(
        jax.random.key(9), returns, valid, (50, 10, 4), max_batches=50, max_batch_size=10, max_elites=4
    )
    np.testing.assert_array_equal(masked, select(jax.random.key(9), returns, valid, **sizes))
    smaller = np.asarray(
        ftw_jax.select_elites_masked(
            jax.random.key(9), returns, valid, (50, 6, 4), max_batches=50, max_batch_size=10, max_elites=4
        )
    )
    assert smaller.max() < 7 and (smaller >= 0).all()  # 7 valid entries fill every C = 6 minibatch


def test_elites_are_distinct_within_a_minibatch_and_repeat_across_them():
    elites = select(jax.random.key(2), np.arange(6.0), np.ones(6, bool), num_batches=64, batch_size=5, num_elites=3)
    assert all(len(set(row)) == 3 for row in elites.tolist())
    assert np.bincount(elites.ravel()).max() > 1  # entries are kept by several minibatches
    assert set(elites[:, 0].tolist()) <= {4, 5}  # the best of 5 out of 6 is always entry 5 or 4


def test_best_first_within_each_minibatch():
    returns = np.random.default_rng(3).normal(size=30).astype(np.float32)
    elites = select(jax.random.key(3), returns, np.ones(30, bool), num_batches=50, batch_size=10, num_elites=4)
    assert np.all(np.diff(returns[elites], axis=1) <= 0)


@KEYS_AND_FLOYD
def test_ties_are_broken_uniformly(floyd):
    n, c, k, j = 10 + 6 * floyd, 4, 2, 40_000
    returns = np.array([3, 1, 1, 1, 1, 2, 2, 0, 0, 0] + [-1] * 6 * floyd, np.float32)
    assert uses_floyd(n, c) == floyd
    elites = select(jax.random.key(4), returns, np.ones(n, bool), num_batches=j, batch_size=c, num_elites=k)
    expected = ftw_jax.tied_occupancy(returns, c, k)
    assert max_z_score(elites, expected, j, k) < 5
    # Had ties gone to the lowest index, entries 1 and 2 would be kept far more often than 3 and 4.
    counts = np.bincount(elites.ravel(), minlength=n)
    assert abs(counts[1] + counts[2] - counts[3] - counts[4]) < 0.05 * counts[1:5].sum()


def test_all_tied_is_uniform():
    n, c, k, j = 9, 4, 2, 30_000
    elites = select(jax.random.key(5), np.zeros(n), np.ones(n, bool), num_batches=j, batch_size=c, num_elites=k)
    assert max_z_score(elites, np.full(n, 1 / n), j, k) < 5


def test_nan_never_outranks_a_number():
    returns = np.array([np.nan, 1.0, -np.inf, np.nan, 0.5, -7.0, np.nan, 2.0], np.float32)
    numbers = {1, 2, 4, 5, 7}
    whole_pool = dict(num_batches=16, batch_size=8, num_elites=5)
    elites = select(jax.random.key(6), returns, np.ones(8, bool), **whole_pool)
    assert all(set(row) == numbers for row in elites.tolist())
    elites = select(jax.random.key(7), returns, np.ones(8, bool), num_batches=400, batch_size=4, num_elites=2)
    for row in elites.tolist():
        if np.isnan(returns[row[0]]):  # a NaN is kept only when the rest of its subset is NaN too
            assert np.isnan(returns[row[1]])


@KEYS_AND_FLOYD
def test_invalid_entries_are_never_selected(floyd):
    c = 4 if floyd else 5
    returns = np.arange(16, dtype=np.float32)
    valid = np.array([True, False] * 6 + [False] * 4)  # entries 0, 2, ..., 10; the best returns are invalid
    assert uses_floyd(16, c) == floyd
    elites = select(jax.random.key(8), returns, valid, num_batches=20_000, batch_size=c, num_elites=2)
    reachable = {10, 8, 6, 4} if floyd else {10, 8, 6}  # ranks <= N − C + K among the 6 valid entries
    assert set(np.unique(elites).tolist()) == reachable
    assert max_z_score(elites, ftw_jax.tied_occupancy(returns, c, 2, valid=valid), 20_000, 2) < 5


@KEYS_AND_FLOYD
def test_fewer_valid_than_elites_fills_minus_one(floyd):
    n = 16 if floyd else 5
    valid = np.arange(n) == 1
    elites = select(jax.random.key(9), np.arange(float(n)), valid, num_batches=3, batch_size=4, num_elites=2)
    np.testing.assert_array_equal(elites, [[1, -1]] * 3)


@KEYS_AND_FLOYD
def test_fewer_valid_than_c_draws_all_of_them(floyd):
    n = 16 if floyd else 5
    valid = np.isin(np.arange(n), [0, 3, 4])
    elites = select(jax.random.key(12), np.arange(float(n)), valid, num_batches=5, batch_size=4, num_elites=3)
    np.testing.assert_array_equal(elites, [[4, 3, 0]] * 5)


def test_keys_matter():
    args = (np.arange(50.0), np.ones(50, bool))
    sizes = dict(num_batches=8, batch_size=10, num_elites=2)
    first = select(jax.random.key(10), *args, **sizes)
    np.testing.assert_array_equal(first, select(jax.random.key(10), *args, **sizes))
    assert not np.array_equal(first, select(jax.random.key(11), *args, **sizes))


@pytest.mark.parametrize(
    ("returns", "valid", "sizes", "message"),
    [
        (np.zeros(8), np.ones(8, bool), dict(num_batches=2, batch_size=3, num_elites=4), "num_elites"),
        (np.zeros(8), np.ones(8, bool), dict(num_batches=2, batch_size=9, num_elites=1), "batch_size"),
        (np.zeros(8), np.ones(8, bool), dict(num_batches=2, batch_size=3, num_elites=0), "num_elites"),
        (np.zeros(8), np.ones(8, bool), dict(num_batches=0, batch_size=3, num_elites=1), "num_batches"),
        (np.zeros((8, 2)), np.ones(8, bool), dict(num_batches=2, batch_size=3, num_elites=1), r"shape \[N\]"),
        (np.zeros(8, np.int32), np.ones(8, bool), dict(num_batches=2, batch_size=3, num_elites=1), "floating"),
        (np.zeros(8), np.ones(8), dict(num_batches=2, batch_size=3, num_elites=1), "valid"),
        (np.zeros(8), np.ones(7, bool), dict(num_batches=2, batch_size=3, num_elites=1), "valid"),
    ],
)
def test_bad_arguments_raise_before_work(returns, valid, sizes, message):
    with pytest.raises(ValueError, match=message):
        ftw_jax.select_elites(jax.random.key(0), jnp.asarray(returns), jnp.asarray(valid), **sizes)


@KEYS_AND_FLOYD
def test_failure_share_of_top_k_matches_the_hypergeometric_prediction_and_beat_minimum_keeps_none(floyd):
    n, m, c, k, j = (64, 10, 5, 3, 20_000) if floyd else (16, 4, 5, 3, 20_000)  # m successes (return 1), the rest 0
    assert uses_floyd(n, c) == floyd
    returns = np.zeros(n, np.float32)
    returns[np.random.default_rng(2).choice(n, m, replace=False)] = 1.0
    sizes = dict(num_batches=j, batch_size=c, num_elites=k)
    top_k = select(jax.random.key(3), returns, np.ones(n, bool), **sizes)
    failures = np.mean(returns[top_k] == 0)  # every slot is filled under top_k
    predicted = float(ftw_jax.expected_failure_share(n, m, c, k))
    # Slots within a minibatch are dependent: bound the sd by that of J independent minibatch shares.
    assert abs(failures - predicted) < 5 * np.sqrt(0.25 / j) and 0.2 < predicted < 0.9
    assert abs(failures - float(ftw_jax.expected_failure_share(n, m, c, k - 1))) > 0.05  # it could fail

    beat = select(jax.random.key(3), returns, np.ones(n, bool), rule="beat_minimum", **sizes)
    kept = beat[beat >= 0]
    assert kept.size and np.all(returns[kept] == 1.0)  # no failure is ever imitated
    # A minibatch keeps min(S, K) successes when it also holds a failure, nothing when all C succeed.
    chance_all_succeed = np.prod([(m - i) / (n - i) for i in range(c)])
    expected_kept = k * (1 - float(ftw_jax.expected_failure_share(n, m, c, k))) - k * chance_all_succeed
    assert abs((beat >= 0).sum(axis=1).mean() - expected_kept) < 0.05


def test_beat_minimum_keeps_nothing_from_ties_and_never_a_nan():
    sizes = dict(num_batches=200, batch_size=4, num_elites=2, rule="beat_minimum")
    tied = select(jax.random.key(0), np.full(8, 3.0), np.ones(8, bool), **sizes)
    assert np.all(tied == -1)
    returns = np.array([np.nan, 1.0, np.nan, 1.0, 2.0, np.nan, 0.0, 5.0], np.float32)
    elites = select(jax.random.key(1), returns, np.ones(8, bool), **sizes)
    kept = elites[elites >= 0]
    assert kept.size and not np.any(np.isnan(returns[kept]))
    with pytest.raises(ValueError, match="rule must be one of"):
        select(jax.random.key(0), returns, np.ones(8, bool), num_batches=1, batch_size=2, num_elites=1, rule="best")

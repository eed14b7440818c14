"""The FIFO pool: filling, wrap-around, expiry, validation, and no retracing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_trajectories

from ftw_jax.core import pool as pool_lib


def one(trajectories):
    return jax.tree.map(lambda leaf: leaf[0], trajectories)


@pytest.fixture
def empty_pool():
    return pool_lib.init(5, one(make_trajectories(1, 4)))


def test_init_is_empty(empty_pool):
    assert empty_pool.capacity == 5
    assert int(empty_pool.size) == 0 and int(empty_pool.insert_index) == 0
    assert not np.any(pool_lib.valid_mask(empty_pool))
    assert empty_pool.trajectories.action.shape == (5, 4)
    assert empty_pool.trajectories.observation.shape == (5, 4, 3)


def test_fifo_wraps_around_and_expires_oldest(empty_pool):
    pool = empty_pool
    for step, start in enumerate((0, 3, 6)):  # three batches of 3 returns: 0..2, 3..5, 6..8
        pool = pool_lib.add(pool, make_trajectories(3, 4, returns=jnp.arange(start, start + 3)))
        assert int(pool.num_adds) == step + 1
    # 9 trajectories through 5 slots: slots hold returns [5, 6, 7, 8, 4] (0..3 expired).
    np.testing.assert_array_equal(pool.trajectories.episode_return, [5, 6, 7, 8, 4])
    np.testing.assert_array_equal(pool.added_at, [1, 2, 2, 2, 1])
    assert int(pool.insert_index) == 9 % 5 and int(pool.size) == 5
    assert np.all(pool_lib.valid_mask(pool))


def test_partial_fill_is_valid_up_to_size(empty_pool):
    pool = pool_lib.add(empty_pool, make_trajectories(2, 4))
    np.testing.assert_array_equal(pool_lib.valid_mask(pool), [True, True, False, False, False])
    np.testing.assert_array_equal(pool.added_at, [0, 0, -1, -1, -1])


def test_adding_n_replaces_everything(empty_pool):
    pool = pool_lib.add(
        pool_lib.add(empty_pool, make_trajectories(2, 4)), make_trajectories(5, 4, returns=jnp.arange(10, 15))
    )
    # Written at slots 2, 3, 4, 0, 1.
    np.testing.assert_array_equal(pool.trajectories.episode_return, [13, 14, 10, 11, 12])


def test_a_pool_using_fewer_slots_holds_what_a_smaller_pool_holds():
    example = one(make_trajectories(1, 4))
    small, inside = pool_lib.init(5, example), pool_lib.init(8, example, slots_in_use=jnp.int32(5))
    add = jax.jit(pool_lib.add)
    for start in (0, 3, 6, 9):
        batch = make_trajectories(3, 4, returns=jnp.arange(start, start + 3), seed=start)
        small, inside = add(small, batch), add(inside, batch)
        for got, expected in zip(jax.tree.leaves(inside), jax.tree.leaves(small)):
            if np.ndim(expected):  # the first 5 slots are the small pool's; the other 3 never fill
                np.testing.assert_array_equal(np.asarray(got)[:5], expected)
            else:
                np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(pool_lib.valid_mask(inside), np.r_[pool_lib.valid_mask(small), [False] * 3])
    np.testing.assert_array_equal(inside.added_at[5:], -1)
    with pytest.raises(ValueError, match="slots_in_use must be in \\[1, capacity=8\\], got 9"):
        pool_lib.init(8, example, slots_in_use=9)


def test_add_does_not_mutate_its_input(empty_pool):
    pool_lib.add(empty_pool, make_trajectories(2, 4))
    assert int(empty_pool.size) == 0 and float(jnp.abs(empty_pool.trajectories.observation).sum()) == 0.0


def test_jitted_donated_add_traces_once(empty_pool):
    traces = []

    def counting_add(pool, batch):
        traces.append(1)
        return pool_lib.add(pool, batch)

    add = jax.jit(counting_add, donate_argnums=0)
    pool = empty_pool
    for seed in range(4):
        pool = add(pool, make_trajectories(3, 4, seed=seed, returns=jnp.full(3, seed)))
    assert len(traces) == 1
    np.testing.assert_array_equal(pool.trajectories.episode_return, [3, 3, 2, 2, 3])


@pytest.mark.parametrize("capacity", [0, -3, 2.5, True])
def test_bad_capacity(capacity):
    with pytest.raises(ValueError, match="capacity"):
        pool_lib.init(capacity, one(make_trajectories(1, 4)))


def test_batch_larger_than_capacity(empty_pool):
    with pytest.raises(ValueError, match="B=6"):
        pool_lib.add(empty_pool, make_trajectories(6, 4))


def test_wrong_shapes_and_dtypes(empty_pool):
    good = make_trajectories(2, 4)
    with pytest.raises(ValueError, match="observation"):
        pool_lib.add(empty_pool, make_trajectories(2, 4, observation_size=5))
    with pytest.raises(ValueError, match="action"):
        pool_lib.add(empty_pool, good.replace(action=good.action.astype(jnp.float32)))
    with pytest.raises(ValueError, match="mask"):
        pool_lib.add(empty_pool, good.replace(mask=good.mask[:, :3]))
    with pytest.raises(ValueError, match="episode_return"):
        pool_lib.add(empty_pool, good.replace(episode_return=jnp.zeros((2, 1))))
    with pytest.raises(ValueError, match="shape"):
        pool_lib.add(empty_pool, make_trajectories(2, 6))
    with pytest.raises(ValueError, match="Trajectory"):
        pool_lib.add(empty_pool, {"action": good.action})
    with pytest.raises(ValueError, match="behaviour_version"):
        pool_lib.init(5, one(good).replace(behaviour_version=jnp.zeros(4, jnp.float32)))

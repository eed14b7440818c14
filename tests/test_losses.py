"""Per-step losses: hand-computed values, masking, gradients and their direction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from ftw_jax.core import losses

LOGITS = jnp.array([[0.0, 1.0, -1.0], [2.0, 0.0, 0.0], [0.5, 0.5, 0.5]])
OTHER = jnp.array([[1.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, -1.0, 2.0]])
ACTIONS = jnp.array([1, 0, 2])
MASK = jnp.array([True, False, True])


@pytest.mark.parametrize("jit", [True, False])
def test_log_likelihood_by_hand(jit):
    fn = jax.jit(losses.log_likelihood) if jit else losses.log_likelihood
    expected = [1.0 - np.log(1 + np.e + np.exp(-1)), 0.0, -np.log(3.0)]
    np.testing.assert_allclose(fn(LOGITS, ACTIONS, MASK), expected, rtol=1e-6)


@pytest.mark.parametrize("jit", [True, False])
def test_kl_by_hand_both_directions(jit):
    fn = jax.jit(losses.categorical_kl) if jit else losses.categorical_kl
    p = jax.nn.softmax(LOGITS)
    q = jax.nn.softmax(OTHER)
    forward = np.sum(p * np.log(p / q), axis=-1) * MASK
    reverse = np.sum(q * np.log(q / p), axis=-1) * MASK
    np.testing.assert_allclose(fn(LOGITS, OTHER, MASK), forward, rtol=1e-5)
    np.testing.assert_allclose(fn(OTHER, LOGITS, MASK), reverse, rtol=1e-5)
    assert not np.allclose(forward, reverse)


def test_kl_is_zero_for_equal_policies_and_handles_zero_probability():
    np.testing.assert_allclose(losses.categorical_kl(LOGITS, LOGITS + 3.0, MASK), 0.0, atol=1e-6)
    certain = jnp.array([[0.0, -jnp.inf, -jnp.inf]])  # p puts no mass on actions 1, 2
    value = losses.categorical_kl(certain, jnp.zeros((1, 3)), jnp.array([True]))
    np.testing.assert_allclose(value, [np.log(3.0)], rtol=1e-6)


def test_entropy_by_hand():
    np.testing.assert_allclose(
        losses.entropy(jnp.zeros((2, 4)), jnp.array([True, False])), [np.log(4.0), 0.0], rtol=1e-6
    )


def test_gradients_are_correct():
    check_grads(
        lambda x: losses.categorical_kl(x, OTHER, MASK).sum(), (LOGITS,), order=2, modes=["rev"], atol=1e-2, rtol=1e-2
    )
    check_grads(
        lambda x: losses.categorical_kl(OTHER, x, MASK).sum(), (LOGITS,), order=2, modes=["rev"], atol=1e-2, rtol=1e-2
    )
    check_grads(
        lambda x: losses.log_likelihood(x, ACTIONS, MASK).sum(), (LOGITS,), order=2, modes=["rev"], atol=1e-2, rtol=1e-2
    )


def test_cross_entropy_gradient_raises_the_kept_action_and_ignores_masked_steps():
    grad = jax.grad(lambda x: -losses.log_likelihood(x, ACTIONS, MASK).sum())(LOGITS)
    stepped = LOGITS - 0.1 * grad
    before = jax.nn.softmax(LOGITS)[jnp.arange(3), ACTIONS]
    after = jax.nn.softmax(stepped)[jnp.arange(3), ACTIONS]
    assert after[0] > before[0] and after[2] > before[2]
    np.testing.assert_array_equal(grad[1], 0.0)  # masked step: no gradient


def test_kl_gradient_pulls_towards_the_reference():
    grad = jax.grad(lambda x: losses.categorical_kl(x, OTHER, MASK).sum())(LOGITS)
    stepped = LOGITS - 0.1 * grad
    kept = np.array([0, 2])
    assert np.all(
        np.asarray(losses.categorical_kl(stepped, OTHER, MASK))[kept]
        < np.asarray(losses.categorical_kl(LOGITS, OTHER, MASK))[kept]
    )


def test_shape_mismatch_is_caught():
    with pytest.raises(AssertionError):
        losses.log_likelihood(LOGITS, ACTIONS[:2], MASK)
    with pytest.raises(AssertionError):
        losses.categorical_kl(LOGITS, OTHER[:, :2], MASK)


def test_an_action_outside_the_action_space_is_nan_where_it_counts():
    logits = jnp.zeros((4, 3))
    actions = jnp.array([0, -1, 3, 2])
    got = losses.log_likelihood(logits, actions, jnp.array([True, True, True, False]))
    np.testing.assert_allclose(got[0], -np.log(3), rtol=1e-6)
    assert np.isnan(got[1]) and np.isnan(got[2])  # not trained as action A - 1 (or clipped to 2)
    assert got[3] == 0.0  # a step that does not count stays 0, whatever its action

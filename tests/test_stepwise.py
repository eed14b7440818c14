"""The step-wise gradient (`ftw_jax.core.stepwise`): the dense sum's value, gradient and per-step values, on the
counted steps alone."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ftw_jax.core import stepwise

S = 21  # steps: 8 chunks of 3, the last three filler


def inputs():
    x = jax.random.normal(jax.random.key(0), (S, 3))
    params = {"w": jnp.array([0.5, -1.0, 0.25]), "b": jnp.array(0.1)}
    return x, params


def step_values(params, x):  # [n, 3] -> [n]
    return jnp.tanh(x @ params["w"] + params["b"])


@pytest.mark.parametrize("counted_steps", [list(range(S)), [2, 7, 19], [20]])
def test_the_stepwise_gradient_is_the_dense_sums(counted_steps):
    x, params = inputs()
    counted = jnp.zeros(S, bool).at[jnp.array(counted_steps)].set(True)
    weights = jnp.linspace(0.5, 1.5, S)

    def dense(params):
        values = step_values(params, x)
        return jnp.sum(jnp.where(counted, weights * values**2, 0.0)), values

    def chunk_loss(params, steps, in_chunk):
        values = step_values(params, x[steps])
        value = jnp.sum(jnp.where(in_chunk, weights[steps] * values**2, 0.0))
        return value, ({"squares": value, "count": jnp.sum(in_chunk)}, values)

    (value, (sums, per_step)), grads = stepwise.stepwise_value_and_grad(chunk_loss, params, counted)
    (expected, values), expected_grads = jax.value_and_grad(dense, has_aux=True)(params)
    np.testing.assert_allclose(value, expected, rtol=1e-6)
    np.testing.assert_allclose(sums["squares"], expected, rtol=1e-6)
    assert int(sums["count"]) == len(counted_steps)
    chex.assert_trees_all_close(grads, expected_grads, rtol=1e-5)
    np.testing.assert_allclose(per_step, jnp.where(counted, values, 0.0), rtol=1e-6)  # each in its own place


def test_nothing_counted_runs_nothing_and_gives_zeros():
    x, params = inputs()
    calls = []

    def chunk_loss(params, steps, in_chunk):
        jax.debug.callback(lambda: calls.append(1))
        return jnp.sum(jnp.where(in_chunk, step_values(params, x[steps]), 0.0)), ((), ())

    (value, _), grads = jax.jit(stepwise.stepwise_value_and_grad, static_argnums=0)(
        chunk_loss, params, jnp.zeros(S, bool)
    )
    jax.effects_barrier()
    assert float(value) == 0.0 and calls == []
    chex.assert_trees_all_equal(grads, jax.tree.map(jnp.zeros_like, params))


def test_an_uncounted_steps_inputs_never_reach_the_gradient():
    """Step 0 is not counted and its input is NaN: the filler of the last chunk must not read it (0 × NaN)."""
    x, params = inputs()
    poisoned = x.at[0].set(jnp.nan)
    counted = jnp.zeros(S, bool).at[jnp.array([2, 7])].set(True)  # one chunk of 3: one filler slot

    def chunk_loss(params, steps, in_chunk):
        return jnp.sum(jnp.where(in_chunk, step_values(params, poisoned[steps]) ** 2, 0.0)), ((), ())

    (value, _), grads = stepwise.stepwise_value_and_grad(chunk_loss, params, counted)
    expected = jax.grad(lambda params: jnp.sum(jnp.where(counted, step_values(params, x) ** 2, 0.0)))(params)
    assert np.isfinite(float(value))
    chex.assert_trees_all_close(grads, expected, rtol=1e-5)

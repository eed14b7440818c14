"""Staleness, importance ratios and their effective sample size, and the trust-region quantities, by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from ftw_jax.core.diagnostics import (
    effective_sample_size,
    log_importance_ratio,
    staleness,
    total_variation,
    trpo_penalty,
)


def test_staleness_counts_from_the_oldest_policy_step():
    versions = jnp.array([[3, 3, 3], [1, 2, 2], [0, 5, 5], [4, 4, 4]])
    mask = jnp.array([[True, True, False], [True, True, True], [False, True, True], [False, False, False]])
    np.testing.assert_array_equal(
        staleness(jnp.int32(6), versions, mask), [3, 5, 1, 0]
    )  # step 0 of row 2 is not the policy's


def test_log_importance_ratio_sums_the_policy_steps():
    log_p = jnp.log(jnp.array([[0.5, 0.2, 0.9]]))
    log_q = jnp.log(jnp.array([[0.25, 0.4, 0.1]]))
    mask = jnp.array([[True, True, False]])
    np.testing.assert_allclose(log_importance_ratio(log_p, log_q, mask), [np.log(2.0 * 0.5)], atol=1e-6)


def test_effective_sample_size():
    assert float(effective_sample_size(jnp.zeros(8))) == pytest.approx(8.0)  # equal weights: all count
    assert float(effective_sample_size(jnp.array([0.0, -50.0, -50.0]))) == pytest.approx(1.0, abs=1e-6)
    weights = jnp.array([1.0, 2.0, 4.0])  # (Σ w)² / Σ w² = 49 / 21 by hand
    assert float(effective_sample_size(jnp.log(weights))) == pytest.approx(49 / 21, rel=1e-6)
    # Counts repeat weights exactly as duplicated entries would, and zero counts drop them.
    repeated = effective_sample_size(jnp.log(jnp.array([1.0, 2.0, 4.0, 9.0])), jnp.array([2, 1, 1, 0]))
    assert float(repeated) == pytest.approx(float(effective_sample_size(jnp.log(jnp.array([1.0, 1.0, 2.0, 4.0])))))
    assert float(effective_sample_size(jnp.array([1000.0, 1000.0]))) == pytest.approx(2.0)  # no overflow
    assert float(effective_sample_size(jnp.zeros(3), jnp.zeros(3))) == 0.0


def test_total_variation_and_the_trpo_penalty_by_hand():
    p, q = jnp.log(jnp.array([0.7, 0.2, 0.1])), jnp.log(jnp.array([0.4, 0.4, 0.2]))
    assert float(total_variation(p, q)) == pytest.approx(0.3, abs=1e-6)
    assert float(total_variation(p, p + 3.0)) == pytest.approx(0.0, abs=1e-7)  # logits up to a constant
    assert float(trpo_penalty(jnp.float32(0.1), jnp.float32(10.0), 0.9)) == pytest.approx(4 * 10 * 0.9 * 0.01 / 0.01)
    with pytest.raises(ValueError, match="discount in \\[0, 1\\), got 1.0"):
        trpo_penalty(jnp.float32(0.1), jnp.float32(1.0), 1.0)

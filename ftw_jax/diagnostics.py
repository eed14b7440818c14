"""Which policy produced each trajectory, and how far an update moves the policy: pure functions on arrays.

FTW learns from a pool filled by many past policy versions. These measure it:

- staleness: the current version minus the oldest behaviour version among a trajectory's policy steps;
- the trajectory importance ratio log w(τ) = Σ_t mask_t [log π_θ(a_t | h_t) − log q(a_t | h_t)] of the policy
  being trained against the one that acted, and the effective sample size of those weights;
- the trust-region monitor: KL(π_old ‖ π_new) and the total-variation distance between the policies before
  and after an update, per state, and the TRPO penalty term 4 ε γ α² / (1 − γ)².

Axis legend: M trajectories, T steps, A actions.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

# The behaviour version of a step that is not the policy's own (padding, environment tokens) is ignored.
_NO_VERSION = jnp.iinfo(jnp.int32).max


def staleness(current_version: jax.Array, behaviour_version: jax.Array, mask: jax.Array) -> jax.Array:
    """Versions between the current policy and the oldest one that acted in each trajectory.

    Args:
      current_version: [] int32.
      behaviour_version: [..., T] int32, the version that acted at each step.
      mask: [..., T] bool, the policy's own steps.

    Returns:
      [...] int32; 0 for a trajectory without policy steps.
    """
    chex.assert_equal_shape((behaviour_version, mask))
    oldest = jnp.min(jnp.where(mask, behaviour_version, _NO_VERSION), axis=-1)
    return jnp.where(jnp.any(mask, axis=-1), current_version - oldest, 0).astype(jnp.int32)


def log_importance_ratio(log_probs: jax.Array, behaviour_log_probs: jax.Array, mask: jax.Array) -> jax.Array:
    """log w(τ) = Σ_t mask_t [log π(a_t | h_t) − log q(a_t | h_t)]: [..., T] -> [...]."""
    chex.assert_equal_shape((log_probs, behaviour_log_probs, mask))
    return jnp.sum(jnp.where(mask, log_probs - behaviour_log_probs, 0.0), axis=-1)


def effective_sample_size(log_weights: jax.Array, counts: jax.Array | None = None) -> jax.Array:
    """Kish's effective sample size (Σ c w)² / Σ c w² of importance weights w = exp(log_weights) [M].

    `counts` [M] (default 1) repeat each weight, e.g. an elite kept by several minibatches. Computed in log
    space (the largest weight factored out), so huge or tiny weights do not overflow. Between 1 and Σ c when
    any count is positive; 0 when none is.
    """
    chex.assert_rank(log_weights, 1)
    counts = jnp.ones_like(log_weights) if counts is None else counts.astype(log_weights.dtype)
    chex.assert_equal_shape((log_weights, counts))
    present = counts > 0
    shift = jnp.max(jnp.where(present, log_weights, -jnp.inf))
    scaled = jnp.where(present, jnp.exp(log_weights - jnp.where(jnp.isfinite(shift), shift, 0.0)), 0.0)
    total = jnp.sum(counts * scaled)
    return jnp.where(jnp.any(present), total**2 / jnp.maximum(jnp.sum(counts * scaled**2), 1e-30), 0.0)


def total_variation(logits_p: jax.Array, logits_q: jax.Array) -> jax.Array:
    """½ Σ_a |p(a) − q(a)| per state: [..., A] -> [...]."""
    chex.assert_equal_shape((logits_p, logits_q))
    return 0.5 * jnp.sum(jnp.abs(jax.nn.softmax(logits_p) - jax.nn.softmax(logits_q)), axis=-1)


def trpo_penalty(max_total_variation: jax.Array, max_abs_advantage: jax.Array, discount: float) -> jax.Array:
    """4 ε γ α² / (1 − γ)²: the term by which TRPO's surrogate may overstate the new policy's return.

    Schulman et al. (2015), Theorem 1: η(π_new) ≥ L_{π_old}(π_new) − 4 ε γ α² / (1 − γ)², with
    α = max_s D_TV(π_old(·|s) ‖ π_new(·|s)) and ε = max_{s,a} |A_{π_old}(s, a)|, for γ < 1.
    """
    if not 0 <= discount < 1:
        raise ValueError(f"the TRPO bound needs a discount in [0, 1), got {discount!r}.")
    return 4.0 * max_abs_advantage * discount * max_total_variation**2 / (1.0 - discount) ** 2

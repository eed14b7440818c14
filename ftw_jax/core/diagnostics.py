"""Which policy produced each trajectory, and how far an update moves the policy: pure functions on arrays.

FTW learns from a pool filled by many past policy versions. These measure it:

- staleness: the current version minus the oldest behaviour version among a trajectory's policy steps;
- the trajectory importance ratio log w(τ) = Σ_t mask_t [log π_θ(a_t | h_t) − log q(a_t | h_t)] of the policy
  being trained against the one that acted, and the effective sample size of those weights;
- the sampler gap: that ratio per token on the trajectories the current version wrote, which a sampler that
  reports the policy's own log-probs keeps at rounding (`sampler_gap`);
- the trust-region monitor: KL(π_old ‖ π_new) and the total-variation distance between the policies before
  and after an update, per state, and the TRPO penalty term 4 ε γ α² / (1 − γ)²;
- over a whole pool (`make_pool_diagnostics`, the update's phase 4): its staleness and their histogram, and the
  monitor on evenly spaced entries.

Axis legend: M trajectories, T steps, A actions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from ftw_jax.core import losses
from ftw_jax.core import pool as pool_lib

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


def sampler_gap(
    log_weights: jax.Array, weights: jax.Array, behaviour_version: jax.Array, mask: jax.Array, version: jax.Array
) -> dict[str, jax.Array]:
    """How far the log-probs a sampler reported are from the policy's own, on the trajectories the current
    version wrote itself (staleness 0), where they should agree to rounding: `sampler_gap`, Σ |log w(τ)| over
    those of weight > 0 divided by their policy steps (nats per token; 0 when there is none), and
    `sampler_tokens`, those steps. A sampler at another temperature, with top-p/top-k, or reporting processed
    log-probs moves every token's log-prob the same way, so the gap grows with each token.

    Args:
      log_weights: [M] log π(τ)/q(τ) under the current params (`log_importance_ratio`).
      weights: [M] the loss's weights (counts); entries of weight 0 are not measured.
      behaviour_version: [M, T] int32. mask: [M, T] bool, the policy's own steps. version: [] int32, the current.
    """
    chex.assert_rank((log_weights, weights, behaviour_version), (1, 1, 2))
    own = (weights > 0) & (staleness(version, behaviour_version, mask) == 0)  # [M]
    tokens = jnp.sum(jnp.where(own[:, None], mask, False))
    total = jnp.sum(jnp.where(own, jnp.abs(log_weights), 0.0))
    return {"sampler_gap": total / jnp.maximum(tokens, 1), "sampler_tokens": tokens}


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


def pool_staleness(pool: pool_lib.Pool, version: jax.Array) -> jax.Array:
    """[N] int32: versions between `version` and the oldest that acted in each pool entry."""
    return staleness(version, pool.trajectories.behaviour_version, pool.trajectories.mask)


def make_trust_region(
    apply_fn: Callable[[Any, Any], jax.Array],
    *,
    entries: int,
    discount: float,
    chunked: losses.ChunkedLogits | None = None,
) -> Callable[[Any, Any, pool_lib.Pool], dict]:
    """`monitor(old_params, new_params, pool) -> metrics`: KL(π_old ‖ π_new) and total variation on the policy
    steps of `entries` evenly spaced pool entries (at most the pool's capacity), and the TRPO penalty term they
    imply at `discount` (with `chunked`, the logits made a chunk of steps at a time)."""

    def divergences(old, new, mask):  # [n, A] logits -> KL and TV [n]
        return losses.categorical_kl(old, new, mask), jnp.where(mask, total_variation(old, new), 0.0)

    # [M, T, ...] -> KL and TV [M, T]: the loss's way to logits (one model call over the batch, in chunks where
    # `chunked` says), the new params in the reference's place
    batch_divergences = losses.per_step_terms(apply_fn, divergences, chunked)

    def monitor(old_params, new_params, pool: pool_lib.Pool) -> dict:
        count = min(entries, pool.capacity)  # more would only repeat entries
        picks = (jnp.arange(count) * pool.size) // count
        monitored = jax.tree.map(lambda leaf: leaf[picks], pool.trajectories)
        mask = monitored.mask & (pool.size > 0)
        kl, tv = batch_divergences(old_params, new_params, monitored.observation, mask)
        steps = jnp.maximum(jnp.sum(mask), 1)
        largest_return = jnp.max(jnp.where(pool_lib.valid_mask(pool), jnp.abs(pool.trajectories.episode_return), 0.0))
        return {
            "policy_kl_mean": jnp.sum(kl) / steps,
            "policy_kl_max": jnp.max(kl),
            "policy_tv_mean": jnp.sum(tv) / steps,
            "policy_tv_max": jnp.max(tv),
            "trpo_penalty": trpo_penalty(jnp.max(tv), largest_return, discount),
        }

    return monitor


def staleness_histogram(pool: pool_lib.Pool, staleness: jax.Array, bins: int) -> jax.Array:
    """[bins] int32: filled entries by staleness 0, 1, ..., the last bin counting everything from bins − 1 up."""
    filled = pool_lib.valid_mask(pool).astype(jnp.int32)
    return jnp.zeros(bins, jnp.int32).at[jnp.minimum(staleness, bins - 1)].add(filled)


def make_pool_diagnostics(
    apply_fn: Callable[[Any, Any], jax.Array],
    *,
    monitor_entries: int,
    monitor_discount: float,
    histogram_bins: int,
    chunked: losses.ChunkedLogits | None = None,
) -> Callable[[Any, Any, pool_lib.Pool, jax.Array], dict]:
    """`diagnose(old_params, new_params, pool, version) -> metrics` that read the whole pool or run the policy on
    it: the pool's staleness (a pass over [N, T]), its histogram over `histogram_bins` (0: none), and the
    trust-region monitor on `monitor_entries` entries (0: none)."""
    trust_region = make_trust_region(apply_fn, entries=monitor_entries, discount=monitor_discount, chunked=chunked)

    def diagnose(old_params, new_params, pool: pool_lib.Pool, version: jax.Array) -> dict:
        staleness, filled = pool_staleness(pool, version), pool_lib.valid_mask(pool)
        metrics = {
            "pool_staleness_mean": jnp.sum(jnp.where(filled, staleness, 0)) / jnp.maximum(pool.size, 1),
            "pool_staleness_max": jnp.max(jnp.where(filled, staleness, 0)),
        }
        if histogram_bins:
            metrics["pool_staleness_histogram"] = staleness_histogram(pool, staleness, histogram_bins)
        if monitor_entries:
            metrics.update(trust_region(old_params, new_params, pool))
        return metrics

    return diagnose


def not_measured(metrics: dict) -> dict:
    """Stand-ins of the diagnostics' shapes for an update that skips them: NaN, or -1 for integers."""

    def missing(leaf):
        return jnp.full(leaf.shape, jnp.nan if jnp.issubdtype(leaf.dtype, jnp.floating) else -1, leaf.dtype)

    return jax.tree.map(missing, metrics)


def measured_if(diagnose: bool | jax.Array, pool_diagnostics: Callable[..., dict], *arguments: Any) -> dict:
    """`pool_diagnostics(*arguments)` where `diagnose` asks for them, else `not_measured` stand-ins. A Python
    bool is known while tracing (no branch in the program); a traced flag not batched under vmap (a loop index)
    skips the work; a batched one runs both sides."""
    if isinstance(diagnose, bool):
        measured = pool_diagnostics(*arguments)
        return measured if diagnose else not_measured(measured)
    measured = jax.eval_shape(pool_diagnostics, *arguments)
    return jax.lax.cond(diagnose, pool_diagnostics, lambda *_: not_measured(measured), *arguments)

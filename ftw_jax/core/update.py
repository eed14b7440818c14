"""The FTW update (Algorithm 2): select elites → cross-entropy + β·KL → gradient → Optax step, one jit.

Axis legend: N pool entries, J minibatches, C candidates, K elites, M trajectories in the loss, T steps,
A actions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.core
import jax.numpy as jnp
import optax

from ftw_jax.core import diagnostics, losses
from ftw_jax.core import pool as pool_lib
from ftw_jax.core.elite_loss import ApplyFn, make_loss_and_grad
from ftw_jax.core.selection import select_elites_masked
from ftw_jax.core.state import PolicyState, select_tree
from ftw_jax.core.update_config import Sizes, UpdateConfig


class Selection(flax.struct.PyTreeNode):
    """What the select phase hands the loss: the trajectories and their weights, and what the diagnostics read."""

    trajectories: pool_lib.Trajectory  # [M, T, ...]: the kept ones (gathered), or the whole pool (counts path)
    weights: jax.Array  # [M] float32: how often each was kept
    elites: jax.Array  # [J·K] int32 pool indices (0 for an unfilled slot)
    filled: jax.Array  # [J·K] bool: the slot holds an elite
    counts: jax.Array  # [N] float32: how often each pool entry was kept
    valid: jax.Array  # [N] bool: entries selection could draw
    elite_staleness: jax.Array  # [J·K] int32: versions since each kept slot's entry was played


def select(config: UpdateConfig, pool: pool_lib.Pool, version: jax.Array, key: jax.Array, sizes: Sizes) -> Selection:
    """Phase 1: J C-subsets of the valid pool entries, the top K of each, as the loss will read them."""
    valid = pool_lib.valid_mask(pool)
    if config.max_staleness is not None:  # the only use of every entry's staleness (a pass over [N, T])
        valid = valid & (diagnostics.pool_staleness(pool, version) <= config.max_staleness)
    elites = select_elites_masked(
        key,
        pool.trajectories.episode_return,
        valid,
        (sizes.num_batches, sizes.batch_size, sizes.num_elites),
        max_batches=config.num_batches,
        max_batch_size=config.batch_size,
        max_elites=config.num_elites,
        rule=config.elite_rule,
    ).reshape(config.num_batches * config.num_elites)
    filled = elites >= 0
    elites = jnp.maximum(elites, 0)
    counts = jnp.zeros(config.pool_capacity, jnp.float32).at[elites].add(filled)  # [N]
    kept_versions = pool.trajectories.behaviour_version[elites], pool.trajectories.mask[elites]  # [J·K, T]
    if config.uses_counts:  # every entry once, weighted by its count: no repeated forward passes
        trajectories, weights = pool.trajectories, counts
    else:
        trajectories = jax.tree.map(lambda leaf: leaf[elites], pool.trajectories)
        weights = filled.astype(jnp.float32)
    return Selection(
        trajectories=trajectories,
        weights=weights,
        elites=elites,
        filled=filled,
        counts=counts,
        valid=valid,
        elite_staleness=diagnostics.staleness(version, *kept_versions),
    )


def apply_step(
    config: UpdateConfig, state: PolicyState, grads: Any, loss: jax.Array, ready: jax.Array
) -> tuple[PolicyState, jax.Array, jax.Array]:
    """Phase 3: one optimizer step if `ready` and everything is finite; "previous" moves the reference along."""
    new_state, applied, finite = state.apply_if_finite(grads, loss, ready)
    if config.reference == "previous":
        moved = jax.tree.map(lambda new, old: new.astype(old.dtype), state.params, state.reference_params)
        new_state = new_state.replace(reference_params=select_tree(applied, moved, state.reference_params))
    return new_state, applied, finite


def selection_metrics(
    pool: pool_lib.Pool, selection: Selection, log_weights: jax.Array, sizes: Sizes, version: jax.Array
) -> dict:
    """Phase 4a: what was kept, from where in the pool, how stale, and how far off-policy (before the step, at
    `version`), the sampler's log-probs on the kept entries `version` wrote included (`diagnostics.sampler_gap`)."""
    returns = pool.trajectories.episode_return
    filled, filled_slots = selection.filled, pool_lib.valid_mask(pool)
    elite_returns, elite_staleness = returns[selection.elites], selection.elite_staleness
    kept, slots = jnp.maximum(jnp.sum(filled), 1), sizes.num_batches * sizes.num_elites
    pool_entries = jnp.maximum(pool.size, 1)
    weights = selection.weights
    return {
        "elite_return_mean": jnp.sum(jnp.where(filled, elite_returns, 0.0)) / kept,
        "elite_return_min": jnp.min(jnp.where(filled, elite_returns, jnp.inf)),
        "unique_elite_fraction": jnp.sum(selection.counts > 0) / slots,
        "kept_fraction": jnp.sum(filled) / slots,  # < 1 under beat_minimum, or with fewer than K valid entries
        "pool_filled": pool.size,  # entries in the pool (N is its capacity)
        "pool_return_mean": jnp.sum(jnp.where(filled_slots, returns, 0.0)) / pool_entries,
        # Staleness: the current version (before this step) minus the version that played the entry.
        "elite_staleness_mean": jnp.sum(jnp.where(filled, elite_staleness, 0)) / kept,
        "elite_staleness_max": jnp.max(jnp.where(filled, elite_staleness, 0)),
        "usable_fraction": jnp.sum(selection.valid) / pool_entries,  # < 1 only with max_staleness
        # Importance ratios π_θ(τ) / q(τ) of the kept trajectories (θ before this step), repeats counted.
        "elite_log_weight_mean": jnp.sum(weights * log_weights) / jnp.maximum(jnp.sum(weights), 1),
        "elite_ess_fraction": diagnostics.effective_sample_size(log_weights, weights)
        / jnp.maximum(jnp.sum(weights), 1),
        # Behaviour log-probs that are not finite make the two above NaN; the step itself does not use them.
        "behaviour_logp_nonfinite": jnp.any((weights > 0) & ~jnp.isfinite(log_weights)),
        # An observation the loss reads that is not finite makes the gradient NaN: the step is skipped (nonfinite).
        "observation_nonfinite": nonfinite_observations(selection.trajectories, weights),
        **diagnostics.sampler_gap(
            log_weights, weights, selection.trajectories.behaviour_version, selection.trajectories.mask, version
        ),
    }


def nonfinite_observations(trajectories: pool_lib.Trajectory, weights: jax.Array) -> jax.Array:
    """Whether a float observation the loss reads is NaN or infinite: a step of an entry of weight > 0 before its
    episode's end (`elite_loss.without_unused_observations` zeroes the others)."""
    used = (weights > 0)[:, None] & trajectories.alive  # [M, T]
    flags = [
        jnp.any(used & ~jnp.all(jnp.isfinite(leaf).reshape(*used.shape, -1), axis=-1))
        for leaf in jax.tree.leaves(trajectories.observation)
        if jnp.issubdtype(leaf.dtype, jnp.inexact)
    ]
    return jnp.any(jnp.stack(flags)) if flags else jnp.zeros((), bool)


def _check_pool(config: UpdateConfig, pool: pool_lib.Pool) -> None:
    if not isinstance(pool, pool_lib.Pool) or pool.capacity != config.pool_capacity:
        capacity = pool.capacity if isinstance(pool, pool_lib.Pool) else type(pool).__name__
        raise ValueError(f"the update was built for a pool of capacity {config.pool_capacity}, got {capacity}.")


def make_update(
    apply_fn: ApplyFn, config: UpdateConfig, *, markov: bool = False, chunked: losses.ChunkedLogits | None = None
) -> Callable[..., tuple[PolicyState, dict[str, jax.Array]]]:
    """Builds the jitted FTW update `(state, pool, key[, sizes[, diagnose]]) -> (state, metrics)`.

    One call selects J·K elites (`select_elites`), computes

        L(θ) = mean over kept steps of [−log π_θ(a_t | h_t)] + β · mean of KL(π_θ ‖ π_ref)(h_t)

    (repeats counted; see `UpdateConfig` for the normalisation and KL options), and applies one step of
    `state.optimizer`. It is a no-op (params, optimizer state and version unchanged; `metrics["applied"]`
    False) while the pool holds fewer than C valid entries, when the loss or any gradient or update is not
    finite (`metrics["nonfinite"]` True), and when no elite is kept (possible under "beat_minimum"). The key
    is consumed. Its phases are `select`, the loss (`ftw_jax.core.elite_loss`), `apply_step` and the diagnostics.

    `sizes` (`Sizes`, int32 arrays) runs the update for those J, C, K inside the config's, which are then
    maxima (`select_elites_masked`): one compiled update serves a grid of sizes, e.g. vmapped in a sweep.
    Without it the config's sizes are used.

    `diagnose` (default True) asks for the diagnostics that read or run the policy on the whole pool: the
    pool's staleness, its histogram and the trust-region monitor (`make_pool_diagnostics`). Where it is False
    they are NaN (-1 for integers) and cost nothing; the step is the same. A training program that reports
    one update of several passes its loop index (`u == U - 1`): under vmap an unbatched flag still skips the
    work.

    Args:
      apply_fn: `apply_fn(params, observation) -> [T, A] logits` for one trajectory.
      config: the static sizes and options.
      markov: the policy's logits at a step depend on that step's observation alone (`policy.markov`). The
        loss then runs on the kept steps only, not on the padding after each episode's end
        (`make_stepwise_loss_and_grad`); without an importance-weight cap, which needs every step first.
      chunked: the policy's logits as a head over features (`losses.ChunkedLogits`), for the loss and the monitor to
        make a chunk of steps at a time: the same values, with one chunk's logits alive instead of all of them.

    Returns:
      The update, compiled as one jit (it traces once per pool/state structure).
    """
    if not isinstance(config, UpdateConfig):
        raise ValueError(f"config must be an UpdateConfig, got {type(config).__name__}.")
    loss_and_grad = make_loss_and_grad(apply_fn, config, markov=markov, chunked=chunked)
    pool_diagnostics = diagnostics.make_pool_diagnostics(
        apply_fn,
        monitor_entries=config.monitor_entries,
        monitor_discount=config.monitor_discount,
        histogram_bins=config.staleness_histogram_bins,
        chunked=chunked,
    )

    def update(
        state: PolicyState,
        pool: pool_lib.Pool,
        key: jax.Array,
        sizes: Sizes | None = None,
        diagnose: bool | jax.Array = True,
    ):
        _check_pool(config, pool)  # while tracing, so a mismatch fails before any work
        sizes, sizes_clamped = (Sizes.of(config) if sizes is None else sizes).within(config)
        selection = select(config, pool, state.version, key, sizes)
        (loss, (terms, log_weights, kept_steps)), grads = loss_and_grad(
            state.params, state.reference_params, state.kl_coef, selection.trajectories, selection.weights
        )
        ready = jnp.sum(selection.valid) >= sizes.batch_size
        # Nothing to learn from (no kept step of the policy's own): no step, as Adam's momentum would still move.
        new_state, applied, finite = apply_step(config, state, grads, loss, ready & (kept_steps > 0))
        metrics = {
            "loss": loss,
            **terms,
            **selection_metrics(pool, selection, log_weights, sizes, state.version),
            "grad_norm": optax.tree_utils.tree_norm(grads),
            "ready": ready,
            "nonfinite": ~finite,
            "applied": applied,
            "version": new_state.version,
            "sizes_clamped": sizes_clamped,
        }
        arguments = (state.params, new_state.params, pool, state.version)
        return new_state, {**metrics, **diagnostics.measured_if(diagnose, pool_diagnostics, *arguments)}

    jitted = jax.jit(update, static_argnames="diagnose")
    jitted_traced_flag = jax.jit(update)

    @functools.wraps(update)
    def checked_update(
        state: PolicyState,
        pool: pool_lib.Pool,
        key: jax.Array,
        sizes: Sizes | None = None,
        diagnose: bool | jax.Array = True,
    ):
        if sizes is not None:  # concrete sizes outside the maxima are refused before tracing
            sizes.check(config)
        if isinstance(diagnose, bool):
            return jitted(state, pool, key, sizes, diagnose=diagnose)
        return jitted_traced_flag(state, pool, key, sizes, diagnose)

    return checked_update

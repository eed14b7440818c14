"""The FTW update's loss on the kept trajectories (phase 2 of `ftw_jax.core.update`): cross-entropy on their actions
plus β·KL to the reference, averaged over their steps as `UpdateConfig` says, and its gradient.

    loss_and_grad = make_loss_and_grad(policy.apply, config, markov=policy.markov, chunked=policy.chunked_logits())
    (loss, (terms, log_weights, kept_steps)), grads = loss_and_grad(params, reference_params, kl_coef,
                                                                    trajectories, weights)

Three ways to the same loss: dense (`make_loss`, every step of every trajectory), chunked (the logits a chunk of
steps at a time, for a real vocabulary) and step-wise (`make_stepwise_loss_and_grad`, the kept steps alone, for
a Markov policy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from ftw_jax.core import diagnostics, losses, stepwise
from ftw_jax.core import pool as pool_lib
from ftw_jax.core.update_config import UpdateConfig

# apply_fn(params, observation) -> [T, A] logits for one trajectory's observation pytree (leaves [T, ...]).
ApplyFn = Callable[[Any, Any], Any]


def make_loss_and_grad(
    apply_fn: ApplyFn, config: UpdateConfig, *, markov: bool = False, chunked: losses.ChunkedLogits | None = None
) -> Callable[..., tuple[tuple[jax.Array, tuple[dict[str, jax.Array], jax.Array, jax.Array]], Any]]:
    """`value_and_grad` of the loss, `(params, reference_params, kl_coef, trajectories [M], weights [M]) ->
    ((loss, (terms, log importance weights [M], kept steps)), grads)`: step-wise for a Markov policy without an
    importance-weight cap (which needs every step first), else `make_loss`'s (chunked where given)."""
    if markov and config.importance_weight_cap is None:
        return make_stepwise_loss_and_grad(apply_fn, config)
    return jax.value_and_grad(make_loss(apply_fn, config, chunked), has_aux=True)


def without_unused_observations(trajectories: pool_lib.Trajectory, weights: jax.Array) -> pool_lib.Trajectory:
    """`trajectories` with the observations of steps that cannot reach the loss set to 0: every step of an entry
    of weight 0 and the padding after each episode's end. Their loss terms are 0 already, but a NaN among
    their inputs would still make the gradient NaN (0 × NaN in the backward pass) and skip the update."""
    used = (weights > 0)[:, None] & trajectories.alive  # [M, T]

    def zeroed(leaf):
        shaped = used.reshape(used.shape + (1,) * (leaf.ndim - used.ndim))
        return jnp.where(shaped, leaf, jnp.zeros((), leaf.dtype))

    return trajectories.replace(observation=jax.tree.map(zeroed, trajectories.observation))


def make_step_losses(
    apply_fn: ApplyFn, config: UpdateConfig, chunked: losses.ChunkedLogits | None = None
) -> Callable[[Any, Any, Any, jax.Array, jax.Array], dict[str, jax.Array]]:
    """`step_losses(params, reference_params, observations [M, T, ...], actions [M, T], mask [M, T]) ->
    {name: [M, T]}`: the cross-entropy, the configured KL and the entropy of each step (0 where masked out); with
    `chunked`, one model call over the batch, the logits made and used a chunk of steps at a time (the same
    values)."""

    def terms(logits, reference_logits, action, mask):
        chex.assert_rank(logits, 2)
        chex.assert_equal_shape((logits, reference_logits))
        if config.kl_direction == "policy_to_reference":
            kl = losses.categorical_kl(logits, reference_logits, mask)
        else:
            kl = losses.categorical_kl(reference_logits, logits, mask)
        return {
            "cross_entropy": -losses.log_likelihood(logits, action, mask),
            "kl": kl,
            "entropy": losses.entropy(logits, mask),
        }

    return losses.per_step_terms(apply_fn, terms, chunked)


def step_coefficients(config: UpdateConfig, step_weights: jax.Array) -> jax.Array:
    """[M, T] c such that the configured average of per-step values x is Σ c·x (steps of weight 0 get c = 0)."""
    if config.normalisation == "token":
        return step_weights / jnp.maximum(jnp.sum(step_weights), 1e-12)
    steps = jnp.sum(step_weights, axis=1, keepdims=True)
    trajectory_weights = jnp.where(steps > 0, jnp.max(step_weights, axis=1, keepdims=True), 0.0)
    return (
        step_weights / jnp.maximum(steps, 1e-12) * trajectory_weights / jnp.maximum(jnp.sum(trajectory_weights), 1e-12)
    )


def make_loss(
    apply_fn: ApplyFn, config: UpdateConfig, chunked: losses.ChunkedLogits | None = None
) -> Callable[
    [Any, Any, float | jax.Array, pool_lib.Trajectory, jax.Array],
    tuple[jax.Array, tuple[dict[str, jax.Array], jax.Array, jax.Array]],
]:
    """Phase 2: `loss(params, reference_params, kl_coef, trajectories [M], weights [M]) -> (loss, (terms,
    log importance weights [M], kept steps))`: cross-entropy + β·KL over the kept steps, averaged as configured
    (with `chunked`, the logits made a chunk of steps at a time: `make_step_losses`)."""
    step_losses = make_step_losses(apply_fn, config, chunked)

    def average(per_step, step_weights):
        """Weighted mean of [M, T] per-step values under the configured normalisation (a step of weight 0 adds
        0 even where its value is NaN)."""
        return jnp.sum(jnp.where(step_weights > 0, per_step, 0.0) * step_coefficients(config, step_weights))

    def loss(params, reference_params, kl_coef, trajectories, weights):
        trajectories = without_unused_observations(trajectories, weights)
        per_step = step_losses(
            params, reference_params, trajectories.observation, trajectories.action, trajectories.mask
        )
        log_weights = diagnostics.log_importance_ratio(  # [M] log π_θ(τ) / q(τ), no gradient through it
            jax.lax.stop_gradient(-per_step["cross_entropy"]), trajectories.behaviour_logp, trajectories.mask
        )
        if config.importance_weight_cap is not None:
            weights = weights * jnp.minimum(jnp.exp(log_weights), config.importance_weight_cap)
        step_weights = weights[:, None] * trajectories.mask
        terms = {name: average(value, step_weights) for name, value in per_step.items()}
        kept_steps = jnp.sum(step_weights > 0)  # 0: nothing to learn from
        return terms["cross_entropy"] + kl_coef * terms["kl"], (terms, log_weights, kept_steps)

    return loss


def make_stepwise_loss_and_grad(
    apply_fn: ApplyFn, config: UpdateConfig
) -> Callable[
    [Any, Any, float | jax.Array, pool_lib.Trajectory, jax.Array],
    tuple[tuple[jax.Array, tuple[dict[str, jax.Array], jax.Array, jax.Array]], Any],
]:
    """Phase 2 for a Markov policy (a step's logits depend on its own observation only): `value_and_grad` of
    `make_loss`, `(params, reference_params, kl_coef, trajectories [M], weights [M]) -> ((loss, aux), grads)`,
    run on the kept steps alone (`stepwise.stepwise_value_and_grad`: the loss is Σ_s c_s·ℓ_s over steps,
    `step_coefficients`). The padding after each episode's end and the entries of weight 0 cost nothing (and
    their inputs, never run, need no zeroing). The same loss and gradient as `make_loss`, up to the order of
    float sums."""
    step_losses = make_step_losses(apply_fn, config)

    def loss_and_grad(params, reference_params, kl_coef, trajectories, weights):
        step_weights = weights[:, None] * trajectories.mask  # [M, T]
        coefficients, observation, action = stepwise.flat_steps(
            (step_coefficients(config, step_weights), trajectories.observation, trajectories.action)
        )

        def chunk_loss(params, steps, in_chunk):
            c = jnp.where(in_chunk, coefficients[steps], 0.0)
            observed = jax.tree.map(lambda leaf: leaf[steps][None], observation)  # the chunk as one sequence
            per_step = jax.tree.map(
                lambda value: value[0],
                step_losses(params, reference_params, observed, action[steps][None], (c > 0)[None]),
            )
            terms = {name: jnp.sum(jnp.where(c > 0, value, 0.0) * c) for name, value in per_step.items()}
            return terms["cross_entropy"] + kl_coef * terms["kl"], (terms, -per_step["cross_entropy"])

        kept = stepwise.flat_steps(step_weights > 0)
        (loss, (terms, log_probs)), grads = stepwise.stepwise_value_and_grad(chunk_loss, params, kept)
        log_weights = diagnostics.log_importance_ratio(  # [M]; 0 for an entry of weight 0 (its steps not run)
            log_probs.reshape(trajectories.mask.shape), trajectories.behaviour_logp, step_weights > 0
        )
        return (loss, (terms, log_weights, jnp.sum(kept, dtype=jnp.int32))), grads

    return loss_and_grad

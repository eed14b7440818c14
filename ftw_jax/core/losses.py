"""Per-step losses on one trajectory: masked log-likelihood, exact categorical KL, entropy.

Functions act on one trajectory ([T, A] logits); batch with `jax.vmap`. They return per-step values with
masked steps set to zero and leave the averaging to the caller (the update).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp


def log_likelihood(logits: jax.Array, actions: jax.Array, mask: jax.Array) -> jax.Array:
    """log π(a_t | h_t) on the policy's own steps, 0 elsewhere.

    Args:
      logits: [T, A] policy logits.
      actions: [T] int actions.
      mask: [T] bool, True on the steps that count.

    Returns:
      [T] masked log-probabilities (the negative is the per-step cross-entropy); NaN on a counted step whose
      action is outside [0, A), so that a bad action id fails the step instead of training another action.
    """
    chex.assert_rank(logits, 2)
    chex.assert_shape((actions, mask), (logits.shape[0],))
    log_probs = jax.nn.log_softmax(logits)
    in_range = (actions >= 0) & (actions < logits.shape[-1])
    chosen = jnp.take_along_axis(log_probs, jnp.where(in_range, actions, 0)[:, None], axis=-1)[:, 0]
    return jnp.where(mask, jnp.where(in_range, chosen, jnp.nan), 0.0)


def categorical_kl(p_logits: jax.Array, q_logits: jax.Array, mask: jax.Array) -> jax.Array:
    """Exact KL(p ‖ q) = Σ_a p(a) (log p(a) − log q(a)) per step, 0 on masked-out steps.

    Both directions come from the argument order: KL(π ‖ π_ref) is `categorical_kl(policy, reference, m)`,
    KL(π_ref ‖ π) is `categorical_kl(reference, policy, m)`. Actions with p(a) = 0 contribute 0.

    Args:
      p_logits: [T, A].
      q_logits: [T, A].
      mask: [T] bool.

    Returns:
      [T] non-negative KL per step.
    """
    chex.assert_rank(p_logits, 2)
    chex.assert_equal_shape((p_logits, q_logits))
    chex.assert_shape(mask, (p_logits.shape[0],))
    log_p = jax.nn.log_softmax(p_logits)
    log_q = jax.nn.log_softmax(q_logits)
    p = jnp.exp(log_p)
    kl = jnp.sum(jnp.where(p > 0, p * (log_p - log_q), 0.0), axis=-1)
    return jnp.where(mask, kl, 0.0)


def entropy(logits: jax.Array, mask: jax.Array) -> jax.Array:
    """Policy entropy −Σ_a π(a) log π(a) per step, 0 on masked-out steps. [T, A] -> [T]."""
    chex.assert_rank(logits, 2)
    chex.assert_shape(mask, (logits.shape[0],))
    log_p = jax.nn.log_softmax(logits)
    value = -jnp.sum(jnp.where(log_p > -jnp.inf, jnp.exp(log_p) * log_p, 0.0), axis=-1)
    return jnp.where(mask, value, 0.0)


class ChunkedLogits(NamedTuple):
    """A policy whose logits are a head over per-step features, computed for a batch of sequences in one call
    (one model call over [M, T] tokens, not M calls under `vmap`: XLA's CPU programs were 1.3× slower vmapped),
    `chunk` steps of every sequence at a time (`map_chunks`; 0: all steps at once): an LM's [M, T, V] logits
    over a real vocabulary outweigh the rest of the step, and in chunks only one chunk's [M, chunk, V] is alive.
    `head(params, features(params, observations))[m]` equals `apply_fn(params, observations[m])`."""

    features: Callable[[Any, Any], Any]  # (params, observations [M, T, ...]) -> the head's inputs, leaves [M, T, ...]
    head: Callable[[Any, Any], jax.Array]  # (params, inputs with leaves [M, n, ...]) -> logits [M, n, A]
    chunk: int  # steps per chunk (0: the whole sequence)


def map_chunks(fn: Callable[..., Any], chunk: int, *per_step: Any) -> Any:
    """`fn` over consecutive chunks of `chunk` steps of a batch's per-step inputs (pytrees of leaves [M, T, ...]),
    its outputs (leaves [M, chunk, ...]) joined back to [M, T, ...]. The last chunk is padded with zeros (a False
    mask), and each chunk is recomputed in the backward pass (`jax.checkpoint`), so what `fn` makes inside — a
    chunk's logits [M, chunk, A] over a whole vocabulary — is alive for one chunk at a time, forward and backward."""
    num_steps = jax.tree.leaves(per_step)[0].shape[1]
    num_chunks = -(-num_steps // chunk)

    def split(leaf):  # [M, T, ...] -> [chunks, M, chunk, ...]
        padded = jnp.pad(leaf, [(0, 0), (0, num_chunks * chunk - num_steps)] + [(0, 0)] * (leaf.ndim - 2))
        return jnp.moveaxis(padded.reshape(leaf.shape[:1] + (num_chunks, chunk) + leaf.shape[2:]), 1, 0)

    def join(leaf):  # [chunks, M, chunk, ...] -> [M, T, ...]
        joined = jnp.moveaxis(leaf, 0, 1)
        return joined.reshape(joined.shape[:1] + (num_chunks * chunk,) + joined.shape[3:])[:, :num_steps]

    out = jax.lax.map(lambda chunks: jax.checkpoint(fn)(*chunks), jax.tree.map(split, per_step))
    return jax.tree.map(join, out)


def filled_reference(reference_params: Any, params: Any) -> Any:
    """The KL's reference params with the params' own (without a gradient) where it holds None: the leaves it
    shares with the policy, stored once (`PolicyState.create`'s `frozen`)."""
    return jax.tree.map(
        lambda reference, own: jax.lax.stop_gradient(own) if reference is None else reference,
        reference_params,
        params,
        is_leaf=lambda node: node is None,
    )


def per_step_terms(
    apply_fn: Callable[[Any, Any], jax.Array],
    terms: Callable[..., Any],
    chunked: ChunkedLogits | None = None,
) -> Callable[..., Any]:
    """`step_terms(params, reference_params, observations [M, T, ...], *per_step [M, T]) -> leaves [M, T]`:
    `terms(logits, reference_logits, *per_step)` of each sequence, the reference's logits without a gradient
    (`reference_params` None: `reference_logits` None, and no reference pass). Without `chunked`, `apply_fn` runs
    on one sequence at a time under `vmap`; with it, the model runs once on the batch and the logits are made and
    used `chunked.chunk` steps at a time (`map_chunks`): the same values."""

    def reference(logits_of, reference_params, inputs):
        return None if reference_params is None else jax.lax.stop_gradient(logits_of(reference_params, inputs))

    def sequence_terms(params, reference_params, observation, *per_step):
        return terms(apply_fn(params, observation), reference(apply_fn, reference_params, observation), *per_step)

    def step_terms(params, reference_params, observations, *per_step):
        if reference_params is not None:
            reference_params = filled_reference(reference_params, params)
        if chunked is None:
            in_axes = (None, None) + (0,) * (1 + len(per_step))
            return jax.vmap(sequence_terms, in_axes=in_axes)(params, reference_params, observations, *per_step)
        features, head = chunked.features(params, observations), chunked.head
        reference_features = reference(chunked.features, reference_params, observations)

        def chunk_terms(features, reference_features, *per_step):
            reference_logits = None if reference_features is None else head(reference_params, reference_features)
            return jax.vmap(terms)(head(params, features), reference_logits, *per_step)

        if not chunked.chunk:
            return chunk_terms(features, reference_features, *per_step)
        return map_chunks(chunk_terms, chunked.chunk, features, reference_features, *per_step)

    return step_terms

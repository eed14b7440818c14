"""The gradient of a loss summed over steps, taken on the steps that count alone.

    (value, (sums, per_step)), grads = stepwise_value_and_grad(chunk_loss, params, counted)

For a Markov policy (a step's logits depend on that step's observation only) a loss of the form Σ_s c_s·ℓ_s
over the steps of [M, T] trajectories does not need the trajectories whole: its gradient is a sum over any
split of the steps. The padding after each episode's end and the steps of weight 0 then cost nothing, where
a pass over [M, T] pays for every episode as long as the longest. The FTW loss and the baselines' policy and
critic steps take this path for Markov policies; the same values as the dense pass, up to the order of float sums.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

# The counted steps run in at most this many chunks of equal size: fewer chunks pay the loop's fixed cost
# fewer times, more run fewer filler steps in the last one. 8 was the fastest of 4, 8 and 16 for FTW on CartPole
# and Sokoban and for PPO on CartPole (2-core CPU, docs/results.md).
STEP_CHUNKS = 8


def flat_steps(tree: Any) -> Any:
    """Every leaf [B, T, ...] as [S, ...], S = B·T: the flat steps `stepwise_value_and_grad` indexes."""
    return jax.tree.map(lambda leaf: leaf.reshape((-1,) + leaf.shape[2:]), tree)


def stepwise_value_and_grad(
    chunk_loss: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, tuple[Any, Any]]],
    params: Any,
    counted: jax.Array,
    num_chunks: int = STEP_CHUNKS,
) -> tuple[tuple[jax.Array, tuple[Any, Any]], Any]:
    """`value_and_grad` of a loss summed over the steps where `counted` is True, a chunk of them at a time.

    Args:
      chunk_loss: `(params, steps [n], in_chunk [n]) -> (value, (sums, per_step))` on the flat steps `steps`
        (indices into [S]); those with `in_chunk` False are filler (the first counted step again) and must add
        nothing (weight them 0). `value` and the leaves of `sums` are scalars that add up over chunks; the
        leaves of `per_step` are [n].
      params: what the gradient is taken with respect to.
      counted: [S] bool, the steps the loss is summed over, taken in their order in chunks of
        n = ⌈S / num_chunks⌉ by a `while_loop` that stops after the chunk holding the last one.

    Returns:
      ((value, (sums, per_step)), grads) as `jax.value_and_grad(..., has_aux=True)` returns them, with
      `per_step` leaves [S] (each step's own value, 0 where not counted).
    """
    size = counted.shape[0]
    chunk = -(-size // num_chunks)
    num_counted = jnp.sum(counted, dtype=jnp.int32)
    # The counted steps' indices first, in order (the rest of `order` is never read): a scatter, where a stable
    # argsort of `~counted` took 5x as long on a CPU.
    place = jnp.where(counted, jnp.cumsum(counted, dtype=jnp.int32) - 1, num_chunks * chunk)
    order = jnp.zeros(num_chunks * chunk, jnp.int32).at[place].set(jnp.arange(size, dtype=jnp.int32), mode="drop")
    value_and_grad = jax.value_and_grad(chunk_loss, has_aux=True)

    def body(carry):
        index, value, (sums, per_step), grads = carry
        start = index * chunk
        in_chunk = start + jnp.arange(chunk) < num_counted
        # Filler repeats the first counted step: an uncounted step's inputs (NaN past an episode's end, say)
        # would reach the gradient as 0 × NaN.
        steps = jnp.where(in_chunk, jax.lax.dynamic_slice(order, (start,), (chunk,)), order[0])
        (chunk_value, (chunk_sums, chunk_per_step)), chunk_grads = value_and_grad(params, steps, in_chunk)
        per_step = jax.tree.map(
            lambda total, part: total.at[steps].add(jnp.where(in_chunk, part, jnp.zeros((), part.dtype))),
            per_step,
            chunk_per_step,
        )
        sums = jax.tree.map(jnp.add, sums, chunk_sums)
        return index + 1, value + chunk_value, (sums, per_step), jax.tree.map(jnp.add, grads, chunk_grads)

    value_spec, (sums_spec, per_step_spec) = jax.eval_shape(
        chunk_loss, params, order[:chunk], jnp.zeros((chunk,), bool)
    )
    zeros = lambda spec: jnp.zeros(spec.shape, spec.dtype)  # noqa: E731
    every_step = lambda spec: jnp.zeros((size,) + spec.shape[1:], spec.dtype)  # noqa: E731  [n, ...] -> [S, ...]
    start = (
        jnp.zeros((), jnp.int32),
        zeros(value_spec),
        (jax.tree.map(zeros, sums_spec), jax.tree.map(every_step, per_step_spec)),
        jax.tree.map(jnp.zeros_like, params),
    )
    _, value, aux, grads = jax.lax.while_loop(lambda carry: carry[0] * chunk < num_counted, body, start)
    return (value, aux), grads

"""The policy-gradient step the baselines share: a surrogate on advantages + β·KL, one step if finite.

REINFORCE, GRPO and PPO (`ftw_jax.algos.reinforce`, `.grpo`, `.ppo`) learn from the batch of B episodes
just played, not from a pool. Losses average over the policy's own steps (mask True), as FTW's "token"
normalisation does. docs/baselines.md writes their maths out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax

from ftw_jax.algos.base import Context, Learner
from ftw_jax.core import diagnostics, losses, stepwise
from ftw_jax.core.pool import Trajectory
from ftw_jax.core.settings import setting
from ftw_jax.core.state import PolicyState

# The entropy bonuses `compare --search` tries for each of them (0: none, as REINFORCE and TRL's GRPO run).
ENTROPY_COEFS = (0.0, 0.01)

ADVANTAGE_EPSILON = 1e-6


def clip_epsilon_setting() -> Any:
    """ε, declared by the clipped-ratio baselines."""
    return setting(0.2, "the ratio clip of GRPO and PPO (and PPO's value clip)")


def entropy_coef_setting(default: float = 0.0) -> Any:
    """The entropy bonus's weight, declared by every baseline (PPO's references use 0.01, TRL's GRPO none)."""
    return setting(
        default,
        "the entropy bonus's weight: the loss subtracts it times the policy's mean entropy "
        "(baselines; PPO's default 0.01 as its references, REINFORCE's and GRPO's 0)",
    )


class BatchLearnerState(flax.struct.PyTreeNode):
    """A learner that keeps nothing but its policy between batches (REINFORCE, GRPO)."""

    policy: PolicyState


def mean_baseline_advantages(returns: jax.Array) -> jax.Array:
    """R_i − mean(R) over the batch. [B] -> [B]."""
    chex.assert_rank(returns, 1)
    return returns - jnp.mean(returns)


def group_advantages(returns: jax.Array, group_size: int, *, normalise: bool = True) -> jax.Array:
    """(R_i − mean of its group) / (sd of its group + ε), or without the division. Groups are consecutive.

    Args:
      returns: [B] with B a multiple of `group_size`.
      group_size: G.
      normalise: divide by the group's standard deviation (GRPO as published) or not.

    Returns:
      [B]; a group of equal returns gets advantage 0 either way.
    """
    chex.assert_rank(returns, 1)
    if returns.shape[0] % group_size:
        raise ValueError(f"B={returns.shape[0]} returns do not split into groups of G={group_size}.")
    grouped = returns.reshape(-1, group_size)
    centred = grouped - jnp.mean(grouped, axis=1, keepdims=True)
    if normalise:
        centred = centred / (jnp.std(grouped, axis=1, keepdims=True) + ADVANTAGE_EPSILON)
    return centred.reshape(-1)


def k3_kl(log_probs: jax.Array, reference_log_probs: jax.Array) -> jax.Array:
    """The k3 estimate of KL(π ‖ π_ref) at actions sampled from π: exp(d) − d − 1, d = log π_ref − log π.

    Its value is unbiased for KL(π ‖ π_ref) when the actions come from π, and never negative. Its gradient is
    not that KL's: differentiated with the sampled actions held fixed (as GRPO does), ∇k3 = (1 − π_ref/π) ∇log π,
    whose expectation under π is −Σ π_ref ∇log π = ∇KL(π_ref ‖ π), the reverse direction. After the first of
    several steps on one batch the actions come from the behaviour policy, not π, and neither holds exactly.
    Elementwise.
    """
    difference = reference_log_probs - log_probs
    return jnp.exp(difference) - difference - 1.0


def clipped_surrogate(
    log_probs: jax.Array, behaviour_log_probs: jax.Array, advantages: jax.Array, clip_epsilon: float
) -> jax.Array:
    """PPO's per-step loss −min(r A, clip(r, 1 − ε, 1 + ε) A) with r = exp(log π − log q). Elementwise."""
    ratio = jnp.exp(log_probs - behaviour_log_probs)
    clipped = jnp.clip(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon)
    return -jnp.minimum(ratio * advantages, clipped * advantages)


def _advantage_abs_mean(advantages: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean |A| over trajectories [B], or over the policy's steps for per-step advantages [B, T]."""
    if advantages.ndim == 2:
        return jnp.sum(jnp.where(mask, jnp.abs(advantages), 0.0)) / jnp.maximum(jnp.sum(mask), 1)
    return jnp.mean(jnp.abs(advantages))


def make_policy_gradient_update(
    apply_fn: Callable[[Any, Any], jax.Array],
    *,
    clip_epsilon: float | None = None,
    kl_estimate: Literal["exact", "k3"] | None = "exact",
    entropy_coef: float = 0.0,
    chunked: losses.ChunkedLogits | None = None,
    markov: bool = False,
) -> Callable[[PolicyState, Trajectory, jax.Array], tuple[PolicyState, dict]]:
    """`update(state, batch, advantages) -> (state, metrics)`: one gradient step on a batch of B trajectories.

    loss = surrogate + β·KL − entropy_coef·entropy, each averaged over the policy's steps. The surrogate is
    −A·log π (plain policy gradient), or the clipped ratio to the behaviour policy when `clip_epsilon` is
    given; the KL to `state.reference_params` is KL(π ‖ π_ref) exact from the logits ("exact", its gradient
    that KL's), the k3 estimate at the sampled actions ("k3", whose gradient follows KL(π_ref ‖ π): see
    `k3_kl`), or none (None: the KL is paid in the rewards, PPO's `kl_in_reward`; no reference pass).
    `advantages` are [B] per trajectory or [B, T] per step (PPO). With `chunked` (an LM over a real vocabulary)
    the logits are made a chunk of steps at a time; with `markov` (a policy whose logits at a step depend on
    that step's observation only) the policy's steps alone are run, not the padding after each episode's end
    (`stepwise`). A step whose loss, gradients or updates are not finite is skipped (`metrics["applied"]`
    False), as in the FTW update.
    """

    def terms(logits, reference_logits, action, mask):
        log_probs = losses.log_likelihood(logits, action, mask)
        if kl_estimate is None:
            kl = jnp.zeros_like(log_probs)
        elif kl_estimate == "k3":
            reference_log_probs = losses.log_likelihood(reference_logits, action, mask)
            kl = jnp.where(mask, k3_kl(log_probs, reference_log_probs), 0.0)
        else:
            kl = losses.categorical_kl(logits, reference_logits, mask)
        return {"log_probs": log_probs, "kl": kl, "entropy": losses.entropy(logits, mask)}

    step_terms = losses.per_step_terms(apply_fn, terms, chunked)

    def summed_loss(per_step, behaviour_logp, advantages, counted, steps, kl_coef):
        """(loss, terms): each term the sum over the `counted` steps given / `steps`, the batch's policy steps
        (so the sums over any split of the batch add up to its averages)."""
        log_probs = per_step["log_probs"]
        if clip_epsilon is not None:
            surrogate = clipped_surrogate(log_probs, behaviour_logp, advantages, clip_epsilon)
        else:
            surrogate = -advantages * log_probs
        total = lambda values: jnp.sum(jnp.where(counted, values, 0.0)) / steps  # noqa: E731
        terms = {"surrogate": total(surrogate), "kl": total(per_step["kl"]), "entropy": total(per_step["entropy"])}
        terms["log_ratio"] = jax.lax.stop_gradient(total(log_probs - behaviour_logp))  # 0: on-policy
        return terms["surrogate"] + kl_coef * terms["kl"] - entropy_coef * terms["entropy"], terms

    loss_and_grad = make_loss_and_grad(step_terms, summed_loss, stepwise_steps=markov and chunked is None)

    def update(state: PolicyState, batch: Trajectory, advantages: jax.Array):
        reference_params = None if kl_estimate is None else state.reference_params
        (loss, (terms, log_probs)), grads = loss_and_grad(
            state.params, reference_params, state.kl_coef, batch, advantages
        )
        log_weights = diagnostics.log_importance_ratio(log_probs, batch.behaviour_logp, batch.mask)
        ones = jnp.ones_like(log_weights)  # the sampler gap of every episode the current version wrote
        gap = diagnostics.sampler_gap(log_weights, ones, batch.behaviour_version, batch.mask, state.version)
        new_state, applied, _ = state.apply_if_finite(grads, loss)
        metrics = {
            "loss": loss,
            **terms,
            "advantage_abs_mean": _advantage_abs_mean(advantages, batch.mask),
            **gap,
            "grad_norm": optax.tree_utils.tree_norm(grads),
            "applied": applied,
            "version": new_state.version,
        }
        return new_state, metrics

    return update


def make_loss_and_grad(
    step_terms: Callable[..., dict], summed_loss: Callable[..., tuple[jax.Array, dict]], stepwise_steps: bool
) -> Callable[..., tuple[tuple[jax.Array, tuple[dict, jax.Array]], Any]]:
    """`loss_and_grad(params, reference_params, kl_coef, batch, advantages) -> ((loss, (terms, log-probs [B, T])),
    grads)` of the policy-gradient loss: over the whole [B, T] batch, or with `stepwise_steps` (a Markov policy)
    over the policy's steps alone, a chunk at a time (`stepwise`). `step_terms` and `summed_loss` are
    `make_policy_gradient_update`'s."""

    def per_step_advantages(batch: Trajectory, advantages):  # [B] or [B, T] -> [B, T]
        return jnp.broadcast_to(advantages if advantages.ndim == 2 else advantages[:, None], batch.mask.shape)

    def dense_loss_and_grad(params, reference_params, kl_coef, batch: Trajectory, advantages):
        steps = jnp.maximum(jnp.sum(batch.mask), 1)

        def loss_fn(params):
            per_step = step_terms(params, reference_params, batch.observation, batch.action, batch.mask)
            chex.assert_equal_shape((per_step["log_probs"], batch.mask))
            step_advantages = per_step_advantages(batch, advantages)
            loss, terms = summed_loss(per_step, batch.behaviour_logp, step_advantages, batch.mask, steps, kl_coef)
            return loss, (terms, jax.lax.stop_gradient(per_step["log_probs"]))

        return jax.value_and_grad(loss_fn, has_aux=True)(params)

    def stepwise_loss_and_grad(params, reference_params, kl_coef, batch: Trajectory, advantages):
        steps = jnp.maximum(jnp.sum(batch.mask), 1)
        observation, action, behaviour_logp, mask, step_advantages = stepwise.flat_steps(
            (batch.observation, batch.action, batch.behaviour_logp, batch.mask, per_step_advantages(batch, advantages))
        )

        def chunk_loss(params, chunk, in_chunk):
            counted = in_chunk & mask[chunk]
            observed = jax.tree.map(lambda leaf: leaf[chunk][None], observation)  # the chunk as one sequence
            per_step = step_terms(params, reference_params, observed, action[chunk][None], counted[None])
            per_step = jax.tree.map(lambda value: value[0], per_step)
            loss, terms = summed_loss(per_step, behaviour_logp[chunk], step_advantages[chunk], counted, steps, kl_coef)
            return loss, (terms, jax.lax.stop_gradient(per_step["log_probs"]))

        (loss, (terms, log_probs)), grads = stepwise.stepwise_value_and_grad(chunk_loss, params, mask)
        return (loss, (terms, log_probs.reshape(batch.mask.shape))), grads

    return stepwise_loss_and_grad if stepwise_steps else dense_loss_and_grad


def repeated_steps_learner(
    context: Context,
    update: Callable[[PolicyState, Trajectory, jax.Array], tuple[PolicyState, dict]],
    advantages: Callable[[jax.Array], jax.Array],
    steps: int,
    group_size: int = 1,
) -> Learner:
    """A learner that takes `steps` updates on each batch, all with the advantages of the batch's returns
    (REINFORCE's and GRPO's; metrics [steps])."""

    def init(key, observation, hyperparameters, start=None):
        return BatchLearnerState(policy=context.init_policy(key, observation, hyperparameters, start))

    def learn(state, batch, key, hyperparameters):
        batch_advantages = advantages(batch.episode_return)
        policy, metrics = jax.lax.scan(
            lambda policy, _: update(policy, batch, batch_advantages), state.policy, None, length=steps
        )
        return BatchLearnerState(policy=policy), metrics

    return Learner(init=init, learn=learn, group_size=group_size, steps_per_batch=steps)

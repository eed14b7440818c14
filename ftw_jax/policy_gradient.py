"""Policy-gradient baselines on the same rollouts: REINFORCE with a mean baseline, GRPO and PPO.

All learn from the batch of B episodes just played (no pool). REINFORCE and GRPO take per-trajectory
advantages from the terminal returns; PPO per-step advantages from a critic:

- REINFORCE: A_i = R_i − mean(R) over the batch; loss = −A_i · log π(a_t | h_t) + β · KL(π ‖ π_ref) (exact,
  as FTW's), one gradient step per batch.
- GRPO: the B episodes come in B / G groups of G that share a start state (the same reset key);
  A_i = (R_i − mean_group) / (std_group + ε), or un-normalised R_i − mean_group. U clipped-surrogate steps on
  the batch, ratio r_t = π(a_t | h_t) / q(a_t | h_t) against the behaviour policy, plus β times the k3
  estimate of KL(π ‖ π_ref) at the sampled actions: exp(log π_ref − log π) − (log π_ref − log π) − 1.
- PPO: a critic V (a network of the policy's architecture with one output) gives per-step advantages by
  GAE(γ, λ) over the steps' rewards (`gae_advantages`), normalised over the batch's policy steps; U epochs
  of full-batch steps, each a clipped-surrogate step of the policy (+ β · exact KL, as FTW's) and a
  squared-error step of the critic towards the GAE returns. Critic values come from before the epochs.

Losses average over the policy's own steps (mask True), as FTW's "token" normalisation does. The state
is `FTWState` (params, optimizer, reference, β, version), so the training program, checkpoints and sweeps
treat every algorithm alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState

from ftw_jax import losses
from ftw_jax.pool import Trajectory
from ftw_jax.update import FTWState, all_finite, select_tree

ALGORITHMS = ("ftw", "reinforce", "grpo", "ppo")
ADVANTAGE_EPSILON = 1e-6


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

    Unbiased, and never negative. Elementwise.
    """
    difference = reference_log_probs - log_probs
    return jnp.exp(difference) - difference - 1.0


def clipped_surrogate(log_probs: jax.Array, behaviour_log_probs: jax.Array, advantages: jax.Array,
                      clip_epsilon: float) -> jax.Array:
    """PPO's per-step loss −min(r A, clip(r, 1 − ε, 1 + ε) A) with r = exp(log π − log q). Elementwise."""
    ratio = jnp.exp(log_probs - behaviour_log_probs)
    clipped = jnp.clip(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon)
    return -jnp.minimum(ratio * advantages, clipped * advantages)


def gae_advantages(rewards: jax.Array, alive: jax.Array, values: jax.Array, *, discount: float,
                   gae_lambda: float) -> jax.Array:
    """Per-step GAE(γ, λ) advantages of B episodes, 0 after each episode's end (Schulman et al. 2016).

    Backwards in time: δ_t = r_t + γ c_t V(h_{t+1}) − V(h_t) and A_t = δ_t + γ λ c_t A_{t+1}, where c_t says
    the episode goes on after step t (one `lax.scan`).

    Args:
      rewards: [B, T] each step's reward.
      alive: [B, T] steps before the episode's end; the last alive step is terminal (nothing after it is
        bootstrapped, so an episode cut by the step limit counts as ended, as the environments define it).
      values: [B, T] the critic's V(h_t).
      discount, gae_lambda: γ and λ.

    Returns:
      [B, T]; the value targets are these plus `values`.
    """
    chex.assert_equal_shape((rewards, alive, values))
    goes_on = jnp.concatenate([alive[:, 1:], jnp.zeros_like(alive[:, :1])], axis=1).astype(rewards.dtype)  # c_t
    next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
    deltas = rewards + discount * goes_on * next_values - values

    def backwards(following, step):  # [B] A_{t+1} -> A_t
        delta, continues = step
        advantage = delta + discount * gae_lambda * continues * following
        return advantage, advantage

    _, advantages = jax.lax.scan(backwards, jnp.zeros_like(rewards[:, 0]), (deltas.T, goes_on.T), reverse=True)
    return jnp.where(alive, advantages.T, 0.0)


def normalised(values: jax.Array, mask: jax.Array) -> jax.Array:
    """(values − mean) / (sd + ε) with mean and sd over the masked entries; 0 elsewhere."""
    count = jnp.maximum(jnp.sum(mask), 1)
    mean = jnp.sum(jnp.where(mask, values, 0.0)) / count
    sd = jnp.sqrt(jnp.sum(jnp.where(mask, (values - mean) ** 2, 0.0)) / count)
    return jnp.where(mask, (values - mean) / (sd + ADVANTAGE_EPSILON), 0.0)


@dataclasses.dataclass(frozen=True)
class PolicyGradientConfig:
    """Static choices of a policy-gradient update; validated on construction."""

    algorithm: str = "grpo"  # "reinforce", "grpo" or "ppo"
    group_size: int = 8  # G (GRPO)
    normalise_advantages: bool = True  # GRPO: divide by the group's sd
    clip_epsilon: float = 0.2  # GRPO and PPO
    discount: float = 1.0  # γ (PPO)
    gae_lambda: float = 0.95  # λ (PPO)

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS[1:]:
            raise ValueError(f"algorithm must be one of {ALGORITHMS[1:]}, got {self.algorithm!r}.")
        if not (isinstance(self.group_size, int) and self.group_size >= 2):
            raise ValueError(f"group_size must be an int >= 2, got {self.group_size!r}.")
        if not 0 < self.clip_epsilon < 1:
            raise ValueError(f"clip_epsilon must be in (0, 1), got {self.clip_epsilon!r}.")
        for name in ("discount", "gae_lambda"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}.")


def make_policy_gradient_update(apply_fn: Callable[[Any, Any], jax.Array], config: PolicyGradientConfig):
    """`update(state, batch, advantages) -> (state, metrics)`: one gradient step on a batch of B trajectories.

    `advantages` are [B] per trajectory (`batch_advantages`) or [B, T] per step (PPO); a step whose loss, gradients or updates are not finite is
    skipped (`metrics["applied"]` False), as in the FTW update.
    """

    def per_trajectory(params, reference_params, trajectory):
        logits = apply_fn(params, trajectory.observation)
        reference_logits = jax.lax.stop_gradient(apply_fn(reference_params, trajectory.observation))
        log_probs = losses.log_likelihood(logits, trajectory.action, trajectory.mask)
        reference_log_probs = losses.log_likelihood(reference_logits, trajectory.action, trajectory.mask)
        if config.algorithm == "grpo":
            kl = jnp.where(trajectory.mask, k3_kl(log_probs, reference_log_probs), 0.0)
        else:
            kl = losses.categorical_kl(logits, reference_logits, trajectory.mask)
        return log_probs, kl, losses.entropy(logits, trajectory.mask)

    def loss_fn(params, reference_params, kl_coef, batch: Trajectory, advantages):
        log_probs, kl, entropy = jax.vmap(per_trajectory, in_axes=(None, None, 0))(params, reference_params, batch)
        chex.assert_equal_shape((log_probs, batch.mask))
        steps = jnp.maximum(jnp.sum(batch.mask), 1)
        per_step = advantages if advantages.ndim == 2 else advantages[:, None]
        if config.algorithm in ("grpo", "ppo"):
            surrogate = clipped_surrogate(log_probs, batch.behaviour_logp, per_step, config.clip_epsilon)
        else:
            surrogate = -per_step * log_probs
        mean = lambda per_step: jnp.sum(jnp.where(batch.mask, per_step, 0.0)) / steps  # noqa: E731
        terms = {"surrogate": mean(surrogate), "kl": mean(kl), "entropy": mean(entropy)}
        return terms["surrogate"] + kl_coef * terms["kl"], terms

    def update(state: FTWState, batch: Trajectory, advantages: jax.Array):
        (loss, terms), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state.reference_params, state.kl_coef, batch, advantages
        )
        updates, opt_state = state.optimizer.update(grads, state.opt_state, state.params)
        finite = jnp.isfinite(loss) & all_finite(grads) & all_finite(updates)
        new_state = state.replace(
            params=select_tree(finite, optax.apply_updates(state.params, updates), state.params),
            opt_state=select_tree(finite, opt_state, state.opt_state),
            version=state.version + finite.astype(jnp.int32),
        )
        steps = jnp.maximum(jnp.sum(batch.mask), 1)
        advantage_abs_mean = (jnp.sum(jnp.where(batch.mask, jnp.abs(advantages), 0.0)) / steps
                              if advantages.ndim == 2 else jnp.mean(jnp.abs(advantages)))
        metrics = {"loss": loss, **terms, "advantage_abs_mean": advantage_abs_mean,
                   "grad_norm": optax.tree_utils.tree_norm(grads), "applied": finite, "version": new_state.version}
        return new_state, metrics

    return update


def batch_advantages(config: PolicyGradientConfig, returns: jax.Array) -> jax.Array:
    """The algorithm's advantages of B returns (in group order for GRPO)."""
    if config.algorithm == "grpo":
        return group_advantages(returns, config.group_size, normalise=config.normalise_advantages)
    return mean_baseline_advantages(returns)


def create_critic(params: Any, optimizer: optax.GradientTransformation) -> TrainState:
    """The critic's params and optimizer state (a flax `TrainState`; its `apply_fn` is unused)."""
    return TrainState.create(apply_fn=None, params=params, tx=optimizer)


def make_critic_update(value_fn: Callable[[Any, Any], jax.Array]):
    """`update(critic, batch, targets) -> (critic, value_loss)`: one step on ½ (V(h_t) − target_t)² averaged over
    the alive steps. `value_fn(params, observation [T, ...]) -> [T]`; a non-finite step is skipped."""

    def loss_fn(params, batch: Trajectory, targets):
        values = jax.vmap(value_fn, in_axes=(None, 0))(params, batch.observation)
        chex.assert_equal_shape((values, targets))
        squared = jnp.where(batch.alive, 0.5 * (values - targets) ** 2, 0.0)
        return jnp.sum(squared) / jnp.maximum(jnp.sum(batch.alive), 1)

    def update(critic: TrainState, batch: Trajectory, targets: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(critic.params, batch, targets)
        stepped = critic.apply_gradients(grads=grads)
        finite = jnp.isfinite(loss) & all_finite(grads) & all_finite(stepped.params)
        return select_tree(finite, stepped, critic), loss

    return update


def ppo_advantages(config: PolicyGradientConfig, value_fn, critic_params, batch: Trajectory):
    """(advantages [B, T] normalised over the policy's steps, value targets [B, T]) for one PPO iteration."""
    values = jax.lax.stop_gradient(jax.vmap(value_fn, in_axes=(None, 0))(critic_params, batch.observation))
    advantages = gae_advantages(batch.reward, batch.alive, values, discount=config.discount,
                                gae_lambda=config.gae_lambda)
    return normalised(advantages, batch.mask), advantages + values

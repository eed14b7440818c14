"""PPO with a critic: GAE(γ, λ) advantages, U epochs each of one clipped policy step + β·KL (exact) and one
critic step.

The critic is a network of the policy's architecture with one output. Advantages are normalised over the
batch's policy steps; values and targets come from before the epochs; the critic fits ½ (V(h_t) − target_t)²
averaged over the alive steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax

from ftw_jax.algos.base import Algorithm, Context, Learner, updates_per_iteration_setting, with_learning_rate
from ftw_jax.algos.policy_gradient import ADVANTAGE_EPSILON, clip_epsilon_setting, make_policy_gradient_update
from ftw_jax.checks import check_positive_int
from ftw_jax.envs.base import WithLegalActions
from ftw_jax.pool import Trajectory
from ftw_jax.settings import check_settings, setting
from ftw_jax.state import PolicyState, apply_if_finite


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
class PPOConfig:
    updates_per_iteration: int = updates_per_iteration_setting()
    clip_epsilon: float = clip_epsilon_setting()
    discount: float = setting(1.0, "PPO: gamma")
    gae_lambda: float = setting(0.95, "PPO: GAE lambda")

    def __post_init__(self):
        check_settings(self)
        check_positive_int("updates_per_iteration", self.updates_per_iteration)
        if not 0 < self.clip_epsilon < 1:
            raise ValueError(f"clip_epsilon must be in (0, 1), got {self.clip_epsilon!r}.")
        for name in ("discount", "gae_lambda"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}.")


@flax.struct.dataclass
class Critic:
    params: Any
    opt_state: optax.OptState


@flax.struct.dataclass
class PPOLearnerState:
    policy: PolicyState
    critic: Critic


def without_legal_actions(observation):
    """A critic reads the observation only (legal-action masks shape logits, not values)."""
    return observation.observation if isinstance(observation, WithLegalActions) else observation


def make_critic_update(value_fn: Callable[[Any, Any], jax.Array], optimizer: optax.GradientTransformation):
    """`update(critic, batch, targets) -> (critic, value_loss)`: one step on ½ (V(h_t) − target_t)² averaged over
    the alive steps. `value_fn(params, observation [T, ...]) -> [T]`; a non-finite step is skipped."""

    def loss_fn(params, batch: Trajectory, targets):
        values = jax.vmap(value_fn, in_axes=(None, 0))(params, batch.observation)
        chex.assert_equal_shape((values, targets))
        squared = jnp.where(batch.alive, 0.5 * (values - targets) ** 2, 0.0)
        return jnp.sum(squared) / jnp.maximum(jnp.sum(batch.alive), 1)

    def update(critic: Critic, batch: Trajectory, targets: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(critic.params, batch, targets)
        params, opt_state, _, _ = apply_if_finite(optimizer, critic.params, critic.opt_state, grads, loss)
        return Critic(params=params, opt_state=opt_state), loss

    return update


def ppo_advantages(config: PPOConfig, value_fn, critic_params, batch: Trajectory):
    """(advantages [B, T] normalised over the policy's steps, value targets [B, T]) for one PPO iteration."""
    values = jax.lax.stop_gradient(jax.vmap(value_fn, in_axes=(None, 0))(critic_params, batch.observation))
    advantages = gae_advantages(batch.reward, batch.alive, values, discount=config.discount,
                                gae_lambda=config.gae_lambda)
    return normalised(advantages, batch.mask), advantages + values


def make_step(config: PPOConfig, apply_fn):
    """PPO's policy step: the clipped ratio to the behaviour policy + β·KL(π ‖ π_ref), exact."""
    return make_policy_gradient_update(apply_fn, clip_epsilon=config.clip_epsilon)


def make_learner(config: PPOConfig, context: Context) -> Learner:
    policy_update = make_step(config, context.policy.apply)
    critic_network = context.make_network(1)
    value_fn = lambda params, observation: critic_network.apply(  # noqa: E731
        params, without_legal_actions(observation))[:, 0]
    critic_update = make_critic_update(value_fn, context.optimizer)

    def init(key, observation, hyperparameters):
        policy_key, critic_key = jax.random.split(key)
        critic_params = critic_network.init(critic_key, without_legal_actions(observation))
        opt_state = with_learning_rate(context.optimizer.init(critic_params), hyperparameters.learning_rate)
        return PPOLearnerState(policy=context.init_policy(policy_key, observation, hyperparameters),
                               critic=Critic(params=critic_params, opt_state=opt_state))

    def learn(state: PPOLearnerState, batch, key, hyperparameters):
        advantages, targets = ppo_advantages(config, value_fn, state.critic.params, batch)

        def epoch(state, _):
            policy, metrics = policy_update(state.policy, batch, advantages)
            critic, value_loss = critic_update(state.critic, batch, targets)
            return PPOLearnerState(policy=policy, critic=critic), {**metrics, "value_loss": value_loss}

        return jax.lax.scan(epoch, state, None, length=config.updates_per_iteration)

    return Learner(init=init, learn=learn, steps_per_batch=config.updates_per_iteration)


ALGORITHM = Algorithm(name="ppo", config=PPOConfig, make_learner=make_learner)

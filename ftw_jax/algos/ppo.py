"""PPO with a critic, as CleanRL's and PureJaxRL's PPO run it: GAE(γ, λ) advantages, U epochs each of M
minibatch steps (the batch's trajectories shuffled and split), a clipped policy step + β·KL (exact) − the entropy
bonus, and a critic step on the (clipped) squared error.

The critic is a network of the policy's architecture with one output and its own optimizer state (the
references share one optimizer over both networks). Values, advantages and targets come from before the
epochs; advantages are normalised over each minibatch's policy steps; the critic fits ½ (V(h_t) − target_t)²,
or with `clip_value_loss` ½ max of that and the same for V_old + clip(V − V_old, ±ε), averaged over the alive steps.

For an LLM, as Search-R1 runs it (verl): `kl_in_reward` pays β (log q − log π_ref) per model token in the rewards
instead of the loss, the critic starts from the pretrained model under a fresh value head where the context
says so (`Context.critic_from_start`), and `critic_learning_rate_scale` sets its own learning rate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax

from ftw_jax.algos.base import Algorithm, Context, Learner, updates_per_iteration_setting, with_learning_rate
from ftw_jax.algos.policy_gradient import (
    ADVANTAGE_EPSILON,
    ENTROPY_COEFS,
    clip_epsilon_setting,
    entropy_coef_setting,
    make_policy_gradient_update,
)
from ftw_jax.core import losses, stepwise
from ftw_jax.core.actions import split_legal_actions
from ftw_jax.core.checks import check_non_negative, check_positive_int
from ftw_jax.core.losses import ChunkedLogits
from ftw_jax.core.pool import Trajectory
from ftw_jax.core.settings import check_settings, setting
from ftw_jax.core.state import PolicyState, apply_if_finite


def gae_advantages(
    rewards: jax.Array, alive: jax.Array, values: jax.Array, *, discount: float, gae_lambda: float
) -> jax.Array:
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


def minibatch_indices(key: jax.Array, batch_size: int, num_minibatches: int) -> jax.Array:
    """[M, B / M] trajectory indices: a random permutation of the B trajectories split into M minibatches."""
    if batch_size % num_minibatches:
        raise ValueError(f"B={batch_size} trajectories do not split into {num_minibatches} minibatches.")
    return jax.random.permutation(key, batch_size).reshape(num_minibatches, batch_size // num_minibatches)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    updates_per_iteration: int = updates_per_iteration_setting()
    num_minibatches: int = setting(
        4, "PPO: M minibatch steps per epoch, each on B/M of the batch's trajectories (CleanRL and PureJaxRL: 4)"
    )
    clip_epsilon: float = clip_epsilon_setting()
    clip_value_loss: bool = setting(
        True, "PPO: clip the critic's change from its pre-epoch values at clip_epsilon (as CleanRL and PureJaxRL)"
    )
    entropy_coef: float = entropy_coef_setting(0.01)
    discount: float = setting(1.0, "PPO: gamma")
    gae_lambda: float = setting(0.95, "PPO: GAE lambda")
    kl_in_reward: bool = setting(
        False,
        "PPO: pay the KL penalty in the rewards, beta (log q - log pi_ref) at each of the policy's steps, as "
        "Search-R1 and verl's PPO do, instead of beta KL(pi || pi_ref) in the loss",
    )
    critic_learning_rate_scale: float | None = setting(
        None, "PPO: the critic's learning rate is the policy's times this (Search-R1: 10, 1e-5 against 1e-6); None: 1"
    )

    def __post_init__(self):
        check_settings(self)
        check_positive_int("updates_per_iteration", self.updates_per_iteration)
        check_positive_int("num_minibatches", self.num_minibatches)
        check_non_negative("entropy_coef", self.entropy_coef)
        if not 0 < self.clip_epsilon < 1:
            raise ValueError(f"clip_epsilon must be in (0, 1), got {self.clip_epsilon!r}.")
        for name in ("discount", "gae_lambda"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}.")
        if self.critic_learning_rate_scale is not None and not self.critic_learning_rate_scale > 0:
            raise ValueError(
                f"critic_learning_rate_scale must be None or > 0, got {self.critic_learning_rate_scale!r}."
            )


class Critic(flax.struct.PyTreeNode):
    params: Any
    opt_state: optax.OptState


class PPOLearnerState(flax.struct.PyTreeNode):
    policy: PolicyState
    critic: Critic


def without_legal_actions(observation: Any) -> Any:
    """A critic reads the observation only (legal-action masks shape logits, not values)."""
    return split_legal_actions(observation)[0]


def make_critic_update(
    value_fn: Callable[[Any, Any], jax.Array],
    optimizer: optax.GradientTransformation,
    clip_epsilon: float | None = None,
    markov: bool = False,
) -> Callable[[Critic, Trajectory, jax.Array, jax.Array], tuple[Critic, jax.Array]]:
    """`update(critic, batch, targets, old_values) -> (critic, value_loss)`: one step on ½ (V(h_t) − target_t)²
    averaged over the alive steps; with `clip_epsilon` on ½ max((V − target)², (V_clipped − target)²) with
    V_clipped = V_old + clip(V − V_old, −ε, ε). `value_fn(params, observation [T, ...]) -> [T]`; with `markov`
    (V(h_t) reads observation t alone) only the alive steps are run (`stepwise`). A non-finite step is skipped."""

    def summed_loss(values, targets, old_values, counted, steps):
        """½ (squared error) summed over the `counted` steps given / `steps`, the batch's alive steps."""
        squared = (values - targets) ** 2
        if clip_epsilon is not None:
            clipped = old_values + jnp.clip(values - old_values, -clip_epsilon, clip_epsilon)
            squared = jnp.maximum(squared, (clipped - targets) ** 2)
        return jnp.sum(jnp.where(counted, 0.5 * squared, 0.0)) / steps

    def dense_loss_and_grad(params, batch: Trajectory, targets, old_values, steps):
        def loss_fn(params):
            values = jax.vmap(value_fn, in_axes=(None, 0))(params, batch.observation)
            chex.assert_equal_shape((values, targets, old_values))
            return summed_loss(values, targets, old_values, batch.alive, steps)

        return jax.value_and_grad(loss_fn)(params)

    def stepwise_loss_and_grad(params, batch: Trajectory, targets, old_values, steps):
        observation, alive, targets, old_values = stepwise.flat_steps(
            (batch.observation, batch.alive, targets, old_values)
        )

        def chunk_loss(params, chunk, in_chunk):
            values = value_fn(params, jax.tree.map(lambda leaf: leaf[chunk], observation))  # the chunk as one sequence
            loss = summed_loss(values, targets[chunk], old_values[chunk], in_chunk & alive[chunk], steps)
            return loss, ((), ())

        (loss, _), grads = stepwise.stepwise_value_and_grad(chunk_loss, params, alive)
        return loss, grads

    loss_and_grad = stepwise_loss_and_grad if markov else dense_loss_and_grad

    def update(critic: Critic, batch: Trajectory, targets: jax.Array, old_values: jax.Array):
        steps = jnp.maximum(jnp.sum(batch.alive), 1)
        loss, grads = loss_and_grad(critic.params, batch, targets, old_values, steps)
        params, opt_state, _, _ = apply_if_finite(optimizer, critic.params, critic.opt_state, grads, loss)
        return Critic(params=params, opt_state=opt_state), loss

    return update


def ppo_advantages(
    config: PPOConfig, value_fn: Callable[[Any, Any], jax.Array], critic_params: Any, batch: Trajectory
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(advantages, value targets, values), each [B, T], for one PPO iteration: from before its epochs."""
    values = jax.lax.stop_gradient(jax.vmap(value_fn, in_axes=(None, 0))(critic_params, batch.observation))
    advantages = gae_advantages(
        batch.reward, batch.alive, values, discount=config.discount, gae_lambda=config.gae_lambda
    )
    return advantages, advantages + values, values


def make_step(
    config: PPOConfig,
    apply_fn: Callable[[Any, Any], jax.Array],
    chunked: ChunkedLogits | None = None,
    markov: bool = False,
) -> Callable[[PolicyState, Trajectory, jax.Array], tuple[PolicyState, dict]]:
    """PPO's policy step: the clipped ratio to the behaviour policy + β·KL(π ‖ π_ref), exact (none where the KL is
    paid in the rewards), − the entropy bonus."""
    return make_policy_gradient_update(
        apply_fn,
        clip_epsilon=config.clip_epsilon,
        kl_estimate=None if config.kl_in_reward else "exact",
        entropy_coef=config.entropy_coef,
        chunked=chunked,
        markov=markov,
    )


def rewards_with_kl(
    batch: Trajectory, reference_log_probs: jax.Array, kl_coef: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """(rewards [B, T] − β (log q − log π_ref) at the policy's steps, that KL's mean over them): the KL penalty
    paid in the rewards, at the behaviour policy's log-probs (`kl_in_reward`)."""
    kl = jnp.where(batch.mask, batch.behaviour_logp - reference_log_probs, 0.0)
    return batch.reward - kl_coef * kl, jnp.sum(kl) / jnp.maximum(jnp.sum(batch.mask), 1)


def starting_critic(fresh: Any, start: Any) -> Any:
    """The critic's fresh params with every subtree the policy's starting params share with it (by name) taken
    from those: a value head on its own copy of the pretrained model."""
    if isinstance(fresh, dict) and isinstance(start, dict):
        return {name: starting_critic(value, start[name]) if name in start else value for name, value in fresh.items()}
    chex.assert_trees_all_equal_shapes_and_dtypes(fresh, start)
    return start


def make_learner(config: PPOConfig, context: Context) -> Learner:
    policy = context.policy
    policy_update = make_step(config, policy.apply, policy.chunked_logits(), policy.markov)
    if context.make_network is None:
        raise ValueError("PPO needs a critic network of the policy's architecture, and this policy provides none.")
    critic_network = context.make_network(1)
    value_fn = lambda params, observation: critic_network.apply(  # noqa: E731
        params, without_legal_actions(observation)
    )[:, 0]
    critic_optimizer = context.optimizer
    if config.critic_learning_rate_scale is not None:  # after the injected rate: a sweep's or an annealed one's
        critic_optimizer = optax.chain(critic_optimizer, optax.scale(config.critic_learning_rate_scale))
    critic_update = make_critic_update(
        value_fn, critic_optimizer, config.clip_epsilon if config.clip_value_loss else None, policy.markov
    )
    reference_log_probs = losses.per_step_terms(
        policy.apply,
        lambda logits, _, action, mask: losses.log_likelihood(logits, action, mask),
        policy.chunked_logits(),
    )

    def init(key, observation, hyperparameters, start=None):
        policy_key, critic_key = jax.random.split(key)
        critic_params = critic_network.init(critic_key, without_legal_actions(observation))
        if context.critic_from_start and start is not None:
            critic_params = starting_critic(critic_params, start)
        opt_state = with_learning_rate(critic_optimizer.init(critic_params), hyperparameters.learning_rate)
        return PPOLearnerState(
            policy=context.init_policy(policy_key, observation, hyperparameters, start),
            critic=Critic(params=critic_params, opt_state=opt_state),
        )

    def learn(state: PPOLearnerState, batch, key, hyperparameters):
        extra = {}
        if config.kl_in_reward:
            reference_params = losses.filled_reference(state.policy.reference_params, state.policy.params)
            reference = reference_log_probs(reference_params, None, batch.observation, batch.action, batch.mask)
            rewards, extra["kl"] = rewards_with_kl(batch, reference, state.policy.kl_coef)
            batch = batch.replace(reward=rewards)
        advantages, targets, values = ppo_advantages(config, value_fn, state.critic.params, batch)

        def minibatch_step(state, indices):
            part = jax.tree.map(lambda leaf: leaf[indices], batch)
            policy, metrics = policy_update(state.policy, part, normalised(advantages[indices], part.mask))
            critic, value_loss = critic_update(state.critic, part, targets[indices], values[indices])
            return PPOLearnerState(policy=policy, critic=critic), {**metrics, **extra, "value_loss": value_loss}

        def epoch(state, epoch_key):
            order = minibatch_indices(epoch_key, batch.reward.shape[0], config.num_minibatches)
            return jax.lax.scan(minibatch_step, state, order)

        state, metrics = jax.lax.scan(epoch, state, jax.random.split(key, config.updates_per_iteration))
        return state, jax.tree.map(lambda leaf: leaf.reshape(-1, *leaf.shape[2:]), metrics)  # [U·M] steps

    return Learner(init=init, learn=learn, steps_per_batch=steps_per_batch(config))


def steps_per_batch(config: PPOConfig) -> int:
    """U epochs of M minibatch steps."""
    return config.updates_per_iteration * config.num_minibatches


def check(config: PPOConfig, episodes_per_iteration: int) -> None:
    if episodes_per_iteration % config.num_minibatches:
        raise ValueError(
            f"episodes_per_iteration (B={episodes_per_iteration}) must be a multiple of "
            f"num_minibatches (M={config.num_minibatches}) for PPO."
        )


ALGORITHM = Algorithm(
    name="ppo",
    config=PPOConfig,
    make_learner=make_learner,
    check=check,
    steps_per_batch=steps_per_batch,
    # The knobs CleanRL's and rejax's PPO expose beside the learning rate (the clipped value loss and γ fixed).
    search_space={
        "num_minibatches": (1, 4),
        "entropy_coef": ENTROPY_COEFS,
        "clip_epsilon": (0.1, 0.2, 0.3),
        "updates_per_iteration": (1, 4, 10),  # epochs
        "gae_lambda": (0.9, 0.95, 1.0),
    },
    # CleanRL's ppo.py: 4 minibatches, 4 epochs, ε 0.2, entropy 0.01, λ 0.95, no KL (its γ 0.99 is not searched:
    # our tasks reward at the end of at most a few dozen steps, and run at γ 1 as Search-R1 does).
    reference={
        "kl_coef": 0.0,
        "kl_decay_fraction": 1.0,
        "num_minibatches": 4,
        "entropy_coef": 0.01,
        "clip_epsilon": 0.2,
        "updates_per_iteration": 4,
        "gae_lambda": 0.95,
    },
)

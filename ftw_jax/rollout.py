"""Rollouts: one whole episode of at most T steps, recorded as a fixed-shape `Trajectory`.

Steps after the episode ends stay in the record with mask False (never in the loss), so every trajectory
has the same shape; so do steps the environment writes itself (`env.forced_action`, e.g. tool output).
The return is the sum of rewards before the end; each step's reward is kept too (0 after the end), with
`alive` marking the steps before the end (a critic's targets need both).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from ftw_jax.envs.base import Environment
from ftw_jax.pool import Trajectory


def rollout(
    key: jax.Array,
    env: Environment,
    env_params: Any,
    policy: nn.Module,
    params: Any,
    version: jax.Array,
    reset_key: jax.Array | None = None,
) -> tuple[Trajectory, jax.Array]:
    """Plays one episode of at most `env.max_steps` steps with actions sampled from `policy`.

    Args:
      key: consumed.
      env, env_params: the environment and its params.
      policy: a module from `ftw_jax.policies` (`policy.apply(params, observations [T, ...]) -> [T, A]`).
      params: the policy's params.
      version: [] int32 policy version, recorded on every step.
      reset_key: if given, the start state comes from it (episodes that share it start alike, as GRPO's
        groups do) and `key` drives only the actions and the environment's steps.

    Returns:
      A `Trajectory` with leaves [T, ...] (T = env.max_steps), and whether the episode solved the task
      ([] bool; always False where the environment has no notion of success).
    """
    # What a policy remembers of the episode: nothing (markov: it acts on the current observation), its KV
    # cache (cached: it reads one new token a step), or else the whole history buffer, re-read every step.
    cached = getattr(policy, "cached", False)

    def act(memory, observation, state, t, key):
        if policy.markov or cached:
            current = jax.tree.map(lambda leaf: leaf[None], observation)
            if cached:
                logits, memory = policy.apply(params, current, cache=memory, position=t)
            else:
                logits = policy.apply(params, current)
            logits = logits[0]
        else:
            memory = jax.tree.map(lambda buffer, leaf: buffer.at[t].set(leaf), memory, observation)
            logits = policy.apply(params, memory)[t]
        action = jax.random.categorical(key, logits)
        return action, jax.nn.log_softmax(logits)[action], memory

    def memory(observation):
        if policy.markov:
            return None
        if cached:
            return policy.init_cache()
        return jax.tree.map(lambda leaf: jnp.zeros((env.max_steps,) + jnp.shape(leaf), jnp.result_type(leaf)),
                            observation)

    return play(key, env, env_params, act, memory, version, reset_key)


def demonstration(key: jax.Array, env: Environment, env_params: Any) -> tuple[Trajectory, jax.Array]:
    """One episode written by the environment's demonstrator (`env.expert_action(state)`), recorded as `rollout`
    records a policy's (behaviour log-probs 0, version 0): what a supervised warm start imitates."""

    def act(memory, observation, state, t, key):
        return env.expert_action(state), jnp.zeros((), jnp.float32), memory

    return play(key, env, env_params, act, lambda observation: None, jnp.zeros((), jnp.int32))


def play(key: jax.Array, env: Environment, env_params: Any, act: Callable, init_memory: Callable, version: jax.Array,
         reset_key: jax.Array | None = None) -> tuple[Trajectory, jax.Array]:
    """The episode loop `rollout` and `demonstration` share: `act(memory, observation, state, t, key) -> (action,
    log-prob, memory)` chooses at every step the environment does not write itself, `init_memory(observation)`
    gives its memory at the start."""
    num_steps = env.max_steps
    own_reset_key, steps_key = jax.random.split(key)
    observation, state = env.reset(own_reset_key if reset_key is None else reset_key, env_params)

    def step(carry, inputs):
        state, observation, memory, alive, episode_return, success = carry
        t, step_key = inputs
        action_key, env_key = jax.random.split(step_key)
        chosen, chosen_log_prob, memory = act(memory, observation, state, t, action_key)
        forced, forced_token = env.forced_action(state, env_params)
        action = jnp.where(forced, forced_token, chosen).astype(jnp.int32)
        log_prob = jnp.where(forced, 0.0, chosen_log_prob)
        next_observation, state, reward, done, info = env.step(env_key, state, action, env_params)
        step_reward = jnp.where(alive, reward, 0.0).astype(jnp.float32)
        episode_return = episode_return + step_reward
        if env.has_success:
            success = success | (alive & info["solved"])
        record = (observation, action, alive & ~forced, log_prob, step_reward, alive)
        return (state, next_observation, memory, alive & ~done, episode_return, success), record

    carry = (state, observation, init_memory(observation), jnp.ones((), bool), jnp.zeros((), jnp.float32),
             jnp.zeros((), bool))
    inputs = (jnp.arange(num_steps), jax.random.split(steps_key, num_steps))
    (_, _, _, _, episode_return, success), (observations, actions, mask, log_probs, rewards, alive) = jax.lax.scan(
        step, carry, inputs
    )
    trajectory = Trajectory(
        observation=observations,
        action=actions,
        mask=mask,
        behaviour_logp=log_probs.astype(jnp.float32),
        behaviour_version=jnp.broadcast_to(version, (num_steps,)).astype(jnp.int32),
        episode_return=episode_return.astype(jnp.float32),
        reward=rewards,
        alive=alive,
    )
    return trajectory, success


def rollouts(key: jax.Array, env: Environment, env_params: Any, policy: nn.Module, params: Any, version: jax.Array,
             num_episodes: int, group_size: int = 1, reset_keys: jax.Array | None = None) -> tuple[Trajectory, jax.Array]:
    """B episodes in parallel (a vmap of `rollout`): trajectories [B, T, ...] and success [B].

    `reset_keys` [B], if given, set each episode's start state (episodes sharing a key start alike: the same
    task). Otherwise, with `group_size` G > 1, consecutive groups of G episodes start from the same state
    (B a multiple of G), and with G = 1 every episode starts from its own.
    """
    if reset_keys is None and group_size == 1:
        return jax.vmap(rollout, in_axes=(0, None, None, None, None, None))(
            jax.random.split(key, num_episodes), env, env_params, policy, params, version
        )
    if reset_keys is None:
        reset_key, key = jax.random.split(key)
        reset_keys = jnp.repeat(jax.random.split(reset_key, num_episodes // group_size), group_size, axis=0)
    return jax.vmap(rollout, in_axes=(0, None, None, None, None, None, 0))(
        jax.random.split(key, num_episodes), env, env_params, policy, params, version, reset_keys
    )

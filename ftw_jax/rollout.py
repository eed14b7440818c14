"""Rollouts: one whole episode of at most T steps, recorded as a fixed-shape `Trajectory`.

Steps after the episode ends stay in the record with mask False (never in the loss), so every trajectory
has the same shape; so do steps the environment writes itself (`env.forced_action`, e.g. tool output).
The return is the sum of rewards before the end; each step's reward is kept too (0 after the end), with
`alive` marking the steps before the end (a critic's targets need both).
"""

from __future__ import annotations

from typing import Any

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
    num_steps = env.max_steps
    own_reset_key, steps_key = jax.random.split(key)
    observation, state = env.reset(own_reset_key if reset_key is None else reset_key, env_params)
    # What a policy remembers of the episode: nothing (markov: it acts on the current observation), its KV
    # cache (cached: it reads one new token a step), or else the whole history buffer, re-read every step.
    cached = getattr(policy, "cached", False)
    if policy.markov:
        memory = None
    elif cached:
        memory = policy.init_cache()
    else:
        memory = jax.tree.map(lambda leaf: jnp.zeros((num_steps,) + jnp.shape(leaf), jnp.result_type(leaf)),
                              observation)

    def act(carry, inputs):
        state, observation, memory, alive, episode_return, success = carry
        t, step_key = inputs
        action_key, env_key = jax.random.split(step_key)
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
        forced, forced_token = env.forced_action(state, env_params)
        action = jnp.where(forced, forced_token, jax.random.categorical(action_key, logits)).astype(jnp.int32)
        log_prob = jnp.where(forced, 0.0, jax.nn.log_softmax(logits)[action])
        next_observation, state, reward, done, info = env.step(env_key, state, action, env_params)
        step_reward = jnp.where(alive, reward, 0.0).astype(jnp.float32)
        episode_return = episode_return + step_reward
        if env.has_success:
            success = success | (alive & info["solved"])
        record = (observation, action, alive & ~forced, log_prob, step_reward, alive)
        return (state, next_observation, memory, alive & ~done, episode_return, success), record

    carry = (state, observation, memory, jnp.ones((), bool), jnp.zeros((), jnp.float32), jnp.zeros((), bool))
    inputs = (jnp.arange(num_steps), jax.random.split(steps_key, num_steps))
    (_, _, _, _, episode_return, success), (observations, actions, mask, log_probs, rewards, alive) = jax.lax.scan(
        act, carry, inputs
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

"""Rollouts: one whole episode of at most T steps, recorded as a fixed-shape `Trajectory`.

    player = Player(env, env_params, policy, params, version)
    trajectory, solved = rollout(key, player)                          # one episode
    batch, success = rollouts(key, player, num_episodes=16)           # B in parallel, [B, T, ...]

Steps after the episode ends have mask and alive False and reward 0 (never in the loss), so every trajectory
has the same shape; those after the chunk of steps in which it ended are not played at all (zeros); steps
the environment writes itself (`env.forced_action`, e.g. tool output) are in the record with mask False too.
The return is the sum of rewards before the end; each step's reward is kept too (0 after the end), with
`alive` marking the steps before the end (a critic's targets need both).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from ftw_jax.core.pool import Trajectory
from ftw_jax.envs.base import Environment
from ftw_jax.policies.base import PolicyNetwork

# Steps per chunk of an episode's loop: it stops after the chunk in which the episode ends.
CHUNK_STEPS = 32


class Player(flax.struct.PyTreeNode):
    """Who plays: an environment with its params, and a policy with its params and version. The environment
    and the policy are static (compiled into the program); the params and the version are its inputs."""

    env: Environment = flax.struct.field(pytree_node=False)
    env_params: Any
    policy: PolicyNetwork = flax.struct.field(pytree_node=False)  # `apply(params, observations [T, ...]) -> [T, A]`
    params: Any
    version: jax.Array  # [] int32, recorded on every step


def rollout(
    key: jax.Array, player: Player, reset_key: jax.Array | None = None, greedy: bool = False
) -> tuple[Trajectory, jax.Array]:
    """Plays one episode of at most `env.max_steps` steps with actions sampled from the player's policy (or its
    most likely ones).

    Args:
      key: consumed.
      player: the environment and the policy.
      reset_key: if given, the start state comes from it (episodes that share it start alike, as GRPO's
        groups do) and `key` drives only the actions and the environment's steps.
      greedy: take the most likely action at every step instead of sampling one (static).

    Returns:
      A `Trajectory` with leaves [T, ...] (T = env.max_steps), and whether the episode solved the task
      ([] bool; always False where the environment has no notion of success).
    """
    env, policy, params = player.env, player.policy, player.params
    # What a policy remembers of the episode: nothing (markov: it acts on the current observation), its KV
    # cache (cached: it reads one new token a step), or else the whole history buffer, re-read every step.
    cached = policy.cached

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
        action = jnp.argmax(logits) if greedy else jax.random.categorical(key, logits)
        return action, jax.nn.log_softmax(logits)[action], memory

    def memory(observation):
        if policy.markov:
            return None
        if cached:
            return policy.init_cache()
        return jax.tree.map(
            lambda leaf: jnp.zeros((env.max_steps,) + jnp.shape(leaf), jnp.result_type(leaf)), observation
        )

    return play(key, env, player.env_params, act, memory, player.version, reset_key)


def demonstration(key: jax.Array, env: Environment, env_params: Any) -> tuple[Trajectory, jax.Array]:
    """One episode written by the environment's demonstrator (`env.expert_action(state)`), recorded as `rollout`
    records a policy's (behaviour log-probs 0, version 0): what a supervised warm start imitates."""

    def act(memory, observation, state, t, key):
        return env.expert_action(state), jnp.zeros((), jnp.float32), memory

    return play(key, env, env_params, act, lambda observation: None, jnp.zeros((), jnp.int32))


def play(
    key: jax.Array,
    env: Environment,
    env_params: Any,
    act: Callable,
    init_memory: Callable,
    version: jax.Array,
    reset_key: jax.Array | None = None,
) -> tuple[Trajectory, jax.Array]:
    """The episode loop `rollout` and `demonstration` share: `act(memory, observation, state, t, key) -> (action,
    log-prob, memory)` chooses at every step the environment does not write itself, `init_memory(observation)`
    gives its memory at the start."""
    num_steps = env.max_steps
    own_reset_key, steps_key = jax.random.split(key)
    observation, state = env.reset(own_reset_key if reset_key is None else reset_key, env_params)
    # Step t's key, however many steps are played. Held as raw data: each is used once, at its own step, which
    # the key-reuse checker cannot see through a loop's index.
    step_keys = jax.random.key_data(jax.random.split(steps_key, num_steps))
    key_impl = jax.random.key_impl(steps_key)

    def step(carry, t):
        state, observation, memory, alive, episode_return, success = carry
        action_key, env_key = jax.random.split(jax.random.wrap_key_data(step_keys[t], impl=key_impl))
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

    carry = (
        state,
        observation,
        init_memory(observation),
        jnp.ones((), bool),
        jnp.zeros((), jnp.float32),
        jnp.zeros((), bool),
    )
    carry, records = _played_until_done(step, carry, num_steps)
    episode_return, success = carry[4], carry[5]
    observations, actions, mask, log_probs, rewards, alive = records
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


def _played_until_done(step: Callable, carry: tuple, num_steps: int) -> tuple[tuple, tuple]:
    """(carry, records [T, ...]) of `step(carry, t) -> (carry, record)` over the steps of an episode, whose carry
    holds `alive` at index 3 and whose record ends with it.

    Chunks of steps, stopping after the chunk in which the episode ends (under vmap: in which every episode of
    the batch has), so short episodes cost about their own length, not T. A loop of single steps would be
    slower: under vmap, every step would select over the whole record. Steps after the end that are not played
    stay zero in the record."""
    chunk = min(num_steps, CHUNK_STEPS)
    num_chunks, remainder = divmod(num_steps, chunk)

    def play_steps(carry, first, count):
        return jax.lax.scan(step, carry, first + jnp.arange(count))

    def play_chunk(loop):
        index, carry, records = loop
        carry, chunk_records = play_steps(carry, index * chunk, chunk)
        write = lambda buffer, values: jax.lax.dynamic_update_slice_in_dim(buffer, values, index * chunk, 0)  # noqa: E731
        return index + 1, carry, jax.tree.map(write, records, chunk_records)

    record_spec = jax.eval_shape(step, carry, jnp.zeros((), jnp.int32))[1]
    records = jax.tree.map(lambda spec: jnp.zeros((num_steps,) + spec.shape, spec.dtype), record_spec)
    _, carry, records = jax.lax.while_loop(
        lambda loop: (loop[0] < num_chunks) & loop[1][3], play_chunk, (jnp.zeros((), jnp.int32), carry, records)
    )
    if remainder:  # the last steps, fewer than a chunk: played always, zeroed where the episode had ended
        carry, last = play_steps(carry, num_chunks * chunk, remainder)
        played = last[-1]  # alive [remainder]

        def zeroed(values):
            where = played.reshape(played.shape + (1,) * (values.ndim - 1))  # [remainder, 1, ...]
            return jnp.where(where, values, jnp.zeros((), values.dtype))

        records = jax.tree.map(
            lambda buffer, values: buffer.at[num_chunks * chunk :].set(zeroed(values)), records, last
        )
    return carry, records


def rollouts(
    key: jax.Array,
    player: Player,
    num_episodes: int,
    group_size: int = 1,
    reset_keys: jax.Array | None = None,
    greedy: bool = False,
    episode_params: Callable[[jax.Array], Any] | None = None,
) -> tuple[Trajectory, jax.Array]:
    """B episodes in parallel (a vmap of `rollout`): trajectories [B, T, ...] and success [B].

    `reset_keys` [B], if given, set each episode's start state (episodes sharing a key start alike: the same
    task). Otherwise, with `group_size` G > 1, consecutive groups of G episodes start from the same state
    (B a multiple of G), and with G = 1 every episode starts from its own. `greedy`: as `rollout`'s.
    `episode_params(i)`, if given (G = 1, no `reset_keys`), are episode i's environment params in place of the
    player's (an evaluation's i-th episode plays test level i); the episodes' keys are the same either way.
    """
    play_one = functools.partial(rollout, greedy=greedy)
    if episode_params is not None:
        if reset_keys is not None or group_size != 1:
            raise ValueError("episode_params sets each episode's own task: not with reset_keys or groups.")
        own = lambda key, episode: play_one(key, player.replace(env_params=episode_params(episode)))  # noqa: E731
        return jax.vmap(own)(jax.random.split(key, num_episodes), jnp.arange(num_episodes, dtype=jnp.int32))
    if reset_keys is None and group_size == 1:
        return jax.vmap(play_one, in_axes=(0, None))(jax.random.split(key, num_episodes), player)
    if reset_keys is None:
        reset_key, key = jax.random.split(key)
        reset_keys = jnp.repeat(jax.random.split(reset_key, num_episodes // group_size), group_size, axis=0)
    return jax.vmap(play_one, in_axes=(0, None, 0))(jax.random.split(key, num_episodes), player, reset_keys)

"""Environments and rollouts: dynamics, the gymnax adapter, masking after the end."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ftw_jax import envs
from ftw_jax.lab.rollout import Player, rollout
from ftw_jax.policies import MLPPolicy, TabularPolicy


def test_bandit_env_pays_the_arm_mean_plus_noise():
    env = envs.make("bandit", arm_means=(0.0, 2.0, 1.0), noise_sd=0.0)
    params = env.default_params()
    observation, state = env.reset(jax.random.key(0), params)
    _, _, reward, done, _ = env.step(jax.random.key(1), state, jnp.int32(1), params)
    assert float(reward) == 2.0 and bool(done) and env.num_actions == 3 and env.max_steps == 1 and env.best_arm == 1


@pytest.mark.slow
def test_gymnax_cartpole_through_the_adapter():
    env = envs.make("cartpole")
    assert env.num_actions == 2 and env.max_steps == 500
    params = env.default_params()
    observation, state = env.reset(jax.random.key(0), params)
    assert observation.shape == (4,)
    done, steps, total = False, 0, 0.0
    key = jax.random.key(1)
    while not done:  # always pushing right topples the pole within a few dozen steps
        key, step_key = jax.random.split(key)
        observation, state, reward, done, _ = env.step(step_key, state, jnp.int32(1), params)
        total += float(reward)
        steps += 1
        assert steps < 200
    assert total == steps  # +1 per step, including the one that ends the episode


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse")
def test_cartpole_rollout_masks_after_the_end():
    env = envs.make("cartpole")
    policy = MLPPolicy(num_actions=2)
    params = policy.init(jax.random.key(0), jnp.zeros((1, 4)))
    player = Player(env, env.default_params(), policy, params, jnp.int32(7))
    batch, success = jax.jit(jax.vmap(lambda k: rollout(k, player)))(jax.random.split(jax.random.key(1), 8))
    assert not np.any(success)  # CartPole has no notion of success
    assert batch.observation.shape == (8, 500, 4) and batch.action.dtype == jnp.int32
    mask = np.asarray(batch.mask)
    lengths = mask.sum(axis=1)
    assert np.all(mask == (np.arange(500)[None, :] < lengths[:, None]))  # a prefix of True, then False
    np.testing.assert_array_equal(batch.episode_return, lengths)  # CartPole pays 1 per step
    assert np.all(lengths < 500) and len(set(lengths.tolist())) > 1
    assert np.all(np.asarray(batch.behaviour_version) == 7)
    np.testing.assert_allclose(np.exp(batch.behaviour_logp)[mask], 0.5, atol=0.05)  # near-uniform at init


def test_bandit_rollout_is_one_step():
    env = envs.make("bandit")
    policy = TabularPolicy(num_actions=2)
    params = policy.init(jax.random.key(0), jnp.zeros((1,), jnp.int32))
    trajectory, _ = rollout(jax.random.key(1), Player(env, env.default_params(), policy, params, jnp.int32(0)))
    assert trajectory.action.shape == (1,) and bool(trajectory.mask[0])
    np.testing.assert_allclose(trajectory.behaviour_logp, np.log(0.5), rtol=1e-6)


def test_unknown_env_and_bad_options():
    with pytest.raises(ValueError, match="unknown environment"):
        envs.make("pong")
    with pytest.raises(ValueError, match="arm_means"):
        envs.make("bandit", arm_means=(1.0,))
    with pytest.raises(ValueError, match="no options"):
        envs.make("cartpole", noise_sd=1.0)


def test_conv_policy_matches_flax_conv_with_the_same_weights():
    import flax.linen as nn

    from ftw_jax.policies import ConvPolicy

    policy = ConvPolicy(num_actions=4, channels=(5,), hidden_sizes=())
    observation = jax.random.normal(jax.random.key(0), (3, 6, 6, 4))
    params = policy.init(jax.random.key(1), observation)
    dense = params["params"]["Dense_0"]
    conv = nn.Conv(5, (3, 3), padding="SAME")
    conv_params = {"params": {"kernel": dense["kernel"].reshape(3, 3, 4, 5), "bias": dense["bias"]}}
    features = jax.nn.relu(conv.apply(conv_params, observation)).reshape(3, -1)
    head = params["params"]["Dense_1"]
    np.testing.assert_allclose(policy.apply(params, observation), features @ head["kernel"] + head["bias"], atol=1e-5)


def test_gymnax_episodes_end_at_the_time_limit_though_not_terminated():
    cartpole = envs.make("cartpole")
    limit = 3  # far too few steps to drop the pole from a near-upright start
    env = envs.GymnaxEnvironment(
        "CartPole-v1",
        gymnax_env=cartpole.gymnax_env,
        gymnax_params=cartpole.gymnax_params.replace(max_steps_in_episode=limit),
    )
    params = env.default_params()
    _, state = env.reset(jax.random.key(0), params)
    done = []
    for key in jax.random.split(jax.random.key(1), limit):
        _, state, _, step_done, info = env.step(key, state, jnp.int32(len(done) % 2), params)
        done.append(bool(step_done))
        assert not bool(info["terminated"])
    assert done == [False] * (limit - 1) + [True]

"""Baselines: advantages (GAE included), the k3 KL estimator, the clipped surrogate, GRPO groups, PPO's losses,
and learning a probe task."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import make_trajectories

from ftw_jax import envs
from ftw_jax.algos import ALGORITHMS, grpo, ppo, reinforce
from ftw_jax.algos.grpo import group_advantages
from ftw_jax.algos.policy_gradient import clipped_surrogate, k3_kl, mean_baseline_advantages
from ftw_jax.algos.ppo import Critic, gae_advantages, make_critic_update
from ftw_jax.core import losses
from ftw_jax.core.state import PolicyState
from ftw_jax.lab.rollout import Player, rollouts
from ftw_jax.lab.train import TrainConfig, make_train
from ftw_jax.policies import MLPPolicy

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")
BASELINES = {"reinforce": reinforce, "grpo": grpo, "ppo": ppo}


def baseline_config(algorithm, **options):
    """The algorithm's config with those of `options` that are its settings."""
    config = ALGORITHMS[algorithm].config
    return config(
        **{name: value for name, value in options.items() if name in {f.name for f in dataclasses.fields(config)}}
    )


def baseline_step(algorithm, apply_fn, **options):
    """The algorithm's own policy step (as its learner builds it)."""
    return BASELINES[algorithm].make_step(baseline_config(algorithm, **options), apply_fn)


def test_advantages_are_centred_per_group_and_optionally_scaled():
    returns = jnp.array([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    np.testing.assert_allclose(mean_baseline_advantages(returns), returns - 1.125)
    plain = group_advantages(returns, 4, normalise=False)
    np.testing.assert_allclose(plain, [0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])
    scaled = group_advantages(returns, 4)
    np.testing.assert_allclose(scaled[:4], np.array([0.75, -0.25, -0.25, -0.25]) / (np.sqrt(0.1875) + 1e-6), rtol=1e-6)
    np.testing.assert_array_equal(scaled[4:], 0.0)  # a group of ties teaches nothing
    with pytest.raises(ValueError, match="B=8 returns do not split into groups of G=3"):
        group_advantages(returns, 3)


def test_k3_is_an_unbiased_non_negative_estimate_of_the_kl():
    logits, reference = jnp.array([1.0, 0.0, -1.0]), jnp.array([0.0, 0.5, 0.0])
    actions = jax.random.categorical(jax.random.key(0), logits, shape=(200_000,))
    log_p, log_ref = jax.nn.log_softmax(logits)[actions], jax.nn.log_softmax(reference)[actions]
    estimates = k3_kl(log_p, log_ref)
    exact = losses.categorical_kl(logits[None], reference[None], jnp.ones(1, bool))[0]
    assert float(estimates.min()) >= 0.0
    assert abs(float(estimates.mean()) - float(exact)) < 4 * float(estimates.std()) / np.sqrt(actions.size)
    np.testing.assert_array_equal(k3_kl(log_p, log_p), 0.0)


def test_clipped_surrogate_is_written_out():
    log_q = jnp.log(jnp.array([0.5, 0.5, 0.5, 0.5]))
    log_p = jnp.log(jnp.array([0.8, 0.8, 0.2, 0.2]))  # ratios 1.6, 1.6, 0.4, 0.4
    advantages = jnp.array([1.0, -1.0, 1.0, -1.0])
    # -min(r A, clip(r, 0.8, 1.2) A): 1.2 clipped for A > 0; -1.6 for A < 0; 0.4 for A > 0; clipped 0.8 for A < 0.
    np.testing.assert_allclose(clipped_surrogate(log_p, log_q, advantages, 0.2), [-1.2, 1.6, -0.4, 0.8], rtol=1e-6)


def test_reinforce_loss_is_the_advantage_weighted_log_likelihood():
    batch = make_trajectories(4, 3, returns=jnp.array([3.0, 1.0, 0.0, 0.0]))

    def apply(params, observation):
        return observation @ params

    params = 0.1 * jnp.arange(6.0).reshape(3, 2)
    update = baseline_step("reinforce", apply)
    state = PolicyState.create(params, optax.sgd(1.0), kl_coef=0.0)
    advantages = mean_baseline_advantages(batch.episode_return)
    new_state, metrics = update(state, batch, advantages)

    def written_out(params):
        log_probs = jax.vmap(lambda o, a, m: losses.log_likelihood(apply(params, o), a, m))(
            batch.observation, batch.action, batch.mask
        )
        return -jnp.sum(advantages[:, None] * log_probs) / jnp.sum(batch.mask)

    np.testing.assert_allclose(metrics["loss"], written_out(params), rtol=1e-6)
    np.testing.assert_allclose(new_state.params, params - jax.grad(written_out)(params), rtol=1e-5)
    assert bool(metrics["applied"]) and int(new_state.version) == 1


def test_gae_follows_its_backward_recursion_and_stops_at_the_episode_end():
    rewards = jnp.array([[0.5, 0.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    alive = jnp.array([[True, True, True, False, False], [True] * 5])  # episode 0 ends after step 2
    values = jnp.array([[0.3, -0.2, 0.7, 9.0, 9.0], [0.1, 0.2, 0.3, 0.4, 0.5]])
    gamma, lam = 0.9, 0.8
    expected = np.zeros((2, 5))
    for b in range(2):  # A_t = δ_t + γλ A_{t+1}, δ_t = r_t + γ V_{t+1} − V_t; nothing after the last alive step
        following = 0.0
        for t in reversed(range(5)):
            if not alive[b, t]:
                continue
            next_value = values[b, t + 1] if t + 1 < 5 and alive[b, t + 1] else 0.0
            following = (
                rewards[b, t]
                + gamma * next_value
                - values[b, t]
                + (gamma * lam * following if t + 1 < 5 and alive[b, t + 1] else 0.0)
            )
            expected[b, t] = following
    np.testing.assert_allclose(
        gae_advantages(rewards, alive, values, discount=gamma, gae_lambda=lam), expected, rtol=1e-6
    )
    # λ = 1, γ = 1: the advantage is the return-to-go minus the value.
    np.testing.assert_allclose(
        gae_advantages(rewards, alive, values, discount=1.0, gae_lambda=1.0)[0, :3],
        np.array([2.5, 2.0, 2.0]) - values[0, :3],
        rtol=1e-6,
    )


def test_ppo_policy_loss_is_the_per_step_clipped_surrogate():
    batch = make_trajectories(3, 4, seed=1)
    batch = batch.replace(mask=batch.mask.at[0, 3].set(False))

    def apply(params, observation):
        return observation @ params

    params = 0.3 * jax.random.normal(jax.random.key(5), (3, 2))
    advantages = jax.random.normal(jax.random.key(6), (3, 4))
    update = baseline_step("ppo", apply, clip_epsilon=0.1, entropy_coef=0.0)
    _, metrics = update(PolicyState.create(params, optax.sgd(0.1)), batch, advantages)
    log_probs = jax.vmap(lambda o, a, m: losses.log_likelihood(apply(params, o), a, m))(
        batch.observation, batch.action, batch.mask
    )
    per_step = clipped_surrogate(log_probs, batch.behaviour_logp, advantages, 0.1)
    np.testing.assert_allclose(metrics["loss"], jnp.sum(jnp.where(batch.mask, per_step, 0.0)) / 11, rtol=1e-6)


def test_critic_step_descends_the_squared_error_on_alive_steps():
    batch = make_trajectories(2, 3).replace(alive=jnp.array([[True, True, False], [True, False, False]]))
    value_fn = lambda params, observation: observation @ params["w"]  # noqa: E731  [T, 3] @ [3] -> [T]
    params = {"w": jnp.array([0.1, -0.2, 0.3])}
    targets = jnp.array([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])  # the 100s are after the end: ignored

    def written_out(params):
        values = batch.observation @ params["w"]
        return 0.5 * jnp.sum(jnp.where(batch.alive, (values - targets) ** 2, 0.0)) / 3

    critic = Critic(params=params, opt_state=optax.sgd(0.5).init(params))
    critic, loss = make_critic_update(value_fn, optax.sgd(0.5))(critic, batch, targets, jnp.zeros_like(targets))
    np.testing.assert_allclose(loss, written_out(params), rtol=1e-6)
    np.testing.assert_allclose(critic.params["w"], params["w"] - 0.5 * jax.grad(written_out)(params)["w"], rtol=1e-5)


@pytest.mark.slow
def test_grpo_groups_share_their_start_state():
    env = envs.make("cartpole")  # a random start state per reset
    policy = MLPPolicy(num_actions=env.num_actions, hidden_sizes=(8,))
    observation, _ = env.reset(jax.random.key(0), env.default_params())
    params = policy.init(jax.random.key(1), observation[None])
    player = Player(env, env.default_params(), policy, params, jnp.int32(0))
    batch, _ = jax.jit(lambda key: rollouts(key, player, 8, 4))(jax.random.key(2))
    first = np.asarray(batch.observation[:, 0]).reshape(2, 4, -1)  # the start states, by group
    assert (first == first[:, :1]).all() and not (first[0, 0] == first[1, 0]).all()
    assert not (np.asarray(batch.action[:4]) == np.asarray(batch.action[0])).all()  # the actions differ


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["reinforce", "grpo", "ppo"])
def test_baselines_learn_the_probe_bandit(algorithm):
    # Arms with means 1.0 and 0.3: a uniform policy earns 0.65, the best arm 1.0.
    config = TrainConfig.for_env(
        "bandit",
        algorithm=algorithm,
        episodes_per_iteration=16,
        num_iterations=60,
        eval_every=20,
        kl_coef=0.0,
        learning_rate=0.1,
    )
    _, (metrics, evaluation) = make_train(config).train(jax.random.key(0))
    assert float(evaluation["return"][0]) < float(evaluation["return"][-1]) and float(evaluation["return"][-1]) > 0.85
    assert np.asarray(metrics["applied"]).all()
    if algorithm == "ppo":  # the critic learns the policy's value
        assert float(metrics["value_loss"][-1].mean()) < 0.5 * float(metrics["value_loss"][0].mean())


def test_bad_baseline_options_raise():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        TrainConfig.for_env("bandit", algorithm="ppo2")
    with pytest.raises(ValueError, match="multiple of group_size"):
        TrainConfig.for_env("bandit", algorithm="grpo", episodes_per_iteration=6, group_size=4)
    with pytest.raises(ValueError, match="gae_lambda must be in"):
        TrainConfig.for_env("bandit", algorithm="ppo", gae_lambda=1.5)


def log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


KL_COEF = 0.4  # β of the by-hand baseline tests


def away_from_the_reference(algorithm, clip_epsilon=0.2, **options):
    """A linear policy moved away from its reference (β = KL_COEF), one SGD step of the algorithm's config with
    `options` (PPO's entropy bonus 0 unless given); returns what the update did and the batch, params and
    reference in float64."""
    batch = make_trajectories(4, 3, seed=2, returns=jnp.array([1.0, 0.0, 3.0, 3.5]))
    batch = batch.replace(mask=batch.mask.at[1, 2].set(False).at[3, 0].set(False))
    reference = 0.1 * jnp.arange(6.0).reshape(3, 2)
    params = reference + jnp.array([[0.8, -0.5], [-0.7, 0.6], [0.4, 0.9]])
    logits = jnp.einsum("btd,da->bta", batch.observation, params)
    chosen = jnp.take_along_axis(jax.nn.log_softmax(logits), batch.action[..., None], -1)[..., 0]
    # Behaviour log-probs ±0.5 away from the policy's: ratios e^∓0.5 = 0.61, 1.65, outside the clip range.
    offsets = jnp.array([[0.5, -0.5, 0.5], [-0.5, 0.5, -0.5], [0.5, 0.5, -0.5], [-0.5, -0.5, 0.5]])
    batch = batch.replace(behaviour_logp=chosen + offsets)
    config = baseline_config(algorithm, group_size=2, clip_epsilon=clip_epsilon, **{"entropy_coef": 0.0, **options})
    advantages = (
        grpo.advantages(config, batch.episode_return)
        if algorithm == "grpo"
        else mean_baseline_advantages(batch.episode_return)
    )
    state = PolicyState.create(reference, optax.sgd(0.5), kl_coef=KL_COEF).replace(params=params)
    new_state, metrics = BASELINES[algorithm].make_step(config, lambda p, o: o @ p)(state, batch, advantages)
    as64 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    return new_state, metrics, advantages, jax.tree.map(as64, batch), as64(params), as64(reference)


def written_out_baseline_loss(
    params, reference, batch, advantages, algorithm, clip_epsilon=0.2, entropy_coef=0.0, kl_estimate="k3"
):
    """Each baseline's loss in plain jnp (float32 inputs from float64): surrogate + β·KL − c·entropy over the
    policy's steps (GRPO's KL: `kl_estimate`)."""
    observation, mask = jnp.asarray(batch.observation, jnp.float32), jnp.asarray(batch.mask, bool)
    actions = jnp.asarray(batch.action, jnp.int32)

    def log_probs_of(p):
        logits = observation @ p
        return logits - jax.scipy.special.logsumexp(logits, -1, keepdims=True)

    log_pi, log_ref = log_probs_of(params), log_probs_of(jnp.asarray(reference, jnp.float32))
    chosen = jnp.take_along_axis(log_pi, actions[..., None], -1)[..., 0]
    chosen_ref = jnp.take_along_axis(log_ref, actions[..., None], -1)[..., 0]
    advantages = jnp.asarray(advantages, jnp.float32)[:, None]
    if algorithm == "reinforce":
        surrogate = -advantages * chosen
    else:
        ratio = jnp.exp(chosen - jnp.asarray(batch.behaviour_logp, jnp.float32))
        surrogate = -jnp.minimum(ratio * advantages, jnp.clip(ratio, 1 - clip_epsilon, 1 + clip_epsilon) * advantages)
    if algorithm == "grpo" and kl_estimate == "k3":  # k3 at the taken action: e^d − d − 1, d = log π_ref − log π
        kl = jnp.exp(chosen_ref - chosen) - (chosen_ref - chosen) - 1
    else:  # exact KL(π ‖ π_ref)
        kl = jnp.sum(jnp.exp(log_pi) * (log_pi - log_ref), -1)
    entropy = -jnp.sum(jnp.exp(log_pi) * log_pi, -1)
    return jnp.sum(jnp.where(mask, surrogate + KL_COEF * kl - entropy_coef * entropy, 0.0)) / jnp.sum(mask)


@pytest.mark.parametrize("algorithm", ["reinforce", "grpo"])
def test_baseline_losses_with_a_kl_penalty_away_from_the_reference_by_hand(algorithm):
    new_state, metrics, advantages, batch, params, reference = away_from_the_reference(algorithm)
    returns = batch.episode_return  # [1, 0, 3, 3.5]
    if algorithm == "grpo":  # groups of 2: (1, 0) around 0.5 with sd 0.5, (3, 3.5) around 3.25 with sd 0.25
        np.testing.assert_allclose(
            advantages, np.array([0.5, -0.5, -0.25, 0.25]) / (np.array([0.5, 0.5, 0.25, 0.25]) + 1e-6), rtol=1e-6
        )
    else:
        np.testing.assert_allclose(advantages, returns - 1.875, rtol=1e-6)
    expected = written_out_baseline_loss(jnp.asarray(params, jnp.float32), reference, batch, advantages, algorithm)
    np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-5)
    assert float(metrics["kl"]) > 0.05  # the penalty is in play
    grad = jax.grad(written_out_baseline_loss)(
        jnp.asarray(params, jnp.float32), reference, batch, advantages, algorithm
    )
    np.testing.assert_allclose(new_state.params, params - 0.5 * np.asarray(grad, np.float64), rtol=1e-4, atol=1e-6)


def test_grpo_clips_its_ratio_and_ppo_uses_the_exact_kl():
    # Clipping matters here: with ε = 0.2 the loss differs from the unclipped one by more than 10%.
    _, metrics, advantages, batch, params, reference = away_from_the_reference("grpo")
    unclipped = written_out_baseline_loss(
        jnp.asarray(params, jnp.float32), reference, batch, advantages, "grpo", clip_epsilon=0.99
    )
    assert abs(float(metrics["loss"]) - float(unclipped)) > 0.1 * abs(float(unclipped))
    _, metrics, advantages, batch, params, reference = away_from_the_reference("ppo", clip_epsilon=0.1)
    expected = written_out_baseline_loss(jnp.asarray(params, jnp.float32), reference, batch, advantages, "ppo", 0.1)
    np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-5)


@pytest.mark.parametrize("algorithm", ["reinforce", "grpo", "ppo"])
def test_a_baseline_step_with_a_nan_gradient_and_a_finite_loss_changes_nothing(algorithm):
    batch = make_trajectories(4, 3)

    def apply(params, observation):  # 0·sqrt(z) at z = 0: finite logits, a NaN gradient for z
        return observation @ params["w"] + 0.0 * jnp.sqrt(params["z"])

    state = PolicyState.create({"w": 0.1 * jnp.ones((3, 2)), "z": jnp.zeros(())}, optax.adam(0.1), kl_coef=0.1)
    update = baseline_step(algorithm, apply, group_size=2)
    new_state, metrics = update(state, batch, mean_baseline_advantages(batch.episode_return))
    assert np.isfinite(float(metrics["loss"])) and not np.isfinite(float(metrics["grad_norm"]))
    assert not bool(metrics["applied"])
    chex.assert_trees_all_equal(new_state, state)  # params, Adam's state, version
    critic_params = {"w": jnp.ones(3), "z": jnp.zeros(())}
    critic = Critic(params=critic_params, opt_state=optax.adam(0.1).init(critic_params))
    value_fn = lambda params, observation: observation @ params["w"] + 0.0 * jnp.sqrt(params["z"])  # noqa: E731
    new_critic, value_loss = make_critic_update(value_fn, optax.adam(0.1))(
        critic, batch, jnp.ones((4, 3)), jnp.zeros((4, 3))
    )
    assert np.isfinite(float(value_loss))
    chex.assert_trees_all_equal(new_critic, critic)  # params, Adam's state


def ragged_batch():
    """Six episodes of 2 to 7 steps padded to T = 9, with steps the environment wrote (alive, not the policy's)."""
    batch = make_trajectories(6, 9, seed=3, returns=jnp.array([1.0, 0.0, 3.0, 3.5, 2.0, 0.5]))
    lengths = jnp.array([2, 7, 4, 5, 3, 6])
    alive = jnp.arange(9) < lengths[:, None]
    mask = alive & ~((jnp.arange(9) == 1) & (lengths[:, None] > 3))  # step 1 of the longer ones: written for them
    offsets = 0.3 * jax.random.normal(jax.random.key(4), mask.shape)
    return batch.replace(mask=mask, alive=alive, behaviour_logp=batch.behaviour_logp + offsets)


@pytest.mark.parametrize(
    "algorithm, options",
    [("reinforce", {}), ("grpo", {"kl_estimate": "k3"}), ("grpo", {"kl_estimate": "exact"}), ("ppo", {})],
)
def test_a_markov_policys_step_runs_its_own_steps_alone_to_the_same_update(algorithm, options):
    batch = ragged_batch()
    config = baseline_config(algorithm, group_size=2, entropy_coef=0.05, **options)
    reference = 0.1 * jnp.arange(6.0).reshape(3, 2)
    state = PolicyState.create(reference, optax.adam(0.1), kl_coef=0.3).replace(
        params=reference + jnp.array([[0.8, -0.5], [-0.7, 0.6], [0.4, 0.9]])
    )
    advantages = mean_baseline_advantages(batch.episode_return)
    if algorithm == "ppo":  # per-step advantages
        advantages = jnp.where(batch.alive, advantages[:, None] + jnp.arange(9.0) / 9, 0.0)
    apply = lambda p, o: o @ p  # noqa: E731
    dense = BASELINES[algorithm].make_step(config, apply)(state, batch, advantages)
    stepwise = BASELINES[algorithm].make_step(config, apply, markov=True)(state, batch, advantages)
    chex.assert_trees_all_close(stepwise, dense, rtol=1e-5, atol=1e-7)
    assert float(dense[1]["kl"]) > 0.01 and float(dense[1]["entropy"]) > 0.1  # every term in play
    # The steps after each end are not run: a NaN there would make the dense gradient NaN.
    poisoned = batch.replace(observation=jnp.where(batch.alive[..., None], batch.observation, jnp.nan))
    unharmed = BASELINES[algorithm].make_step(config, apply, markov=True)(state, poisoned, advantages)
    chex.assert_trees_all_close(unharmed, dense, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("clip_epsilon", [None, 0.05])
def test_a_markov_critics_step_runs_the_alive_steps_alone_to_the_same_update(clip_epsilon):
    batch = ragged_batch()
    params = {"w": jnp.array([0.3, -0.2, 0.5]), "b": jnp.zeros(())}
    critic = Critic(params=params, opt_state=optax.adam(0.1).init(params))
    value_fn = lambda params, observation: observation @ params["w"] + params["b"]  # noqa: E731
    targets = jnp.arange(54.0).reshape(6, 9) / 20
    old_values = jax.vmap(value_fn, in_axes=(None, 0))(params, batch.observation) + 0.1
    dense = make_critic_update(value_fn, optax.adam(0.1), clip_epsilon)(critic, batch, targets, old_values)
    stepwise = make_critic_update(value_fn, optax.adam(0.1), clip_epsilon, markov=True)(
        critic, batch, targets, old_values
    )
    chex.assert_trees_all_close(stepwise, dense, rtol=1e-5, atol=1e-7)
    assert float(dense[1]) > 0.1


# ------------------------------------------------------------------------------ the baselines as LLM trainers run them


def test_leave_one_out_advantages_by_hand():
    """RLOO (Ahmadian et al. 2024): each episode's baseline is the mean of the other G − 1 of its group."""
    returns = jnp.array([1.0, 0.0, 0.0, 1.0, 3.0, 3.0, 0.0, 6.0])
    expected = [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 3 - 3, 3 - 3, 0 - 4, 6 - 2]
    config = reinforce.ReinforceConfig(leave_one_out=4)
    np.testing.assert_allclose(reinforce.advantages(config, returns), expected, rtol=1e-6)
    np.testing.assert_allclose(  # no groups: the batch's mean
        reinforce.advantages(reinforce.ReinforceConfig(), returns), returns - jnp.mean(returns), rtol=1e-6
    )
    with pytest.raises(ValueError, match=r"multiple of leave_one_out \(G=4\)"):
        reinforce.check(config, 6)


def test_grpo_advantages_follow_trls_documented_formula():
    """TRL's GRPOTrainer: A_i = (r_i − mean(r)) / (std(r) + ε) over the G completions of one prompt (ε 1e-4 in
    TRL, 1e-6 here, as verl); a group of equal rewards gives 0."""
    rewards = np.array([0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 1.0, 5.0])
    grouped = rewards.reshape(-1, 4)
    expected = (grouped - grouped.mean(1, keepdims=True)) / (grouped.std(1, keepdims=True) + 1e-6)
    config = grpo.GRPOConfig(group_size=4)
    np.testing.assert_allclose(grpo.advantages(config, jnp.asarray(rewards)), expected.reshape(-1), rtol=1e-5)
    assert np.all(np.asarray(grpo.advantages(config, jnp.asarray(rewards)))[4:8] == 0)


def test_ppos_kl_in_the_rewards_by_hand():
    """Search-R1's PPO pays β (log q − log π_ref) at every model step in the rewards (verl's `kl_penalty: kl`)
    and none in the loss; with γ = λ = 1 the advantage of a step is the rewards from it on minus its value."""
    batch = make_trajectories(2, 4, seed=3)
    batch = batch.replace(
        mask=jnp.array([[False, True, True, True], [True, False, True, False]]),
        alive=jnp.array([[True] * 4, [True, True, True, False]]),
        reward=jnp.array([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.5, 0.0]]),
        behaviour_logp=jnp.array([[0.0, -1.0, -0.5, -2.0], [-0.3, 0.0, -0.1, 0.0]]),
    )
    reference = jnp.array([[-9.0, -1.5, -0.5, -1.0], [-0.1, -9.0, -0.4, -9.0]])
    rewards, kl = ppo.rewards_with_kl(batch, reference, jnp.float32(0.1))
    differences = np.array([[0, 0.5, 0.0, -1.0], [-0.2, 0, 0.3, 0]])  # log q − log π_ref at the model's steps
    np.testing.assert_allclose(rewards, np.asarray(batch.reward) - 0.1 * differences, rtol=1e-6)
    np.testing.assert_allclose(kl, differences.sum() / 5, rtol=1e-6)
    values = jnp.array([[0.2, 0.1, -0.3, 0.4], [0.0, 0.5, 0.1, 7.0]])
    advantages = gae_advantages(rewards, batch.alive, values, discount=1.0, gae_lambda=1.0)
    to_go = np.cumsum(np.asarray(rewards)[:, ::-1], axis=1)[:, ::-1]
    np.testing.assert_allclose(advantages, np.where(batch.alive, to_go - values, 0.0), rtol=1e-5, atol=1e-6)
    step = ppo.make_step(ppo.PPOConfig(kl_in_reward=True, entropy_coef=0.0), lambda p, o: o @ p)
    params = 0.3 * jax.random.normal(jax.random.key(5), (3, 2))
    far = PolicyState.create(params, optax.sgd(0.1), kl_coef=100.0).replace(reference_params=-params)
    near = PolicyState.create(params, optax.sgd(0.1), kl_coef=100.0)
    (_, far_metrics), (_, near_metrics) = (step(state, batch, advantages) for state in (far, near))
    assert float(far_metrics["loss"]) == float(near_metrics["loss"])  # the reference is not in the loss


def test_a_critic_starts_from_the_policys_weights_under_a_fresh_head():
    fresh = {"params": {"lm": {"w": jnp.zeros((2, 3))}, "head": {"kernel": jnp.ones((3, 1))}}}
    start = {"params": {"lm": {"w": jnp.full((2, 3), 7.0)}}}
    critic = ppo.starting_critic(fresh, start)
    np.testing.assert_array_equal(critic["params"]["lm"]["w"], 7.0)
    np.testing.assert_array_equal(critic["params"]["head"]["kernel"], 1.0)
    with pytest.raises(AssertionError):
        ppo.starting_critic(fresh, {"params": {"lm": {"w": jnp.zeros((3, 3))}}})

"""The options that run the baselines as their references do (issue 16), each checked against its written-out
effect: PPO's minibatches and value clipping, the entropy bonus, GRPO's KL choice and the direction of the k3
term's gradient, REINFORCE's U steps, and the run-level gradient clipping, learning-rate annealing and β horizon."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import make_trajectories
from test_policy_gradient import away_from_the_reference, written_out_baseline_loss

from ftw_jax.algos.policy_gradient import k3_kl
from ftw_jax.algos.ppo import Critic, make_critic_update, minibatch_indices
from ftw_jax.core import losses
from ftw_jax.lab.train import TrainConfig, make_optimizer, make_train

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")


def test_ppo_minibatches_cover_every_trajectory_once_per_epoch():
    first, second = minibatch_indices(jax.random.key(0), 12, 4), minibatch_indices(jax.random.key(1), 12, 4)
    assert first.shape == (4, 3)
    np.testing.assert_array_equal(np.sort(np.asarray(first).ravel()), np.arange(12))
    np.testing.assert_array_equal(np.sort(np.asarray(second).ravel()), np.arange(12))
    assert not np.array_equal(first, second)  # each epoch shuffles anew
    with pytest.raises(ValueError, match="B=10 trajectories do not split into 4 minibatches"):
        minibatch_indices(jax.random.key(0), 10, 4)


def test_ppo_takes_epochs_times_minibatches_steps_and_refuses_an_uneven_split():
    config = TrainConfig.for_env(
        "bandit",
        algorithm="ppo",
        episodes_per_iteration=8,
        num_iterations=2,
        eval_every=1,
        eval_episodes=2,
        updates_per_iteration=3,
        num_minibatches=4,
    )
    trainer = make_train(config)
    assert trainer.learner.steps_per_batch == 12
    carry, (metrics, _) = trainer.train(jax.random.key(0))
    assert metrics["applied"].shape == (2, 1)  # [periods, iterations]: each iteration's last step
    assert int(carry.learner.policy.version) == 2 * 12
    with pytest.raises(
        ValueError, match=r"episodes_per_iteration \(B=6\) must be a multiple of num_minibatches \(M=4\)"
    ):
        TrainConfig.for_env("cartpole", algorithm="ppo", episodes_per_iteration=6)


def test_entropy_bonus_changes_the_step_as_written():
    for algorithm in ("reinforce", "grpo", "ppo"):
        new_state, metrics, advantages, batch, params, reference = away_from_the_reference(algorithm, entropy_coef=0.3)
        expected = written_out_baseline_loss(
            jnp.asarray(params, jnp.float32), reference, batch, advantages, algorithm, entropy_coef=0.3
        )
        without = written_out_baseline_loss(jnp.asarray(params, jnp.float32), reference, batch, advantages, algorithm)
        np.testing.assert_allclose(metrics["loss"], expected, rtol=1e-5)
        np.testing.assert_allclose(float(without) - float(expected), 0.3 * float(metrics["entropy"]), rtol=1e-4)
        grad = jax.grad(written_out_baseline_loss)(
            jnp.asarray(params, jnp.float32), reference, batch, advantages, algorithm, 0.2, 0.3
        )
        np.testing.assert_allclose(new_state.params, params - 0.5 * np.asarray(grad, np.float64), rtol=1e-4, atol=1e-6)


def test_grpo_exact_kl_is_the_kl_term_every_other_method_uses():
    _, grpo_exact, advantages, batch, params, reference = away_from_the_reference("grpo", kl_estimate="exact")
    _, ppo, *_ = away_from_the_reference("ppo")
    _, grpo_k3, *_ = away_from_the_reference("grpo")
    assert float(grpo_exact["kl"]) == float(ppo["kl"])
    assert abs(float(grpo_k3["kl"]) - float(ppo["kl"])) > 0.01  # the estimate at the sampled actions differs
    expected = written_out_baseline_loss(
        jnp.asarray(params, jnp.float32), reference, batch, advantages, "grpo", kl_estimate="exact"
    )
    np.testing.assert_allclose(grpo_exact["loss"], expected, rtol=1e-5)


def test_k3_gradient_follows_the_reverse_kl_on_policy():
    """E_{a~π}[∇k3(a)] with the samples held fixed = ∇KL(π_ref ‖ π), not ∇KL(π ‖ π_ref): exact expectations
    over the actions of a peaked π against a uniform π_ref."""
    logits = jnp.array([2.0, 0.5, -1.0, -1.5])
    reference_log_probs = jax.nn.log_softmax(jnp.zeros(4))
    actions = jnp.arange(4)

    def expected_k3(logits):  # Σ_a π(a) k3(a), π's weights the fixed sampling distribution
        log_probs = jax.nn.log_softmax(logits)
        return jnp.sum(jax.lax.stop_gradient(jnp.exp(log_probs)) * k3_kl(log_probs[actions], reference_log_probs))

    mask = jnp.ones(1, bool)

    def forward(policy_logits):  # KL(π ‖ π_ref)
        return losses.categorical_kl(policy_logits[None], jnp.zeros((1, 4)), mask)[0]

    def reverse(policy_logits):  # KL(π_ref ‖ π)
        return jnp.sum(jnp.exp(reference_log_probs) * (reference_log_probs - jax.nn.log_softmax(policy_logits)))

    k3_gradient = jax.grad(expected_k3)(logits)
    np.testing.assert_allclose(k3_gradient, jax.grad(reverse)(logits), atol=1e-6)
    assert float(jnp.max(jnp.abs(k3_gradient - jax.grad(forward)(logits)))) > 0.1
    np.testing.assert_allclose(expected_k3(logits), forward(logits), rtol=1e-6)  # its value is the forward KL


def test_clipped_critic_loss_is_written_out():
    batch = make_trajectories(2, 3)
    value_fn = lambda params, observation: observation @ params["w"]  # noqa: E731
    params = {"w": jnp.array([0.4, -0.3, 0.8])}
    targets = jnp.array([[1.0, -2.0, 0.5], [3.0, 0.0, 0.2]])
    old_values = batch.observation @ params["w"] + jnp.array([[0.5, -0.5, 0.05], [-0.5, 0.5, 0.0]])

    def written_out(params):
        values = batch.observation @ params["w"]
        clipped = old_values + jnp.clip(values - old_values, -0.2, 0.2)
        squared = jnp.maximum((values - targets) ** 2, (clipped - targets) ** 2)
        return 0.5 * jnp.sum(jnp.where(batch.alive, squared, 0.0)) / jnp.sum(batch.alive)

    critic = Critic(params=params, opt_state=optax.sgd(0.1).init(params))
    new_critic, loss = make_critic_update(value_fn, optax.sgd(0.1), clip_epsilon=0.2)(
        critic, batch, targets, old_values
    )
    _, unclipped = make_critic_update(value_fn, optax.sgd(0.1))(critic, batch, targets, old_values)
    np.testing.assert_allclose(loss, written_out(params), rtol=1e-6)
    assert abs(float(loss) - float(unclipped)) > 0.01  # the clipped branch is taken somewhere
    np.testing.assert_allclose(
        new_critic.params["w"], params["w"] - 0.1 * jax.grad(written_out)(params)["w"], rtol=1e-5
    )


def test_reinforce_takes_u_steps_per_batch():
    config = TrainConfig.for_env(
        "bandit",
        algorithm="reinforce",
        episodes_per_iteration=4,
        num_iterations=2,
        eval_every=1,
        updates_per_iteration=3,
    )
    carry, _ = make_train(config).train(jax.random.key(0))
    assert int(carry.learner.policy.version) == 6


def test_global_norm_clipping_scales_the_gradient_as_written():
    gradient = {"a": jnp.array([3.0, 0.0]), "b": jnp.array([4.0])}  # global norm 5
    params = jax.tree.map(jnp.zeros_like, gradient)
    for max_norm, scale in ((1.0, 1 / 5), (10.0, 1.0)):
        config = TrainConfig.for_env("bandit", optimizer="sgd", learning_rate=0.5, max_grad_norm=max_norm)
        optimizer = make_optimizer(config)
        updates, _ = optimizer.update(gradient, optimizer.init(params), params)
        for name in gradient:
            np.testing.assert_allclose(updates[name], -0.5 * scale * gradient[name], rtol=1e-6)


@pytest.mark.parametrize("optimizer_name", ["adam", "sgd"])
def test_bfloat16_parameters_take_the_steps_float32_hyperparameters_give(optimizer_name):
    # Issue 31: hyperparameters injected in the parameters' dtype made Adam's b2 = 0.999 a bfloat16 1.0, and
    # every step a division by zero. Adam's first step is -lr * sign(g) (bias-corrected m / sqrt(v)).
    gradient = {"w": jnp.array([0.5, -2.0, 0.25], jnp.bfloat16)}
    params = jax.tree.map(jnp.ones_like, gradient)
    config = TrainConfig.for_env("bandit", optimizer=optimizer_name, learning_rate=0.01, max_grad_norm=None)
    optimizer = make_optimizer(config)
    state = optimizer.init(params)
    updates, new_state = optimizer.update(gradient, state, params)
    expected = -0.01 * (np.sign(gradient["w"]) if optimizer_name == "adam" else np.asarray(gradient["w"], np.float32))
    np.testing.assert_allclose(np.asarray(updates["w"], np.float32), expected, rtol=1e-3)
    assert jax.tree.map(lambda leaf: leaf.dtype, new_state) == jax.tree.map(lambda leaf: leaf.dtype, state)
    stepped = optax.apply_updates(params, updates)
    assert stepped["w"].dtype == jnp.bfloat16 and not np.array_equal(stepped["w"], params["w"])


@pytest.mark.slow
def test_annealing_sets_every_learning_rate_of_the_learner_each_iteration():
    config = TrainConfig.for_env(
        "bandit",
        algorithm="ppo",
        episodes_per_iteration=4,
        num_iterations=4,
        eval_every=2,
        eval_episodes=2,
        learning_rate=0.01,
        anneal_learning_rate=True,
    )
    carry, (metrics, _) = make_train(config).train(jax.random.key(0))
    np.testing.assert_allclose(
        np.asarray(metrics["learning_rate"]).ravel(), 0.01 * np.array([1, 0.75, 0.5, 0.25]), rtol=1e-6
    )
    for opt_state in (carry.learner.policy.opt_state, carry.learner.critic.opt_state):  # the last iteration's
        np.testing.assert_allclose(opt_state.hyperparams["learning_rate"], 0.0025, rtol=1e-6)
    plain = TrainConfig.for_env(
        "bandit", episodes_per_iteration=4, num_iterations=2, eval_every=2, eval_episodes=2, learning_rate=0.01
    )
    _, (metrics, _) = make_train(plain).train(jax.random.key(0))
    np.testing.assert_allclose(np.asarray(metrics["learning_rate"]).ravel(), [0.01, 0.01], rtol=1e-6)


@pytest.mark.slow
def test_kl_decays_over_its_own_horizon_then_stays():
    config = TrainConfig.for_env(
        "bandit", num_iterations=8, eval_every=4, kl_coef=0.6, kl_coef_final=0.0, kl_decay_iterations=4
    )
    _, (metrics, _) = make_train(config).train(jax.random.key(0))
    np.testing.assert_allclose(np.asarray(metrics["kl_coef"]).ravel(), [0.6, 0.4, 0.2, 0, 0, 0, 0, 0], atol=1e-7)
    with pytest.raises(ValueError, match="kl_decay_iterations=4 needs kl_coef_final"):
        TrainConfig.for_env("bandit", kl_decay_iterations=4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(algorithm="ppo", entropy_coef=-0.01), "entropy_coef must be a number >= 0, got -0.01"),
        (dict(algorithm="ppo", num_minibatches=0), "num_minibatches must be an int >= 1, got 0"),
        (dict(algorithm="grpo", kl_estimate="k2"), "kl_estimate"),
        (dict(max_grad_norm=0.0), "max_grad_norm must be > 0 or None, got 0.0"),
        (dict(algorithm="reinforce", updates_per_iteration=0), "updates_per_iteration must be an int >= 1, got 0"),
    ],
)
def test_bad_reference_options_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.for_env("cartpole", **overrides)

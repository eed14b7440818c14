"""The bandit reproduction: the paper's protocol on a Gaussian bandit, every seed in one vmapped, jitted program.

Protocol of the paper's reference implementation: arm means 1.0 and 0.3, Gaussian reward noise sd 0.2
(`GaussianBandit`'s defaults), one pull per iteration for 240 iterations, pool capacity 128, C = 5, K = 1,
J = 4, loss = cross-entropy on the kept actions + 0.05 · KL(π ‖ uniform), plain SGD with learning rate 0.08
(the bandit's training defaults, `ftw_jax.envs.ENVIRONMENTS`), logits starting at zero (so the frozen
initial policy is the uniform reference), updates from the moment the pool holds C = 5 entries.

It takes the training settings (`protocol_config`: FTW's update, β, the learning rate, the iterations) and
runs them with its own loop, the reference's: one pull, then one update, and the best arm's probability
read off the logits after every pull, where the training program evaluates by playing episodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ftw_jax.algos import defaults
from ftw_jax.algos.ftw import FTWConfig
from ftw_jax.core import pool as pool_lib
from ftw_jax.core.pool import Trajectory
from ftw_jax.core.state import PolicyState
from ftw_jax.core.update import make_update
from ftw_jax.envs.bandit import GaussianBandit
from ftw_jax.lab.train import TrainConfig
from ftw_jax.policies import TabularPolicy
from ftw_jax.running.compile_cache import cached_export
from ftw_jax.running.loop import seed_keys

# The training settings the protocol reads (`ftw-jax bandit` takes a flag for each).
PROTOCOL_SETTINGS = (
    "num_iterations",
    "pool_capacity",
    "num_batches",
    "batch_size",
    "num_elites",
    "kl_coef",
    "learning_rate",
)


def protocol_config(**settings: Any) -> TrainConfig:
    """The bandit's training config with `settings` (of `PROTOCOL_SETTINGS`) changed; the protocol reports once,
    after its last pull."""
    unknown = sorted(set(settings) - set(PROTOCOL_SETTINGS))
    if unknown:
        raise ValueError(f"the bandit protocol does not take {unknown}; it takes {list(PROTOCOL_SETTINGS)}.")
    iterations = settings.get("num_iterations", defaults.DEFAULTS["bandit"].run["num_iterations"])
    return TrainConfig.for_env("bandit", **settings, eval_every=iterations)


def _check(config: TrainConfig, env: GaussianBandit) -> None:
    if not isinstance(env, GaussianBandit):
        raise ValueError(f"the bandit protocol runs on a GaussianBandit, got {type(env).__name__}.")
    fits = (
        isinstance(config.algorithm_config, FTWConfig)
        and config.episodes_per_iteration == 1
        and config.optimizer == "sgd"
    )
    if not fits:
        raise ValueError("the bandit protocol runs FTW with one pull per iteration and SGD (see protocol_config).")


def pull_record(action: jax.Array, log_prob: jax.Array, version: jax.Array, reward: jax.Array) -> Trajectory:
    """One pull as a batch of one trajectory of one step ([1, 1] leaves; the return [1])."""
    return Trajectory(
        observation=jnp.zeros((1, 1), jnp.int32),
        action=action.reshape(1, 1).astype(jnp.int32),
        mask=jnp.ones((1, 1), bool),
        behaviour_logp=log_prob.reshape(1, 1).astype(jnp.float32),
        behaviour_version=version.reshape(1, 1).astype(jnp.int32),
        episode_return=reward.reshape(1).astype(jnp.float32),
        reward=reward.reshape(1, 1).astype(jnp.float32),
        alive=jnp.ones((1, 1), bool),
    )


def make_run(
    config: TrainConfig, env: GaussianBandit = GaussianBandit(), metric_names: tuple[str, ...] | None = None
) -> Callable[[jax.Array], dict]:
    """Builds `run(key) -> curves`, the whole protocol for one seed (vmap it over keys).

    `curves` holds `best_arm_probability` and `expected_reward` [I + 1] (before the first pull, then after
    each iteration), and the update metrics [I]: all of them, or those named in `metric_names` (the compiled
    program then leaves out the work of the others, e.g. the trust-region monitor's forward passes).
    """
    _check(config, env)
    policy = TabularPolicy(num_actions=env.num_actions)
    update = make_update(policy.apply, config.algorithm_config)
    optimizer = optax.sgd(config.learning_rate)
    # No array is made out here: each would be a small compile of its own, paid even when the program is cached.

    def logits_of(params):
        return params["params"]["logits"]  # [A]

    def summary(params, env_params):
        probs = jax.nn.softmax(logits_of(params))
        return probs[env.best_arm], jnp.dot(probs, env_params.arm_means)

    def iteration(carry, key):
        state, pool = carry
        env_params = env.default_params()
        action_key, reward_key, update_key = jax.random.split(key, 3)
        logits = logits_of(state.params)
        log_probs = jax.nn.log_softmax(logits)
        action = jax.random.categorical(action_key, logits)
        _, _, reward, _, _ = env.step(reward_key, jnp.zeros((), jnp.int32), action, env_params)
        pulled = pull_record(action, log_probs[action], state.version, reward)
        pool = pool_lib.add(pool, pulled)
        state, metrics = update(state, pool, update_key)
        if metric_names is not None:
            metrics = {name: metrics[name] for name in metric_names}
        best_probability, expected_reward = summary(state.params, env_params)
        return (state, pool), (best_probability, expected_reward, metrics)

    def run(key: jax.Array) -> dict:
        # Zero logits, so the frozen initial policy is the uniform reference.
        params = {"params": {"logits": jnp.zeros(env.num_actions, jnp.float32)}}
        state = PolicyState.create(params, optimizer, kl_coef=config.kl_coef)
        zero = jnp.zeros(())
        example = jax.tree.map(lambda leaf: leaf[0], pull_record(zero, zero, zero, zero))  # one trajectory
        pool = pool_lib.init(config.algorithm_config.pool_capacity, example)
        keys = jax.random.split(key, config.num_iterations)
        _, (best_probability, expected_reward, metrics) = jax.lax.scan(iteration, (state, pool), keys)
        initial_best, initial_reward = summary(state.params, env.default_params())
        return {
            "best_arm_probability": jnp.concatenate([initial_best[None], best_probability]),
            "expected_reward": jnp.concatenate([initial_reward[None], expected_reward]),
            "metrics": metrics,
        }

    return run


def run_seeds(
    config: TrainConfig,
    seeds: list[int],
    env: GaussianBandit = GaussianBandit(),
    metric_names: tuple[str, ...] | None = None,
) -> dict:
    """Runs every seed in one jit(vmap(run)); returns the curves as arrays with a leading [S] axis.

    With a persistent compilation cache on, the traced program is kept there too (`compile_cache.cached_export`):
    a second process with the same settings and number of seeds skips tracing. The keys are made inside the
    program, from the seeds as data.
    """

    program, seed_array = seeds_program(config, seeds, env, metric_names)
    return program(seed_array)


def seeds_program(
    config: TrainConfig,
    seeds: list[int],
    env: GaussianBandit = GaussianBandit(),
    metric_names: tuple[str, ...] | None = None,
) -> tuple[Callable[[np.ndarray], dict], np.ndarray]:
    """`run_seeds`'s program compiled ahead of time, and its argument: the seeds' run is then timed apart from
    tracing and compiling (`ftw-jax bandit` prints seeds per second after compile)."""

    def make_program():
        run = make_run(config, env, metric_names)
        return jax.jit(lambda seed_array: jax.vmap(run)(seed_keys(seed_array)))

    seed_array = np.asarray(seeds, np.uint32)
    function = cached_export(make_program, (seed_array,), identity=repr((config, env, metric_names)))
    return jax.jit(function).lower(seed_array).compile(), seed_array


def winners_only_probability(config: TrainConfig, env: GaussianBandit = GaussianBandit()) -> float:
    """Best-arm probability at the end of the run if every kept action were the best arm.

    With logits z, the loss −log π_best + β·KL(π ‖ uniform) has gradient (π − e_best) + β·π ⊙ (log π + H(π)),
    so this path is a deterministic recurrence: the first update comes after C pulls, then one per pull.
    Written out in numpy, independently of the jitted update, as a check on it.
    """
    num_arms = env.num_actions
    target = np.eye(num_arms)[env.best_arm]
    logits = np.zeros(num_arms)
    for _ in range(config.num_iterations - config.algorithm_config.batch_size + 1):
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        entropy = -np.sum(probs * np.log(probs))
        logits = logits - config.learning_rate * (probs - target + config.kl_coef * probs * (np.log(probs) + entropy))
    probs = np.exp(logits - logits.max())
    return float(probs[env.best_arm] / probs.sum())


def kl_fixed_point_probability(config: TrainConfig, env: GaussianBandit = GaussianBandit()) -> float:
    """Best-arm probability p at which −log π_best + β·KL(π ‖ uniform) is stationary (other arms equal).

    Stationarity in the best arm's logit reads β·p·(log p + H) = 1 − p; solved by bisection on (1/A, 1).
    Returns 1.0 when β = 0 (no finite fixed point).
    """
    if config.kl_coef == 0:
        return 1.0
    num_arms = env.num_actions

    def excess(p):
        others = (1 - p) / (num_arms - 1)
        entropy = -p * np.log(p) - (1 - p) * np.log(others)
        return config.kl_coef * p * (np.log(p) + entropy) - (1 - p)

    low, high = 1.0 / num_arms, 1.0
    for _ in range(2000):
        middle = 0.5 * (low + high)
        if middle in (low, high):
            break
        low, high = (middle, high) if excess(middle) < 0 else (low, middle)
    return float(low)

"""The bandit reproduction: FTW on a Gaussian K-armed bandit, every seed in one vmapped, jitted program.

Protocol of the paper's reference implementation (the defaults): arm means 1.0 and 0.3, Gaussian reward
noise sd 0.2, one pull per iteration for 240 iterations, pool capacity 128, C = 5, K = 1, J = 4, loss =
cross-entropy on the kept actions + 0.05 · KL(π ‖ uniform), plain SGD with learning rate 0.08, logits
starting at zero (so the frozen initial policy is the uniform reference), updates from the moment the pool
holds C = 5 entries.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ftw_jax import pool as pool_lib
from ftw_jax.checks import check_positive_int
from ftw_jax.envs.bandit import GaussianBandit
from ftw_jax.policies import TabularPolicy
from ftw_jax.pool import Trajectory
from ftw_jax.settings import setting
from ftw_jax.state import PolicyState
from ftw_jax.update import UpdateConfig, make_update


@dataclasses.dataclass(frozen=True)
class BanditConfig:
    """The bandit protocol; every number can be overridden (`ftw-jax bandit --help`)."""

    arm_means: tuple[float, ...] = setting((1.0, 0.3), "the arms' mean rewards")
    noise_sd: float = setting(0.2, "sd of the Gaussian reward noise")
    num_iterations: int = setting(240, "pulls (one per iteration)", flag="iterations")
    pool_capacity: int = setting(128, "N, the pool's capacity", short="-N")
    batch_size: int = setting(5, "C, pool entries drawn per minibatch", short="-C")
    num_elites: int = setting(1, "K, entries kept per minibatch", short="-K")
    num_batches: int = setting(4, "J, minibatches per update", short="-J")
    kl_coef: float = setting(0.05, "beta, the weight of KL(pi || uniform)")
    learning_rate: float = setting(0.08, "SGD's learning rate")

    def __post_init__(self):
        self.env  # validates arm_means and noise_sd
        check_positive_int("num_iterations", self.num_iterations)
        if not self.kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef!r}.")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}.")
        self.update_config  # validates N, J, C, K

    @property
    def update_config(self) -> UpdateConfig:
        return UpdateConfig(
            pool_capacity=self.pool_capacity,
            num_batches=self.num_batches,
            batch_size=self.batch_size,
            num_elites=self.num_elites,
        )

    @property
    def env(self) -> GaussianBandit:
        return GaussianBandit(arm_means=self.arm_means, noise_sd=self.noise_sd)

    @property
    def best_arm(self) -> int:
        return self.env.best_arm


def make_run(config: BanditConfig):
    """Builds `run(key) -> curves`, the whole protocol for one seed (vmap it over keys).

    `curves` holds `best_arm_probability` and `expected_reward` [I + 1] (before the first pull, then after
    each iteration), and the update metrics [I].
    """
    env = config.env
    env_params = env.default_params()
    policy = TabularPolicy(num_actions=env.num_actions)
    update = make_update(policy.apply, config.update_config)
    optimizer = optax.sgd(config.learning_rate)
    example = Trajectory(
        observation=jnp.zeros((1,), jnp.int32),
        action=jnp.zeros((1,), jnp.int32),
        mask=jnp.ones((1,), bool),
        behaviour_logp=jnp.zeros((1,), jnp.float32),
        behaviour_version=jnp.zeros((1,), jnp.int32),
        episode_return=jnp.zeros((), jnp.float32),
        reward=jnp.zeros((1,), jnp.float32),
        alive=jnp.ones((1,), bool),
    )

    def logits_of(params):
        return params["params"]["logits"]  # [A]

    def summary(params):
        probs = jax.nn.softmax(logits_of(params))
        return probs[config.best_arm], jnp.dot(probs, env_params.arm_means)

    def iteration(carry, key):
        state, pool = carry
        action_key, reward_key, update_key = jax.random.split(key, 3)
        logits = logits_of(state.params)
        log_probs = jax.nn.log_softmax(logits)
        action = jax.random.categorical(action_key, logits)
        _, _, reward, _, _ = env.step(reward_key, jnp.zeros((), jnp.int32), action, env_params)
        pulled = Trajectory(
            observation=jnp.zeros((1, 1), jnp.int32),
            action=action.reshape(1, 1).astype(jnp.int32),
            mask=jnp.ones((1, 1), bool),
            behaviour_logp=log_probs[action].reshape(1, 1),
            behaviour_version=state.version.reshape(1, 1),
            episode_return=reward.reshape(1),
            reward=reward.reshape(1, 1).astype(jnp.float32),
            alive=jnp.ones((1, 1), bool),
        )
        pool = pool_lib.add(pool, pulled)
        state, metrics = update(state, pool, update_key)
        best_probability, expected_reward = summary(state.params)
        return (state, pool), (best_probability, expected_reward, metrics)

    def run(key: jax.Array) -> dict:
        # Zero logits, so the frozen initial policy is the uniform reference.
        params = {"params": {"logits": jnp.zeros(env.num_actions, jnp.float32)}}
        state = PolicyState.create(params, optimizer, kl_coef=config.kl_coef)
        pool = pool_lib.init(config.pool_capacity, example)
        keys = jax.random.split(key, config.num_iterations)
        _, (best_probability, expected_reward, metrics) = jax.lax.scan(iteration, (state, pool), keys)
        initial_best, initial_reward = summary(state.params)
        return {
            "best_arm_probability": jnp.concatenate([initial_best[None], best_probability]),
            "expected_reward": jnp.concatenate([initial_reward[None], expected_reward]),
            "metrics": metrics,
        }

    return run


def run_seeds(config: BanditConfig, seeds: list[int]) -> dict:
    """Runs every seed in one jit(vmap(run)); returns the curves as arrays with a leading [S] axis."""
    keys = jnp.stack([jax.random.key(seed) for seed in seeds])
    return jax.jit(jax.vmap(make_run(config)))(keys)


def winners_only_probability(config: BanditConfig) -> float:
    """Best-arm probability at the end of the run if every kept action were the best arm.

    With logits z, the loss −log π_best + β·KL(π ‖ uniform) has gradient (π − e_best) + β·π ⊙ (log π + H(π)),
    so this path is a deterministic recurrence: the first update comes after C pulls, then one per pull.
    Written out in numpy, independently of the jitted update, as a check on it.
    """
    num_arms = len(config.arm_means)
    target = np.eye(num_arms)[config.best_arm]
    logits = np.zeros(num_arms)
    for _ in range(config.num_iterations - config.batch_size + 1):
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        entropy = -np.sum(probs * np.log(probs))
        logits = logits - config.learning_rate * (probs - target + config.kl_coef * probs * (np.log(probs) + entropy))
    probs = np.exp(logits - logits.max())
    return float(probs[config.best_arm] / probs.sum())


def kl_fixed_point_probability(config: BanditConfig) -> float:
    """Best-arm probability p at which −log π_best + β·KL(π ‖ uniform) is stationary (other arms equal).

    Stationarity in the best arm's logit reads β·p·(log p + H) = 1 − p; solved by bisection on (1/A, 1).
    Returns 1.0 when β = 0 (no finite fixed point).
    """
    if config.kl_coef == 0:
        return 1.0
    num_arms = len(config.arm_means)

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

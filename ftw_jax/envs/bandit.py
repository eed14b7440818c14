"""A Gaussian K-armed bandit as a one-step environment.

Observation: a constant int32 0. Actions: the arms. Reward: mean of the pulled arm plus Gaussian noise.
Every episode is one pull (max_steps = 1).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from ftw_jax.core.settings import check_settings, setting
from ftw_jax.envs.base import Environment


class BanditParams(flax.struct.PyTreeNode):
    arm_means: jax.Array  # [A]
    noise_sd: jax.Array  # []


@dataclasses.dataclass(frozen=True)
class GaussianBandit(Environment):
    arm_means: tuple[float, ...] = setting((1.0, 0.3), "the arms' mean rewards")
    noise_sd: float = setting(0.2, "sd of the Gaussian reward noise")

    def __post_init__(self):
        check_settings(self)
        if len(self.arm_means) < 2:
            raise ValueError(f"arm_means needs at least 2 arms, got {self.arm_means!r}.")
        if not self.noise_sd >= 0:
            raise ValueError(f"noise_sd must be >= 0, got {self.noise_sd!r}.")

    @property
    def num_actions(self) -> int:
        return len(self.arm_means)

    @property
    def max_steps(self) -> int:
        return 1

    @property
    def best_arm(self) -> int:
        return max(range(self.num_actions), key=lambda arm: self.arm_means[arm])

    def default_params(self) -> BanditParams:
        return BanditParams(jnp.asarray(self.arm_means, jnp.float32), jnp.asarray(self.noise_sd, jnp.float32))

    def reset(self, key: jax.Array, params: BanditParams) -> tuple[jax.Array, jax.Array]:
        del key, params
        return jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)

    def step(
        self, key: jax.Array, state: jax.Array, action: jax.Array, params: BanditParams
    ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, dict[str, jax.Array]]:
        reward = params.arm_means[action] + params.noise_sd * jax.random.normal(key)
        return jnp.zeros((), jnp.int32), state + 1, reward, jnp.ones((), bool), {}

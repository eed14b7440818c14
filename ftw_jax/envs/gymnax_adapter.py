"""Use a gymnax environment (gymnax >= 1.0) through ftw_jax's environment API.

gymnax 1.0's `step` returns six values (obs, state, reward, terminated, truncated, info) and resets itself
when an episode ends; here `done = terminated | truncated`, and the auto-reset is harmless because rollouts
mask every step after the first `done`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from ftw_jax.envs.base import Environment


@dataclasses.dataclass(frozen=True)
class GymnaxEnvironment(Environment):
    """Wraps `gymnax.make(name)`; `max_steps` is the gymnax episode limit (`max_steps_in_episode`)."""

    name: str
    gymnax_env: Any = dataclasses.field(compare=False, repr=False, default=None)
    gymnax_params: Any = dataclasses.field(compare=False, repr=False, default=None)

    def __post_init__(self):
        if self.gymnax_env is None:
            try:
                import gymnax
            except ImportError as error:
                raise ImportError("gymnax environments need gymnax: pip install 'ftw_jax[gymnax]'") from error
            env, params = gymnax.make(self.name)
            object.__setattr__(self, "gymnax_env", env)
            object.__setattr__(self, "gymnax_params", params)

    def __hash__(self):
        return hash((type(self), self.name))

    @property
    def num_actions(self) -> int:
        return self.gymnax_env.num_actions

    @property
    def max_steps(self) -> int:
        return int(self.gymnax_params.max_steps_in_episode)

    def default_params(self) -> Any:
        return self.gymnax_params

    def reset(self, key: jax.Array, params: Any) -> tuple[Any, Any]:
        return self.gymnax_env.reset(key, params)

    def step(
        self, key: jax.Array, state: Any, action: jax.Array, params: Any
    ) -> tuple[Any, Any, jax.Array, jax.Array, dict]:
        obs, state, reward, terminated, truncated, info = self.gymnax_env.step(key, state, action, params)
        return obs, state, reward, terminated | truncated, info

"""The environment API: functional and jittable, with explicit keys, state and params (as in gymnax).

    obs, state = env.reset(key, params)
    obs, state, reward, done, info = env.step(key, state, action, params)

An environment object holds only static configuration (it is a frozen dataclass, hashable, so it can be
closed over or passed as a static argument); everything that changes lives in `state`, everything a sweep
might vary lives in `params`. `step` after `done` must stay finite (rollouts mask those steps out).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from ftw_jax.lm.tokenizer import Tokenizer


class Environment(abc.ABC):
    """Base class; subclasses are frozen dataclasses.

    An environment whose task can be solved sets `has_success = True` and reports `info["solved"]`; one with a
    demonstrator for a supervised warm start sets `has_expert = True` and defines `expert_action`.
    """

    has_success = False
    has_expert = False

    @property
    @abc.abstractmethod
    def num_actions(self) -> int:
        """A: actions are ints in [0, A)."""

    @property
    @abc.abstractmethod
    def max_steps(self) -> int:
        """The episode limit; rollouts record this many steps (T)."""

    @property
    def vocabulary_size(self) -> int | None:
        """V where observations are token ids in [0, V) (a token environment: the transformer and the LM embed
        them); None otherwise."""
        return None

    def written_in(self, tokenizer: Tokenizer, vocab_size: int) -> Environment:
        """This environment with its text in a pretrained model's tokens (`tokenizer`'s, the actions its
        `vocab_size` embedding rows), for a policy that starts from that model; a ValueError where it has no text."""
        raise ValueError(
            f"{type(self).__name__} is not written in text: a run that starts from a pretrained model needs a text "
            "environment (text-search)."
        )

    @abc.abstractmethod
    def default_params(self) -> Any:
        """The params pytree of the standard task."""

    @abc.abstractmethod
    def reset(self, key: jax.Array, params: Any) -> tuple[Any, Any]:
        """(observation, state) of a new episode. The key is consumed."""

    @abc.abstractmethod
    def step(
        self, key: jax.Array, state: Any, action: jax.Array, params: Any
    ) -> tuple[Any, Any, jax.Array, jax.Array, dict]:
        """(observation, state, reward, done, info) after `action`. The key is consumed."""

    def evaluation_params(self, params: Any, episode: jax.Array | None = None) -> Any:
        """The params to evaluate on (e.g. held-out levels); the training params by default. `episode` ([] int32),
        where given, is the episode's index in an evaluation: an environment with a finite test set can play its
        test task `episode` mod their number, so that an evaluation plays distinct ones (Sokoban does)."""
        del episode
        return params

    def forced_action(self, state: Any, params: Any) -> tuple[jax.Array, jax.Array]:
        """(forced, token): whether the environment writes this step's action itself (e.g. tool output).

        A forced step is recorded with mask False, so it never enters the loss. None are forced by default.
        """
        return jnp.zeros((), bool), jnp.zeros((), jnp.int32)

    def expert_action(self, state: Any) -> jax.Array:
        """The demonstrator's action ([] int32) at a step the environment does not write (`has_expert`)."""
        raise NotImplementedError(f"{type(self).__name__} has no demonstrator.")

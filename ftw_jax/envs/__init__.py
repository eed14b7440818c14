"""Functional, jittable environments, and the registry of those the training program knows by name.

    entry = ENVIRONMENTS["sokoban"]      # its factory, the policy architectures that fit it
    env = make("sokoban", reward="binary")

A new environment is its module and one `EnvEntry` here (and, if it needs them, one line of training defaults in
`ftw_jax.algos.defaults`); nothing else tests an environment's name.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from ftw_jax.core.settings import check_field_types, check_option_types
from ftw_jax.envs.bandit import GaussianBandit
from ftw_jax.envs.base import Environment
from ftw_jax.envs.gymnax_adapter import GymnaxEnvironment
from ftw_jax.envs.search import SearchTask
from ftw_jax.envs.sokoban import Sokoban
from ftw_jax.envs.text_search import TextSearchTask


@dataclasses.dataclass(frozen=True)
class EnvEntry:
    """One environment of the registry."""

    make: Callable[..., Environment]  # options -> the environment
    # The policy architectures that fit its observations (`policies.ARCHITECTURES`), the first the default.
    policies: tuple[str, ...]


def _gymnax(name: str, **options) -> GymnaxEnvironment:
    if options:
        raise ValueError(f"{name} takes no options, got {sorted(options)}.")
    return GymnaxEnvironment(name)


ENVIRONMENTS: dict[str, EnvEntry] = {
    "bandit": EnvEntry(GaussianBandit, ("tabular",)),
    "cartpole": EnvEntry(functools.partial(_gymnax, "CartPole-v1"), ("mlp",)),
    "sokoban": EnvEntry(Sokoban, ("conv", "mlp")),
    "search": EnvEntry(SearchTask, ("lm", "transformer")),
    "text-search": EnvEntry(TextSearchTask, ("lm",)),
}


def entry(name: str) -> EnvEntry:
    """The registry entry of `name`; a ValueError naming the choices otherwise."""
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; expected one of {sorted(ENVIRONMENTS)}.")
    return ENVIRONMENTS[name]


def make(name: str, **options: Any) -> Environment:
    """An environment by registry name; options go to its class (a ValueError names one it does not take)."""
    kind = entry(name).make
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        # Options are the fields a user sets; one the program sets (`written_in`'s lexicon) is not among them.
        fields = dataclasses.fields(kind)
        known = {field.name for field in fields if field.init and not field.metadata.get("not_option")}
        if set(options) - known:
            raise ValueError(
                f"bad options for {name}: {sorted(set(options) - known)} (it takes {', '.join(sorted(known))})."
            )
        try:
            check_option_types(kind, options)
        except ValueError as error:
            raise ValueError(f"bad options for {name}: {error}") from None
    try:
        env = entry(name).make(**options)
    except TypeError as error:  # an option the environment does not have
        raise ValueError(f"bad options for {name}: {error}") from None
    if dataclasses.is_dataclass(env):
        try:
            check_field_types(env)
        except ValueError as error:
            raise ValueError(f"bad options for {name}: {error}") from None
    return env


__all__ = [
    "ENVIRONMENTS",
    "EnvEntry",
    "Environment",
    "GaussianBandit",
    "GymnaxEnvironment",
    "SearchTask",
    "Sokoban",
    "TextSearchTask",
    "entry",
    "make",
]

"""Functional, jittable environments, and `make(name, **options)` for the ones the CLI knows."""

from ftw_jax.envs.bandit import GaussianBandit
from ftw_jax.envs.base import Environment
from ftw_jax.envs.gymnax_adapter import GymnaxEnvironment
from ftw_jax.envs.search import SearchTask
from ftw_jax.envs.sokoban import Sokoban

_GYMNAX_NAMES = {"cartpole": "CartPole-v1"}


def make(name: str, **options) -> Environment:
    """An environment by CLI name: "bandit", "cartpole" (gymnax), "sokoban" or "search"; options go to its class."""
    if name == "bandit":
        return GaussianBandit(**options)
    if name == "sokoban":
        return Sokoban(**options)
    if name == "search":
        return SearchTask(**options)
    if name in _GYMNAX_NAMES:
        if options:
            raise ValueError(f"{name} takes no options, got {sorted(options)}.")
        return GymnaxEnvironment(_GYMNAX_NAMES[name])
    raise ValueError(f"unknown environment {name!r}; expected one of {['bandit', *_GYMNAX_NAMES, 'sokoban', 'search']}.")


__all__ = ["Environment", "GaussianBandit", "GymnaxEnvironment", "SearchTask", "Sokoban", "make"]

"""Every algorithm the training program runs, by name. A new one is a module and a line here.

algorithm = ALGORITHMS["ppo"]                 # an `Algorithm`: name, config class, make_learner, ...
learner = algorithm.make_learner(algorithm.config(), context)
"""

from typing import Any

from ftw_jax.algos import ftw, grpo, ppo, reinforce
from ftw_jax.algos.base import Algorithm, Context, Hyperparameters, Learner

ALGORITHMS: dict[str, Algorithm] = {
    "ftw": ftw.ALGORITHM,
    "reinforce": reinforce.ALGORITHM,
    "grpo": grpo.ALGORITHM,
    "ppo": ppo.ALGORITHM,
}


def get(name: str) -> Algorithm:
    """The registry entry of `name`; a ValueError naming the choices otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {tuple(ALGORITHMS)}, got {name!r}.")
    return ALGORITHMS[name]


def config_of(name: str, config: Any) -> Any:
    """`name`'s config: `config`, or the algorithm's defaults where it is None; a ValueError where it is another
    algorithm's (what `TrainConfig` and the LM learner's `LearnConfig` hold as `algorithm_config`)."""
    algorithm = get(name)
    if config is None:
        return algorithm.config()
    if not isinstance(config, algorithm.config):
        raise ValueError(
            f"algorithm_config must be a {algorithm.config.__name__} for {name}, got {type(config).__name__}."
        )
    return config


__all__ = ["ALGORITHMS", "Algorithm", "Context", "Hyperparameters", "Learner", "config_of", "get"]

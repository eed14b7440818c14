"""Every algorithm the training program runs, by name. A new one is a module and a line here.

algorithm = ALGORITHMS["ppo"]                 # an `Algorithm`: name, config class, make_learner, ...
learner = algorithm.make_learner(algorithm.config(), context)
"""

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


__all__ = ["ALGORITHMS", "Algorithm", "Context", "Hyperparameters", "Learner", "get"]

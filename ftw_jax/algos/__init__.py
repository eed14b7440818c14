"""Every algorithm the training program runs, by name. A new one is a module and a line here.

algorithm = ALGORITHMS["ppo"]                 # an `Algorithm`: name, config class, make_learner, ...
learner = algorithm.make_learner(algorithm.config(), context)
"""

from collections.abc import Collection, Mapping
from typing import Any

from ftw_jax.algos import ftw, grpo, ppo, reinforce
from ftw_jax.algos.base import Algorithm, Context, Hyperparameters, Learner
from ftw_jax.core.settings import describe

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


def split_settings(
    name: str, settings: Mapping[str, Any], run_fields: Collection[str]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the run's settings, `name`'s config's, those only other algorithms declare) of `settings`, where the run's
    are `run_fields` (`TrainConfig`'s, or the LM learner's `LearnConfig`'s). A name nobody declares is refused."""
    own = {item.name for item in describe(get(name).config)}
    known = {*run_fields, *(item.name for entry in ALGORITHMS.values() for item in describe(entry.config))}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; expected names among {sorted(known)}.")
    run = {key: value for key, value in settings.items() if key in run_fields}
    config = {key: value for key, value in settings.items() if key in own and key not in run}
    others = {key: value for key, value in settings.items() if key not in run and key not in config}
    return run, config, others


__all__ = ["ALGORITHMS", "Algorithm", "Context", "Hyperparameters", "Learner", "config_of", "get", "split_settings"]

"""Equal tuning for every algorithm: the same number of configurations, drawn at random from each one's space.

    configurations = draw_configurations("ppo", count=8, seed=0)       # override dicts, distinct
    sweeps = group_sweeps("sokoban", configurations, seeds=[1000, 1001, 1002], algorithm="ppo")

Every algorithm searches the settings they share (the learning rate on a log grid 3e-4–1e-2, β at the start,
the iterations over which it decays to 0) and its own knobs (FTW: N, J, C, K; PPO: minibatches and entropy
bonus; GRPO: G and entropy bonus; REINFORCE: steps per batch and entropy bonus). Configurations that differ
only in sweep axes (learning rate, β, N, J, C, K) share one compiled program; `group_sweeps` makes one sweep
per program. `ftw_jax.compare` runs them on tuning seeds and keeps the configuration with the best mean AUC.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ftw_jax.sweep import Sweep, program_key, sweep_of
from ftw_jax.train import TrainConfig

LEARNING_RATES = (3e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2)
KL_COEFS = (0.0, 0.1, 0.3, 0.5, 1.0)
KL_DECAY_FRACTIONS = (0.25, 0.5, 1.0)  # β reaches 0 after this share of the run's iterations
SHARED = {"learning_rate": LEARNING_RATES, "kl_coef": KL_COEFS, "kl_decay_fraction": KL_DECAY_FRACTIONS}
ENTROPY_COEFS = (0.0, 0.01)
SPACES: dict[str, dict[str, tuple]] = {
    "ftw": {
        "pool_capacity": (256, 512, 1024),
        "num_batches": (32, 64, 128),
        "batch_size": (4, 8, 16, 32),
        "num_elites": (1, 2, 4),
    },
    "ppo": {"num_minibatches": (1, 4), "entropy_coef": ENTROPY_COEFS},
    "grpo": {"group_size": (4, 8, 16), "entropy_coef": ENTROPY_COEFS},
    "reinforce": {"updates_per_iteration": (1, 4), "entropy_coef": ENTROPY_COEFS},
}


def space(algorithm: str) -> dict[str, tuple]:
    """Setting -> the values tried: the shared ones, then the algorithm's own."""
    if algorithm not in SPACES:
        raise ValueError(f"no search space for {algorithm!r}; spaces: {sorted(SPACES)}.")
    return {**SHARED, **SPACES[algorithm]}


def _valid(point: dict) -> bool:
    """Points that are runs: K < C ≤ N; β's horizon only matters with a β."""
    if "num_elites" in point and not point["num_elites"] < point["batch_size"] <= point["pool_capacity"]:
        return False
    return point["kl_coef"] > 0 or point["kl_decay_fraction"] == KL_DECAY_FRACTIONS[-1]


def draw_configurations(algorithm: str, count: int, seed: int) -> list[dict]:
    """`count` distinct points of the algorithm's space, uniformly at random among the valid ones (numpy,
    seeded: the same seed draws the same configurations)."""
    names = list(space(algorithm))
    points = [dict(zip(names, values)) for values in itertools.product(*space(algorithm).values())]
    points = [point for point in points if _valid(point)]
    if not 1 <= count <= len(points):
        raise ValueError(f"count must be in [1, {len(points)}] for {algorithm}'s space, got {count}.")
    chosen = np.random.default_rng(seed).choice(len(points), size=count, replace=False)
    return [points[index] for index in sorted(chosen)]


def as_overrides(point: dict, num_iterations: int) -> dict:
    """A configuration as `TrainConfig` overrides: the β decay share becomes kl_coef_final = 0 after that many
    iterations (none when β starts at 0)."""
    overrides = {name: value for name, value in point.items() if name != "kl_decay_fraction"}
    if point["kl_coef"] > 0:
        overrides["kl_coef_final"] = 0.0
        overrides["kl_decay_iterations"] = max(1, round(point["kl_decay_fraction"] * num_iterations))
    else:
        overrides["kl_coef_final"] = None
        overrides["kl_decay_iterations"] = None
    return overrides


def group_sweeps(
    env: str, configurations: list[dict], seeds: list[int], env_options: dict | None = None, **overrides: Any
) -> list[tuple[Sweep, list[int]]]:
    """One sweep per compiled program: (sweep, the indices of `configurations` it runs), in first-seen order.

    `overrides` (the algorithm and run settings every configuration shares) come first, each configuration's
    own on top of them.
    """
    base = TrainConfig.for_env(env, **overrides)
    configs = [base.replace(**as_overrides(point, base.num_iterations)) for point in configurations]
    groups: dict[str, list[int]] = {}
    for index, config in enumerate(configs):
        groups.setdefault(repr(sorted(program_key(config).items())), []).append(index)
    return [(sweep_of([configs[i] for i in indices], seeds, env_options), indices) for indices in groups.values()]

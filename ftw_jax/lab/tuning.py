"""Equal tuning for every algorithm: the same number of configurations, drawn at random from each one's space,
beside each one's reference recipe, narrowed by the same successive halving.

    configurations = candidates("ppo", count=21, seed=task_seed(0, "sokoban", {}, "ppo"), reference_rate=3e-3)
    sweeps = group_sweeps("sokoban", configurations, seeds=[1000, 1001, 1002], algorithm="ppo")
    rung_periods(num_periods=40, rungs=3)                              # [10, 20, 40]: 22, then 11, then 6 run on

Every algorithm searches the settings they share (the learning rate on a half-decade log grid 1e-4–1e-1, β at the
start, the iterations over which it decays to 0) and five knobs of its own where its references tune five (FTW:
N, J, C, K and the elite rule; PPO: minibatches, epochs, clip, GAE λ and entropy bonus; GRPO: G, steps per batch,
clip, the group's sd and entropy bonus, with TRL's β = 0.04 among the βs); REINFORCE has three (steps per batch,
entropy bonus, RLOO's group). The learning rate is stratified: the draws take every rate of the grid in turn
(a random order), so 21 configurations give each of the 7 rates three. Beside the drawn ones, each algorithm runs
its reference implementation's recipe (its registry entry's `reference`) at the task's own learning rate, the
same rate for every algorithm. Configurations that differ only in sweep axes (learning rate, β, N, J, C, K)
share one compiled program; `group_sweeps` makes one sweep per program. `ftw_jax.lab.compare` runs them on tuning
seeds and keeps the configuration with the best mean AUC; with rungs, every configuration runs to the first
rung, the better half (by mean AUC so far) goes on to the next, and so on to the full horizon, whose schedules
(β's decay, the annealed learning rate) every rung shares: a configuration is scored on the start of the very
run it would make. The grid is fixed before any run; a choice on its edge is reported as such (`at_edge` for the
learning rate, `ends` for every setting), never followed by a wider grid for one method.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ftw_jax import algos
from ftw_jax.lab.sweep import Sweep, program_key, sweep_of
from ftw_jax.lab.train import TrainConfig

# A half-decade log grid, fixed before the runs: 3e-2 and 1e-1 were added when FTW's tuning chose the top of
# the grid then (binary, then shaped Sokoban); every task and method now starts from the whole of it.
LEARNING_RATES = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
KL_COEFS = (0.0, 0.1, 0.3, 0.5, 1.0)
KL_DECAY_FRACTIONS = (0.25, 0.5, 1.0)  # β reaches 0 after this share of the run's iterations
SHARED = {"learning_rate": LEARNING_RATES, "kl_coef": KL_COEFS, "kl_decay_fraction": KL_DECAY_FRACTIONS}


def space(algorithm: str, learning_rates: Sequence[float] | None = None) -> dict[str, tuple]:
    """Setting -> the values tried: the shared ones, then the algorithm's own (its registry entry's
    `search_space`, which may replace a shared one's values); `learning_rates` replaces the grid of rates
    (a task whose choice lands on the grid's edge extends it, for every algorithm alike)."""
    rates = {"learning_rate": tuple(learning_rates)} if learning_rates else {}
    return {**SHARED, **algos.get(algorithm).search_space, **rates}


def reference_configuration(algorithm: str, learning_rate: float) -> dict:
    """The algorithm's reference recipe (its registry entry's `reference`) at `learning_rate`, as a point of its
    space (`space`'s names, in order; a `kl_decay_fraction` of None keeps β constant). What the entry leaves out
    is its config's default, without a KL: an algorithm registered without a recipe runs its defaults."""
    entry = algos.get(algorithm)
    names = list(space(algorithm))
    defaults = entry.config()
    own = {name: getattr(defaults, name) for name in names if hasattr(defaults, name)}
    recipe = {**own, "kl_coef": 0.0, "kl_decay_fraction": 1.0, **entry.reference, "learning_rate": learning_rate}
    if set(recipe) != set(names):
        raise ValueError(f"{algorithm}'s reference recipe sets {sorted(recipe)}; its searched settings are {names}.")
    return {name: recipe[name] for name in names}


def candidates(
    algorithm: str,
    count: int,
    seed: int | Sequence[int],
    reference_rate: float,
    learning_rates: Sequence[float] | None = None,
) -> list[dict]:
    """What `compare --search` tunes: `count` configurations drawn from the algorithm's space
    (`draw_configurations`, never the reference's point), then its reference recipe at `reference_rate`."""
    reference = reference_configuration(algorithm, reference_rate)
    return [*draw_configurations(algorithm, count, seed, learning_rates, exclude=reference), reference]


def at_edge(rate: float, grid: Sequence[float]) -> bool:
    """Whether a chosen learning rate is the lowest or highest of the grid it was chosen from."""
    return rate in (min(grid), max(grid))


def ends(chosen: dict, drawn: Sequence[dict]) -> dict[str, tuple[float, float]]:
    """The chosen settings that are the lowest or highest value of the `drawn` configurations, {name: (lowest,
    highest)}: every numeric setting that took three values or more, for every algorithm alike (a two-value
    setting's every choice is an end; a category has none; β's horizon means nothing without a β). Reported,
    never followed by a wider grid."""
    found = {}
    for name, value in chosen.items():
        if name == "kl_decay_fraction" and chosen.get("kl_coef") == 0:
            continue
        values = {row[name] for row in drawn if name in row}
        numbers = {each for each in values if isinstance(each, int | float) and not isinstance(each, bool)}
        if len(numbers) >= 3 and numbers == values and value in (min(numbers), max(numbers)):
            found[name] = (min(numbers), max(numbers))
    return found


def _valid(point: dict) -> bool:
    """Points that are runs: K < C ≤ N; β's horizon only matters with a β."""
    if "num_elites" in point and not point["num_elites"] < point["batch_size"] <= point["pool_capacity"]:
        return False
    return point["kl_coef"] > 0 or point["kl_decay_fraction"] == KL_DECAY_FRACTIONS[-1]


def task_seed(search_seed: int, env: str, env_options: dict | None, algorithm: str) -> list[int]:
    """The seed that draws an algorithm's configurations on a task (`draw_configurations`): `search_seed` with the
    task (the environment and its options: one hop and two hops are two tasks) and the algorithm, so that each
    task and method gets its own draw, and tuning luck is not shared across every task of a comparison."""
    task = json.dumps({"env": env, "options": env_options or {}, "algorithm": algorithm}, sort_keys=True)
    return [search_seed, zlib.crc32(task.encode())]


def draw_configurations(
    algorithm: str,
    count: int,
    seed: int | Sequence[int],
    learning_rates: Sequence[float] | None = None,
    exclude: dict | None = None,
) -> list[dict]:
    """`count` distinct points of the algorithm's space (numpy, seeded: the same seed, an int or the entropy
    `task_seed` makes, draws the same ones; `learning_rates`: the grid of rates, default `LEARNING_RATES`;
    `exclude`: a point never drawn).

    The learning rate is stratified: the draws walk the grid's rates in a random order (again and again when
    `count` exceeds them), and each draws the rest of its point uniformly among the valid ones with that rate
    not drawn yet.
    """
    searched = space(algorithm, learning_rates)
    names = list(searched)
    points = [dict(zip(names, values)) for values in itertools.product(*searched.values())]
    points = [point for point in points if _valid(point) and point != exclude]
    if not 1 <= count <= len(points):
        raise ValueError(f"count must be in [1, {len(points)}] for {algorithm}'s space, got {count}.")
    rng = np.random.default_rng(seed)
    rates = searched["learning_rate"]
    order = itertools.cycle([rates[index] for index in rng.permutation(len(rates))])
    chosen: list[int] = []
    while len(chosen) < count:  # ends: count <= len(points)
        rate = next(order)
        left = [i for i, point in enumerate(points) if point["learning_rate"] == rate and i not in chosen]
        if left:
            chosen.append(left[rng.integers(len(left))])
    return [points[index] for index in sorted(chosen)]


def rung_periods(num_periods: int, rungs: int) -> list[int]:
    """The evaluation periods at which successive halving's rungs end: halving the horizon back from the last,
    e.g. 40 periods in 3 rungs -> [10, 20, 40]."""
    if not (isinstance(rungs, int) and rungs >= 1):
        raise ValueError(f"rungs must be an int >= 1, got {rungs!r}.")
    if num_periods < 2 ** (rungs - 1):
        raise ValueError(
            f"{rungs} rungs halve the horizon {rungs - 1} time(s), which needs at least {2 ** (rungs - 1)} "
            f"evaluation periods; the tuning runs have {num_periods}: use fewer rungs or evaluate more often."
        )
    return [-(-num_periods // 2 ** (rungs - 1 - rung)) for rung in range(rungs)]


def promoted(scores: dict[int, float]) -> list[int]:
    """The better half (rounded up) of configurations by score, best first: those that go on to the next rung."""
    ranked = sorted(scores, key=lambda index: -scores[index])
    return ranked[: -(-len(ranked) // 2)]


def as_overrides(point: dict, num_iterations: int) -> dict:
    """A configuration as `TrainConfig` overrides: the β decay share becomes kl_coef_final = 0 after that many
    iterations (none when β starts at 0, or the share is None: a constant β)."""
    overrides = {name: value for name, value in point.items() if name != "kl_decay_fraction"}
    if point["kl_coef"] > 0 and point["kl_decay_fraction"] is not None:
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


@dataclasses.dataclass(frozen=True)
class Search:
    """A random search, the same for every algorithm (`compare`'s `search`, `search_seed`, `learning_rates`,
    `tuning_iterations`, `rungs`), and the rate its reference recipes run at (the environment's)."""

    count: int
    seed: int
    learning_rates: list[float] | None
    tuning_iterations: int | None
    rungs: int
    reference_rate: float

    def candidates(self, env: str, env_options: dict | None, algorithm: str) -> list[dict]:
        """The configurations the algorithm tunes on this task (`candidates`, its own draw)."""
        draw = task_seed(self.seed, env, env_options, algorithm)
        return candidates(algorithm, self.count, draw, self.reference_rate, self.learning_rates)


def check_search(
    env: str, env_options: dict | None, own_settings: dict[str, dict], search: Search, tuning_seeds: list[int]
) -> None:
    """Raises ValueError unless every algorithm's random search can run: tuning seeds given, no searched setting
    among its overrides, and every configuration it tunes a run of this environment (e.g. B a multiple of GRPO's
    G)."""
    if not tuning_seeds:
        raise ValueError(f"a random search of {search.count} configurations needs tuning seeds.")
    for algorithm, settings in own_settings.items():
        searched = sorted(set(space(algorithm)) & set(settings))
        if searched:
            raise ValueError(f"{', '.join(searched)} is/are searched for {algorithm}; leave them out of the overrides.")
        # draw_configurations refuses a bad count.
        configurations = search.candidates(env, env_options, algorithm)
        try:
            group_sweeps(env, configurations, tuning_seeds, env_options, algorithm=algorithm, **settings)
        except ValueError as error:
            raise ValueError(f"{algorithm}: a searched configuration: {error}") from None

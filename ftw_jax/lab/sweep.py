"""Sweeps: seeds × (N, J, C, K, β, learning rate) as one compiled program, sharded over every device.

    sweep = make_sweep("cartpole", parse_grid("C=4,8 K=1,2 kl=0,0.05"), seeds=[0, 1, 2])
    results = run_sweep(sweep)          # evaluation curves [M, periods] of every member

Every member (one grid point and one seed) runs the same program: the config's N, J, C, K are the grid's
maxima and each member uses its own sizes inside them (a pool using its first N slots, `select_elites_masked`);
β and the learning rate are arrays in its state. The member axis is a `vmap`, split over the devices (of
every process) with a `NamedSharding`.

A member draws exactly as a run with its own sizes does, in distribution. It also reproduces that run
number for number when both take the same subset method and elite path, which depend on the static sizes
(`selection.uses_floyd(N, C)`, `UpdateConfig.uses_counts`): always at the maxima.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax import algos
from ftw_jax.algos.base import Hyperparameters
from ftw_jax.algos.defaults import DEFAULT_ALGORITHM
from ftw_jax.core.settings import Setting, describe
from ftw_jax.lab.train import TrainConfig, Trainer, make_train
from ftw_jax.running.checkpoints import Checkpointer
from ftw_jax.running.loop import MemberRun, seed_keys


def axes(algorithm: str = DEFAULT_ALGORITHM) -> dict[str, Setting]:
    """Grid axis -> setting: those marked sweepable on the run's config and on the algorithm's."""
    settings = [*describe(algos.get(algorithm).config), *describe(TrainConfig)]
    return {item.axis: item for item in settings if item.axis}


def all_axes() -> dict[str, Setting]:
    """Every algorithm's axes (those registered by now): axis -> its setting."""
    return {axis: item for algorithm in algos.ALGORITHMS for axis, item in axes(algorithm).items()}


def parse_grid(text: str) -> dict[str, list]:
    """'C=4,5,8 K=1,2 kl=0.01,0.05' -> {'C': [4, 5, 8], 'K': [1, 2], 'kl': [0.01, 0.05]} (axes: N J C K kl lr)."""
    known = all_axes()
    grid: dict[str, list] = {}
    for item in text.split():
        name, separator, values = item.partition("=")
        if not separator or name not in known:
            raise ValueError(f"bad grid item {item!r}: expected AXIS=v1,v2,... with AXIS one of {list(known)}.")
        if name in grid:
            raise ValueError(f"grid axis {name!r} is given twice.")
        kind = known[name].base_type
        try:
            grid[name] = [kind(value) for value in values.split(",")]
        except ValueError:
            raise ValueError(f"bad values for grid axis {name!r}: {values!r} (expected {kind.__name__}s).") from None
        if len(set(grid[name])) < len(grid[name]):
            raise ValueError(f"grid axis {name!r} repeats a value: {values!r} (its members would be the same runs).")
    if not grid:
        raise ValueError(f"empty grid {text!r}: expected e.g. 'C=4,8 K=1,2'.")
    return grid


@dataclasses.dataclass(frozen=True)
class Sweep:
    """The program's config (integer sizes = the grid's maxima) and its members (grid points × seeds)."""

    config: TrainConfig
    env_options: dict
    members: list[dict]  # per member: the value of every axis, and "seed"
    member_configs: list[TrainConfig]  # per member: the config a standalone run of it would take
    grid: dict[str, list]

    def hyperparameters(self) -> Hyperparameters:
        """Leaves [M, ...]: every member's β, learning rate and the algorithm's sizes.

        Made once per distinct config and gathered per member: stacking a million members' arrays one by one
        took minutes and gigabytes before the memory check could refuse them."""
        distinct = {id(config): config for config in self.member_configs}  # a grid point's seeds share its config
        position = {key: index for index, key in enumerate(distinct)}
        rows = np.asarray([position[id(config)] for config in self.member_configs])
        stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *[c.hyperparameters() for c in distinct.values()])
        return jax.tree.map(lambda leaf: leaf[rows], stacked)

    def keys(self) -> jax.Array:
        return seed_keys([m["seed"] for m in self.members])

    def subset(self, members: list[int]) -> Sweep:
        """These members alone, in the same program (the same maxima: a member's numbers depend on them, and a
        run going on from this sweep's carry needs its shapes)."""
        return dataclasses.replace(
            self,
            members=[self.members[i] for i in members],
            member_configs=[self.member_configs[i] for i in members],
        )


def make_sweep(
    env: str, grid: dict[str, list], seeds: list[int], env_options: dict | None = None, **overrides: Any
) -> Sweep:
    """Members = every combination of the grid's values × seeds; axes not in the grid keep the env's defaults."""
    base = TrainConfig.for_env(env, **overrides)
    fields = {axis: item.name for axis, item in axes(base.algorithm).items()}
    for axis in grid:
        if axis not in fields:
            raise ValueError(f"grid axis {axis!r} is not a setting of {base.algorithm}; its axes are {list(fields)}.")
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    configs = []
    for point in points:
        try:
            configs.append(base.replace(**{fields[axis]: value for axis, value in point.items()}))
        except ValueError as error:
            raise ValueError(f"grid point {point}: {error}") from None
    return sweep_of(configs, seeds, env_options, grid)


def sweep_of(
    configs: list[TrainConfig], seeds: list[int], env_options: dict | None = None, grid: dict[str, list] | None = None
) -> Sweep:
    """Members = each config × seeds, in one program: the configs may differ only in their sweep axes."""
    if not seeds:
        raise ValueError("a sweep needs at least one seed.")
    if not configs:
        raise ValueError("a sweep needs at least one config.")
    fields = {axis: item.name for axis, item in axes(configs[0].algorithm).items()}
    for config in configs[1:]:
        if program_key(config) != program_key(configs[0]):
            raise ValueError(
                f"configs of one sweep may differ only in {list(fields)}: {program_key(config)} vs "
                f"{program_key(configs[0])}."
            )
    members = [
        {axis: _value(config, name) for axis, name in fields.items()} | {"seed": seed}
        for config in configs
        for seed in seeds
    ]
    integer_axes = [axis for axis, item in axes(configs[0].algorithm).items() if item.base_type is int]
    maxima = {fields[axis]: max(member[axis] for member in members) for axis in integer_axes}
    return Sweep(
        config=configs[0].replace(**maxima),
        env_options=dict(env_options or {}),
        members=members,
        member_configs=[config for config in configs for _ in seeds],
        grid=dict(grid or {}),
    )


def program_key(config: TrainConfig) -> dict:
    """The config's settings but its sweep axes: configs with the same key compile to one program."""
    swept = {item.name for item in axes(config.algorithm).values()}
    settings = {**dataclasses.asdict(config.algorithm_config), **dataclasses.asdict(config)}
    settings.pop("algorithm_config")
    return {name: value for name, value in settings.items() if name not in swept}


def _value(config: TrainConfig, name: str):
    """A field of the run's config or of its algorithm's."""
    return getattr(config, name) if hasattr(config, name) else getattr(config.algorithm_config, name)


def run_sweep(
    sweep: Sweep,
    on_period: Callable[[int, dict], None] | None = None,
    trainer: Trainer | None = None,
    checkpointer: Checkpointer | None = None,
    metric_names: tuple[str, ...] = (),
) -> dict:
    """Runs every member in one compiled program, one evaluation period per call (progress via `on_period`).

    The members are split over every device of every process (`ftw_jax.runner`); each process gets all the
    results. With a `checkpointer` the carry is saved after every period and a run starts from its latest
    checkpoint. Returns numpy arrays: every evaluation value [M, periods] (`return`, `success`, `env_steps`,
    `iteration`, and with task filtering `informative_tasks`, `probe_env_steps`), the
    last iteration's training `return_mean` as `train_return` [M, periods], and per iteration the training
    metrics named in `metric_names` under "metrics/NAME" [M, iterations] (e.g. "policy_kl_mean": the last
    update's of each).
    """
    trainer = trainer or make_train(sweep.config, **sweep.env_options)
    run = MemberRun(trainer, sweep.keys(), sweep.hyperparameters(), checkpointer, metric_names)
    for _ in run.periods():
        if on_period is not None:
            on_period(len(run.history) - 1, run.history[-1])
    return run.results()


def tidy_rows(sweep: Sweep, results: dict) -> list[dict]:
    """One row per member: its grid values and seed, final and best evaluation return and success, env steps."""
    return [
        {
            **member,
            "final_return": float(results["return"][i, -1]),
            "best_return": float(results["return"][i].max()),
            "final_success": float(results["success"][i, -1]),
            "best_success": float(results["success"][i].max()),
            "env_steps": int(results["env_steps"][i, -1]),
        }
        for i, member in enumerate(sweep.members)
    ]


def summarise_points(sweep: Sweep, values: np.ndarray) -> list[tuple[tuple, float, float]]:
    """(grid point, mean, sd over seeds) of one value per member ([M]), in grid order."""
    points: dict[tuple, list[float]] = {}
    for member, value in zip(sweep.members, values):
        points.setdefault(tuple(member[axis] for axis in sweep.grid), []).append(float(value))
    return [(point, float(np.mean(group)), float(np.std(group))) for point, group in points.items()]


def heatmap_cells(sweep: Sweep, values: np.ndarray, x_axis: str, y_axis: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Means [Y, X] of one value per member over two grid axes (other axes and seeds averaged), and the sd
    over seeds of each seed's average — the seed spread of the cell."""
    y_values = sweep.grid[y_axis] if y_axis else [None]
    seeds = sorted({member["seed"] for member in sweep.members})
    means = np.full((len(y_values), len(sweep.grid[x_axis])), np.nan)
    spreads = np.full_like(means, np.nan)
    for row, y in enumerate(y_values):
        for column, x in enumerate(sweep.grid[x_axis]):
            in_cell = [m[x_axis] == x and (y_axis is None or m[y_axis] == y) for m in sweep.members]
            per_seed = [
                np.mean([v for m, v, inside in zip(sweep.members, values, in_cell) if inside and m["seed"] == s])
                for s in seeds
            ]
            means[row, column], spreads[row, column] = np.mean(per_seed), np.std(per_seed)
    return means, spreads

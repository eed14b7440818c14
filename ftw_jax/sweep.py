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
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ftw_jax.checkpoints import Checkpointer, rows_from_record, rows_record
from ftw_jax.train import Hyperparameters, TrainConfig, Trainer, make_train

# Grid axis -> TrainConfig field.
AXES = {"N": "pool_capacity", "J": "num_batches", "C": "batch_size", "K": "num_elites", "kl": "kl_coef",
        "lr": "learning_rate"}
_INTEGER_AXES = ("N", "J", "C", "K")


def parse_grid(text: str) -> dict[str, list]:
    """'C=4,5,8 K=1,2 kl=0.01,0.05' -> {'C': [4, 5, 8], 'K': [1, 2], 'kl': [0.01, 0.05]} (axes: N J C K kl lr)."""
    grid: dict[str, list] = {}
    for item in text.split():
        name, separator, values = item.partition("=")
        if not separator or name not in AXES:
            raise ValueError(f"bad grid item {item!r}: expected AXIS=v1,v2,... with AXIS one of {list(AXES)}.")
        if name in grid:
            raise ValueError(f"grid axis {name!r} is given twice.")
        kind = int if name in _INTEGER_AXES else float
        try:
            grid[name] = [kind(value) for value in values.split(",")]
        except ValueError:
            raise ValueError(f"bad values for grid axis {name!r}: {values!r} (expected {kind.__name__}s).") from None
    if not grid:
        raise ValueError(f"empty grid {text!r}: expected e.g. 'C=4,8 K=1,2'.")
    return grid


@dataclasses.dataclass(frozen=True)
class Sweep:
    """The program's config (sizes = the grid's maxima) and its members (grid points × seeds)."""

    config: TrainConfig
    env_options: dict
    members: list[dict]  # per member: the value of every axis, and "seed"
    grid: dict[str, list]

    def hyperparameters(self) -> Hyperparameters:
        """Leaves [M, ...]: every member's sizes, β, learning rate and pool capacity."""
        return Hyperparameters(
            sizes=jnp.array([[m["J"], m["C"], m["K"]] for m in self.members], jnp.int32),
            kl_coef=jnp.array([m["kl"] for m in self.members], jnp.float32),
            learning_rate=jnp.array([m["lr"] for m in self.members], jnp.float32),
            pool_capacity=jnp.array([m["N"] for m in self.members], jnp.int32),
        )

    def keys(self) -> jax.Array:
        return jnp.stack([jax.random.key(m["seed"]) for m in self.members])


def make_sweep(env: str, grid: dict[str, list], seeds: list[int], env_options: dict | None = None, **overrides) -> Sweep:
    """Members = every combination of the grid's values × seeds; axes not in the grid keep the env's defaults."""
    base = TrainConfig.for_env(env, **overrides)
    defaults = {axis: getattr(base, field) for axis, field in AXES.items()}
    if not seeds:
        raise ValueError("a sweep needs at least one seed.")
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    members = [{**defaults, **point, "seed": seed} for point in points for seed in seeds]
    for member in members:
        sizes_ok = 1 <= member["K"] <= member["C"] <= member["N"] and member["J"] >= 1
        if not sizes_ok or member["N"] < base.episodes_per_iteration:
            raise ValueError(
                f"grid point N={member['N']}, J={member['J']}, C={member['C']}, K={member['K']} is outside "
                f"1 <= K <= C <= N, J >= 1, N >= B (B={base.episodes_per_iteration}, episodes per iteration)."
            )
        if member["kl"] < 0 or member["lr"] <= 0:
            raise ValueError(f"grid point kl={member['kl']}, lr={member['lr']}: expected kl >= 0 and lr > 0.")
    maxima = {AXES[axis]: max(member[axis] for member in members) for axis in _INTEGER_AXES}
    config = dataclasses.replace(base, **maxima)
    return Sweep(config=config, env_options=dict(env_options or {}), members=members, grid=grid)


def member_sharding(num_members: int) -> tuple[NamedSharding, int]:
    """A sharding of the member axis over every visible device, and the member count padded to fit it."""
    devices = np.array(jax.devices())
    padded = -(-num_members // len(devices)) * len(devices)
    return NamedSharding(Mesh(devices, ("members",)), PartitionSpec("members")), padded


def _host_array(array: jax.Array) -> np.ndarray:
    """The whole of a member-sharded array on this host (gathered from the other processes if there are any)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def run_sweep(sweep: Sweep, on_period: Callable[[int, dict], None] | None = None, trainer: Trainer | None = None,
              checkpointer: Checkpointer | None = None, metric_names: tuple[str, ...] = ()) -> dict:
    """Runs every member in one compiled program, one evaluation period per call (progress via `on_period`).

    The members are split over every device of every process (`jax.distributed`); each process gets all the
    results. With a `checkpointer` the carry is saved after every period and a run starts from its latest
    checkpoint. Returns numpy arrays: every evaluation value [M, periods] (`return`, `success`, `env_steps`,
    `iteration`, and with task filtering `informative_tasks`, `probe_env_steps`), the
    last iteration's training `return_mean` [M, periods], and per iteration the training metrics named in
    `metric_names` under "metrics/NAME" [M, iterations] (e.g. "policy_kl_mean": the last update's of each).
    """
    trainer = trainer or make_train(sweep.config, **sweep.env_options)
    num_members = len(sweep.members)
    sharding, padded = member_sharding(num_members)
    key_data = np.asarray(jax.random.key_data(sweep.keys()))  # raw uint32: keys cannot be numpy arrays
    hyperparameters = jax.tree.map(np.asarray, sweep.hyperparameters())
    if padded > num_members:  # filler members (the last one's settings, fresh keys) whose results are dropped
        extra = padded - num_members
        key_data = np.concatenate([key_data, np.asarray(jax.random.key_data(jax.random.split(jax.random.key(-1), extra)))])
        hyperparameters = jax.tree.map(lambda leaf: np.concatenate([leaf, np.repeat(leaf[-1:], extra, 0)]), hyperparameters)
    # Every process holds the same inputs and gives each of its devices that device's members.
    to_devices = lambda leaf: jax.make_array_from_callback(leaf.shape, sharding, lambda index: leaf[index])  # noqa: E731
    init = jax.jit(jax.vmap(lambda data, h: trainer.init(jax.random.wrap_key_data(data), h)), out_shardings=sharding)
    carry = init(to_devices(key_data), jax.tree.map(to_devices, hyperparameters))
    history = []  # per period: {name: [M]}
    restored = checkpointer.restore(carry) if checkpointer else None
    if restored:
        _, carry, record = restored
        history = rows_from_record(record["history"])
    run_period = jax.jit(jax.vmap(trainer.run, in_axes=(0, None)), static_argnums=1)
    for period in range(len(history), sweep.config.num_periods):
        carry, (metrics, evaluation) = run_period(carry, 1)
        row = {
            **{name: _host_array(value)[:num_members, 0] for name, value in evaluation.items()},
            "train_return": _host_array(metrics["return_mean"])[:num_members, 0, -1],
            **{f"metrics/{name}": _host_array(metrics[name])[:num_members, 0] for name in metric_names},  # [M, E]
        }
        history.append(row)
        if checkpointer:
            checkpointer.save(period + 1, carry, {"history": rows_record(history)},
                              final=period + 1 == sweep.config.num_periods)
        if on_period is not None:
            on_period(period, row)
    results = {name: np.stack([row[name] for row in history], axis=1) for name in history[0]}
    for name in metric_names:  # [M, periods, eval_every] -> [M, iterations]
        results[f"metrics/{name}"] = results[f"metrics/{name}"].reshape(num_members, -1)
    return results


def tidy_rows(sweep: Sweep, results: dict) -> list[dict]:
    """One row per member: its grid values and seed, final and best evaluation return and success, env steps."""
    return [
        {**{axis: member[axis] for axis in AXES}, "seed": member["seed"],
         "final_return": float(results["return"][i, -1]), "best_return": float(results["return"][i].max()),
         "final_success": float(results["success"][i, -1]), "best_success": float(results["success"][i].max()),
         "env_steps": int(results["env_steps"][i, -1])}
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
            per_seed = [np.mean([v for m, v, inside in zip(sweep.members, values, in_cell) if inside and m["seed"] == s])
                        for s in seeds]
            means[row, column], spreads[row, column] = np.mean(per_seed), np.std(per_seed)
    return means, spreads

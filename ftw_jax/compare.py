"""Algorithms side by side at a matched budget, and the statistics that report them.

    comparison = compare("sokoban", ["ftw", "ppo", "grpo", "reinforce"], seeds=range(5))
    rows = summary_rows(comparison)     # per algorithm: final and AUC, mean [95% bootstrap CI], IQM

Matched budget: every algorithm runs the environment's `TrainConfig` with the same overrides, so the same
iterations × B episodes (env steps differ only as episode lengths do), the same policy network, the same
optimizer family and the same evaluation. Tuning effort is the same too: each algorithm tries every learning
rate of the grid on the tuning seeds (kept apart from the reported seeds) and keeps the one with the highest
mean AUC; with a one-value grid nothing is tuned. Each (algorithm, phase) is one compiled sweep over
learning rates × seeds (`ftw_jax.sweep`), so it is vmapped, sharded and checkpointed as sweeps are.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import time
from typing import Callable

import numpy as np
import scipy.stats

from ftw_jax import envs
from ftw_jax.checkpoints import Checkpointer
from ftw_jax.sweep import make_sweep, run_sweep
from ftw_jax.train import RUN_FIELDS, TrainConfig, split_overrides

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000


def interquartile_mean(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """The mean of the middle half (scipy's 25% trimmed mean): robust to one run that diverged or got lucky."""
    return scipy.stats.trim_mean(np.asarray(values, np.float64), 0.25, axis=axis)


def bootstrap_interval(values: np.ndarray, axis: int = 0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The 95% percentile-bootstrap interval of the mean over `axis` (seeds); deterministic given `seed`."""
    values = np.asarray(values, np.float64)
    if values.shape[axis] < 2:
        return values.mean(axis=axis), values.mean(axis=axis)
    result = scipy.stats.bootstrap((values,), np.mean, axis=axis, confidence_level=CONFIDENCE, method="percentile",
                                   n_resamples=BOOTSTRAP_RESAMPLES, rng=np.random.default_rng(seed))
    return result.confidence_interval.low, result.confidence_interval.high


def describe(values: np.ndarray) -> dict:
    """mean, 95% bootstrap CI and IQM of one value per seed."""
    low, high = bootstrap_interval(values)
    return {"mean": float(np.mean(values)), "ci_low": float(low), "ci_high": float(high),
            "iqm": float(interquartile_mean(values))}


@dataclasses.dataclass(frozen=True)
class AlgorithmResult:
    """One algorithm's reported runs: curves [S, periods] of the metric, and how its learning rate was chosen."""

    algorithm: str
    learning_rate: float
    curves: np.ndarray  # [S, periods] the evaluation metric
    env_steps: np.ndarray  # [S, periods] training env steps at each evaluation
    seconds: float  # wall clock of its runs (tuning included)
    tuning: list[dict]  # per learning rate tried: {"learning_rate", "auc_mean"}; empty when not tuned
    applied_share: np.ndarray  # [S] the share of its optimizer steps each reported seed applied

    @property
    def final(self) -> np.ndarray:
        return self.curves[:, -1]

    @property
    def auc(self) -> np.ndarray:
        """Area under the evaluation curve, normalised by its length: the mean over evaluations, per seed."""
        return self.curves.mean(axis=1)


@dataclasses.dataclass(frozen=True)
class Comparison:
    env: str
    metric: str
    seeds: list[int]
    episodes: np.ndarray  # [periods] training episodes at each evaluation (the same for every algorithm)
    results: list[AlgorithmResult]


def compare(env: str, algorithms: list[str], seeds: list[int], *, learning_rates: list[float] | None = None,
            tuning_seeds: list[int] = (), env_options: dict | None = None, overrides: dict | None = None,
            metric: str | None = None, checkpoint_folder: pathlib.Path | None = None,
            on_period: Callable[[str, str, int, np.ndarray], None] | None = None,
            log: Callable[[str], None] | None = None) -> Comparison:
    """Runs every algorithm on `env` at the same budget (see the module docstring) and returns their curves.

    Args:
      env, env_options, overrides: as for `TrainConfig.for_env`; each algorithm takes those of `overrides`
        that are its settings (`log` names the others).
      algorithms: names from `ftw_jax.algos.ALGORITHMS`.
      seeds: the reported seeds.
      learning_rates: the tuning grid (default: the environment's learning rate alone, no tuning).
      tuning_seeds: seeds for choosing the learning rate; must not overlap `seeds` and are needed when the
        grid has more than one value.
      metric: "success" or "return" (default: success where the environment has it).
      checkpoint_folder: each (algorithm, phase) checkpoints under it and resumes from it.
      on_period: progress, called as (algorithm, phase, period, metric of every member [M]) after every
        evaluation period; phase is "tune" or "report".
    """
    overrides = dict(overrides or {})
    own_settings = {}  # each algorithm's settings among the overrides (the run's and its own)
    for algorithm in algorithms:
        own_settings[algorithm], ignored = split_overrides(algorithm, overrides)
        if ignored and log:
            log(f"note: {', '.join(sorted(ignored))} do(es) not apply to {algorithm}; ignored for it.")
    base = TrainConfig.for_env(env, **{name: value for name, value in overrides.items() if name in RUN_FIELDS})
    learning_rates = list(learning_rates or [base.learning_rate])
    seeds, tuning_seeds = list(seeds), list(tuning_seeds)
    if len(set(algorithms)) != len(algorithms) or not algorithms:
        raise ValueError(f"algorithms must be distinct and at least one, got {algorithms}.")
    if len(learning_rates) > 1 and not tuning_seeds:
        raise ValueError(f"a tuning grid of {len(learning_rates)} learning rates needs tuning seeds.")
    if set(seeds) & set(tuning_seeds):
        raise ValueError(f"tuning seeds {sorted(set(seeds) & set(tuning_seeds))} are also reported seeds; "
                         "tune on other seeds.")
    for algorithm in algorithms:  # every algorithm's options are checked before the first one runs
        try:
            make_sweep(env, {"lr": learning_rates}, seeds, env_options, algorithm=algorithm, **own_settings[algorithm])
        except ValueError as error:
            raise ValueError(f"{algorithm}: {error} (change its settings, or leave it out of the algorithms)") from None
    if metric not in (None, "success", "return"):
        raise ValueError(f"metric must be 'success' or 'return', got {metric!r}.")
    metric = metric or ("success" if envs.make(env, **dict(env_options or {})).has_success else "return")
    phases = _Phases(env, dict(env_options or {}), metric, checkpoint_folder, on_period)
    results = [phases.compare(algorithm, own_settings[algorithm], learning_rates, seeds, tuning_seeds)
               for algorithm in algorithms]
    episodes = np.arange(1, base.num_periods + 1) * base.eval_every * base.episodes_per_iteration
    return Comparison(env=env, metric=metric, seeds=seeds, episodes=episodes, results=results)


@dataclasses.dataclass(frozen=True)
class _Phases:
    """How `compare` runs an algorithm: a tuning sweep over learning rates, then the reported seeds."""

    env: str
    env_options: dict
    metric: str
    checkpoint_folder: pathlib.Path | None
    on_period: Callable[[str, str, int, np.ndarray], None] | None

    def run(self, algorithm: str, phase: str, sweep) -> dict:
        """One phase's sweep, checkpointed in its own folder ("ALGORITHM-PHASE") and resumed from it."""
        checkpointer = None
        if self.checkpoint_folder:
            checkpointer = Checkpointer(self.checkpoint_folder / f"{algorithm}-{phase}", {
                "algorithm": algorithm, "phase": phase, "members": sweep.members,
                "config": dataclasses.asdict(sweep.config)})
        progress = self.on_period and (lambda period, row: self.on_period(algorithm, phase, period, row[self.metric]))
        try:
            return run_sweep(sweep, progress, checkpointer=checkpointer)
        finally:
            if checkpointer:
                checkpointer.close()

    def compare(self, algorithm: str, settings: dict, learning_rates: list[float], seeds: list[int],
                tuning_seeds: list[int]) -> AlgorithmResult:
        """The learning rate with the best mean AUC on the tuning seeds (if several), then the reported seeds."""
        started = time.perf_counter()
        chosen, tuning = learning_rates[0], []
        sweep = functools.partial(make_sweep, self.env, env_options=self.env_options, algorithm=algorithm, **settings)
        if len(learning_rates) > 1:
            tuning_sweep = sweep({"lr": learning_rates}, tuning_seeds)
            curves = self.run(algorithm, "tune", tuning_sweep)[self.metric]
            for rate in learning_rates:
                members = [i for i, m in enumerate(tuning_sweep.members) if m["lr"] == rate]
                tuning.append({"learning_rate": rate, "auc_mean": float(curves[members].mean())})
            chosen = max(tuning, key=lambda row: row["auc_mean"])["learning_rate"]
        reported = self.run(algorithm, "report", sweep({"lr": [chosen]}, seeds))
        return AlgorithmResult(algorithm=algorithm, learning_rate=chosen, curves=reported[self.metric],
                               env_steps=reported["env_steps"], seconds=time.perf_counter() - started, tuning=tuning,
                               applied_share=reported["updates_applied_share"])


def summary_rows(comparison: Comparison) -> list[dict]:
    """Per algorithm: its learning rate, final and AUC (mean, 95% CI, IQM over seeds), env steps, seconds."""
    rows = []
    for result in comparison.results:
        row = {"algorithm": result.algorithm, "learning_rate": result.learning_rate, "seeds": len(comparison.seeds)}
        for name, values in (("final", result.final), ("auc", result.auc)):
            row.update({f"{name}_{key}": value for key, value in describe(values).items()})
        row["env_steps_mean"] = float(result.env_steps[:, -1].mean())
        row["seconds"] = result.seconds
        rows.append(row)
    return rows


def seed_rows(comparison: Comparison) -> list[dict]:
    """One row per (algorithm, seed): final, AUC, env steps."""
    return [{"algorithm": result.algorithm, "seed": seed, "learning_rate": result.learning_rate,
             "final": float(final), "auc": float(auc), "env_steps": int(steps)}
            for result in comparison.results
            for seed, final, auc, steps in zip(comparison.seeds, result.final, result.auc, result.env_steps[:, -1])]


def markdown_table(comparison: Comparison) -> str:
    """The summary as a markdown table (values as percentages for success)."""
    scale, unit = (100.0, "%") if comparison.metric == "success" else (1.0, "")
    cell = lambda row, name: (f"{scale * row[f'{name}_mean']:.1f}{unit} [{scale * row[f'{name}_ci_low']:.1f}, "  # noqa: E731
                              f"{scale * row[f'{name}_ci_high']:.1f}] | {scale * row[f'{name}_iqm']:.1f}{unit}")
    lines = [f"| algorithm | learning rate | final {comparison.metric}: mean [95% CI] | final IQM | "
             f"AUC: mean [95% CI] | AUC IQM | env steps / seed | seconds |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in summary_rows(comparison):
        lines.append(f"| {row['algorithm']} | {row['learning_rate']:g} | {cell(row, 'final')} | {cell(row, 'auc')} | "
                     f"{row['env_steps_mean']:,.0f} | {row['seconds']:.0f} |")
    return "\n".join(lines) + "\n"

"""Whether each method's learning curve still moves at the end of a finished comparison.

Reads the comparison's `curves.npz` (held-out success per seed and evaluation) and `summary.json` (the run's
size). For each method and seed, the least-squares slope of success against iterations over the evaluations in
the last quarter of the run (at least three; `last` sets the share read); then, over the seeds, the mean slope in
points per 100 iterations with its 95% t-interval, the one-sample t-test of a zero slope (two-sided), and how many
seeds rise. A curve is "rising" or "falling" where that test's p is below 0.05, and otherwise "no trend shown": a
run too short for its best method shows as "rising". Nothing is run, and nothing here enters a comparison's own
tables.
"""

from __future__ import annotations

import pathlib

import numpy as np
import scipy.stats

from ftw_jax.lab.reports.comparison_summary import LABELS, METHODS, read_summary, run_size
from ftw_jax.lab.stats import p_text, t_interval

MINIMUM_EVALUATIONS = 3  # a slope through two points has no error to test
SIGNIFICANCE = 0.05


def slopes(success: np.ndarray, iterations: np.ndarray) -> np.ndarray:
    """Least-squares slope of each seed's success [seeds, evaluations] against `iterations` [evaluations]."""
    centred = iterations - iterations.mean()
    return (success - success.mean(axis=1, keepdims=True)) @ centred / (centred @ centred)


def trend(per_seed: np.ndarray) -> tuple[float, str]:
    """The two-sided p-value of the one-sample t-test of a zero mean slope, and the verdict it gives: "rising",
    "falling" or "no trend shown". Seeds that all lie on one line (a flat 0% or 100%) leave nothing to test."""
    if np.all(per_seed == per_seed[0]):
        p_value = 1.0 if per_seed.mean() == 0 else 0.0
    else:
        p_value = float(scipy.stats.ttest_1samp(per_seed, 0.0).pvalue)  # pyright: ignore[reportAttributeAccessIssue]
    if p_value >= SIGNIFICANCE:
        return p_value, "no trend shown"
    return p_value, "rising" if per_seed.mean() > 0 else "falling"


def read_window(folder: pathlib.Path, last: float) -> tuple[np.lib.npyio.NpzFile, np.ndarray, np.ndarray]:
    """The comparison's curves, the iteration of each evaluation and the mask of those in the run's last `last`;
    a ValueError (one line) where `last` is outside (0, 1], the comparison has not finished or the window holds
    fewer than `MINIMUM_EVALUATIONS` evaluations."""
    if not 0.0 < last <= 1.0:
        raise ValueError(f"`last` must be in (0, 1], got {last}")
    if not (folder / "summary.json").is_file():
        raise ValueError(f"{folder} holds no finished comparison (no summary.json)")
    summary = read_summary(folder)
    if not (folder / "curves.npz").is_file():
        raise ValueError(f"{folder} has no curves.npz (a comparison writes it when it finishes)")
    curves = np.load(folder / "curves.npz")
    iterations = curves["episodes"] / run_size(summary).episodes_per_iteration
    window = iterations >= iterations[-1] * (1.0 - last)
    if window.sum() < MINIMUM_EVALUATIONS:
        raise ValueError(
            f"`last` {last} reads {window.sum()} of the run's {iterations.size} evaluations; "
            f"a slope needs at least {MINIMUM_EVALUATIONS}"
        )
    return curves, iterations, window


def end_rows(folder: pathlib.Path, last: float = 0.25) -> list[str]:
    """The lines of a Markdown table, one row per method of the comparison in `folder`: its curves' slope over the
    run's last `last`, in points per 100 iterations (see `read_window` for the ValueErrors)."""
    curves, iterations, window = read_window(folder, last)
    shown = iterations[window]
    rows = [
        f"Slopes over iterations {shown[0]:.0f}–{shown[-1]:.0f} ({window.sum()} evaluations), points per 100 "
        "iterations:\n",
        "| method | mean slope [95% t-interval] | t-test p | seeds rising | at the end |",
        "|---|---:|---:|---:|---|",
    ]
    for name in (name for name in METHODS if f"{name}_success" in curves.files):
        per_seed = 100 * 100 * slopes(curves[f"{name}_success"][:, window], shown)
        low, high = t_interval(per_seed)
        p_value, verdict = trend(per_seed)
        rows.append(
            f"| {LABELS[name]} | {per_seed.mean():+.2f} [{low:+.2f}, {high:+.2f}] | {p_text(p_value)} | "
            f"{int((per_seed > 0).sum())} of {per_seed.size} | {verdict} |"
        )
    return rows

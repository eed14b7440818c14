"""Whether each method's learning curve still moves at the end of a finished comparison.

    python experiments/curve_ends.py results/compare-reference-recipes/search-2hop

Reads the comparison's `curves.npz` (held-out success per seed and evaluation) and `summary.json` (the run's
size). For each method and seed, the least-squares slope of success against iterations over the evaluations in
the last quarter of the run (at least three); then, over the seeds, the mean slope in points per 100 iterations
with its 95% t-interval, the one-sample t-test of a zero slope (two-sided), and how many seeds rise. A curve is
"rising" or "falling" where that test's p is below 0.05, and otherwise "no trend shown": a run too short for its
best method shows as "rising". `--last` sets the share of the run read. Nothing is run, and nothing here enters a
comparison's own tables.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
import scipy.stats

from ftw_jax.lab.stats import p_text, t_interval

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from comparison_summary import LABELS, METHODS, read_summary, run_size  # noqa: E402

MINIMUM_EVALUATIONS = 3  # a slope through two points has no error to test


def slopes(success: np.ndarray, iterations: np.ndarray) -> np.ndarray:
    """Least-squares slope of each seed's success [seeds, evaluations] against `iterations` [evaluations]."""
    centred = iterations - iterations.mean()
    return (success - success.mean(axis=1, keepdims=True)) @ centred / (centred @ centred)


def end_rows(folder: pathlib.Path, last: float) -> list[str]:
    """One Markdown row per method of the comparison in `folder`: its curves' slope over the run's last `last`."""
    summary = read_summary(folder)
    if not (folder / "curves.npz").is_file():
        raise SystemExit(f"error: {folder} has no curves.npz (a comparison writes it when it finishes)")
    curves = np.load(folder / "curves.npz")
    iterations = curves["episodes"] / run_size(summary).episodes_per_iteration
    window = iterations >= iterations[-1] * (1.0 - last)
    if window.sum() < MINIMUM_EVALUATIONS:
        raise SystemExit(
            f"error: --last {last} reads {window.sum()} of the run's {iterations.size} evaluations; "
            f"a slope needs at least {MINIMUM_EVALUATIONS}"
        )
    shown = iterations[window]
    rows = [
        f"Slopes over iterations {shown[0]:.0f}–{shown[-1]:.0f} ({window.sum()} evaluations), points per 100 "
        "iterations:\n",
        "| method | mean slope [95% t-interval] | t-test p | seeds rising | at the end |",
        "|---|---:|---:|---:|---|",
    ]
    for name in (name for name in METHODS if f"{name}_success" in curves.files):
        per_seed = 100 * 100 * slopes(curves[f"{name}_success"][:, window], shown)
        mean = per_seed.mean()
        low, high = t_interval(per_seed)
        if np.all(per_seed == per_seed[0]):  # every seed on one line (a flat 0% or 100%): nothing to test
            p_value = 1.0 if mean == 0 else 0.0
        else:
            p_value = scipy.stats.ttest_1samp(per_seed, 0.0).pvalue  # pyright: ignore[reportAttributeAccessIssue]
        trend = "no trend shown" if p_value >= 0.05 else ("rising" if mean > 0 else "falling")
        rows.append(
            f"| {LABELS[name]} | {mean:+.2f} [{low:+.2f}, {high:+.2f}] | {p_text(p_value)} | "
            f"{int((per_seed > 0).sum())} of {per_seed.size} | {trend} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="Whether each method's curve still moves at a comparison's end.")
    parser.add_argument("folder", type=pathlib.Path, help="a finished comparison (its summary.json and curves.npz)")
    parser.add_argument("--last", type=float, default=0.25, help="the share of the run read, from its end")
    args = parser.parse_args()
    if not 0.0 < args.last <= 1.0:
        raise SystemExit(f"error: --last must be in (0, 1], got {args.last}")
    if not (args.folder / "summary.json").is_file():
        raise SystemExit(f"error: {args.folder} holds no finished comparison (no summary.json)")
    print("\n".join(end_rows(args.folder, args.last)))


if __name__ == "__main__":
    main()

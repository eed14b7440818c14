"""Whether each method's learning curve still moves at the end of a finished comparison.

    python experiments/protocol/curve_ends.py results/compare-reference-recipes/search-2hop

Reads the comparison's `curves.npz` (held-out success per seed and evaluation) and `summary.json` (the run's
size). For each method and seed, the least-squares slope of success against iterations over the evaluations in
the last quarter of the run (at least three); then, over the seeds, the mean slope in points per 100 iterations
with its 95% t-interval, the one-sample t-test of a zero slope (two-sided), and how many seeds rise. A curve is
"rising" or "falling" where that test's p is below 0.05, and otherwise "no trend shown": a run too short for its
best method shows as "rising". `--last` sets the share of the run read. Nothing is run, and nothing here enters a
comparison's own tables. The slopes are `ftw_jax.lab.reports.curve_ends`'s; this is their command line.
"""

from __future__ import annotations

import argparse
import pathlib

from ftw_jax.lab.reports.curve_ends import end_rows


def main() -> None:
    parser = argparse.ArgumentParser(description="Whether each method's curve still moves at a comparison's end.")
    parser.add_argument("folder", type=pathlib.Path, help="a finished comparison (its summary.json and curves.npz)")
    parser.add_argument("--last", type=float, default=0.25, help="the share of the run read, from its end")
    args = parser.parse_args()
    try:
        rows = end_rows(args.folder, args.last)
    except ValueError as error:  # the library names a setting (`last`); this names its flag
        raise SystemExit(f"error: {str(error).replace('`last`', '--last')}") from None
    print("\n".join(rows))


if __name__ == "__main__":
    main()

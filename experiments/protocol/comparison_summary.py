"""The numbers of the README's comparison table and its FTW-minus-baseline tests, from finished comparisons.

    python experiments/protocol/comparison_summary.py  # results/compare-reference-recipes
    python experiments/protocol/comparison_summary.py results/compare-successive-halving   # an earlier protocol's

Reads each task folder's `summary.json` (written when `ftw-jax compare` finishes: per-method statistics and the
differences with their Holm-adjusted p-values) and `curves.npz` (greedy evaluation), in the order of TASKS; a
task still running (no summary.json) is listed as such. Prints two Markdown tables: held-out success per method
(final sampled with its t-interval cut to [0, 100], final greedy, AUC with its interval; the best mean of a row
in bold), and every FTW − baseline difference with its Welch interval and p, the Holm-adjusted and Mann–Whitney
p, the verdict and the solved-seed counts with Fisher's exact p. Nothing is computed here that the comparison
did not write (but the greedy means of the final evaluation): this only lays its numbers side by side. The
tables are `ftw_jax.lab.reports.comparison_summary`'s; this is their command line.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

from ftw_jax.lab.reports.comparison_summary import summary_text


def main() -> None:
    try:
        summarise()
    except BrokenPipeError:  # read through `| head`: stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        sys.exit(1)


def summarise() -> None:
    parser = argparse.ArgumentParser(
        description="The numbers of the README's comparison table, from finished comparisons."
    )
    parser.add_argument(
        "folder", nargs="?", type=pathlib.Path, default=pathlib.Path("results/compare-reference-recipes")
    )
    args = parser.parse_args()
    try:
        text = summary_text(args.folder)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    print(text)


if __name__ == "__main__":
    main()

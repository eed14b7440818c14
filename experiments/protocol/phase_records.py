"""What a comparison's finished phases say so far, from their records alone (no weights, nothing run).

    python experiments/protocol/phase_records.py results/compare-successive-halving/search-1hop

One row per configuration and phase (`checkpoints/ALGORITHM-PHASE.json`), best first within each phase kind:
the iterations reached, the mean over the phase's seeds of the evaluation AUC and final value, and with greedy
evaluation the greedy final value; success as percentages; and the commit of the code that wrote the record
("+dirty": with changes not committed; "-": a record written before records named their code). A long
`compare --search --rungs` can be watched (and its tuning tables previewed) while it runs, or read in another
session from the committed records. The rows are `ftw_jax.lab.reports.phase_records`'s; this is their command line.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

from ftw_jax.lab.reports.phase_records import phase_table


def main() -> None:
    parser = argparse.ArgumentParser(description="What a comparison's finished phases say so far, from their records.")
    parser.add_argument("folder", type=pathlib.Path, help="a compare run folder (or its committed copy)")
    args = parser.parse_args()
    try:
        lines = phase_table(args.folder)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    for line in lines:
        print(line)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # read through `| head`: stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        sys.exit(1)

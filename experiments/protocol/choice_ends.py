"""Which of each method's chosen settings are an end of the values its tuning drew, from a finished comparison.

    python experiments/protocol/choice_ends.py results/compare-reference-recipes/*/

Reads the comparison's `summary.json` (each method's chosen configuration) and `tuning.csv` (every configuration
tried, the drawn ones marked); prints, per task and method, the chosen settings that are the lowest or highest
value the drawn configurations took, of every numeric setting that took three or more (`ftw_jax.lab.tuning.ends`,
which a comparison's `tuning.md` now reports itself). The protocol reports these and never widens a grid after;
this reads the same for every method, so that no method's ends are the only ones named. The reading is
`ftw_jax.lab.reports.choice_ends`'s; this is its command line.
"""

from __future__ import annotations

import argparse
import pathlib

from ftw_jax.lab.reports.choice_ends import ends_lines


def main() -> None:
    parser = argparse.ArgumentParser(description="Chosen settings at an end of the values tuning drew.")
    parser.add_argument("folders", nargs="+", type=pathlib.Path, help="finished comparisons with a search")
    for folder in parser.parse_args().folders:
        if not folder.is_dir():
            raise SystemExit(f"error: {folder} is not a folder (a finished comparison's)")
        print(f"{folder.name or folder}:")
        try:
            lines = ends_lines(folder)
        except ValueError as error:  # the library names a setting (`search`); this names its flag
            raise SystemExit(f"error: {str(error).replace('`search`', '--search')}") from None
        for line in lines:
            print(line)


if __name__ == "__main__":
    main()

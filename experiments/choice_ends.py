"""Which of each method's chosen settings are an end of the values its tuning drew, from a finished comparison.

    python experiments/choice_ends.py results/compare-reference-recipes/*/

Reads the comparison's `summary.json` (each method's chosen configuration) and `tuning.csv` (every configuration
tried, the drawn ones marked); prints, per task and method, the chosen settings that are the lowest or highest
value the drawn configurations took, of every numeric setting that took three or more (`ftw_jax.lab.tuning.ends`,
which a comparison's `tuning.md` now reports itself). The protocol reports these and never widens a grid after;
this reads the same for every method, so that no method's ends are the only ones named.
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib

from ftw_jax.lab import tuning


def cell(text: str):
    """A tuning.csv cell of a method's own setting as the value it was: a number, a truth value, None (written
    empty, or "None"), or the text itself."""
    if text in ("True", "False"):
        return text == "True"
    if text in ("", "None"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def choice_ends(folder: pathlib.Path) -> dict[str, dict[str, tuple]]:
    """{method: {setting: (chosen, lowest, highest)}} for a finished comparison with a search."""
    if not (folder / "tuning.csv").is_file():
        raise SystemExit(f"error: {folder} has no tuning.csv (a finished comparison with --search writes it)")
    chosen = json.loads((folder / "summary.json").read_text()).get("chosen") or {}
    with open(folder / "tuning.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    found = {}
    for method, settings in chosen.items():
        drawn = [
            {name: cell(row[name]) for name in settings}
            for row in rows
            if row["algorithm"] == method and row["candidate"] == "drawn"
        ]
        found[method] = {
            name: (settings[name], low, high) for name, (low, high) in tuning.ends(settings, drawn).items()
        }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description="Chosen settings at an end of the values tuning drew.")
    parser.add_argument("folders", nargs="+", type=pathlib.Path, help="finished comparisons with a search")
    for folder in parser.parse_args().folders:
        if not folder.is_dir():
            raise SystemExit(f"error: {folder} is not a folder (a finished comparison's)")
        print(f"{folder.name or folder}:")
        if not (folder / "summary.json").is_file():  # `results/*/` takes a comparison still running too
            print("  not finished yet (no summary.json)")
            continue
        for method, found in choice_ends(folder).items():
            listed = ", ".join(f"{name} {value:g} ({low:g}…{high:g})" for name, (value, low, high) in found.items())
            print(f"  {method}: {listed or 'none'}")


if __name__ == "__main__":
    main()

"""Which of each method's chosen settings are an end of the values its tuning drew, from a finished comparison.

Reads the comparison's `summary.json` (each method's chosen configuration) and `tuning.csv` (every configuration
tried, the drawn ones marked): per method, the chosen settings that are the lowest or highest value the drawn
configurations took, of every numeric setting that took three or more (`ftw_jax.lab.tuning.ends`, which a
comparison's `tuning.md` now reports itself). The protocol reports these and never widens a grid after; this reads
the same for every method, so that no method's ends are the only ones named.
"""

from __future__ import annotations

import csv
import pathlib
from typing import Any

from ftw_jax.lab import tuning
from ftw_jax.running.run_files import read_json

NOT_FINISHED = "  not finished yet (no summary.json)"


def cell(text: str) -> Any:
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
    """{method: {setting: (chosen, lowest, highest)}} for a finished comparison with a search; a ValueError where
    `folder` has no tuning.csv."""
    if not (folder / "tuning.csv").is_file():
        raise ValueError(f"{folder} has no tuning.csv (a finished comparison with `search` writes it)")
    chosen = read_json(folder / "summary.json").get("chosen") or {}
    with open(folder / "tuning.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    found = {}
    for method, settings in chosen.items():
        drawn = [
            {name: cell(row[name]) for name in settings}
            for row in rows
            # Comparisons before the reviewed protocol drew every configuration they tuned (no `candidate` column).
            if row["algorithm"] == method and row.get("candidate", "drawn") == "drawn"
        ]
        found[method] = {
            name: (settings[name], low, high) for name, (low, high) in tuning.ends(settings, drawn).items()
        }
    return found


def ends_lines(folder: pathlib.Path) -> list[str]:
    """The lines printed under a comparison's name: per method, its chosen settings at an end, `name value
    (lowest…highest)`, or `none`; one line saying so where the comparison has not finished (no summary.json)."""
    if not (folder / "summary.json").is_file():  # `results/*/` takes a comparison still running too
        return [NOT_FINISHED]
    lines = []
    for method, found in choice_ends(folder).items():
        listed = ", ".join(f"{name} {value:g} ({low:g}…{high:g})" for name, (value, low, high) in found.items())
        lines.append(f"  {method}: {listed or 'none'}")
    return lines

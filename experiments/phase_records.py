"""What a comparison's finished phases say so far, from their records alone (no weights, nothing run).

    python experiments/phase_records.py results/compare-successive-halving/search-1hop

One row per configuration and phase (`checkpoints/ALGORITHM-PHASE.json`), best first within each phase kind:
the iterations reached, the mean over the phase's seeds of the evaluation AUC and final value, and with greedy
evaluation the greedy final value; success as percentages; and the commit of the code that wrote the record
("+dirty": with changes not committed; "-": a record written before records named their code). A long
`compare --search --rungs` can be watched (and its tuning tables previewed) while it runs, or read in another
session from the committed records.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import numpy as np

# Searched settings that are the program's, not a member's (the sweep axes are the members').
STATIC = ("elite_rule", "group_size", "updates_per_iteration", "num_minibatches", "entropy_coef")


def commit_of(record: dict) -> str:
    """The record's commit, short, "+dirty" where the tree had changes; "-" where the record names none."""
    provenance = record.get("provenance") or {}
    commit = provenance.get("commit")
    return f"{commit[:10]}{'+dirty' if provenance.get('dirty') else ''}" if commit else "-"


def rows(folder: pathlib.Path) -> list[dict]:
    found = []
    for path in sorted((folder / "checkpoints").glob("*.json")):
        record = json.loads(path.read_text())
        history, members = record["history"]["rows"], record["fingerprint"]["members"]
        metric = "success" if "success" in history[0] else "return"
        values = np.array([row[metric] for row in history]).T  # [members, periods]
        greedy = np.array([row[f"greedy_{metric}"] for row in history]).T if f"greedy_{metric}" in history[0] else None
        seeds = len({member["seed"] for member in members})
        config = record["fingerprint"]["config"]
        for first in range(0, len(members), seeds):
            chosen = slice(first, first + seeds)
            found.append(
                {
                    "phase": path.stem,
                    "settings": {
                        **{name: value for name, value in members[first].items() if name != "seed"},
                        **{
                            name: config["algorithm_config"][name]
                            for name in STATIC
                            if name in config["algorithm_config"]
                        },
                    },
                    "iterations": len(history) * config["eval_every"],
                    "auc": float(values[chosen].mean()),
                    "final": float(values[chosen, -1].mean()),
                    "greedy_final": None if greedy is None else float(greedy[chosen, -1].mean()),
                    "scale": 100.0 if metric == "success" else 1.0,
                    "commit": commit_of(record),
                }
            )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description="What a comparison's finished phases say so far, from their records.")
    parser.add_argument("folder", type=pathlib.Path, help="a compare run folder (or its committed copy)")
    args = parser.parse_args()
    found = rows(args.folder)
    if not found:
        raise SystemExit(f"error: no phase records in {args.folder / 'checkpoints'}")
    print("| phase | settings | iterations | AUC | final | greedy final | commit |\n|---|---|---:|---:|---:|---:|---|")
    for row in sorted(found, key=lambda row: (row["phase"].split("-")[0], -row["iterations"], -row["auc"])):
        number = lambda value, scale=row["scale"]: "-" if value is None else f"{scale * value:.1f}"  # noqa: E731
        settings = ", ".join(f"{name}={value}" for name, value in row["settings"].items())
        print(
            f"| {row['phase']} | {settings} | {row['iterations']} | {number(row['auc'])} | {number(row['final'])} "
            f"| {number(row['greedy_final'])} | {row['commit']} |"
        )


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # read through `| head`: stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush cannot fail again
        sys.exit(1)

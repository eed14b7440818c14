"""What a comparison's finished phases say so far, from their records alone (no weights, nothing run).

One row per configuration and phase (`checkpoints/ALGORITHM-PHASE.json`), best first within each phase kind:
the iterations reached, the mean over the phase's seeds of the evaluation AUC and final value, and with greedy
evaluation the greedy final value; success as percentages; and the commit of the code that wrote the record
("+dirty": with changes not committed; "-": a record written before records named their code). A long
comparison with a search and rungs can be watched (and its tuning tables previewed) while it runs, or read in
another session from the committed records.
"""

from __future__ import annotations

import pathlib

import numpy as np

from ftw_jax.running.run_files import read_json  # a ValueError that names the file where one is torn

# Searched settings that are the program's, not a member's (the sweep axes are the members').
STATIC = ("elite_rule", "group_size", "updates_per_iteration", "num_minibatches", "entropy_coef")
HEADER = [
    "| phase | settings | iterations | AUC | final | greedy final | commit |",
    "|---|---|---:|---:|---:|---:|---|",
]


def commit_of(record: dict) -> str:
    """The record's commit, short, "+dirty" where the tree had changes; "-" where the record names none."""
    provenance = record.get("provenance") or {}
    commit = provenance.get("commit")
    return f"{commit[:10]}{'+dirty' if provenance.get('dirty') else ''}" if commit else "-"


def record_rows(phase: str, record: dict) -> list[dict]:
    """One row per configuration of a phase's record (its members, a configuration's seeds side by side)."""
    history, members = record["history"]["rows"], record["fingerprint"]["members"]
    metric = "success" if "success" in history[0] else "return"
    values = np.array([row[metric] for row in history]).T  # [members, periods]
    greedy = np.array([row[f"greedy_{metric}"] for row in history]).T if f"greedy_{metric}" in history[0] else None
    seeds = len({member["seed"] for member in members})
    config = record["fingerprint"]["config"]
    static = {name: config["algorithm_config"][name] for name in STATIC if name in config["algorithm_config"]}
    found = []
    for first in range(0, len(members), seeds):
        chosen = slice(first, first + seeds)
        found.append(
            {
                "phase": phase,
                "settings": {**{name: value for name, value in members[first].items() if name != "seed"}, **static},
                "iterations": len(history) * config["eval_every"],
                "auc": float(values[chosen].mean()),
                "final": float(values[chosen, -1].mean()),
                "greedy_final": None if greedy is None else float(greedy[chosen, -1].mean()),
                "scale": 100.0 if metric == "success" else 1.0,
                "commit": commit_of(record),
            }
        )
    return found


def rows(folder: pathlib.Path) -> list[dict]:
    """Every configuration's row of every phase record in `folder`'s checkpoints/, in the records' name order:
    {phase, settings, iterations, auc, final, greedy_final (None without greedy evaluation), scale (100 for
    success, shown as percent; 1 for return), commit}."""
    return [
        row
        for path in sorted((folder / "checkpoints").glob("*.json"))
        for row in record_rows(path.stem, read_json(path))
    ]


def table_lines(found: list[dict]) -> list[str]:
    """The Markdown table of `rows`' rows: best first (by AUC) within each phase kind, the furthest phases first."""
    lines = list(HEADER)
    for row in sorted(found, key=lambda row: (row["phase"].split("-")[0], -row["iterations"], -row["auc"])):
        number = lambda value, scale=row["scale"]: "-" if value is None else f"{scale * value:.1f}"  # noqa: E731
        settings = ", ".join(f"{name}={value}" for name, value in row["settings"].items())
        lines.append(
            f"| {row['phase']} | {settings} | {row['iterations']} | {number(row['auc'])} | {number(row['final'])} "
            f"| {number(row['greedy_final'])} | {row['commit']} |"
        )
    return lines


def phase_table(folder: pathlib.Path) -> list[str]:
    """The table's lines for the comparison in `folder`; a ValueError where it holds no phase record."""
    found = rows(folder)
    if not found:
        raise ValueError(f"no phase records in {folder / 'checkpoints'}")
    return table_lines(found)

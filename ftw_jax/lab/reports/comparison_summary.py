"""The numbers of the README's comparison table and its FTW-minus-baseline tests, from finished comparisons.

Reads each task folder's `summary.json` (written when `ftw-jax compare` finishes: per-method statistics and the
differences with their Holm-adjusted p-values) and `curves.npz` (greedy evaluation), in the order of `TASKS`; a
task still running (no summary.json) is listed as such. `summary_text` lays out two Markdown tables: held-out
success per method (final sampled with its t-interval cut to [0, 100], final greedy, AUC with its interval; the
best mean of a row in bold), and every FTW − baseline difference with its Welch interval and p, the Holm-adjusted
and Mann–Whitney p, the verdict and the solved-seed counts with Fisher's exact p. Nothing is computed here that
the comparison did not write (but the greedy means of the final evaluation): this only lays its numbers side by
side.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

import numpy as np

from ftw_jax.lab.stats import p_text  # as the comparison's tables print a p-value
from ftw_jax.running.run_files import read_json

if TYPE_CHECKING:
    from ftw_jax.lab.train import TrainConfig

TASKS = {  # folder: how the table names it
    "sokoban-binary": "Sokoban 6×6, binary reward",
    "sokoban-shaped": "Sokoban 6×6, shaped reward",
    "search-1hop": "search, one hop",
    "search-2hop": "search, two hops",
    "text-search-guess": "text search agent, guessing warm start",
    "text-search": "text search agent",
}
METHODS = ["ftw", "ppo", "grpo", "reinforce"]
LABELS = {"ftw": "FTW", "ppo": "PPO", "grpo": "GRPO", "reinforce": "REINFORCE"}


def percent(value: float) -> str:
    """A share as percent with one decimal, no sign: 0.9142 -> "91.4"."""
    return f"{100 * value:.1f}"


def read_summary(folder: pathlib.Path) -> dict:
    """A finished comparison's summary.json; a ValueError (one line) where its metric is not a success rate."""
    summary = read_json(folder / "summary.json")
    if summary.get("metric") != "success":
        raise ValueError(f"{folder} compares {summary.get('metric')!r}; this lays out success rates only")
    return summary


def interval(row: dict, name: str) -> str:
    """mean [t-interval cut to [0, 100]], as the comparison's own table prints it."""
    low, high = max(row[f"{name}_t_low"], 0.0), min(row[f"{name}_t_high"], 1.0)
    return f"{percent(row[f'{name}_mean'])}% [{percent(low)}, {percent(high)}]"


def run_size(summary: dict) -> TrainConfig:
    """The TrainConfig of the comparison's runs: its task's defaults with the iterations and episodes it set."""
    from ftw_jax.lab.train import TrainConfig  # here: the errors before it need no JAX

    sizes = {
        key: summary["overrides"][key]
        for key in ("num_iterations", "episodes_per_iteration")
        if key in summary["overrides"]
    }
    return TrainConfig.for_env(summary["env"], **sizes)


def task_rows(folder: pathlib.Path, summary: dict, label: str) -> list[str]:
    """Three rows of the success table (final sampled, final greedy, AUC) for one finished task."""
    stats = {row["algorithm"]: row for row in summary["algorithms"]}
    greedy = {}
    if (folder / "curves.npz").is_file():  # greedy evaluation is kept in the curves only
        curves = np.load(folder / "curves.npz")
        greedy = {
            name: float(curves[f"{name}_greedy_success"][:, -1].mean())
            for name in stats
            if f"{name}_greedy_success" in curves.files
        }
    config = run_size(summary)
    title = f"{label} ({config.num_iterations} × {config.episodes_per_iteration}, {len(summary['seeds'])} seeds)"
    cells = {
        "final, sampled": {name: (row["final_mean"], interval(row, "final")) for name, row in stats.items()},
        "final, greedy": {name: (value, f"{percent(value)}%") for name, value in greedy.items()},
        "AUC": {name: (row["auc_mean"], interval(row, "auc")) for name, row in stats.items()},
    }
    rows = []
    for index, (kind, values) in enumerate(cells.items()):
        best = max(values.values())[0] if values else None
        shown = [
            "-" if name not in values else (f"**{values[name][1]}**" if values[name][0] == best else values[name][1])
            for name in METHODS
        ]
        rows.append(f"| {title if index == 0 else ''} | {kind} | {' | '.join(shown)} |")
    return rows


def difference_rows(summary: dict, label: str) -> list[str]:
    """One row per baseline: FTW minus it on final and AUC (points), as the comparison tested them."""
    rows = []
    for row in summary["differences"]:
        cells = []
        for name in ("final", "auc"):
            holm = row.get(f"{name}_holm_p_value")  # absent from comparisons made before the correction
            # "equivalent" rests on the 90% interval (two one-sided tests), as the comparison's table says.
            judged = "90% CI inside" if row[f"{name}_verdict"] == "equivalent" else "margin"
            cells.append(
                f"{100 * row[f'{name}_difference']:+.1f} [{100 * row[f'{name}_low']:+.1f}, "
                f"{100 * row[f'{name}_high']:+.1f}], Welch {p_text(row[f'{name}_p_value'])}, "
                f"Holm {'-' if holm is None else p_text(holm)}, Mann–Whitney {p_text(row[f'{name}_rank_p_value'])}"
                f": **{row[f'{name}_verdict']}** ({judged} ±{100 * row[f'{name}_margin']:.1f})"
            )
        solved = (
            f"{row['solved']} vs {row['other_solved']}, {p_text(row['solved_p_value'])}" if "solved" in row else "-"
        )
        rows.append(f"| {label} | {LABELS.get(row['algorithm'], row['algorithm'])} | {' | '.join(cells)} | {solved} |")
    return rows


def summary_text(folder: pathlib.Path) -> str:
    """Both tables for the comparisons in `folder` (one folder per task, named as in `TASKS`), and the tasks still
    running; a ValueError where `folder` is not a folder or a finished task's metric is not a success rate."""
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of comparisons (one folder per task)")
    finished = {name: read_summary(folder / name) for name in TASKS if (folder / name / "summary.json").is_file()}
    running = [name for name in TASKS if (folder / name).is_dir() and name not in finished]
    parts = [
        "| task (iterations × episodes, seeds) | | " + " | ".join(LABELS[name] for name in METHODS) + " |",
        "|---|---|" + "---:|" * len(METHODS),
        *("\n".join(task_rows(folder / name, summary, TASKS[name])) for name, summary in finished.items()),
        "",
        "| task | FTW minus | final: points [95% Welch CI], p-values: verdict | AUC: the same | seeds solved, Fisher |",
        "|---|---|---|---|---|",
        *("\n".join(difference_rows(summary, TASKS[name])) for name, summary in finished.items()),
    ]
    if running:
        parts.append(f"\nnot finished yet: {', '.join(running)}")
    return "\n".join(parts)

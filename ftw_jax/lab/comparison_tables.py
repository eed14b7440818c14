"""A comparison as rows and tables: per algorithm, the differences from a reference, per seed, the tuning.

rows = summary_rows(comparison)     # per algorithm: final and AUC, mean [95% t- and bootstrap CIs], IQM
tests = difference_rows(comparison, "ftw")      # FTW minus each baseline: Welch's t-test (and Holm's), Mann–Whitney
print(markdown_table(comparison))
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.stats

from ftw_jax.lab import tuning
from ftw_jax.lab.compare import DIAGNOSTICS, AlgorithmResult, Comparison
from ftw_jax.lab.stats import holm, p_text, rank_test, seed_statistics, verdict, welch


def updates_per_algorithm(comparison: Comparison) -> dict:
    """Per algorithm: optimizer steps its reported seeds applied and skipped (ready, not applied), those skipped
    for a non-finite value, per seed [S]; and its tuning runs' skipped and non-finite, all together."""
    return {
        result.algorithm: {
            "applied": [] if result.updates is None else result.updates[:, -1].tolist(),
            "skipped": [] if result.skipped is None else result.skipped.tolist(),
            "nonfinite": [] if result.nonfinite is None else result.nonfinite.tolist(),
            "tuning_skipped": result.tuning_skipped[0],
            "tuning_nonfinite": result.tuning_skipped[1],
        }
        for result in comparison.results
    }


def summary_rows(comparison: Comparison) -> list[dict]:
    """Per algorithm: its learning rate, final and AUC (mean, 95% t- and bootstrap CIs, IQM over seeds), env
    steps, seconds."""
    rows = []
    for result in comparison.results:
        row = {"algorithm": result.algorithm, "learning_rate": result.learning_rate, "seeds": len(comparison.seeds)}
        for name, values in (("final", result.final), ("auc", result.auc)):
            row.update({f"{name}_{key}": value for key, value in seed_statistics(values).items()})
        row["env_steps_mean"] = float(result.env_steps[:, -1].mean())
        row["seconds"] = result.seconds
        rows.append(row)
    return rows


def difference_rows(comparison: Comparison, reference: str = "ftw", margin: float | None = None) -> list[dict]:
    """`reference` minus each other algorithm, on final and AUC: the difference of means, its 95% Welch
    interval, Welch's p-value, the Mann–Whitney p-value (`rank_test`), and Welch's verdict ("better", "worse",
    or with a `margin` "equivalent" / "inconclusive"; default margin: 5 points of success or 5% of the
    reference's mean return)."""
    by_name = {result.algorithm: result for result in comparison.results}
    if reference not in by_name:
        return []
    rows = []
    for result in comparison.results:
        if result.algorithm == reference:
            continue
        row: dict[str, Any] = {"reference": reference, "algorithm": result.algorithm}
        for name in ("final", "auc"):
            mine, theirs = getattr(by_name[reference], name), getattr(result, name)
            bound = (
                margin
                if margin is not None
                else (0.05 if comparison.metric == "success" else 0.05 * abs(float(np.mean(mine))))
            )
            test = welch(mine, theirs)
            row.update({f"{name}_{key}": value for key, value in test.items()})
            row[f"{name}_rank_p_value"] = rank_test(mine, theirs)
            row[f"{name}_margin"] = bound
        if comparison.metric == "success":
            row.update(solved_seeds(by_name[reference].final, result.final))
        rows.append(row)
    # One family per table: every baseline on final and AUC. A verdict of "better" or "worse" needs its
    # Holm-adjusted Welch p below 5%, so that the table as a whole errs with chance at most 5%.
    names = [(row, name) for row in rows for name in ("final", "auc")]
    adjusted = holm(np.asarray([row[f"{name}_p_value"] for row, name in names]))
    for (row, name), p_value in zip(names, adjusted):
        mine, theirs = getattr(by_name[reference], name), getattr(by_name[row["algorithm"]], name)
        row[f"{name}_holm_p_value"] = float(p_value)
        row[f"{name}_verdict"] = verdict(mine, theirs, row[f"{name}_margin"], p_value=float(p_value))
    return rows


# A seed is solved when its final success is at least this: set before the reruns where outcomes split in two
# (one-hop search: seeds end near chance, 12.5%, or near 100%), the same for every task and method.
SOLVED_AT = 0.5


def solved_seeds(reference: np.ndarray, other: np.ndarray) -> dict:
    """How many seeds of each end solved (final success >= `SOLVED_AT`) and Fisher's exact two-sided p-value for
    the two counts: the test for outcomes that split in two, where a mean and its t-interval say little."""
    mine, theirs = int((reference >= SOLVED_AT).sum()), int((other >= SOLVED_AT).sum())
    table = [[mine, reference.size - mine], [theirs, other.size - theirs]]
    p_value = scipy.stats.fisher_exact(table).pvalue  # pyright: ignore[reportAttributeAccessIssue]
    return {"solved": mine, "other_solved": theirs, "solved_p_value": float(p_value)}


def seed_rows(comparison: Comparison) -> list[dict]:
    """One row per (algorithm, seed): final, AUC, env steps."""
    return [
        {
            "algorithm": result.algorithm,
            "seed": seed,
            "learning_rate": result.learning_rate,
            "final": float(final),
            "auc": float(auc),
            "env_steps": int(steps),
        }
        for result in comparison.results
        for seed, final, auc, steps in zip(comparison.seeds, result.final, result.auc, result.env_steps[:, -1])
    ]


def markdown_table(comparison: Comparison) -> str:
    """The summary as a markdown table (values as percentages for success): mean, 95% t-interval, 95% bootstrap
    interval and IQM of final and AUC; then, with FTW among the algorithms, FTW minus each baseline."""
    scale, unit = (100.0, "%") if comparison.metric == "success" else (1.0, "")
    number = lambda value: f"{scale * value:.1f}" if unit else f"{value:.4g}"  # noqa: E731
    # A success rate lies in [0, 1]: a t-interval past it (bimodal seeds) is cut there, and says so.
    bounded = (lambda value: min(max(value, 0.0), 1.0)) if unit else (lambda value: value)

    def cell(row, name):
        return (
            f"{number(row[f'{name}_mean'])}{unit} [{number(bounded(row[f'{name}_t_low']))}, "
            f"{number(bounded(row[f'{name}_t_high']))}] [{number(row[f'{name}_ci_low'])}, "
            f"{number(row[f'{name}_ci_high'])}] | {number(row[f'{name}_iqm'])}{unit}"
        )

    def judgement(row, name):
        # "equivalent" rests on the 90% interval (two one-sided tests), not the 95% one printed beside it.
        judged = "90% CI inside" if row[f"{name}_verdict"] == "equivalent" else "margin"
        return f"{row[f'{name}_verdict']} ({judged} ±{number(row[f'{name}_margin'])})"

    cut = " in [0, 100]" if unit else ""
    lines = [
        f"| algorithm | learning rate | final {comparison.metric}: mean [95% t-CI{cut}] [95% bootstrap CI] | "
        f"final IQM | AUC: mean [t-CI{cut}] [bootstrap CI] | AUC IQM | env steps / seed | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary_rows(comparison):
        lines.append(
            f"| {row['algorithm']} | {row['learning_rate']:g} | {cell(row, 'final')} | {cell(row, 'auc')} | "
            f"{row['env_steps_mean']:,.0f} | {row['seconds']:.0f} |"
        )
    differences = difference_rows(comparison)
    if differences:
        lines += [
            "",
            "| FTW minus | final: difference [95% Welch CI], Welch p, Holm p, Mann–Whitney p | verdict | AUC: "
            "difference [95% Welch CI], Welch p, Holm p, Mann–Whitney p | verdict |"
            + (f" seeds solved (final ≥ {number(SOLVED_AT)}%), Fisher's exact p |" if unit else ""),
            "|---|---:|---|---:|---|" + ("---:|" if unit else ""),
        ]
        for row in differences:
            cells = [
                f"{number(row[f'{name}_difference'])} [{number(row[f'{name}_low'])}, "
                f"{number(row[f'{name}_high'])}], {p_text(row[f'{name}_p_value'])}, Holm "
                f"{p_text(row[f'{name}_holm_p_value'])}, {p_text(row[f'{name}_rank_p_value'])} | {judgement(row, name)}"
                for name in ("final", "auc")
            ]
            solved = (
                f" {row['solved']} vs {row['other_solved']} of {len(comparison.seeds)}, "
                f"{p_text(row['solved_p_value'])} |"
                if unit
                else ""
            )
            lines.append(f"| {row['algorithm']} | {cells[0]} | {cells[1]} |{solved}")
    return "\n".join(lines) + "\n"


def diagnostics_table(comparison: Comparison) -> str:
    """Per algorithm, the mean over reported seeds of the batch diagnostics (`train.batch_diagnostics`) over the
    first, middle and last evaluation period's iterations, and greedy evaluation beside sampled where it was
    run, as a markdown table; empty when no reported run kept them."""
    results = [result for result in comparison.results if result.diagnostics]
    if not results:
        return ""
    number = (lambda value: f"{100 * value:.1f}%") if comparison.metric == "success" else (lambda v: f"{v:.4g}")
    periods = len(comparison.episodes)
    stages = {"first": 0, "middle": (periods - 1) // 2, "last": periods - 1}
    lines = [
        "| algorithm | policy entropy (nats/step): first, middle, last period | groups tied: first, middle, last | "
        f"final {comparison.metric}: sampled, greedy |",
        "|---|---:|---:|---:|",
    ]
    for result in results:
        cells = []
        for name in DIAGNOSTICS:
            if name not in result.diagnostics:
                cells.append("-")
                continue
            per_period = result.diagnostics[name].reshape(len(comparison.seeds), periods, -1).mean(axis=(0, 2))
            cells.append(", ".join(f"{per_period[index]:.2f}" for index in stages.values()))
        greedy = "-" if result.greedy is None else number(float(result.greedy[:, -1].mean()))
        sampled = number(float(result.final.mean()))
        lines.append(f"| {result.algorithm} | {cells[0]} | {cells[1]} | {sampled}, {greedy} |")
    return "\n".join(lines) + "\n"


def tuning_table(comparison: Comparison) -> str:
    """Every configuration each algorithm tried on the tuning seeds, best first, as markdown tables (the chosen
    one in bold); empty when nothing was tuned."""
    number = (lambda value: f"{100 * value:.1f}") if comparison.metric == "success" else (lambda value: f"{value:.4g}")
    sections = []
    for result in comparison.results:
        if not result.tuning:
            continue
        scores = ("iterations", "auc_mean", "final_mean", "auc_per_seed")
        names = [name for name in result.tuning[0] if name not in scores]
        # A search's rows were scored at the last rung each ran (its iterations): those that went furthest first.
        horizon = ["iterations"] if "iterations" in result.tuning[0] else []
        lines = [
            f"{result.algorithm}:",
            "",
            "| " + " | ".join([*names, *horizon, "tuning AUC", "tuning final"]) + " |",
            "|" + "---:|" * (len(names) + len(horizon) + 2),
        ]
        for row in sorted(result.tuning, key=lambda row: (-row.get("iterations", 0), -row["auc_mean"])):
            chosen = _is_chosen(result, row, names)
            cells = [f"{row[name]:g}" if isinstance(row[name], float) else str(row[name]) for name in names]
            cells += [str(row[name]) for name in horizon]
            cells += [number(row["auc_mean"]), number(row["final_mean"]) if "final_mean" in row else ""]
            lines.append("| " + " | ".join(f"**{cell}**" if chosen and cell else cell for cell in cells) + " |")
        sections.append("\n".join([*lines, *_choice_notes(result, names)]))
    return "\n\n".join(sections) + ("\n" if sections else "")


def _is_chosen(result: AlgorithmResult, row: dict, names: list[str]) -> bool:
    """Whether a tuning row is the configuration the algorithm reported (its settings, where it has them)."""
    return all(result.settings.get(name, row[name]) == row[name] for name in names)


def _choice_notes(result: AlgorithmResult, names: list[str]) -> list[str]:
    """What a reader of a search's tuning table should know about its choice: whether the last rung's final
    evaluation would have chosen the same configuration as its AUC did, and whether the chosen learning rate, or any
    other setting, is an end of the values the drawn configurations took (reported, never followed by a wider
    grid)."""
    if "iterations" not in result.tuning[0]:
        return []
    horizon = max(row["iterations"] for row in result.tuning)
    finalists = [row for row in result.tuning if row["iterations"] == horizon]
    by_final = max(finalists, key=lambda row: row["final_mean"])
    same = _is_chosen(result, by_final, names)
    described = ", ".join(f"{name} {by_final[name]}" for name in names if name != "candidate")
    notes = [
        "",
        "Chosen by tuning AUC; by the final evaluation the last rung would choose "
        + ("the same configuration." if same else f"another: {described}."),
    ]
    drawn = [row for row in result.tuning if row.get("candidate", "drawn") == "drawn"]
    grid = sorted({row["learning_rate"] for row in drawn})
    if len(grid) > 1 and tuning.at_edge(result.settings["learning_rate"], grid):
        notes.append(
            f"The chosen learning rate {result.settings['learning_rate']:g} is an edge of the grid "
            f"{grid[0]:g}…{grid[-1]:g}."
        )
    others = {name: span for name, span in tuning.ends(result.settings, drawn).items() if name != "learning_rate"}
    if others:
        listed = ", ".join(
            f"{name} {result.settings[name]:g} ({low:g}…{high:g})" for name, (low, high) in others.items()
        )
        notes.append(
            f"Other chosen settings at an end of the values drawn (reported for every method alike): {listed}."
        )
    return notes

"""ftw_jax.lab.reports.comparison_summary (experiments/protocol/comparison_summary.py's tables): the README's comparison
table laid out from finished comparisons' files."""

import json
import pathlib
import subprocess
import sys

import pytest

from ftw_jax.lab.reports.comparison_summary import summary_text

_REPOSITORY = pathlib.Path(__file__).parents[1]
_SCRIPT = _REPOSITORY / "experiments" / "protocol" / "comparison_summary.py"
_FINISHED = _REPOSITORY / "results" / "compare-successive-halving"


def test_the_summary_prints_what_each_comparisons_own_table_does(tmp_path):
    """On an earlier protocol's committed comparisons: every method's final and AUC cells (mean and t-interval)
    are those of the task's table.md, which the comparison wrote from the seeds themselves; binary Sokoban's greedy
    finals and the FTW-minus-PPO tests are those docs/results.md quotes (Welch p = 0.082 on one hop); a task
    without summary.json is listed as running."""
    (tmp_path / "sokoban-shaped").mkdir()
    for name in ("sokoban-binary", "search-1hop"):
        (tmp_path / name).symlink_to(_FINISHED / name)
    out = summary_text(tmp_path)
    lines = out.splitlines()
    for name, label in (("sokoban-binary", "Sokoban 6×6, binary reward"), ("search-1hop", "search, one hop")):
        (sampled,) = (
            index for index, line in enumerate(lines) if line.startswith(f"| {label} (") and "sampled" in line
        )
        table = (_FINISHED / name / "table.md").read_text().splitlines()
        for method, column in (("ftw", 2), ("ppo", 3), ("grpo", 4), ("reinforce", 5)):
            own = next(line.split(" | ") for line in table if line.startswith(f"| {method} | "))  # its first table
            final, auc = (" ".join(cell.split(" ")[:3]) for cell in (own[2], own[4]))  # "91.4% [90.5, 92.3]"
            assert lines[sampled].split(" | ")[column].strip(" *|") == final
            assert lines[sampled + 2].split(" | ")[column].strip(" *|") == auc
    assert "| | final, greedy | 92.1% | 89.7% | 74.8% | 24.5% |" in out.replace("**", "").replace("|  |", "| |")
    assert "| Sokoban 6×6, binary reward | PPO | -4.1 [-5.8, -2.5], Welch p < 0.001" in out
    one_hop = "| search, one hop | PPO | +25.9 [-4.0, +55.9], Welch p = 0.082, Holm -, Mann–Whitney p = 0.231"
    assert f"{one_hop}: **inconclusive**" in out
    assert lines[-1] == "not finished yet: sokoban-shaped"
    with pytest.raises(ValueError, match="is not a folder of comparisons"):
        summary_text(tmp_path / "none")


def test_the_summary_prints_holms_p_and_the_solved_seeds_and_refuses_a_return_metric(tmp_path):
    """A comparison under the reviewed protocol (written here: Holm-adjusted p-values and solved-seed counts, no
    curves.npz): its tests as the comparison wrote them, greedy '-'; a comparison of returns is refused."""

    def stats(algorithm, final, auc):
        return {
            "algorithm": algorithm,
            **{f"final_{key}": value for key, value in zip(("mean", "t_low", "t_high"), final)},
            **{f"auc_{key}": value for key, value in zip(("mean", "t_low", "t_high"), auc)},
        }

    difference = {"algorithm": "ppo", "solved": 29, "other_solved": 21, "solved_p_value": 0.0118}
    for name, values in (
        ("final", (0.21, 0.05, 0.37, 0.011, 0.0204, 0.03)),
        ("auc", (0.02, -0.01, 0.05, 0.2, 0.4, 0.5)),
    ):
        keys = ("difference", "low", "high", "p_value", "holm_p_value", "rank_p_value")
        difference.update({f"{name}_{key}": value for key, value in zip(keys, values)})
        difference[f"{name}_margin"] = 0.05
    difference.update(final_verdict="better", auc_verdict="equivalent")
    summary = {
        "env": "search",
        "metric": "success",
        "seeds": list(range(30)),
        "overrides": {"num_iterations": 400, "max_grad_norm": 0.5},
        "algorithms": [
            stats("ftw", (0.95, 0.9, 1.02), (0.8, 0.7, 0.9)),
            stats("ppo", (0.74, 0.6, 0.88), (0.78, 0.7, 0.86)),
        ],
        "differences": [difference],
    }
    (tmp_path / "search-1hop").mkdir()
    (tmp_path / "search-1hop" / "summary.json").write_text(json.dumps(summary))
    lines = summary_text(tmp_path).splitlines()
    title = "| search, one hop (400 × 128, 30 seeds) | final, sampled |"
    assert lines[2] == f"{title} **95.0% [90.0, 100.0]** | 74.0% [60.0, 88.0] | - | - |"  # cut at 100
    assert lines[3] == "|  | final, greedy | - | - | - | - |"
    assert lines[-1] == (
        "| search, one hop | PPO | +21.0 [+5.0, +37.0], Welch p = 0.011, Holm p = 0.020, Mann–Whitney p = 0.030: "
        "**better** (margin ±5.0) | +2.0 [-1.0, +5.0], Welch p = 0.200, Holm p = 0.400, Mann–Whitney p = 0.500: "
        "**equivalent** (90% CI inside ±5.0) | 29 vs 21, p = 0.012 |"
    )
    summary["metric"] = "return"
    (tmp_path / "search-1hop" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="compares 'return'; this lays out success rates only"):
        summary_text(tmp_path)


def test_the_command_line(tmp_path):
    """End to end: the script prints the tables as they are laid out (run from the repository, its default folder
    the reviewed protocol's); a folder that is none is refused in one line."""
    done = subprocess.run([sys.executable, str(_SCRIPT)], capture_output=True, text=True, check=True, cwd=_REPOSITORY)
    assert done.stdout == summary_text(_REPOSITORY / "results" / "compare-reference-recipes") + "\n"
    missing = subprocess.run([sys.executable, str(_SCRIPT), str(tmp_path / "none")], capture_output=True, text=True)
    assert (
        missing.returncode == 1
        and missing.stderr == f"error: {tmp_path / 'none'} is not a folder of comparisons (one folder per task)\n"
    )

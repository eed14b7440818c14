"""experiments/comparison_summary.py: the README's comparison table laid out from finished comparisons' files."""

import pathlib
import subprocess
import sys

_REPOSITORY = pathlib.Path(__file__).parents[1]
_SCRIPT = _REPOSITORY / "experiments" / "comparison_summary.py"
_FINISHED = _REPOSITORY / "results" / "compare-successive-halving"


def test_the_summary_prints_what_each_comparisons_own_table_does(tmp_path):
    """On an earlier protocol's committed comparisons: every method's final and AUC cells (mean and t-interval)
    are those of the task's table.md, which the comparison wrote from the seeds themselves; greedy finals and the
    FTW-minus-PPO tests are those docs/results.md quotes (Welch p = 0.082 on one hop); a task without summary.json
    is listed as running."""
    (tmp_path / "sokoban-shaped").mkdir()
    for name in ("sokoban-binary", "search-1hop"):
        (tmp_path / name).symlink_to(_FINISHED / name)
    out = subprocess.run(
        [sys.executable, str(_SCRIPT), str(tmp_path)], capture_output=True, text=True, check=True, cwd=_REPOSITORY
    ).stdout
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
    missing = subprocess.run([sys.executable, str(_SCRIPT), str(tmp_path / "none")], capture_output=True, text=True)
    assert (
        missing.returncode == 1 and missing.stderr.strip().startswith("error: ") and "Traceback" not in missing.stderr
    )

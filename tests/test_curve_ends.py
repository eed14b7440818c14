"""ftw_jax.lab.reports.curve_ends (experiments/protocol/curve_ends.py's slopes): whether each method's curve still
moves at the end of a finished comparison."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from ftw_jax.lab.reports.curve_ends import end_rows, slopes, trend

_REPOSITORY = pathlib.Path(__file__).parents[1]
_SCRIPT = _REPOSITORY / "experiments" / "protocol" / "curve_ends.py"
_EARLIER = _REPOSITORY / "results" / "compare-successive-halving" / "search-2hop"


def test_slopes_in_points_per_100_iterations_and_their_verdicts(tmp_path):
    """Written curves of 10 evaluations, 40 iterations apart: a method rising 10 points per 100 iterations on
    every seed reads +10.00 exactly ("rising", 10 of 10); one falling 5 points per 100 with noise "falling"; one
    whose seeds rise and fall alike "no trend shown"; one flat at 100% on every seed, 0 with nothing to test.
    Only the last quarter (iterations 320-400) counts: the flat method climbed before it."""
    iterations = np.arange(1, 11) * 40.0
    noise = np.random.default_rng(0).normal(0, 0.002, (10, 10))
    curves = {
        "episodes": iterations * 64,
        "ftw_success": np.tile(0.2 + 0.001 * iterations, (10, 1)),
        "ppo_success": 0.9 - 0.0005 * iterations + noise,
        "grpo_success": 0.5 + np.outer(np.tile([1.0, -1.0], 5), 0.001 * iterations) + noise,
        "reinforce_success": np.tile(np.minimum(iterations / 200, 1.0), (10, 1)),
    }
    np.savez(tmp_path / "curves.npz", **curves)
    summary = {"env": "search", "metric": "success", "overrides": {"num_iterations": 400, "episodes_per_iteration": 64}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    lines = end_rows(tmp_path, 0.25)
    assert lines[0].startswith("Slopes over iterations 320–400 (3 evaluations)")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in "\n".join(lines).splitlines()}
    assert rows["FTW"][1] == "+10.00 [+10.00, +10.00]" and rows["FTW"][3:] == ["10 of 10", "rising |"]
    assert rows["PPO"][1].startswith("-5.") and rows["PPO"][4] == "falling |"
    assert rows["GRPO"][3] == "5 of 10" and rows["GRPO"][4] == "no trend shown |"
    assert rows["REINFORCE"][1:] == ["+0.00 [+0.00, +0.00]", "p = 1.000", "0 of 10", "no trend shown |"]
    # Half the run (iterations 200-400) reaches REINFORCE's climb.
    assert any(line.startswith("| REINFORCE | +") for line in end_rows(tmp_path, 0.5))


def test_a_slope_is_per_iteration_and_seeds_on_one_line_leave_nothing_to_test():
    iterations = np.array([0.0, 10.0, 20.0])
    np.testing.assert_allclose(slopes(np.array([[0.0, 1.0, 2.0], [5.0, 5.0, 5.0]]), iterations), [0.1, 0.0])
    assert trend(np.zeros(4)) == (1.0, "no trend shown")
    assert trend(np.full(4, -2.0)) == (0.0, "falling")
    assert trend(np.array([1.0, 1.1, 0.9, 1.0]))[1] == "rising"


def test_an_earlier_comparison_and_bad_input(tmp_path):
    """On the earlier protocol's committed two-hop comparison, PPO's rise over its last quarter does not pass the
    test (p = 0.053, the borderline a reviewer found there); a missing folder, a window of fewer than three
    evaluations and a share outside (0, 1] are refused, naming the setting."""
    assert "| PPO | +3.61 [-0.06, +7.28] | p = 0.053 | 8 of 10 | no trend shown |" in end_rows(_EARLIER)
    for folder, last, message in (
        (tmp_path, 0.25, "holds no finished comparison"),
        (_EARLIER, 0.1, "`last` 0.1 reads 2 of the run's 10 evaluations"),
        (_EARLIER, 0.0, r"`last` must be in \(0, 1\]"),
    ):
        with pytest.raises(ValueError, match=message):
            end_rows(folder, last)


def test_the_command_line(tmp_path):
    """End to end: the script prints the rows; its refusals are one line that names the flag."""

    def run(*args):
        return subprocess.run([sys.executable, str(_SCRIPT), *map(str, args)], capture_output=True, text=True)

    assert run(_EARLIER).stdout == "\n".join(end_rows(_EARLIER)) + "\n"
    for args, message in (
        ((tmp_path,), "holds no finished comparison"),
        ((_EARLIER, "--last", "0.1"), "error: --last 0.1 reads 2 of the run's 10 evaluations"),
        ((_EARLIER, "--last", "0"), "error: --last must be in (0, 1]"),
    ):
        refused = run(*args)
        assert refused.returncode == 1 and message in refused.stderr and refused.stderr.count("\n") == 1

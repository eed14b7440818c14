"""ftw_jax.lab.reports.choice_ends (experiments/protocol/choice_ends.py's reading): which chosen settings are an end
of the values tuning drew, for every method alike."""

import pathlib
import subprocess
import sys

import pytest

from ftw_jax.lab.reports.choice_ends import cell, choice_ends, ends_lines

_REPOSITORY = pathlib.Path(__file__).parents[1]
_SCRIPT = _REPOSITORY / "experiments" / "protocol" / "choice_ends.py"
_SHAPED = _REPOSITORY / "results" / "compare-reference-recipes" / "sokoban-shaped"


def test_the_ends_of_a_finished_comparison():
    """Shaped Sokoban under the reviewed protocol (committed): FTW chose the smallest N, J, C and K of its draws,
    PPO four ends of its own; REINFORCE's choice of RLOO's group of 2, between the batch's mean (written empty in
    tuning.csv) and 8, is interior."""
    found = choice_ends(_SHAPED)
    assert found["ftw"] == {
        "pool_capacity": (256, 256, 1024),
        "num_batches": (32, 32, 128),
        "batch_size": (4, 4, 32),
        "num_elites": (1, 1, 4),
    }
    assert found["reinforce"] == {"kl_decay_fraction": (0.25, 0.25, 1.0)}
    lines = ends_lines(_SHAPED)
    assert (
        "  ftw: pool_capacity 256 (256…1024), num_batches 32 (32…128), batch_size 4 (4…32), num_elites 1 (1…4)" in lines
    )
    assert (
        "  ppo: kl_decay_fraction 0.25 (0.25…1), clip_epsilon 0.1 (0.1…0.3), updates_per_iteration 10 (1…10), "
        "gae_lambda 1 (0.9…1)"
    ) in lines
    assert "  reinforce: kl_decay_fraction 0.25 (0.25…1)" in lines


def test_a_comparison_before_the_reviewed_protocol_drew_every_configuration_it_tuned():
    """Its tuning.csv has no `candidate` column (no reference recipe was run beside the drawn ones): every row is
    a drawn one. Committed: text search under successive halving, where FTW chose K = 4 of its draws 1…4."""
    found = choice_ends(_REPOSITORY / "results" / "compare-successive-halving" / "text-search")
    assert found["ftw"]["num_elites"] == (4, 1, 4) and found["ppo"]["kl_coef"] == (1.0, 0.0, 1.0)


def test_cells_are_read_as_the_values_they_were():
    """tuning.csv writes every setting as text: a truth value, None (empty or "None"), a number or a category."""
    read = [cell(text) for text in ("True", "False", "", "None", "8", "0.25", "mean")]
    assert read == [True, False, None, None, 8, 0.25, "mean"]
    assert [type(value) for value in read[4:6]] == [int, float]


def test_a_comparison_still_running_and_one_without_tuning(tmp_path):
    """A comparison still running (no summary.json) is listed as such; a finished one without tuning.csv is
    refused, naming the setting that writes it."""
    assert ends_lines(tmp_path) == ["  not finished yet (no summary.json)"]
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="has no tuning.csv .*`search`"):
        ends_lines(tmp_path)


def test_the_command_line(tmp_path):
    """End to end: the script prints each folder's name and its lines; a finished comparison without tuning.csv,
    or no folder, is refused in one line that names the flag."""
    out = subprocess.run(
        [sys.executable, str(_SCRIPT), str(_SHAPED), str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["sokoban-shaped:", *ends_lines(_SHAPED), f"{tmp_path.name}:", "  not finished yet (no summary.json)"]
    (tmp_path / "summary.json").write_text("{}")
    for folder, message in (
        (tmp_path, "has no tuning.csv (a finished comparison with --search writes it)"),
        (tmp_path / "none", "is not a folder"),
    ):
        refused = subprocess.run([sys.executable, str(_SCRIPT), str(folder)], capture_output=True, text=True)
        assert refused.returncode == 1 and message in refused.stderr and "Traceback" not in refused.stderr
        assert refused.stderr.count("\n") == 1

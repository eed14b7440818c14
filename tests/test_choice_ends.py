"""experiments/choice_ends.py: which chosen settings are an end of the values tuning drew, for every method alike."""

import pathlib
import subprocess
import sys

_REPOSITORY = pathlib.Path(__file__).parents[1]
_SCRIPT = _REPOSITORY / "experiments" / "choice_ends.py"
_SHAPED = _REPOSITORY / "results" / "compare-reference-recipes" / "sokoban-shaped"


def test_the_ends_of_a_finished_comparison_and_a_folder_without_one(tmp_path):
    """Shaped Sokoban under the reviewed protocol (committed): FTW chose the smallest N, J, C and K of its draws,
    PPO four ends of its own; REINFORCE's choice of RLOO's group of 2, between the batch's mean (written empty in
    tuning.csv) and 8, is interior. A comparison still running (no summary.json) is listed as such; a
    finished one without tuning.csv, or no folder, is refused in one line."""
    out = subprocess.run(
        [sys.executable, str(_SCRIPT), str(_SHAPED)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] == "sokoban-shaped:"
    assert (
        "  ftw: pool_capacity 256 (256…1024), num_batches 32 (32…128), batch_size 4 (4…32), num_elites 1 (1…4)" in out
    )
    assert (
        "  ppo: kl_decay_fraction 0.25 (0.25…1), clip_epsilon 0.1 (0.1…0.3), updates_per_iteration 10 (1…10), "
        "gae_lambda 1 (0.9…1)"
    ) in out
    assert "  reinforce: kl_decay_fraction 0.25 (0.25…1)" in out
    running = subprocess.run([sys.executable, str(_SCRIPT), str(tmp_path)], capture_output=True, text=True, check=True)
    assert running.stdout.splitlines()[1] == "  not finished yet (no summary.json)"
    (tmp_path / "summary.json").write_text("{}")
    for folder, message in ((tmp_path, "has no tuning.csv"), (tmp_path / "none", "is not a folder")):
        refused = subprocess.run([sys.executable, str(_SCRIPT), str(folder)], capture_output=True, text=True)
        assert refused.returncode == 1 and message in refused.stderr and "Traceback" not in refused.stderr

"""ftw_jax.lab.reports.seed_groups (experiments/protocol/seed_groups.py's moves): a comparison's reported seeds run as
groups and merged into the whole comparison."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from ftw_jax.cli import main
from ftw_jax.lab.reports.seed_groups import merge, start

_REPOSITORY = pathlib.Path(__file__).parents[1]
_SCRIPT = _REPOSITORY / "experiments" / "protocol" / "seed_groups.py"

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")

# A tuned bandit comparison (two learning rates on a tuning seed) small enough to run four times.
_COMPARE = [
    "compare",
    "--env",
    "bandit",
    "--algos",
    "ftw,grpo",
    "--learning-rates",
    "0.03,0.1",
    "--tuning-seeds",
    "7",
    "--iterations",
    "24",
    "--episodes-per-iteration",
    "8",
    "--eval-every",
    "12",
    "--eval-episodes",
    "32",
    "--json",
]


def seed_groups(*arguments) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(_SCRIPT), *map(str, arguments)], capture_output=True, text=True)


_MERGE = ["python", "experiments/protocol/seed_groups.py", "merge"]  # the command a merge's provenance names


@pytest.mark.slow
def test_seeds_run_in_groups_and_merged_give_the_comparison_of_all_seeds_at_once(tmp_path, capsys):
    """The first group tunes and reports seeds 0 and 1; the second takes its tuning records and reports seeds 2
    and 3 (no tuning phase runs again); merged, a resume writes the comparison that one run of the four seeds
    writes: the same statistics, tests and curves, exactly (this CPU runs a program's members one after another)."""
    assert main([*_COMPARE, "--seeds", "0,1,2,3", "--out", str(tmp_path), "--name", "whole"]) == 0
    expected = json.loads(capsys.readouterr().out)
    assert main([*_COMPARE, "--seeds", "0,1", "--out", str(tmp_path), "--name", "first"]) == 0
    capsys.readouterr()
    assert start(tmp_path / "second", tmp_path / "first", [2, 3], made_by="test") == 2  # two algorithms tuned
    assert main([*_COMPARE, "--seeds", "2,3", "--resume", str(tmp_path / "second")]) == 0
    ran = capsys.readouterr().err
    assert " tune" not in ran and ran.count(" report ") == 4  # two algorithms, two periods each
    merged = merge(tmp_path / "merged", [tmp_path / "first", tmp_path / "second"], _MERGE)
    assert merged[0] == [0, 1, 2, 3]
    assert main([*_COMPARE, "--seeds", "0,1,2,3", "--resume", str(tmp_path / "merged")]) == 0
    captured = capsys.readouterr()
    assert " period " not in captured.err  # every phase from its record: nothing trained
    summary = json.loads(captured.out)
    for name in ("algorithms", "differences"):
        drop = {"seconds", "run_folder"}
        assert [{k: v for k, v in row.items() if k not in drop} for row in summary[name]] == [
            {k: v for k, v in row.items() if k not in drop} for row in expected[name]
        ]
    assert summary["tuning"] == expected["tuning"]
    curves, whole = np.load(tmp_path / "merged" / "curves.npz"), np.load(tmp_path / "whole" / "curves.npz")
    assert sorted(curves.files) == sorted(whole.files)
    for name in whole.files:
        np.testing.assert_array_equal(curves[name], whole[name], err_msg=name)
    record = json.loads((tmp_path / "merged" / "checkpoints" / "grpo-report.json").read_text())
    groups = record["provenance"]["merged_from"]
    assert [group["group"] for group in groups] == [str(tmp_path / "first"), str(tmp_path / "second")]
    assert record["seconds"] == pytest.approx(sum(group["seconds"] for group in groups))


def _finished_group(folder: pathlib.Path, seeds: list[int], learning_rate: float = 0.1) -> None:
    """A finished group's files as `compare` leaves them, by hand: config.json, summary.json, a tuning record
    and one report record whose rows hold each member's seed."""
    (folder / "checkpoints").mkdir(parents=True)
    config = {"algorithms": ["ftw"], "seeds": seeds, "overrides": {"num_iterations": 24}, "provenance": [{}]}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "summary.json").write_text("{}")
    (folder / "checkpoints" / "ftw-tune0-rung0.json").write_text('{"tuning": true}')
    fingerprint = {"algorithm": "ftw", "phase": "report", "config": {"learning_rate": learning_rate}}
    report = {
        "fingerprint": {**fingerprint, "members": [{"seed": seed} for seed in seeds]},
        "seconds": 10.0 * len(seeds),
        "updates_applied_share": [1.0] * len(seeds),
        "history": {"rows": [{"success": [seed / 10 for seed in seeds], "iteration": [12] * len(seeds)}], "dtypes": {}},
        "provenance": {"commit": "abc", "command": ["ftw-jax", "compare"]},
    }
    (folder / "checkpoints" / "ftw-report.json").write_text(json.dumps(report))


def test_merge_lays_the_groups_end_to_end_and_refuses_what_is_not_one_comparison(tmp_path):
    first, second, other = tmp_path / "first", tmp_path / "second", tmp_path / "other"
    _finished_group(first, [0, 1])
    _finished_group(second, [2])
    assert merge(tmp_path / "whole", [first, second], _MERGE) == ([0, 1, 2], 1)
    record = json.loads((tmp_path / "whole" / "checkpoints" / "ftw-report.json").read_text())
    assert record["fingerprint"]["members"] == [{"seed": 0}, {"seed": 1}, {"seed": 2}]
    assert record["history"]["rows"] == [{"success": [0.0, 0.1, 0.2], "iteration": [12, 12, 12]}]
    assert record["updates_applied_share"] == [1.0, 1.0, 1.0] and record["seconds"] == 30.0
    assert record["provenance"]["commit"] == "abc" and record["provenance"]["command"] == _MERGE
    assert json.loads((tmp_path / "whole" / "config.json").read_text())["seeds"] == [0, 1, 2]
    assert (tmp_path / "whole" / "checkpoints" / "ftw-tune0-rung0.json").is_file()
    _finished_group(other, [3], learning_rate=0.3)
    torn = tmp_path / "torn"
    _finished_group(torn, [4])
    (torn / "checkpoints" / "ftw-report.json").write_text("[]")
    refused = {
        "twice": (merge, tmp_path / "again", [first, first], _MERGE),
        "another config": (merge, tmp_path / "whole", [second, first], _MERGE),
        "unfinished": (merge, tmp_path / "late", [first, tmp_path / "none"], _MERGE),
        "another lr": (merge, tmp_path / "mixed", [first, other], _MERGE),
        "not a record": (merge, tmp_path / "mixed", [first, torn], _MERGE),
        "overlap": (start, tmp_path / "third", first, [1, 5], "test"),
        "repeated": (start, tmp_path / "third", first, [5, 5], "test"),
    }
    messages = {}
    for case, (function, *arguments) in refused.items():
        with pytest.raises(ValueError) as refusal:
            function(*arguments)
        messages[case] = str(refusal.value)
        assert "\n" not in messages[case], case
    assert "report seeds [0, 1] more than once" in messages["twice"]
    assert "holds another comparison" in messages["another config"]
    assert f"{tmp_path / 'none'} has not finished" in messages["unfinished"]
    assert "seeds [1] are reported by" in messages["overlap"]
    assert "`seeds` repeats [5]" in messages["repeated"]
    assert "in its config: {'learning_rate': 0.3} against {'learning_rate': 0.1}" in messages["another lr"]
    assert "ftw-report.json has no fingerprint, seconds" in messages["not a record"]
    assert not (tmp_path / "third").exists() and not (tmp_path / "mixed" / "checkpoints" / "ftw-report.json").exists()


def test_start_writes_the_first_groups_comparison_with_the_groups_seeds(tmp_path):
    _finished_group(tmp_path / "first", [0, 1])
    assert start(tmp_path / "second", tmp_path / "first", [2, 3], made_by="test") == 1
    config = json.loads((tmp_path / "second" / "config.json").read_text())
    assert config["seeds"] == [2, 3] and config["overrides"] == {"num_iterations": 24}
    assert config["provenance"] == [{"seed_group": {"like": str(tmp_path / "first"), "made_by": "test"}}]
    assert (tmp_path / "second" / "checkpoints" / "ftw-tune0-rung0.json").is_file()
    assert not (tmp_path / "second" / "checkpoints" / "ftw-report.json").exists()
    with pytest.raises(ValueError, match="already holds a run"):
        start(tmp_path / "second", tmp_path / "first", [4], made_by="test")


def test_the_command_line(tmp_path):
    """End to end: `start` and `merge` print what they made and record the command; a refusal is one line that
    names the flag (`--seeds`), bad seeds among them."""
    first = tmp_path / "first"
    _finished_group(first, [0, 1])
    started = seed_groups("start", tmp_path / "second", "--like", first, "--seeds", "2")
    assert (
        started.returncode == 0
        and started.stdout == f"{tmp_path / 'second'}: seeds [2], 1 tuning records from {first}\n"
    )
    made = json.loads((tmp_path / "second" / "config.json").read_text())["provenance"]
    assert made == [{"seed_group": {"like": str(first), "made_by": "experiments/protocol/seed_groups.py start"}}]
    _finished_group(tmp_path / "later", [2])  # the second group, as if it had run
    merged = seed_groups("merge", tmp_path / "whole", first, tmp_path / "later")
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout.startswith(f"{tmp_path / 'whole'}: seeds [0, 1, 2] from 2 groups, 1 tuning records")
    command = json.loads((tmp_path / "whole" / "config.json").read_text())["provenance"][0]["command"]
    assert command == [
        "python",
        "experiments/protocol/seed_groups.py",
        "merge",
        str(tmp_path / "whole"),
        str(first),
        str(tmp_path / "later"),
    ]
    for arguments, message in (
        (("--seeds", "5,x"), "error: --seeds '5,x': expected integers separated by commas\n"),
        (("--seeds", "5,5"), "error: --seeds repeats [5]; give each seed once\n"),
    ):
        refused = seed_groups("start", tmp_path / "third", "--like", first, *arguments)
        assert refused.returncode == 1 and refused.stderr == message, refused.stderr
    assert not (tmp_path / "third").exists()

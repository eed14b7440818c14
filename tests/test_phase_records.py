"""ftw_jax.lab.reports.phase_records (experiments/protocol/phase_records.py's rows): a comparison's finished phases
read from their committed records."""

import pathlib
import subprocess
import sys

import pytest

from ftw_jax.lab.reports.phase_records import HEADER, commit_of, phase_table, rows

_REPOSITORY = pathlib.Path(__file__).parents[1]
_PHASE_RECORDS = _REPOSITORY / "experiments" / "protocol" / "phase_records.py"
_ONE_HOP_RECORDS = _REPOSITORY / "results" / "compare-successive-halving" / "search-1hop"


def test_phase_records_read_the_committed_tuning_as_the_docs_report_it():
    """One-hop search's records: the finalists docs/results.md names."""
    found = rows(_ONE_HOP_RECORDS)
    ftw = [row for row in found if row["phase"].startswith("ftw-")]
    finalists = sorted((round(100 * row["auc"], 1) for row in ftw if row["phase"].endswith("rung2")), reverse=True)
    assert finalists == [94.8, 84.5]  # "finalists' AUCs 94.8/84.5" in docs/results.md
    (report,) = (row for row in found if row["phase"] == "ftw-report")
    (winner,) = (row for row in ftw if round(100 * row["auc"], 1) == 94.8)
    assert report["settings"] == winner["settings"] and report["iterations"] == 400
    assert round(100 * report["final"], 1) == 99.8 and round(100 * report["greedy_final"], 1) == 100.0


def test_the_table_puts_the_furthest_phases_and_the_best_first(tmp_path):
    """Within a phase kind (the algorithm), the longest phases first and the best AUC first among them; success
    in percent; a folder without records refused."""
    lines = phase_table(_ONE_HOP_RECORDS)
    assert lines[:2] == HEADER and len(lines) == 2 + len(rows(_ONE_HOP_RECORDS))
    ftw = [line.split(" | ") for line in lines if line.startswith("| ftw-")]
    assert ftw[0][0] == "| ftw-report" and ftw[1][0].endswith("rung2") and ftw[1][3] == "94.8"
    assert [int(row[2]) for row in ftw] == sorted((int(row[2]) for row in ftw), reverse=True)
    assert commit_of({"provenance": {"commit": "0123456789abcdef", "dirty": True}}) == "0123456789+dirty"
    assert commit_of({}) == "-"
    with pytest.raises(ValueError, match="no phase records in"):
        phase_table(tmp_path)


def test_phase_records_stop_quietly_when_their_reader_does():
    """`phase_records.py FOLDER | head`: the closed pipe ends it without a traceback."""
    process = subprocess.Popen(
        [sys.executable, str(_PHASE_RECORDS), str(_ONE_HOP_RECORDS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    process.stdout.close()  # before it has written anything (its imports alone take far longer)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1 and b"Traceback" not in stderr, stderr.decode()

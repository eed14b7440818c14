"""experiments/phase_records.py: a comparison's finished phases read from their committed records."""

import importlib.util
import pathlib
import subprocess
import sys

_REPOSITORY = pathlib.Path(__file__).parents[1]
_PHASE_RECORDS = _REPOSITORY / "experiments" / "phase_records.py"
_ONE_HOP_RECORDS = _REPOSITORY / "results" / "compare-successive-halving" / "search-1hop"


def test_phase_records_read_the_committed_tuning_as_the_docs_report_it():
    """experiments/phase_records.py on one-hop search's records: the finalists docs/results.md names."""
    spec = importlib.util.spec_from_file_location("phase_records", _PHASE_RECORDS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = module.rows(_ONE_HOP_RECORDS)
    ftw = [row for row in found if row["phase"].startswith("ftw-")]
    finalists = sorted((round(100 * row["auc"], 1) for row in ftw if row["phase"].endswith("rung2")), reverse=True)
    assert finalists == [94.8, 84.5]  # "finalists' AUCs 94.8/84.5" in docs/results.md
    (report,) = (row for row in found if row["phase"] == "ftw-report")
    (winner,) = (row for row in ftw if round(100 * row["auc"], 1) == 94.8)
    assert report["settings"] == winner["settings"] and report["iterations"] == 400
    assert round(100 * report["final"], 1) == 99.8 and round(100 * report["greedy_final"], 1) == 100.0


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

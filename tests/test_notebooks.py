"""Every notebook runs top to bottom (on its small settings), and the committed ones are executed and small."""

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))
# What a code host renders comfortably: plots, not data.
MAX_BYTES = 1_000_000


def test_the_three_notebooks_are_there():
    assert [path.name for path in NOTEBOOKS] == ["occupancy.ipynb", "sweeps.ipynb", "training.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_committed_notebook_is_executed_without_errors_and_small(path):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code), "commit notebooks executed top to bottom"
    outputs = [output for cell in code for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    assert any("image/png" in output.get("data", {}) for output in outputs)  # it shows plots
    assert path.stat().st_size < MAX_BYTES


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_top_to_bottom(path, monkeypatch):
    monkeypatch.setenv("FTW_NOTEBOOK_QUICK", "1")  # the kernel inherits it: small settings
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    assert not [
        output for cell in notebook.cells for output in cell.get("outputs", []) if output.output_type == "error"
    ]

"""Provenance: every run folder and phase record names the code that wrote it (commit, versions, command line),
beside its fingerprint: a resume at another commit is the same run."""

import importlib.util
import json
import pathlib
import shutil
import subprocess

import pytest

from ftw_jax.cli import main
from ftw_jax.running import run_files
from ftw_jax.running.checkpoints import config_differences
from ftw_jax.running.provenance import PACKAGES, provenance

_REPOSITORY = pathlib.Path(__file__).parents[1]
_SOURCE = _REPOSITORY / "ftw_jax" / "running" / "provenance.py"
_IN_GIT = shutil.which("git") is not None and (_REPOSITORY / ".git").exists()  # a clone, or a worktree's file

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")


def _head() -> str:
    return subprocess.run(["git", "-C", str(_REPOSITORY), "rev-parse", "HEAD"], capture_output=True, text=True).stdout


def _copy_outside_git(tmp_path: pathlib.Path):
    """The module loaded from a copy in `tmp_path/ftw_jax/running/` (no git checkout), its cache fresh."""
    copy = tmp_path / "ftw_jax" / "running" / "provenance.py"
    copy.parent.mkdir(parents=True)
    shutil.copy(_SOURCE, copy)
    spec = importlib.util.spec_from_file_location("provenance_copy", copy)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not _IN_GIT, reason="needs git and a git checkout of the project")
def test_provenance_names_this_checkouts_commit_the_versions_and_the_command():
    found = provenance(["ftw-jax", "train"])
    assert found["commit"] == _head().strip() and isinstance(found["dirty"], bool)
    assert set(found["versions"]) == {"ftw_jax", *PACKAGES, "python"} and found["versions"]["jax"]
    assert found["command"] == ["ftw-jax", "train"] and found["source"].startswith("git checkout")


def test_outside_a_git_checkout_or_without_git_the_commit_is_none(tmp_path, monkeypatch):
    outside = _copy_outside_git(tmp_path).provenance(["x"])
    assert outside["commit"] is None and outside["dirty"] is None and "not a git checkout" in outside["source"]
    assert outside["versions"]["numpy"]  # the rest is there
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # a checkout, but no git to read it
    (tmp_path / "checkout" / ".git").mkdir(parents=True)
    unread = _copy_outside_git(tmp_path / "checkout").provenance(["x"])
    assert unread["commit"] is None and unread["dirty"] is None and "git absent or failing" in unread["source"]


def test_a_resume_at_another_commit_is_the_same_run_and_config_json_names_both(tmp_path):
    fingerprint = {"seeds": [0], "lr": 0.1}
    at = lambda commit: {"commit": commit, "dirty": False, "command": ["ftw-jax"]}  # noqa: E731
    folder = run_files.open_run(tmp_path, "run", None, "x", fingerprint, provenance=at("aaa"))
    run_files.open_run(tmp_path, None, folder, "x", fingerprint, provenance=at("bbb"))
    written = json.loads((folder / "config.json").read_text())
    assert [entry["commit"] for entry in written["provenance"]] == ["aaa", "bbb"]
    assert {key: value for key, value in written.items() if key != "provenance"} == fingerprint
    # config.json read back as a fingerprint (as a checkpointer's) is still the run's: provenance is not compared.
    assert config_differences(written, fingerprint) == config_differences(fingerprint, written) == []
    with pytest.raises(ValueError, match="lr: 0.1 -> 0.2"):  # what is compared still is
        run_files.open_run(tmp_path, None, folder, "x", {**fingerprint, "lr": 0.2}, provenance=at("ccc"))


@pytest.mark.slow  # compiles a program
def test_compare_phase_records_and_summaries_carry_the_code_and_resume_at_another_commit(tmp_path, capsys):
    arguments = [
        "compare", "--env", "bandit", "--algos", "ftw", "--seeds", "0", "--iterations", "4",
        "--episodes-per-iteration", "8", "--eval-every", "2", "--eval-episodes", "8", "--json",
    ]  # fmt: skip
    assert main([*arguments, "--out", str(tmp_path), "--name", "run"]) == 0
    summary = json.loads(capsys.readouterr().out)
    folder = tmp_path / "run"
    record_path = folder / "checkpoints" / "ftw-report.json"
    record = json.loads(record_path.read_text())
    for written in (
        summary["provenance"],
        record["provenance"],
        *json.loads((folder / "config.json").read_text())["provenance"],
    ):
        assert written["command"] == ["ftw-jax", *arguments, "--out", str(tmp_path), "--name", "run"]
        assert set(written["versions"]) == {"ftw_jax", *PACKAGES, "python"}
        if _IN_GIT:
            assert written["commit"] == _head().strip()
    assert json.loads((folder / "summary.json").read_text())["provenance"] == summary["provenance"]
    # The same run at another commit: its record and config.json say "older", and the resume takes them as its own.
    record["provenance"]["commit"] = "0" * 40
    record_path.write_text(json.dumps(record))
    config = json.loads((folder / "config.json").read_text())
    config["provenance"][0]["commit"] = "0" * 40
    (folder / "config.json").write_text(json.dumps(config))
    assert main([*arguments, "--resume", str(folder)]) == 0
    captured = capsys.readouterr()
    assert "period" not in captured.err  # nothing ran again: the record was taken
    assert json.loads(captured.out)["algorithms"] == summary["algorithms"]
    assert [entry["commit"] for entry in json.loads((folder / "config.json").read_text())["provenance"]][0] == "0" * 40

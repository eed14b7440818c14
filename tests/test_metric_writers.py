"""TensorBoard event files: every row of metrics.jsonl and evaluation.jsonl read back with TensorBoard's own
reader, one point per step after a resume too, and a writer that fails leaving the run to finish."""

import json
import pathlib
import shutil

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ftw_jax import cli
from ftw_jax.running.metric_writers import TensorBoardWriter

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")
BANDIT = ["train", "--env", "bandit", "--seeds", "3,4", "--iterations", "48", "--eval-every", "12", "--no-plot"]


def scalars(folder: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a TensorBoard run folder: [(step, value)], as TensorBoard shows them (purges applied)."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def rows(path: pathlib.Path, seed: int) -> list[dict]:
    return [row for row in map(json.loads, path.read_text().splitlines()) if row["seed"] == seed]


def assert_same_rows(run: pathlib.Path, seed: int) -> None:
    """Each number of the seed's JSON rows is a point of TensorBoard's train/NAME or eval/NAME at the row's env
    steps, and no tag has a point the rows lack."""
    found = scalars(run / "tensorboard" / f"seed_{seed}")
    for prefix, name in (("train", "metrics.jsonl"), ("eval", "evaluation.jsonl")):
        lines = rows(run / name, seed)
        numbers = {key for line in lines for key, value in line.items() if isinstance(value, int | float)} - {"seed"}
        assert {f"{prefix}/{key}" for key in numbers} <= set(found)
        for key in numbers:
            expected = [(line["env_steps"], float(line[key])) for line in lines if line[key] is not None]
            points = found[f"{prefix}/{key}"]
            assert [step for step, _ in points] == [step for step, _ in expected], (prefix, key)
            np.testing.assert_allclose([v for _, v in points], [v for _, v in expected], rtol=1e-6, err_msg=key)
    assert all(tag.startswith(("train/", "eval/")) for tag in found)


def test_train_writes_every_row_per_seed_and_a_resume_shows_one_curve(tmp_path):
    assert cli.main([*BANDIT, "--out", str(tmp_path), "--name", "run"]) == 0
    run = tmp_path / "run"
    assert sorted(path.name for path in (run / "tensorboard").iterdir()) == ["seed_3", "seed_4"]
    for seed in (3, 4):
        assert_same_rows(run, seed)
    # The last two checkpoints gone: the resumed run plays iterations 25-48 again and writes them again; the
    # points the first process wrote there are dropped, not shown twice.
    for step in ("3", "4"):
        shutil.rmtree(run / "checkpoints" / step)
    assert cli.main([*BANDIT, "--resume", str(run)]) == 0
    assert len(list((run / "tensorboard" / "seed_3").iterdir())) == 2  # a second event file
    for seed in (3, 4):
        assert_same_rows(run, seed)


def test_no_tensorboard_writes_none(tmp_path):
    assert cli.main([*BANDIT, "--out", str(tmp_path), "--name", "run", "--no-tensorboard"]) == 0
    assert not (tmp_path / "run" / "tensorboard").exists() and (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_writer_that_fails_warns_once_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    warnings = []
    writer = TensorBoardWriter(tmp_path / "blocked", warnings.append)
    (tmp_path / "blocked").write_text("a file where the folder would go")
    metrics = {"env_steps": np.array([[3, 6]]), "loss": np.array([[0.5, 0.4]])}
    evaluation = {"env_steps": np.array([6]), "return": np.array([1.0])}
    writer.period(["seed_0"], metrics, evaluation)
    writer.period(["seed_0"], metrics, evaluation)
    writer.close()
    assert len(warnings) == 1 and warnings[0].startswith("warning: TensorBoard events under") and writer.failed
    assert "its JSON lines hold every row" in warnings[0]
    # Through the command line, on a full disk: the run finishes, exit 0, every row in metrics.jsonl.
    import tensorboardX

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tensorboardX, "SummaryWriter", full_disk)
    assert cli.main([*BANDIT, "--out", str(tmp_path), "--name", "run"]) == 0
    printed = capsys.readouterr()
    assert (printed.out + printed.err).count("warning: TensorBoard events") == 1
    assert len(rows(tmp_path / "run" / "metrics.jsonl", 3)) == 48


def test_numbers_only_and_flags_as_numbers(tmp_path):
    writer = TensorBoardWriter(tmp_path, lambda message: None)
    writer.scalars("r", 5, {"a": 1.5, "b": True, "c": "text", "d": [1, 2], "e": float("nan"), "f": None}, "x")
    writer.close()
    assert scalars(tmp_path / "r") == {"x/a": [(5, 1.5)], "x/b": [(5, 1.0)]}

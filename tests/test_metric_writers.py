"""TensorBoard event files: every row of metrics.jsonl and evaluation.jsonl read back with TensorBoard's own
reader, one point per step after a resume too, and a writer that fails leaving the run to finish."""

import json
import pathlib
import shutil
import sys

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


def wandb_history(path: pathlib.Path) -> tuple[str, dict, dict[int, dict[str, float]]]:
    """A W&B run file's name, config and history (step -> {key: value}). The file is W&B's header (":W&B", 7
    bytes), then LevelDB's log format (32 KiB blocks of records with a 7-byte header: checksum, length, kind; a
    record cut across blocks comes as first, middle and last pieces), each record one protobuf `Record`. W&B's
    own reader is in its Go service, not in Python."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, pending, name, config, history = 7, b"", "", {}, {}
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a header: padding
            position += 32768 - position % 32768
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or its last piece
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "run":
                name = record.run.display_name
                config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
            if record.WhichOneof("record_type") == "history":
                row = history.setdefault(record.history.step.num, {})
                row.update(
                    {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                )
    return name, config, history


def test_wandb_offline_writes_a_run_per_seed_with_every_row(tmp_path, monkeypatch):
    pytest.importorskip("wandb")  # the `wandb` extra, in `test`
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert cli.main([*BANDIT, "--out", str(tmp_path), "--name", "run", "--wandb", "ftw-tests"]) == 0
    run = tmp_path / "run"
    files = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2  # a W&B run per seed
    runs = {name: (config, history) for name, config, history in map(wandb_history, files)}
    assert set(runs) == {"run/seed_3", "run/seed_4"}  # named by the run folder and the seed
    for seed in (3, 4):
        config, history = runs[f"run/seed_{seed}"]
        assert config["seeds"] == [3, 4] and config["num_iterations"] == 48  # the run's settings
        for line in rows(run / "metrics.jsonl", seed):
            point = history[line["env_steps"]]
            for key, value in line.items():
                if isinstance(value, int | float) and key != "seed":
                    assert point[f"train/{key}"] == pytest.approx(float(value), rel=1e-6), key
        for line in rows(run / "evaluation.jsonl", seed):
            assert history[line["env_steps"]]["eval/return"] == pytest.approx(line["return"], rel=1e-6)


def test_wandb_missing_warns_once_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the `wandb` extra were not installed
    assert cli.main([*BANDIT, "--out", str(tmp_path), "--name", "run", "--wandb", "ftw-tests"]) == 0
    printed = capsys.readouterr()
    warnings = [line for line in (printed.out + printed.err).splitlines() if "W&B runs" in line]
    assert (
        len(warnings) == 1 and "ModuleNotFoundError" in warnings[0] and "its JSON lines hold every row" in warnings[0]
    )
    assert len(rows(tmp_path / "run" / "metrics.jsonl", 4)) == 48 and (tmp_path / "run" / "tensorboard").is_dir()

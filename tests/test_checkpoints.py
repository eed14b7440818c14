"""Checkpoints: a killed run resumes to exactly the uninterrupted result; partial writes, other configs refused."""

import json
import logging
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ftw_jax import cli
from ftw_jax.lab.train import TrainConfig, make_train
from ftw_jax.running.checkpoints import Checkpointer, config_differences, rows_from_record, rows_record, with_raw_keys
from ftw_jax.running.loop import MemberRun, seed_keys

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")

# 30 evaluation periods, each checkpointed: long enough to be killed in the middle. Adam, whose moments and step
# count are state that a resume must restore (SGD has none).
TRAIN = [
    "train",
    "--env",
    "bandit",
    "--seeds",
    "0,1",
    "--iterations",
    "60",
    "--eval-every",
    "2",
    "--optimizer",
    "adam",
    "--no-plot",
    "--json",
]


def _leaves(tree):
    """Leaves as numpy arrays, PRNG keys as their raw data."""
    return [np.asarray(leaf) for leaf in jax.tree.leaves(with_raw_keys(tree))]


def _kill_while_writing(folder: pathlib.Path, after: int) -> list[pathlib.Path]:
    """Runs TRAIN into `folder` and SIGKILLs it while Orbax writes a checkpoint later than `after`; returns
    the partial checkpoint folders the kill left."""
    process = subprocess.Popen(
        [sys.executable, "-m", "ftw_jax.cli", *TRAIN, "--out", str(folder.parent), "--name", folder.name],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoints, deadline = folder / "checkpoints", time.monotonic() + 300
    # A checkpoint is written into a temporary folder and renamed into place when complete.
    while not ((checkpoints / str(after)).exists() and list(checkpoints.glob("*orbax-checkpoint-tmp*"))):
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.001)
    process.send_signal(signal.SIGKILL)
    process.wait()
    return list(checkpoints.glob("*orbax-checkpoint-tmp*"))


@pytest.mark.slow
def test_a_run_killed_mid_write_resumes_where_it_stopped_to_the_uninterrupted_result(tmp_path, capsys):
    killed = tmp_path / "killed"
    partial = _kill_while_writing(killed, after=3)
    assert partial, "the kill came after the write it was aimed at"
    assert not (killed / "summary.json").exists()
    latest = max(int(path.name) for path in (killed / "checkpoints").iterdir() if path.name.isdigit())

    # The last complete checkpoint holds exactly the carry of an uninterrupted run after `latest` periods,
    # Adam's moments and step count included.
    config = TrainConfig.for_env("bandit", num_iterations=60, eval_every=2, optimizer="adam")
    trainer = make_train(config)
    initial = jax.vmap(trainer.init)(jax.numpy.stack([jax.random.key(0), jax.random.key(1)]))
    carry = initial
    run_period = jax.jit(jax.vmap(trainer.run, in_axes=(0, None)), static_argnums=1)
    for _ in range(latest):
        carry, _ = run_period(carry, 1)
    fingerprint = json.loads((killed / "config.json").read_text())
    step, restored, record = Checkpointer(killed / "checkpoints", fingerprint).restore(initial)
    assert step == latest and len(record["history"]["rows"]) == latest
    adam = restored.learner.policy.opt_state.inner_state[0]
    assert np.asarray(adam.count).min() > 0 and np.abs(np.asarray(adam.mu["params"]["logits"])).min() > 0
    for got, expected in zip(_leaves(restored), _leaves(carry)):
        np.testing.assert_array_equal(got, expected)

    assert cli.main([*TRAIN, "--out", str(tmp_path), "--resume", str(killed)]) == 0
    captured = capsys.readouterr()
    resumed = json.loads(captured.out)
    # It went on from the checkpoint: the periods after it ran, and only those.
    assert f"resumed from the checkpoint after iteration {2 * latest}" in captured.err
    iterations = [int(value) for value in re.findall(r"^iteration +(\d+)/60", captured.err, re.MULTILINE)]
    assert iterations == list(range(2 * latest + 2, 61, 2))
    assert cli.main([*TRAIN, "--out", str(tmp_path), "--name", "whole"]) == 0
    whole = json.loads(capsys.readouterr().out)
    for name in ("return", "env_steps"):
        assert resumed[name] == whole[name]
    for log_file in ("metrics.jsonl", "evaluation.jsonl"):  # rows after the checkpoint were dropped, then redone
        assert (killed / log_file).read_text() == (tmp_path / "whole" / log_file).read_text()


@pytest.mark.slow
def test_resume_refuses_a_different_config_and_a_missing_run(tmp_path, capsys):
    argv = ["train", "--env", "bandit", "--eval-every", "2", "--no-plot", "--out", str(tmp_path), "--iterations"]
    assert cli.main([*argv, "4", "--name", "run"]) == 0
    assert cli.main([*argv, "4", "--name", "run"]) == 2  # the folder holds a run: resume it or pick another name
    assert "--resume" in capsys.readouterr().err
    assert cli.main([*argv, "6", "--resume", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert "different configuration" in error and "num_iterations: 4 -> 6" in error
    assert cli.main([*argv, "4", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no run there" in capsys.readouterr().err


def test_checkpointer_round_trip_ignores_partial_writes_and_checks_the_fingerprint(tmp_path, caplog):
    trainer = make_train(TrainConfig.for_env("bandit", num_iterations=4, eval_every=2))
    carry = jax.jit(trainer.init)(jax.random.key(0))
    later, _ = trainer.run(carry, 1)
    checkpointer = Checkpointer(tmp_path, {"config": (1, 2)})
    checkpointer.save(1, later, {"history": [1.5]})
    checkpointer.close()
    (tmp_path / "2.orbax-checkpoint-tmp-1").mkdir()  # what a kill mid-write leaves behind
    with caplog.at_level(logging.WARNING):
        step, restored, record = Checkpointer(tmp_path, {"config": [1, 2]}).restore(carry)
    assert step == 1 and record["history"] == [1.5]
    assert not caplog.records, [entry.getMessage() for entry in caplog.records]  # a resume warns of nothing
    assert jax.tree.structure(restored) == jax.tree.structure(later)
    for got, expected in zip(_leaves(restored), _leaves(later)):
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match=r"different configuration.*config: \[1, 2\] -> \[1, 3\]"):
        Checkpointer(tmp_path, {"config": [1, 3]}).restore(carry)
    larger = make_train(TrainConfig.for_env("bandit", num_iterations=4, eval_every=2, pool_capacity=64))
    with pytest.raises(ValueError, match=r"holds arrays of other shapes .*-> \(64"):  # read from its metadata
        Checkpointer(tmp_path, {"config": [1, 2]}).restore(jax.jit(larger.init)(jax.random.key(0)))
    assert Checkpointer(pathlib.Path(tmp_path / "empty"), {}).restore(carry) is None


def test_the_durable_step_is_the_newest_checkpoint_whose_write_finished(tmp_path, monkeypatch):
    carry = {"weights": jnp.arange(6.0).reshape(2, 3)}
    checkpointer = Checkpointer(tmp_path, {}, keep=3)
    assert checkpointer.durable_step() is None
    checkpointer.save(1, carry, {})
    checkpointer.wait()
    assert checkpointer.durable_step() == 1
    checkpointer.save(2, carry, {})
    checkpointer.wait()
    assert checkpointer.durable_step() == 2
    with monkeypatch.context() as patch:  # Orbax says step 2 is in flight: its folder may be partial (no renames)
        patch.setattr(checkpointer._manager, "is_saving_in_progress", lambda: True)
        assert checkpointer.durable_step() == 1
    shutil.move(tmp_path / "2", tmp_path / "2.orbax-checkpoint-tmp-1")  # or not in place yet
    assert checkpointer.durable_step() == 1
    shutil.move(tmp_path / "2.orbax-checkpoint-tmp-1", tmp_path / "2")
    checkpointer.close()
    restarted = Checkpointer(tmp_path, {})
    restarted.restore(carry)
    assert restarted.durable_step() == 2  # what it resumed from


def test_a_setting_added_since_is_the_same_run_only_while_it_is_off():
    stored = {"config": {"lr": 0.1, "nested": {"a": 1}}}
    for added_off in ({"greedy": False}, {"model": None}):
        assert config_differences(stored, {"config": {"lr": 0.1, **added_off, "nested": {"a": 1, **added_off}}}) == []
    assert config_differences(stored, {"config": {"lr": 0.1, "nested": {"a": 1}, "greedy": True}}) == [
        "config: {'lr': 0.1, 'nested': {'a': 1}} -> {'lr': 0.1, 'nested': {'a': 1}, 'greedy': True}"
    ]
    assert config_differences(stored, {"config": {"lr": 0.1, "nested": {"a": 1}, "probes": 0}})  # 0 is a value
    assert config_differences({"config": {"lr": 0.1, "greedy": False}}, {"config": {"lr": 0.1}})  # dropped: differs


@pytest.mark.slow
def test_checkpoint_every_saves_every_pth_period_and_the_last(tmp_path):
    argv = [
        "train",
        "--env",
        "bandit",
        "--seeds",
        "0",
        "--iterations",
        "10",
        "--eval-every",
        "2",
        "--no-plot",
        "--out",
        str(tmp_path),
    ]
    assert cli.main([*argv, "--name", "every3", "--checkpoint-every", "3"]) == 0
    assert sorted(path.name for path in (tmp_path / "every3" / "checkpoints").iterdir()) == ["3", "5"]  # 3, and the end
    assert cli.main([*argv, "--name", "none", "--no-checkpoint"]) == 0
    assert not (tmp_path / "none" / "checkpoints").exists()
    assert cli.main([*argv, "--name", "kept3", "--checkpoints-kept", "3"]) == 0
    assert sorted(path.name for path in (tmp_path / "kept3" / "checkpoints").iterdir()) == ["3", "4", "5"]


def test_compare_checkpoints_every_phase_at_the_cadence_asked(tmp_path):
    argv = ["compare", "--env", "bandit", "--algos", "ftw,reinforce", "--seeds", "0,1", "--iterations", "16"]
    argv += ["--eval-every", "2", "--episodes-per-iteration", "2", "--out", str(tmp_path), "--json"]
    assert cli.main([*argv, "--name", "every5", "--checkpoint-every", "5"]) == 0
    for algorithm in ("ftw", "reinforce"):  # 8 periods: the 5th and the last, where every period would keep 7 and 8
        steps = sorted(path.name for path in (tmp_path / "every5" / "checkpoints" / f"{algorithm}-report").iterdir())
        assert steps == ["5", "8"]
    assert cli.main([*argv, "--name", "none", "--no-checkpoint"]) == 0
    assert not (tmp_path / "none" / "checkpoints").exists()
    assert cli.main([*argv, "--name", "x", "--resume", str(tmp_path / "every5"), "--no-checkpoint"]) == 2


@pytest.mark.slow
def test_a_run_restored_finished_compiles_nothing_and_keeps_its_seconds(tmp_path):
    trainer = make_train(TrainConfig.for_env("bandit", num_iterations=4, eval_every=2))
    first = MemberRun(trainer, seed_keys([0]), checkpointer=Checkpointer(tmp_path, {"test": 1}))
    assert len(list(first.periods())) == 2 and first.compile_seconds > 0 and first.start_seconds > 0
    # Its seconds count making the members' state (a warm start's place), not only compiling and running.
    assert first.seconds == first.start_seconds + first.compile_seconds + first.clock[-1][0]
    first.checkpointer.close()
    again = MemberRun(trainer, seed_keys([0]), checkpointer=Checkpointer(tmp_path, {"test": 1}))
    assert list(again.periods()) == [] and again.compile_seconds == 0  # nothing left: not even a compile
    again.checkpointer.close()
    assert again.seconds == first.seconds > first.compile_seconds  # the first process's, from the record
    np.testing.assert_array_equal(again.results()["return"], first.results()["return"])


def test_recorded_rows_come_back_as_the_same_arrays():
    rows = [{"return": np.array([0.1, 1 / 3], np.float32), "iteration": np.array([2, 2], np.int32)}]
    [got] = rows_from_record(json.loads(json.dumps(rows_record(rows))))  # through JSON, as Orbax stores it
    for name, expected in rows[0].items():
        assert got[name].dtype == expected.dtype and (got[name] == expected).all()
    older = rows_from_record([{"return": [0.5, 0.25]}])  # records written before dtypes were stored
    assert older[0]["return"].tolist() == [0.5, 0.25]

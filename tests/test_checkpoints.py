"""Checkpoints: a killed run resumes to exactly the uninterrupted result; partial writes and other configs are refused."""

import json
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from ftw_jax import cli
from ftw_jax.checkpoints import Checkpointer, with_raw_keys
from ftw_jax.train import TrainConfig, make_train

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")

# 30 evaluation periods, each checkpointed: long enough to be killed in the middle.
TRAIN = ["train", "--env", "bandit", "--seeds", "0,1", "--iterations", "60", "--eval-every", "2", "--no-plot", "--json"]


def _leaves(tree):
    """Leaves as numpy arrays, PRNG keys as their raw data."""
    return [np.asarray(leaf) for leaf in jax.tree.leaves(with_raw_keys(tree))]


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path, capsys):
    killed = tmp_path / "killed"
    process = subprocess.Popen([sys.executable, "-m", "ftw_jax.cli", *TRAIN, "--out", str(tmp_path), "--name", "killed"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (killed / "checkpoints" / "3").exists():  # a checkpoint appears only once it is complete
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.01)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "summary.json").exists()

    assert cli.main([*TRAIN, "--out", str(tmp_path), "--resume", str(killed)]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert cli.main([*TRAIN, "--out", str(tmp_path), "--name", "whole"]) == 0
    whole = json.loads(capsys.readouterr().out)
    for name in ("return", "env_steps"):
        assert resumed[name] == whole[name]
    for log in ("metrics.jsonl", "evaluation.jsonl"):  # rows after the checkpoint were dropped, then redone
        assert (killed / log).read_text() == (tmp_path / "whole" / log).read_text()


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


def test_checkpointer_round_trip_ignores_partial_writes_and_checks_the_fingerprint(tmp_path):
    trainer = make_train(TrainConfig.for_env("bandit", num_iterations=4, eval_every=2))
    carry = trainer.init(jax.random.key(0))
    later, _ = trainer.run(carry, 1)
    checkpointer = Checkpointer(tmp_path, {"config": (1, 2)})
    checkpointer.save(1, later, {"history": [1.5]})
    checkpointer.close()
    (tmp_path / "2.orbax-checkpoint-tmp-1").mkdir()  # what a kill mid-write leaves behind
    step, restored, record = Checkpointer(tmp_path, {"config": [1, 2]}).restore(carry)
    assert step == 1 and record["history"] == [1.5]
    assert jax.tree.structure(restored) == jax.tree.structure(later)
    for got, expected in zip(_leaves(restored), _leaves(later)):
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match=r"different configuration.*config: \[1, 2\] -> \[1, 3\]"):
        Checkpointer(tmp_path, {"config": [1, 3]}).restore(carry)
    assert Checkpointer(pathlib.Path(tmp_path / "empty"), {}).restore(carry) is None

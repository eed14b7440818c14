"""Faults a run survives (issue 15): a damaged newest checkpoint or a torn log line, a second process on the
same run folder, and an interrupt; each ends with the numbers and files of an uninterrupted run."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ftw_jax import cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("unchecked_key_reuse")]

# 30 checkpointed evaluation periods of a tiny run with Adam (as in test_checkpoints.py).
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
LOGS = ("metrics.jsonl", "evaluation.jsonl")


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """An uninterrupted run: its folder and its printed summary."""
    out = tmp_path_factory.mktemp("runs")
    stdout = tmp_path_factory.mktemp("stdout") / "summary.json"
    with open(stdout, "w") as file:
        done = subprocess.run(
            [sys.executable, "-m", "ftw_jax.cli", *TRAIN, "--out", str(out), "--name", "whole"],
            stdout=file,
            stderr=subprocess.DEVNULL,
            timeout=600,
        )
    assert done.returncode == 0
    return out / "whole", json.loads(stdout.read_text())


def assert_same_run(folder, summary, whole):
    whole_folder, whole_summary = whole
    for key in ("return", "env_steps", "updates_applied"):
        assert summary[key] == whole_summary[key], key
    for name in LOGS:
        assert (folder / name).read_bytes() == (whole_folder / name).read_bytes(), name
    # TensorBoard shows each seed's rows once, whatever the stops and resumes wrote: the run's curve.
    for seed in (0, 1):
        events = EventAccumulator(str(folder / "tensorboard" / f"seed_{seed}"), size_guidance={"scalars": 0})
        events.Reload()
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        expected = [(row["env_steps"], row["return_mean"]) for row in rows if row["seed"] == seed]
        points = [(point.step, point.value) for point in events.Scalars("train/return_mean")]
        assert [step for step, _ in points] == [step for step, _ in expected]
        np.testing.assert_allclose([value for _, value in points], [value for _, value in expected], rtol=1e-6)


def truncate_the_array_files(checkpoint):
    for data in (checkpoint / "carry").rglob("d/*"):
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


def empty_the_metadata(checkpoint):
    (checkpoint / "carry" / "_METADATA").write_text("")


def tear_the_last_log_line(checkpoint):
    shutil.rmtree(checkpoint)  # killed while appending the period's rows, before its checkpoint was written
    with open(checkpoint.parents[1] / "metrics.jsonl", "a") as file:
        file.write('{"seed": 0, "return_mean": 0.5, "ite')


@pytest.mark.parametrize("damage", [truncate_the_array_files, empty_the_metadata, tear_the_last_log_line])
def test_a_damaged_newest_checkpoint_or_log_resumes_from_the_one_before(damage, whole, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(whole[0], folder)
    damage(folder / "checkpoints" / "30")
    assert cli.main([*TRAIN, "--out", str(tmp_path), "--resume", str(folder)]) == 0
    captured = capsys.readouterr()
    assert "resumed from the checkpoint after iteration 58" in captured.err and "Traceback" not in captured.err
    if damage is not tear_the_last_log_line:  # the damaged checkpoint is named and set aside
        assert f"the checkpoint {folder / 'checkpoints' / '30'} cannot be read" in captured.err
        assert len(list((folder / "checkpoints-unreadable").iterdir())) == 1
    assert_same_run(folder, json.loads(captured.out), whole)


@pytest.mark.parametrize("kept", [0, 1.5, 3, 4])  # rows of the last period's 4 in metrics.jsonl; 1.5: torn
def test_a_kill_while_a_periods_rows_are_appended_resumes_to_the_whole_runs_files(kept, whole, tmp_path, capsys):
    """The rows are written (and synced) before the checkpoint that counts them, so a kill in between leaves
    the previous checkpoint and any part of the period's rows: the resume writes them again, whole."""
    folder = tmp_path / "run"
    shutil.copytree(whole[0], folder)
    shutil.rmtree(folder / "checkpoints" / "30")
    (folder / "summary.json").unlink()
    metrics = (folder / "metrics.jsonl").read_text().splitlines(keepends=True)
    last = metrics[-4:]  # iterations 59 and 60 of both seeds
    cut = "".join(metrics[:-4] + last[: int(kept)]) + (last[int(kept)][:25] if kept % 1 else "")
    (folder / "metrics.jsonl").write_text(cut)
    if kept < 4:  # the evaluation rows come after the metrics rows
        evaluation = (folder / "evaluation.jsonl").read_text().splitlines(keepends=True)
        (folder / "evaluation.jsonl").write_text("".join(evaluation[:-2]))
    assert cli.main([*TRAIN, "--out", str(tmp_path), "--resume", str(folder)]) == 0
    assert_same_run(folder, json.loads(capsys.readouterr().out), whole)


def test_a_log_cut_behind_its_checkpoint_is_refused_not_resumed_without_its_rows(whole, tmp_path, capsys):
    """Issue 35: rows lost after their checkpoint was written (a file cut or edited since) would never be
    written again; the resume says which row is missing and stops, before touching anything."""
    folder = tmp_path / "run"
    shutil.copytree(whole[0], folder)
    (folder / "summary.json").unlink()
    metrics = (folder / "metrics.jsonl").read_text().splitlines(keepends=True)
    (folder / "metrics.jsonl").write_text("".join(metrics[:-5]) + metrics[-5][:30])
    assert cli.main([*TRAIN, "--out", str(tmp_path), "--resume", str(folder)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: {folder / 'metrics.jsonl'} lacks the row of seed 1, iteration 58, which the")
    assert (folder / "metrics.jsonl").read_text().endswith(metrics[-5][:30])  # left as it was


def test_a_period_is_checkpointed_only_after_its_rows_are_written(tmp_path):
    """`MemberRun.periods` checkpoints a period once the caller is done with it (has written its rows): a caller
    killed while writing leaves the checkpoint of the period before."""
    from ftw_jax.lab.train import TrainConfig, make_train
    from ftw_jax.running.checkpoints import Checkpointer
    from ftw_jax.running.loop import MemberRun, seed_keys

    config = TrainConfig.for_env("bandit", num_iterations=6, eval_every=2)
    checkpointer = Checkpointer(tmp_path, {"case": "ordering"})
    run = MemberRun(make_train(config), seed_keys([0]), checkpointer=checkpointer)
    with pytest.raises(KeyboardInterrupt):
        for index, _ in enumerate(run.periods()):
            if index == 1:  # killed while writing the second period's rows
                raise KeyboardInterrupt
    checkpointer.close()
    assert Checkpointer(tmp_path, {"case": "ordering"}).restore(run.carry)[0] == 1


def start(folder):
    return subprocess.Popen(
        [sys.executable, "-m", "ftw_jax.cli", *TRAIN, "--out", str(folder.parent), "--name", folder.name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path, process, seconds=300):
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before it could be reached"
        time.sleep(0.05)


def test_a_second_process_on_a_locked_run_folder_is_refused_and_the_first_ends_intact(whole, tmp_path, capsys):
    folder = tmp_path / "run"
    first = start(folder)
    wait_for(folder / "checkpoints" / "2", first)
    assert (folder / ".lock").read_text().strip() == str(first.pid)
    assert cli.main([*TRAIN, "--out", str(tmp_path), "--resume", str(folder)]) == 2
    assert f"is in use by process {first.pid}" in capsys.readouterr().err
    out, _ = first.communicate(timeout=600)
    assert first.returncode == 0 and not (folder / ".lock").exists()
    assert_same_run(folder, json.loads(out), whole)


@pytest.mark.parametrize(
    ("sent", "status", "repeated"),
    [(signal.SIGINT, 130, False), (signal.SIGTERM, 143, False), (signal.SIGINT, 130, True)],
    ids=["SIGINT", "SIGTERM", "SIGINT every 50 ms"],
)
def test_an_interrupt_says_how_to_resume_and_resuming_finishes_the_run(sent, status, repeated, whole, tmp_path, capsys):
    """Within seconds, while checkpoints are written; signals repeated until it ends find no phase where they
    print a traceback (once Orbax's threads, stopped half way) or kill it (once Python shutting down)."""
    folder = tmp_path / "run"
    process = start(folder)
    wait_for(folder / "checkpoints" / "3", process)
    started = time.monotonic()
    os.kill(process.pid, sent)
    while repeated and process.poll() is None:
        time.sleep(0.05)
        os.kill(process.pid, sent)
    _, err = process.communicate(timeout=300)
    assert time.monotonic() - started < 10
    assert process.returncode == status and "Traceback" not in err, err
    assert not (folder / ".lock").exists()
    command = err.strip().splitlines()[-1].strip()  # the last line: the command that resumes it
    assert command.startswith("ftw-jax train") and f"--resume {folder}" in command
    assert cli.main(shlex.split(command)[1:]) == 0
    assert_same_run(folder, json.loads(capsys.readouterr().out), whole)


def test_a_full_disk_while_checkpointing_says_so_in_one_line_and_the_run_resumes(whole, tmp_path, capsys):
    """Files cut at 8 kB (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail as on a full disk): the first checkpoint's
    metadata cannot be written. One line names the checkpoint and the reason, with none of the tracebacks Orbax's
    threads log; given room, the resume runs to the numbers of a run never stopped."""
    small_files = (  # set in the child itself: a preexec_fn would fork this multithreaded (JAX) process
        "import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (8000, 8000)); sys.argv[0] = 'ftw-jax'; "
        "runpy.run_module('ftw_jax.cli', run_name='__main__')"
    )
    folder = tmp_path / "run"
    full = subprocess.run(
        [sys.executable, "-c", small_files, *TRAIN, "--out", str(tmp_path), "--name", "run"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "FTW_JAX_COMPILE_CACHE": "off"},  # its entries are larger than 8 kB
    )
    assert full.returncode == 2 and "Traceback" not in full.stderr and "ERROR" not in full.stderr, full.stderr
    error = full.stderr.strip().splitlines()[-1]  # after the progress lines (--json)
    assert error.startswith(f"error: the checkpoint {folder / 'checkpoints' / '1'} could not be written (File too")
    assert error.endswith(f"no checkpoint was written before it: make room, then resume the run in {folder}")
    assert cli.main([*TRAIN, "--out", str(tmp_path), "--resume", str(folder)]) == 0
    assert_same_run(folder, json.loads(capsys.readouterr().out), whole)

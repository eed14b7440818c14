"""Bad input, through the command line as a user types it: one line naming the bad value and what was
expected, exit status 2, before any work and without a traceback (issue 15)."""

import contextlib
import json
import pathlib

import jax
import pytest

from ftw_jax import cli
from ftw_jax.running import run_files
from ftw_jax.running.checkpoints import CheckpointSettings

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")  # the checker's false positive on vmapped scans
# (argv, a piece of the message). Every one of them once ran, crashed with a traceback, hung or trained nothing.
CASES = [
    # Non-finite numbers pass range checks such as `not lr > 0` and would train nothing.
    (["train", "--env", "bandit", "--learning-rate", "inf"], "--learning-rate must be finite"),
    (["train", "--env", "bandit", "--kl-coef", "inf"], "--kl-coef must be finite"),
    (["train", "--env", "bandit", "--kl-coef-final", "nan"], "--kl-coef-final must be finite"),
    (["train", "--env", "bandit", "--importance-weight-cap", "inf"], "--importance-weight-cap must be finite"),
    (["bandit", "--learning-rate", "inf"], "--learning-rate must be finite"),
    (["bandit", "--kl-coef", "inf"], "--kl-coef must be finite"),
    (["bandit", "--arm-means", "1.0,nan"], "--arm-means must be finite"),
    (["sweep", "--env", "bandit", "--grid", "kl=nan"], "kl_coef must be finite"),
    (["sweep", "--env", "bandit", "--grid", "lr=inf"], "learning_rate must be finite"),
    (["compare", "--env", "bandit", "--algos", "ftw", "--learning-rates", "nan"], "positive finite numbers, got nan"),
    # Sizes and seeds.
    (["train", "--env", "bandit", "--pool-capacity", "0"], "--pool-capacity (N) must be an int >= 1"),
    (["train", "--env", "bandit", "--pool-capacity", "3000000000"], "--pool-capacity must be < 2**31"),
    (["train", "--env", "bandit", "--pool-capacity", "1000000000"], "GiB"),  # checked against memory, not allocated
    pytest.param(  # XLA's count: 184 GiB. (J = 1e8 needed 19.1 GiB, 2% over this machine's limit, then 18.x.)
        ["train", "--env", "bandit", "--num-batches", "2000000000"],
        "of working memory",
        marks=pytest.mark.slow,
    ),
    (  # was a RESOURCE_EXHAUSTED traceback (2.1 TB; issue 35)
        ["train", "--env", "text-search", "--warm-start-demonstrations", "1000000000"],
        "use fewer --warm-start-demonstrations",
    ),
    (["train", "--env", "bandit", "--seeds", "99999999999999999999"], "seeds must be integers in [0, 2147483647]"),
    (["train", "--env", "bandit", "--seeds", "0,0"], "seeds must be distinct"),
    (["train", "--env", "bandit", "--seeds", "1,,2"], "expected comma-separated integers"),
    (["bandit", "--num-seeds", "100000000000"], "at most 1,000,000 seeds"),
    (["sweep", "--env", "bandit", "--grid", "C=4,4"], "repeats a value"),
    (["train", "--env", "bandit", "--algorithm", "reinforce", "--episodes-per-iteration", "1"], "B) >= 2"),
    (["compare", "--env", "bandit"], "reinforce: REINFORCE's mean baseline needs episodes_per_iteration (B) >= 2"),
    (["compare", "--env", "bandit", "--algos", "ftw,grpo"], "grpo: episodes_per_iteration (B=1) must be a multiple"),
    # The reference options and the random search (issue 16).
    (
        ["train", "--env", "sokoban", "--algorithm", "ppo", "--num-minibatches", "3"],
        "--episodes-per-iteration (B=64) must be a multiple of num_minibatches (M=3)",
    ),
    (
        ["train", "--env", "bandit", "--algorithm", "ppo", "--entropy-coef", "-0.1"],
        "--entropy-coef must be a number >= 0",
    ),
    (["train", "--env", "bandit", "--max-grad-norm", "0"], "--max-grad-norm must be > 0"),
    (["train", "--env", "bandit", "--stop-after-skipped", "-1"], "--stop-after-skipped must be an int >= 0 or None"),
    (
        ["train", "--env", "bandit", "--kl-decay-iterations", "10", "--kl-coef-final", "nan"],
        "--kl-coef-final must be finite",
    ),
    (
        ["compare", "--env", "bandit", "--algos", "ftw", "--search", "2", "--learning-rates", "0.1,0.1"],
        "learning rates must be distinct, got [0.1, 0.1]",
    ),
    (
        ["compare", "--env", "bandit", "--algos", "ftw", "--search", "2", "--kl-coef", "0.1"],
        "kl_coef is/are searched for ftw",
    ),
    (["compare", "--env", "bandit", "--algos", "ppo", "--search", "100000"], "count must be in [1, "),
    # Environment options.
    (["train", "--env", "sokoban", "--env-options", "height=6.5"], "height must be int"),
    (["train", "--env", "search", "--env-options", "num_entities=1000000"], "num_entities and num_values must be"),
    (["train", "--env", "sokoban", "--env-options", "nosuch=1"], "bad options for sokoban: ['nosuch'] (it takes "),
    # The checkpoint is a setting of the run (--model), no longer an option of the task.
    (
        ["lm", "text-search", "--env-options", "model=/x"],
        "bad options for text-search: ['model'] (it takes guess_rate, ",
    ),
    (["train", "--env", "sokoban", "--model", "/x"], "model='/x' needs a policy that starts from a checkpoint (lm)"),
    (["train", "--env", "bandit", "--policy", "mlp"], "policy must be one of ('tabular',) for bandit"),
    # Typed before the environment compares them (issue 35: "'>=' not supported between 'str' and 'int'").
    (["train", "--env", "bandit", "--env-options", "noise_sd=abc"], "noise_sd must be int or float, got 'abc'"),
    (["train", "--env", "bandit", "--env-options", "arm_means=1"], "arm_means must be tuple, got 1"),
    (["train", "--env", "sokoban", "--env-options", "height=abc"], "height must be int, got 'abc'"),
    (["train", "--env", "text-search", "--env-options", "two_hop_fraction=abc"], "two_hop_fraction must be"),
    # Settings that would be ignored, seeds out of range, metrics that do not exist (issue 35).
    (["compare", "--env", "bandit", "--algos", "ftw", "--tuning-iterations", "10"], "tuning_iterations=10 applies"),
    (["compare", "--env", "bandit", "--algos", "ftw", "--search-seed=-1"], "expected an integer in [0, 2147483647]"),
    (["compare", "--env", "bandit", "--algos", "ftw", "--metric", "success"], "metric 'success' is not defined"),
    (["sweep", "--env", "bandit", "--grid", "C=4,5", "--metric", "success"], "--metric success is not defined"),
    (
        ["train", "--env", "bandit", "--warm-start-steps", "10"],
        "--warm-start-steps 10 takes effect only with --warm-start-",
    ),
    (
        ["train", "--env", "sokoban", "--probes-per-task", "8"],
        "--probes-per-task 8 takes effect only with --probe-tasks > 0",
    ),
    (["train", "--env", "bandit", "--name="], "expected a folder name, got an empty one"),
    # Run folders.
    (["train", "--env", "bandit", "--name", "../escape"], "--name must be a plain folder name"),
    (["train", "--env", "bandit", "--name", "/absolute/path"], "--name must be a plain folder name"),
    (["train", "--env", "bandit", "--resume", "{out}/x", "--no-checkpoint"], "--resume needs the checkpoints"),
    (["train", "--env", "bandit", "--resume", "{out}/nothing"], "no run there"),
    (["train", "--env", "bandit", "--resume", "{out}/torn"], "torn/config.json:1: not JSON (Unterminated string"),
    (["train", "--env", "bandit", "--out", "{file}"], "cannot use"),
    (["sweep", "--env", "bandit", "--grid", "C=4", "--out", "{file}"], "cannot use"),
    (["compare", "--env", "bandit", "--algos", "ftw", "--out", "{file}"], "cannot use"),
    (["bandit", "--out", "{file}"], "cannot use"),
    (["train", "--env", "bandit", "--name", "{not_a_run}"], "is not a run folder"),
    # Values that would spin, divide by zero or be dropped silently.
    pytest.param(
        ["compare", "--env", "bandit", "--search", "2", "--learning-rates", "nan"],
        "expected positive finite numbers, got nan",
        id="learning rates nan",
    ),
    pytest.param(["train", "--env", "cartpole", "--hidden-sizes", "0"], "must be widths >= 1, got (0,)", id="width 0"),
    pytest.param(
        ["train", "--env", "bandit", "--seeds=0", "--num-seeds", "3"],
        "argument --num-seeds: not allowed with argument --seeds",
        id="seeds and num-seeds",
    ),
    # No flag by abbreviation: `--seed 5` would silently be `--seeds 5`.
    pytest.param(["train", "--env", "bandit", "--seed", "5"], "unrecognized arguments: --seed", id="abbreviation seed"),
    pytest.param(["bandit", "--seed", "5"], "unrecognized arguments: --seed", id="abbreviation bandit seed"),
]


@pytest.mark.parametrize(
    ("argv", "message"), CASES, ids=[" ".join(case.values[0] if hasattr(case, "values") else case[0]) for case in CASES]
)
def test_bad_input_gets_one_line_and_exit_2(argv, message, tmp_path, capsys):
    file = tmp_path / "a-file"
    file.write_text("not a folder")
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "not-a-run" / "notes.txt").write_text("mine")
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "config.json").write_text('{"env": "ban')  # a run's config.json damaged by hand
    values = {"out": tmp_path, "file": file, "not_a_run": "not-a-run"}
    argv = [part.format(**values) for part in argv]
    if "--out" not in argv and argv[0] != "bandit":
        argv += ["--out", str(tmp_path)]
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's own errors (a bad value for a flag's type)
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert message in err
    assert err.strip().splitlines()[-1].count("error") == 1  # the last line is the error
    assert not (tmp_path / "not-a-run" / "config.json").exists()  # nothing half-written


def test_a_sweep_too_big_for_memory_is_refused_before_it_runs_and_leaves_nothing(monkeypatch, tmp_path, capsys):
    """Issue 35: a sweep of a million seeds took 20 GB and minutes before any check. Its state alone fits under
    half the memory here, but a period holds the state twice (in and out, ~2.4 states with its outputs, where
    its outputs and temporaries alone are ~1.6): XLA's count of the compiled period, arguments included, refuses
    it. Memory is set small so that the check is the same on any machine."""
    from ftw_jax.lab import sweep
    from ftw_jax.lab.train import make_train
    from ftw_jax.running import memory

    members = sweep.make_sweep("bandit", {"C": [4, 5]}, list(range(100)))
    state = memory.state_bytes(jax.eval_shape(make_train(members.config).init, jax.random.key(0)))
    monkeypatch.setattr(memory, "memory_available", lambda: int(3.2 * state * len(members.members)))
    argv = ["sweep", "--env", "bandit", "--grid", "C=4,5", "--num-seeds", "100", "--out", str(tmp_path)]
    assert cli.main([*argv, "--name", "big"]) == 2
    err = capsys.readouterr().err
    assert "one evaluation period needs" in err and "of working memory" in err and "Traceback" not in err
    assert not (tmp_path / "big").exists()  # the corrected command may take the same name


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_a_refused_compare_or_sweep_leaves_nothing_that_blocks_the_corrected_command(
    command, monkeypatch, tmp_path, capsys
):
    """Issue 35: compare's refusal left config.json and its empty per-algorithm checkpoint folders, and the
    corrected command under the same --name was told the folder already held a run."""
    from ftw_jax.running import memory

    monkeypatch.setattr(memory, "memory_available", lambda: 16 * 2**30)  # the same refusal on any machine
    what = ["--algos", "ftw"] if command == "compare" else ["--grid", "C=4,5"]
    argv = [command, "--env", "bandit", *what, "--out", str(tmp_path), "--name", "r"]
    assert cli.main([*argv, "--pool-capacity", "1000000000"]) == 2
    assert "the run's state needs" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_run_folder_name_must_stay_inside_out(tmp_path, capsys):
    assert cli.main(["train", "--env", "bandit", "--out", str(tmp_path / "runs"), "--name", "..", "--no-plot"]) == 2
    error = capsys.readouterr().err  # the library names its parameters; the command line prints its flags
    assert error == "error: --name must be a plain folder name inside --out (no '/', not '..'), got '..'.\n"
    assert not (tmp_path / "config.json").exists() and not list(pathlib.Path(tmp_path).glob("*.json"))


OFF = CheckpointSettings(off=True)


def test_a_run_refused_before_its_first_checkpoint_leaves_nothing_that_blocks_a_retry(tmp_path):
    """Issue 32: bad input found after the run folder was made (lm learn reads its episodes there) removes what
    the run wrote, so the same --name works once the input is fixed; an empty folder of the user's stays."""
    (tmp_path / "mine").mkdir()
    for name in ("run", "mine"):
        with pytest.raises(ValueError, match="bad episodes"), contextlib.ExitStack() as cleanup:
            folder = run_files.open_run(tmp_path, name, None, "lm-learn", {"seed": 0}, cleanup=cleanup)
            checkpointer = CheckpointSettings().checkpointer(folder / "checkpoints", {"seed": 0})
            assert checkpointer is not None and (folder / "config.json").is_file()
            checkpointer.close()
            raise ValueError("bad episodes")
    assert not (tmp_path / "run").exists()
    assert (tmp_path / "mine").is_dir() and not any((tmp_path / "mine").iterdir())
    with pytest.raises(RuntimeError), contextlib.ExitStack() as cleanup:  # a crash, not a refusal: kept
        run_files.open_run(tmp_path, "crashed", None, "lm-learn", {"seed": 0}, cleanup=cleanup, checkpoints=OFF)
        raise RuntimeError("a bug")
    assert (tmp_path / "crashed" / "config.json").is_file()
    with contextlib.ExitStack() as cleanup:  # the retry under the refused name
        folder = run_files.open_run(tmp_path, "run", None, "lm-learn", {}, cleanup=cleanup, checkpoints=OFF)
    assert (folder / "config.json").is_file()


@pytest.mark.slow
def test_a_run_that_applies_no_update_says_so(tmp_path, capsys):
    # C = 5 of a pool that 4 pulls never fill: not one update, and the result is the untrained policy's.
    argv = [
        "train",
        "--env",
        "bandit",
        "--iterations",
        "4",
        "--eval-every",
        "4",
        "--seeds",
        "0,1",
        "--out",
        str(tmp_path),
        "--name",
        "run",
        "--no-plot",
        "--json",
    ]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["updates_applied"] == [0, 0] and "few or no updates were applied" in summary["warning"]
    assert summary["warning"] in captured.err

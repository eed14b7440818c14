"""No silent skipped steps (issue 31): every command counts the optimizer updates it skips once they are ready
(non-finite, nothing kept), shows them per period, and a run whose members stop applying them stops with one
line and exit 3, its run folder resumable; updates before FTW's pool is ready never count."""

import json

import chex
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ftw_jax import cli
from ftw_jax.lab import train
from ftw_jax.running import checkpoints, skips

# ------------------------------------------------------------------------------------------ counts, by hand


class CountsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_only_ready_updates_count_and_the_trailing_ones_are_those_after_the_last_applied(self):
        counts = self.variant(skips.update_counts)(
            {
                # update:   0 not ready (non-finite: not counted), 1 skipped, 2 applied, 3 and 4 skipped
                "ready": jnp.array([False, True, True, True, True]),
                "applied": jnp.array([False, False, True, False, False]),
                "nonfinite": jnp.array([True, True, False, False, True]),
            }
        )
        expected = dict(applied_count=1, skipped_count=3, nonfinite_count=2, skipped_trailing=2, nonfinite_trailing=1)
        assert {name: int(value) for name, value in counts.items()} == expected

    @chex.variants(with_jit=True, without_jit=True)
    def test_an_algorithm_without_ready_or_nonfinite_is_always_ready_and_skips_only_non_finite_steps(self):
        counts = self.variant(skips.update_counts)({"applied": jnp.array([False, True, False, False])})
        expected = dict(applied_count=1, skipped_count=3, nonfinite_count=3, skipped_trailing=2, nonfinite_trailing=2)
        assert {name: int(value) for name, value in counts.items()} == expected


def test_skips_in_a_row_go_on_across_iterations_until_one_applies_and_not_ready_ones_neither_add_nor_break():
    # Per iteration of U = 4 for two members: (applied, trailing skips).
    applied = np.array([[0, 0, 0, 1, 0], [0, 2, 0, 0, 0]])
    trailing = np.array([[0, 4, 4, 1, 4], [0, 0, 0, 4, 4]])  # member 0's first and member 1's third: not ready
    assert skips.skipped_in_a_row(np.array([0, 3]), applied, trailing).tolist() == [5, 8]
    assert skips.skipped_in_a_row(np.array([7, 7]), applied[:, :1], trailing[:, :1]).tolist() == [7, 7]


def test_the_limit_is_a_whole_period_by_default_never_for_zero_and_else_n():
    assert skips.limit_of(None, 160) == 160 and skips.limit_of(0, 160) is None and skips.limit_of(5, 160) == 5
    assert skips.stuck(np.array([4, 5, 160]), 5).tolist() == [False, True, True]
    assert not skips.stuck(np.array([10**6]), None).any()


def test_a_period_adds_its_counts_and_carries_the_run_of_skips():
    before = {name: np.array([1, 0]) for name in ("updates_skipped", "updates_nonfinite")}
    before.update(skipped_in_a_row=np.array([3, 0]), nonfinite_in_a_row=np.array([1, 0]))
    metrics = {  # [M, eval_every = 2]
        "applied_count": np.array([[0, 0], [2, 0]]),
        "skipped_count": np.array([[2, 2], [0, 2]]),
        "nonfinite_count": np.array([[2, 0], [0, 1]]),
        "skipped_trailing": np.array([[2, 2], [0, 2]]),
        "nonfinite_trailing": np.array([[2, 0], [0, 1]]),
    }
    after = {name: value.tolist() for name, value in skips.totals_after(before, metrics).items()}
    assert after == {
        "updates_skipped": [5, 2],
        "updates_nonfinite": [3, 1],
        "skipped_in_a_row": [7, 2],
        "nonfinite_in_a_row": [3, 1],
    }


def test_the_stop_message_is_one_line_naming_members_counts_why_and_what_to_try():
    message = skips.stop_message(
        ["seed 0", "seed 1", "seed 2"], np.array([20, 20, 25]), np.array([20, 20, 5]), 20, whole="a whole period"
    )
    assert "\n" not in message
    assert "20 ready updates in a row (a whole period; `stop_after_skipped`)" in message  # the setting's name
    assert "seed 0, seed 1 skipped the last 20 (all non-finite)" in message
    assert "seed 2 skipped the last 25 (5 non-finite, 20 with nothing kept)" in message
    assert "`learning_rate`" in message and "`max_grad_norm` 1" in message and "`optimizer` sgd" in message
    assert "`elite_rule` top_k" in message
    only_kept = skips.stop_message(["seed 0"], np.array([3]), np.array([0]), 3)
    assert "(all with nothing kept)" in only_kept and "learning_rate" not in only_kept
    from ftw_jax.cli.flags import as_flags

    cli.build_parser()  # notes every command's flags
    assert "a whole period; --stop-after-skipped)" in as_flags(message)  # the command line prints its flags
    assert "--max-grad-norm 1" in as_flags(message) and "--elite-rule top_k" in as_flags(message)


def test_a_resume_may_change_when_a_run_stops_and_nothing_else():
    stored = {"seeds": [0], "stop_after_skipped": None, "maxima": {"stop_after_skipped": None, "learning_rate": 0.1}}
    changed = {"seeds": [0], "stop_after_skipped": 0, "maxima": {"stop_after_skipped": 3, "learning_rate": 0.1}}
    assert checkpoints.config_differences(stored, changed) == []
    changed["maxima"]["learning_rate"] = 0.2
    difference = "maxima: {'learning_rate': 0.1} -> {'learning_rate': 0.2}"
    assert checkpoints.config_differences(stored, changed) == [difference]


# ------------------------------------------------------------------------------------------ through the CLI


@pytest.fixture
def nonfinite_optimizer(monkeypatch):
    """Every optimizer update NaN (as bfloat16 Adam's were, issue 31), from finite losses and gradients."""
    original = train.make_optimizer
    monkeypatch.setattr(train, "make_optimizer", lambda config: optax.chain(original(config), optax.scale(jnp.nan)))


# B = 2 of C = 5: the first period's two iterations are not ready (2, 4 entries), the third is (U = 1).
BANDIT = [
    "train",
    "--env",
    "bandit",
    "--seeds",
    "0,1",
    "--iterations",
    "8",
    "--eval-every",
    "2",
    "--episodes-per-iteration",
    "2",
    "--batch-size",
    "5",
    "--eval-episodes",
    "8",
    "--no-plot",
]


def stop_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err  # progress goes to stdout without --json
    return lines[0]


@pytest.mark.usefixtures("unchecked_key_reuse", "nonfinite_optimizer")
def test_a_run_whose_updates_are_all_non_finite_stops_in_one_line_checkpointed_and_resumes(tmp_path, capsys):
    run = tmp_path / "run"
    argv = [*BANDIT, "--out", str(tmp_path), "--name", "run", "--checkpoint-every", "3"]
    assert cli.main(argv) == cli.STOPPED_SKIPPING == 3
    line = stop_line(capsys)
    # Not after the first period (not ready), after the second: its 2 ready updates, a whole period, skipped.
    assert line.startswith("stopped: no update applied for 2 ready updates in a row (a whole period;")
    assert "seed 0, seed 1 skipped the last 2 (all non-finite)" in line and "--learning-rate" in line
    assert f"--resume {run}" in line and "--stop-after-skipped 0" in line
    assert (run / "checkpoints" / "2").is_dir()  # between --checkpoint-every 3 periods: the stopped one is kept
    assert [json.loads(row)["iteration"] for row in (run / "metrics.jsonl").read_text().splitlines()][-1] == 4

    # Resumed as it started, it goes on from there and stops again; the run of skips goes on with it.
    assert cli.main([*BANDIT, "--resume", str(run)]) == 3
    out, err = capsys.readouterr()
    assert "resumed from the checkpoint after iteration 4" in out and "skipped 4/4" in out
    assert "seed 0, seed 1 skipped the last 4 (all non-finite)" in err

    # With --stop-after-skipped 0 it finishes, and the summary counts what it skipped.
    assert cli.main([*BANDIT, "--resume", str(run), "--stop-after-skipped", "0", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["updates_applied"] == [0, 0]
    assert summary["updates_skipped"] == summary["updates_nonfinite"] == [6, 6]  # iterations 3 to 8


@pytest.mark.usefixtures("unchecked_key_reuse")
def test_a_run_that_applies_its_updates_is_unaffected_even_stopped_after_one_skip(tmp_path, capsys):
    """The strictest limit, 1, and a first period whose updates are not ready: nothing stops, nothing is
    counted as skipped."""
    argv = [*BANDIT, "--out", str(tmp_path), "--name", "run", "--stop-after-skipped", "1"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert "stopped" not in err and out.count("skipped 0/4") == 4
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["updates_applied"] == [6, 6] and summary["updates_skipped"] == summary["updates_nonfinite"] == [0, 0]


SWEEP = ["sweep", "--env", "bandit", "--grid", "C=2,8", "--seeds", "0", "--iterations", "8", "--eval-every", "4"]
SWEEP += ["--eval-episodes", "8"]


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse", "nonfinite_optimizer")
def test_a_sweep_stops_for_the_grid_point_that_skips_and_names_it(tmp_path, capsys):
    """B = 1: C = 2 is ready from the second iteration, C = 8 from the eighth. After the first period C = 2 has
    skipped 3 (< 4), C = 8 none; after the second, C = 2 has skipped 7 (stops), C = 8 one."""
    assert cli.main([*SWEEP, "--out", str(tmp_path), "--name", "run"]) == 3
    line = stop_line(capsys)
    assert "C=2, seed 0 skipped the last 7 (all non-finite)" in line and "C=8" not in line
    assert cli.main([*SWEEP, "--resume", str(tmp_path / "run"), "--stop-after-skipped", "0", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["updates_skipped"] == [7, 1] and summary["updates_applied"] == [0, 0]


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse", "nonfinite_optimizer")
def test_compare_tunes_past_configurations_that_skip_and_stops_when_a_reported_seed_does(tmp_path, capsys):
    argv = ["compare", "--env", "bandit", "--algos", "ftw", "--seeds", "0", "--learning-rates", "0.03,0.3"]
    argv += ["--tuning-seeds", "7", "--iterations", "4", "--eval-every", "2", "--episodes-per-iteration", "8"]
    argv += ["--eval-episodes", "8", "--out", str(tmp_path), "--name", "run"]
    assert cli.main(argv) == 3
    out, err = capsys.readouterr()
    assert out.count("ftw   tune") == 2 and "skipped 4/4" in out  # both learning rates, every update skipped
    assert "ftw seed 0 skipped the last 2 (all non-finite)" in err.strip().splitlines()[-1]
    assert cli.main([*argv[:-4], "--resume", str(tmp_path / "run"), "--stop-after-skipped", "0", "--json"]) == 0
    updates = json.loads(capsys.readouterr().out)["updates"]["ftw"]
    assert updates == {"applied": [0], "skipped": [4], "nonfinite": [4], "tuning_skipped": 8, "tuning_nonfinite": 8}

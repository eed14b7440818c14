"""No silent skipped steps (issue 31): the optimizer updates skipped once ready (non-finite, nothing kept) are
counted, in a row across iterations, and said in one line; updates before FTW's pool is ready never count."""

import chex
import jax.numpy as jnp
import numpy as np

from ftw_jax import checkpoints, skips

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
    assert "20 ready updates in a row (a whole period; --stop-after-skipped)" in message
    assert "seed 0, seed 1 skipped the last 20 (all non-finite)" in message
    assert "seed 2 skipped the last 25 (5 non-finite, 20 with nothing kept)" in message
    assert "--learning-rate" in message and "--max-grad-norm" in message and "--optimizer sgd" in message
    assert "--elite-rule top_k" in message
    only_kept = skips.stop_message(["seed 0"], np.array([3]), np.array([0]), 3)
    assert "(all with nothing kept)" in only_kept and "--learning-rate" not in only_kept


def test_a_resume_may_change_when_a_run_stops_and_nothing_else():
    stored = {"seeds": [0], "stop_after_skipped": None, "maxima": {"stop_after_skipped": None, "learning_rate": 0.1}}
    changed = {"seeds": [0], "stop_after_skipped": 0, "maxima": {"stop_after_skipped": 3, "learning_rate": 0.1}}
    assert checkpoints.config_differences(stored, changed) == []
    changed["maxima"]["learning_rate"] = 0.2
    difference = "maxima: {'learning_rate': 0.1} -> {'learning_rate': 0.2}"
    assert checkpoints.config_differences(stored, changed) == [difference]

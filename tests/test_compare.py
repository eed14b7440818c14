"""Comparisons: the reported statistics, the tuning protocol, and the `ftw-jax compare` outputs."""

import csv
import dataclasses
import json
import re
import shutil

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ftw_jax.cli import main
from ftw_jax.lab.compare import AlgorithmResult, Comparison, compare
from ftw_jax.lab.comparison_tables import difference_rows, markdown_table, solved_seeds
from ftw_jax.lab.stats import (
    bootstrap_interval,
    holm,
    interquartile_mean,
    p_text,
    rank_test,
    seed_statistics,
    t_interval,
    verdict,
    welch,
)
from ftw_jax.lab.train import TrainConfig, make_train

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")

# The bandit with 8 pulls per iteration (GRPO needs B a multiple of its groups of 8): compiles and runs in seconds.
BUDGET = dict(episodes_per_iteration=8, num_iterations=24, eval_every=12, eval_episodes=32)


def test_statistics_by_hand():
    values = np.array([0.0, 10.0, 1.0, 2.0, 3.0, 4.0, 5.0, -20.0])
    assert interquartile_mean(values) == pytest.approx(np.mean([1.0, 2.0, 3.0, 4.0]))  # 2 cut at each end
    low, high = bootstrap_interval(values)
    assert low < values.mean() < high and (low, high) == bootstrap_interval(values)  # deterministic
    # The percentile interval of the mean: about mean ± 1.96 standard errors for a sample this size.
    standard_error = values.std() / np.sqrt(len(values))
    assert high - low == pytest.approx(2 * 1.96 * standard_error, rel=0.25)
    assert seed_statistics(np.full(5, 0.75)) == {
        "mean": 0.75,
        "t_low": 0.75,
        "t_high": 0.75,
        "ci_low": 0.75,
        "ci_high": 0.75,
        "iqm": 0.75,
    }
    # The t-interval: mean ± t(0.975, n − 1)·sd/√n, t(0.975, 7) = 2.3646; wider than the bootstrap's at 8 seeds.
    t_low, t_high = t_interval(values)
    half = 2.364624 * values.std(ddof=1) / np.sqrt(8)
    assert (t_low, t_high) == pytest.approx((values.mean() - half, values.mean() + half), rel=1e-5)
    assert t_high - t_low > high - low


def test_rank_test_p_values_and_bounded_intervals_by_hand():
    # No ties, every a above every b: the exact two-sided Mann–Whitney p is 2 / C(6, 3) = 0.1.
    assert rank_test(np.array([5.0, 6.0, 7.0]), np.array([1.0, 2.0, 3.0])) == pytest.approx(0.1)
    assert rank_test(np.ones(4), np.ones(5)) == 1.0
    assert p_text(0.0004) == "p < 0.001" and p_text(0.0123) == "p = 0.012" and p_text(0.001) == "p = 0.001"
    # Two seeds at 100%, one at 50%: the t-interval runs past 100%; the table cuts it there and says so.
    result = AlgorithmResult(
        algorithm="ppo",
        learning_rate=1e-3,
        curves=np.array([[1.0], [1.0], [0.5]]),
        env_steps=np.ones((3, 1)),
        seconds=0.0,
        tuning=[],
        applied_share=np.ones(3),
    )
    assert t_interval(result.final)[1] > 1
    comparison = Comparison(env="search", metric="success", seeds=[0, 1, 2], episodes=np.array([10]), results=[result])
    table = markdown_table(comparison)
    assert "[95% t-CI in [0, 100]]" in table and ", 100.0] [" in table


def test_welch_difference_and_verdicts_by_hand():
    a, b = np.array([3.0, 4.0, 5.0, 6.0]), np.array([1.0, 1.5, 2.0, 2.5, 3.0])
    # var(a)/4 = 1.6667/4, var(b)/5 = 0.625/5; dof by Welch–Satterthwaite 4.749; t(0.975, 4.749) = 2.6119.
    variance = 1.666667 / 4 + 0.625 / 5
    dof = variance**2 / ((1.666667 / 4) ** 2 / 3 + (0.625 / 5) ** 2 / 4)
    assert dof == pytest.approx(4.7494, rel=1e-4)
    test = welch(a, b)
    half = 2.6119 * np.sqrt(variance)
    assert test["difference"] == pytest.approx(2.5)
    assert (test["low"], test["high"]) == pytest.approx((2.5 - half, 2.5 + half), rel=1e-3)
    assert test["p_value"] == pytest.approx(0.02093, abs=1e-4)  # t = 2.5/sqrt(variance) = 3.397 at 4.749 dof
    assert verdict(a, b, margin=0.1) == "better" and verdict(b, a, margin=0.1) == "worse"
    close = np.array([0.50, 0.51, 0.49, 0.50, 0.52, 0.48])
    assert verdict(close, close[::-1] + 0.001, margin=0.05) == "equivalent"
    assert verdict(close, close[::-1] + 0.001, margin=0.001) == "inconclusive"  # too tight a margin to claim


def final_only(finals: dict[str, np.ndarray]) -> Comparison:
    """A success comparison of one evaluation per seed: each algorithm's final successes [S]."""
    results = [
        AlgorithmResult(
            algorithm=name,
            learning_rate=1e-3,
            curves=final[:, None],
            env_steps=np.ones((final.size, 1)),
            seconds=0.0,
            tuning=[],
            applied_share=np.ones(final.size),
        )
        for name, final in finals.items()
    ]
    seeds = list(range(results[0].curves.shape[0]))
    return Comparison(env="search", metric="success", seeds=seeds, episodes=np.array([10]), results=results)


def test_the_table_says_equivalence_rests_on_the_90_percent_interval():
    """A difference whose 95% interval crosses the margin can still be "equivalent" (two one-sided tests at 5%
    use the 90% interval); the table names the interval it used, so the two read together."""
    ftw_final = np.array([0.470, 0.457, 0.418, 0.444, 0.392, 0.431, 0.353, 0.457, 0.405, 0.431])
    ppo_final = np.array([0.399, 0.438, 0.412, 0.373, 0.425, 0.386, 0.451, 0.360, 0.412, 0.386])
    test, tost = welch(ftw_final, ppo_final), welch(ftw_final, ppo_final, confidence=0.9)
    assert test["p_value"] > 0.05 and test["high"] > 0.05 > tost["high"]  # the case two-hop search met
    table = markdown_table(final_only({"ftw": ftw_final, "ppo": ppo_final}))
    assert "| equivalent (90% CI inside ±5.0) |" in table and "equivalent (margin" not in table


def test_seeds_that_split_in_two_are_counted_and_tested_exactly():
    """One-hop search's case: all 10 FTW seeds solve it, 7 of PPO's, 3 stay near chance. Fisher's exact test on
    the counts, two-sided: the tables with 10 solved among the first 10 rows of 20 and 17 solved in all are
    those with 0 or 3 failures among the first: (C(17,10) + C(17,7)) / C(20,10) = 0.2105."""
    ftw, ppo = np.linspace(0.96, 1.0, 10), np.array([1.0] * 7 + [0.12, 0.13, 0.11])
    assert solved_seeds(ftw, ppo) == {
        "solved": 10,
        "other_solved": 7,
        "solved_p_value": pytest.approx(0.21053, abs=1e-5),
    }
    assert solved_seeds(np.full(30, 0.9), np.full(30, 0.1))["solved_p_value"] < 1e-15
    assert solved_seeds(np.array([0.5, 0.49]), np.array([0.5, 0.5]))["solved"] == 1  # half the questions: solved
    comparison = final_only({"ftw": ftw, "ppo": ppo})
    table = markdown_table(comparison)
    assert "seeds solved (final ≥ 50.0%), Fisher's exact p |" in table and "| 10 vs 7 of 10, p = 0.211 |" in table
    returns = markdown_table(dataclasses.replace(comparison, metric="return"))
    assert "Fisher" not in returns  # no success, nothing solved


def test_holm_adjusts_a_family_of_p_values_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> running maximum 0.02, 0.03, 0.06, 0.06
    np.testing.assert_allclose(holm(np.array([0.01, 0.04, 0.03, 0.005])), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm(np.array([0.5, 0.9])), [1.0, 1.0])  # capped at 1
    np.testing.assert_allclose(holm(np.array([0.02])), [0.02])  # one test: nothing to adjust


def test_a_table_of_several_baselines_judges_by_the_holm_adjusted_p_value():
    """FTW against three baselines on final and AUC: six tests. One at Welch p = 0.021 alone would be "better";
    adjusted for the six (Holm) it is not, and the table prints both p-values."""
    ftw = np.array([3.0, 4.0, 5.0, 6.0, 3.0, 4.0, 5.0, 6.0])
    close = ftw.copy()  # the same results: p = 1
    worse = np.array([1.0, 1.5, 2.0, 2.5, 3.0, 5.5, 4.5, 3.5])
    raw = welch(ftw, worse)["p_value"]
    assert raw < 0.05 < 6 * raw
    results = [
        AlgorithmResult(algorithm=name, learning_rate=1e-3, curves=np.stack([final, final], 1),
                        env_steps=np.ones((8, 2)), seconds=0.0, tuning=[], applied_share=np.ones(8))
        for name, final in (("ftw", ftw), ("ppo", worse), ("grpo", close), ("reinforce", close))
    ]  # fmt: skip
    comparison = Comparison(
        env="bandit", metric="return", seeds=list(range(8)), episodes=np.array([1, 2]), results=results
    )
    rows = {row["algorithm"]: row for row in difference_rows(comparison)}
    assert rows["ppo"]["final_p_value"] == pytest.approx(raw) and rows["ppo"]["final_holm_p_value"] > 0.05
    assert rows["ppo"]["final_verdict"] == "inconclusive" and verdict(ftw, worse, margin=0.1) == "better"
    assert f"{p_text(raw)}, Holm {p_text(rows['ppo']['final_holm_p_value'])}" in markdown_table(comparison)


@pytest.mark.slow
def test_compare_tunes_on_its_own_seeds_and_reports_what_a_plain_run_gives():
    comparison = compare(
        "bandit", ["reinforce"], seeds=[3, 4], learning_rates=[0.001, 0.1], tuning_seeds=[7], overrides=BUDGET
    )
    assert comparison.metric == "return"  # the bandit has no success
    np.testing.assert_array_equal(comparison.episodes, [96, 192])
    [result] = comparison.results
    assert [row["learning_rate"] for row in result.tuning] == [0.001, 0.1]
    assert result.learning_rate == max(result.tuning, key=lambda row: row["auc_mean"])["learning_rate"] == 0.1
    assert result.curves.shape == (2, 2) and result.env_steps[:, -1].tolist() == [192, 192]
    # A reported seed is exactly the run `ftw-jax train` would make with the chosen learning rate.
    trainer = make_train(TrainConfig.for_env("bandit", algorithm="reinforce", learning_rate=0.1, **BUDGET))
    _, (_, evaluation) = trainer.train(jax.random.key(4))
    np.testing.assert_allclose(result.curves[1], evaluation["return"], rtol=1e-6)


def test_compare_refuses_unfair_or_impossible_protocols():
    with pytest.raises(ValueError, match=r"tuning seeds \[3\] are also reported seeds"):
        compare("bandit", ["ftw"], seeds=[3, 4], learning_rates=[0.01, 0.1], tuning_seeds=[3], overrides=BUDGET)
    with pytest.raises(ValueError, match="needs tuning seeds"):
        compare("bandit", ["ftw"], seeds=[3], learning_rates=[0.01, 0.1], overrides=BUDGET)
    with pytest.raises(ValueError, match="multiple of group_size"):  # checked before FTW runs
        compare("bandit", ["ftw", "grpo"], seeds=[0], overrides={**BUDGET, "episodes_per_iteration": 4})
    with pytest.raises(ValueError, match="algorithm must be one of"):
        compare("bandit", ["ftw", "dqn"], seeds=[0], overrides=BUDGET)


@pytest.mark.slow
def test_cli_writes_the_table_the_csvs_and_the_plot(tmp_path, capsys):
    arguments = [
        "compare",
        "--env",
        "bandit",
        "--algos",
        "ftw,ppo",
        "--seeds",
        "0,1,2",
        "--iterations",
        "24",
        "--episodes-per-iteration",
        "8",
        "--eval-every",
        "12",
        "--eval-episodes",
        "32",
        "--out",
        str(tmp_path),
        "--name",
        "run",
        "--json",
    ]
    assert main(arguments) == 0
    summary = json.loads(capsys.readouterr().out)
    folder = tmp_path / "run"
    assert [row["algorithm"] for row in summary["algorithms"]] == ["ftw", "ppo"]
    with (folder / "seeds.csv").open() as file:
        seeds = list(csv.DictReader(file))
    assert len(seeds) == 6
    ftw_final = [float(row["final"]) for row in seeds if row["algorithm"] == "ftw"]
    assert summary["algorithms"][0]["final_mean"] == pytest.approx(np.mean(ftw_final))
    table = (folder / "table.md").read_text()
    # header, rule, two rows (the bandit's lr), then FTW minus PPO: blank line, header, rule, one row; then the
    # batch diagnostics: blank line, header, rule, two rows (no groups: PPO and FTW have none)
    assert table.count("\n") == 13 and "| ppo | 0.08 |" in table and "\n| ppo | " in table.split("FTW minus")[1]
    assert table.split("policy entropy")[1].count("| - |") == 2
    differences = summary["differences"][0]
    assert differences["algorithm"] == "ppo" and differences["final_difference"] == pytest.approx(
        summary["algorithms"][0]["final_mean"] - summary["algorithms"][1]["final_mean"], rel=1e-4
    )
    curves = np.load(folder / "curves.npz")
    assert curves["ppo_return"].shape == (3, 2) and curves["ppo_updates"].shape == (3, 2)
    for name in ("curves", "curves_env_steps", "curves_updates"):
        assert (folder / f"{name}.png").stat().st_size > 10_000
    # TensorBoard: one run per algorithm and seed, its evaluations those of the curves.
    boards = folder / "tensorboard"
    assert sorted(str(path.relative_to(boards)) for path in boards.glob("*/*")) == [
        f"{algorithm}/seed_{seed}" for algorithm in ("ftw", "ppo") for seed in (0, 1, 2)
    ]
    events = EventAccumulator(str(boards / "ppo" / "seed_2"))
    events.Reload()
    np.testing.assert_allclose([point.value for point in events.Scalars("eval/return")], curves["ppo_return"][2])


@pytest.mark.slow
def test_cli_resume_runs_only_the_missing_periods_and_gives_the_same_results(tmp_path, capsys):
    arguments = [
        "compare",
        "--env",
        "bandit",
        "--algos",
        "ftw,reinforce",
        "--seeds",
        "0,1",
        "--learning-rates",
        "0.01,0.1",
        "--tuning-seeds",
        "7",
        "--iterations",
        "24",
        "--episodes-per-iteration",
        "8",
        "--eval-every",
        "12",
        "--eval-episodes",
        "32",
        "--json",
    ]
    assert main([*arguments, "--out", str(tmp_path), "--name", "run"]) == 0
    first = json.loads(capsys.readouterr().out)
    checkpoints = tmp_path / "run" / "checkpoints"
    phases = ["ftw-report", "ftw-tune", "reinforce-report", "reinforce-tune"]
    assert sorted(path.name for path in checkpoints.iterdir()) == sorted(phases + [f"{p}.json" for p in phases])
    for phase in ("ftw-tune", "reinforce-report"):  # as if killed in the second period of these two phases
        shutil.rmtree(checkpoints / phase / "2")
        (checkpoints / f"{phase}.json").unlink()
    assert main([*arguments, "--resume", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    again = json.loads(captured.out)
    ran = re.findall(r"^ *(\w+) +(tune|report) +period +(\d+)", captured.err, re.MULTILINE)
    assert ran == [("ftw", "tune", "2"), ("reinforce", "report", "2")]
    assert again["tuning"] == first["tuning"]
    for row, expected in zip(again["algorithms"], first["algorithms"]):
        assert {k: v for k, v in row.items() if k != "seconds"} == {k: v for k, v in expected.items() if k != "seconds"}
    # The finished phases' records alone carry the comparison: no checkpoint left, nothing runs, same results.
    for phase in phases:
        shutil.rmtree(checkpoints / phase)
    assert main([*arguments, "--resume", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert not re.findall(r"^ *(\w+) +(tune|report) +period", captured.err, re.MULTILINE)
    assert json.loads(captured.out)["algorithms"] == again["algorithms"]  # seconds included: from the records
    # A torn record (issue 35: a bare JSON error) is named, set aside, and its phase run again from its start.
    torn = checkpoints / "ftw-report.json"
    torn.write_text(torn.read_text()[:40])
    assert main([*arguments, "--resume", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    assert f"note: {torn} cannot be read (" in captured.err and (checkpoints / "ftw-report.json.unreadable").exists()
    assert re.findall(r"^ *(\w+) +(tune|report) +period +(\d+)", captured.err, re.MULTILINE) == [
        ("ftw", "report", "1"),
        ("ftw", "report", "2"),
    ]
    rows = json.loads(captured.out)["algorithms"]
    assert [{k: v for k, v in row.items() if k != "seconds"} for row in rows] == [
        {k: v for k, v in row.items() if k != "seconds"} for row in again["algorithms"]
    ]
    # TensorBoard, after a phase resumed from its first period and one run again from its start: one point per
    # evaluation in each run, the curves of the comparison.
    curves = np.load(tmp_path / "run" / "curves.npz")
    for algorithm in ("ftw", "reinforce"):
        for index, seed in enumerate((0, 1)):
            events = EventAccumulator(str(tmp_path / "run" / "tensorboard" / algorithm / f"seed_{seed}"))
            events.Reload()
            points = events.Scalars("eval/return")
            assert len({point.step for point in points}) == len(points) == 2
            np.testing.assert_allclose([point.value for point in points], curves[f"{algorithm}_return"][index])
    record = json.loads((checkpoints / "ftw-tune.json").read_text())
    record["fingerprint"]["config"]["learning_rate"] = 0.5
    (checkpoints / "ftw-tune.json").write_text(json.dumps(record))
    assert main([*arguments, "--resume", str(tmp_path / "run")]) != 0
    assert "ftw-tune.json was written by a different configuration" in capsys.readouterr().err

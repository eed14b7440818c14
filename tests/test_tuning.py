"""Equal tuning: the random search's configurations, their grouping into compiled programs, and `compare`'s
search protocol (the best configuration on the tuning seeds is what the reported seeds run)."""

import shutil

import jax
import numpy as np
import pytest

from ftw_jax import algos
from ftw_jax.lab import tuning
from ftw_jax.lab.compare import compare
from ftw_jax.lab.comparison_tables import tuning_table
from ftw_jax.lab.train import TrainConfig, make_train

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")
BUDGET = dict(episodes_per_iteration=8, num_iterations=24, eval_every=12, eval_episodes=32)


def test_every_algorithm_searches_the_shared_settings_and_its_own_knobs():
    for algorithm in algos.ALGORITHMS:
        names = list(tuning.space(algorithm))
        assert names[:3] == ["learning_rate", "kl_coef", "kl_decay_fraction"]
        first, again = (
            tuning.draw_configurations(algorithm, 6, seed=3),
            tuning.draw_configurations(algorithm, 6, seed=3),
        )
        assert first == again and len({tuple(sorted(p.items())) for p in first}) == 6  # seeded, distinct
        assert first != tuning.draw_configurations(algorithm, 6, seed=4)
        for point in first:
            assert min(tuning.LEARNING_RATES) <= point["learning_rate"] <= max(tuning.LEARNING_RATES)
            assert point["kl_coef"] > 0 or point["kl_decay_fraction"] == 1.0  # no horizon without a β
            if algorithm == "ftw":
                assert point["num_elites"] < point["batch_size"] <= point["pool_capacity"]
    with pytest.raises(ValueError, match="count must be in"):
        tuning.draw_configurations("ppo", 0, seed=0)


def test_the_learning_rate_is_stratified_and_the_spaces_hold_the_references_defaults():
    for algorithm in algos.ALGORITHMS:
        rates = [point["learning_rate"] for point in tuning.draw_configurations(algorithm, 8, seed=5)]
        counts = [rates.count(rate) for rate in tuning.LEARNING_RATES]
        assert min(counts) >= 1 and max(counts) - min(counts) <= 1  # 8 draws over 7 rates: each once or twice
        rates = [point["learning_rate"] for point in tuning.draw_configurations(algorithm, 21, seed=5)]
        assert [rates.count(rate) for rate in tuning.LEARNING_RATES] == [3] * 7  # the protocol's budget
    assert {0.0, 0.04} <= set(tuning.space("grpo")["kl_coef"])  # TRL's β values
    assert 1 in tuning.space("grpo")["updates_per_iteration"]  # TRL's one step per batch
    assert set(tuning.space("ftw")["elite_rule"]) == {"top_k", "beat_minimum"}
    # Every point of a space may be drawn: the stratification ends even when a rate has no point left.
    everything = tuning.draw_configurations("reinforce", 50, seed=0)
    assert len({tuple(sorted(point.items(), key=str)) for point in everything}) == 50


def test_every_algorithm_tunes_its_reference_recipe_beside_the_drawn_configurations():
    own = {algorithm: len(tuning.space(algorithm)) - len(tuning.SHARED) for algorithm in algos.ALGORITHMS}
    assert own == {"ftw": 5, "ppo": 5, "grpo": 5, "reinforce": 3}  # as the module docstring says, and why
    for algorithm in algos.ALGORITHMS:
        tried = tuning.candidates(algorithm, 21, seed=[0, 1], reference_rate=3e-3)
        reference = tuning.reference_configuration(algorithm, 3e-3)
        assert len(tried) == 22 and tried[-1] == reference and reference not in tried[:-1]
        assert list(reference) == list(tuning.space(algorithm)) and reference["learning_rate"] == 3e-3
        assert tried[:-1] == tuning.draw_configurations(algorithm, 21, [0, 1], exclude=reference)
        config = TrainConfig.for_env("search", algorithm=algorithm).replace(**tuning.as_overrides(reference, 400))
        for name, value in algos.get(algorithm).reference.items():  # the run is the recipe
            if name != "kl_decay_fraction":
                assert getattr(config, name, getattr(config.algorithm_config, name, None)) == value, name
    grpo = TrainConfig.for_env("search", algorithm="grpo").replace(
        **tuning.as_overrides(tuning.reference_configuration("grpo", 1e-3), 400)
    )
    assert grpo.kl_coef == 0.04 and grpo.kl_coef_final is None  # TRL's β, constant
    ppo = tuning.reference_configuration("ppo", 1e-3)  # CleanRL's
    assert (ppo["num_minibatches"], ppo["updates_per_iteration"], ppo["clip_epsilon"], ppo["gae_lambda"]) == (
        4,
        4,
        0.2,
        0.95,
    )
    # The reference is never drawn as well, even where the draws could reach it.
    reference = tuning.reference_configuration("reinforce", 0.003)
    reference.update(kl_coef=0.0, kl_decay_fraction=1.0)  # a point of the drawn space: β 0 over the whole run
    valid = 13 * 2 * 2 * 4  # β 0, or one of 4 βs × 3 horizons; then REINFORCE's own knobs
    drawn = tuning.draw_configurations("reinforce", valid - 1, seed=0, learning_rates=[0.003], exclude=reference)
    assert reference not in drawn  # every other valid point is
    with pytest.raises(ValueError, match=f"count must be in \\[1, {valid - 1}\\]"):
        tuning.draw_configurations("reinforce", valid, seed=0, learning_rates=[0.003], exclude=reference)
    assert tuning.at_edge(1e-4, tuning.LEARNING_RATES) and tuning.at_edge(0.1, tuning.LEARNING_RATES)
    assert not tuning.at_edge(3e-3, tuning.LEARNING_RATES)


def test_ends_names_every_chosen_setting_at_an_end_of_the_values_drawn():
    """Numeric settings of three values or more, at their lowest or highest: flagged with their range; an interior
    value, a two-value setting, a category and a setting holding None are not; nor β's horizon without a β."""
    drawn = [
        {"learning_rate": rate, "pool_capacity": n, "num_minibatches": m, "elite_rule": rule, "leave_one_out": g}
        for rate, n, m, rule, g in zip(
            (1e-4, 1e-3, 1e-2), (256, 512, 1024), (1, 4, 1), ("top_k", "beat_minimum", "top_k"), (None, 2, 8)
        )
    ]
    chosen = {"learning_rate": 1e-3, "pool_capacity": 1024, "num_minibatches": 4, "elite_rule": "top_k"}
    chosen["leave_one_out"] = 8
    assert tuning.ends(chosen, drawn) == {"pool_capacity": (256, 1024)}
    assert tuning.ends({**chosen, "learning_rate": 1e-4}, drawn) == {
        "learning_rate": (1e-4, 1e-2),
        "pool_capacity": (256, 1024),
    }
    betas = [{"kl_coef": b, "kl_decay_fraction": f} for b, f in ((0.0, 1.0), (0.3, 0.25), (1.0, 0.5))]
    assert tuning.ends({"kl_coef": 0.0, "kl_decay_fraction": 1.0}, betas) == {"kl_coef": (0.0, 1.0)}
    assert tuning.ends({"kl_coef": 0.3, "kl_decay_fraction": 1.0}, betas) == {"kl_decay_fraction": (0.25, 1.0)}


def test_a_grid_of_rates_replaces_the_searched_ones_for_every_algorithm_alike():
    """`--learning-rates` with `--search`: the rates every algorithm draws from."""
    grid = tuning.LEARNING_RATES[:-1]
    for algorithm in algos.ALGORITHMS:
        assert tuning.space(algorithm, grid)["learning_rate"] == grid
        assert tuning.space(algorithm, None) == tuning.space(algorithm)
        drawn = tuning.draw_configurations(algorithm, 8, seed=5, learning_rates=grid)
        rates = [point["learning_rate"] for point in drawn]
        assert sorted(set(rates)) == sorted(grid) and len(rates) == 8  # 8 draws over 6 rates: each at least once


def test_rungs_halve_the_horizon_and_promote_the_better_half():
    assert tuning.rung_periods(40, 1) == [40]
    assert tuning.rung_periods(40, 3) == [10, 20, 40]
    assert tuning.rung_periods(5, 2) == [3, 5]
    with pytest.raises(ValueError, match="needs at least 4 evaluation periods; the tuning runs have 3"):
        tuning.rung_periods(3, 3)
    assert tuning.promoted({0: 0.1, 1: 0.5, 2: 0.3}) == [1, 2]  # the better half, rounded up
    assert tuning.promoted({4: 0.2, 7: 0.9, 1: 0.5, 2: 0.1}) == [7, 1]


def test_a_configuration_becomes_a_beta_schedule_over_its_share_of_the_run():
    point = {"learning_rate": 1e-3, "kl_coef": 0.3, "kl_decay_fraction": 0.25, "num_minibatches": 4}
    assert tuning.as_overrides(point, 100) == {
        "learning_rate": 1e-3,
        "kl_coef": 0.3,
        "num_minibatches": 4,
        "kl_coef_final": 0.0,
        "kl_decay_iterations": 25,
    }
    flat = tuning.as_overrides({**point, "kl_coef": 0.0, "kl_decay_fraction": 1.0}, 100)
    assert flat["kl_coef_final"] is None and flat["kl_decay_iterations"] is None


def test_configurations_that_differ_only_in_sweep_axes_share_one_program():
    points = [
        {"learning_rate": lr, "kl_coef": 0.0, "kl_decay_fraction": 1.0, "updates_per_iteration": u, "entropy_coef": 0.0}
        for lr, u in ((1e-3, 1), (3e-3, 4), (1e-2, 1))
    ]
    groups = tuning.group_sweeps("bandit", points, [0, 1], algorithm="reinforce", **BUDGET)
    assert [indices for _, indices in groups] == [[0, 2], [1]]
    sweep, _ = groups[0]
    assert [member["lr"] for member in sweep.members] == [1e-3, 1e-3, 1e-2, 1e-2]
    assert [member["seed"] for member in sweep.members] == [0, 1, 0, 1]


@pytest.mark.slow
def test_compare_search_reports_the_best_configuration_as_a_plain_run_gives_it():
    grid = [0.03, 0.3]  # the search's rates, in place of the default grid
    comparison = compare(
        "bandit",
        ["reinforce"],
        seeds=[3],
        search=3,
        search_seed=1,
        learning_rates=grid,
        tuning_seeds=[7, 8],
        overrides=BUDGET,
    )
    [result] = comparison.results
    assert len(result.tuning) == 4 and all(len(row["auc_per_seed"]) == 2 for row in result.tuning)
    drawn = [row for row in result.tuning if row["candidate"] == "drawn"]
    assert sorted({row["learning_rate"] for row in drawn}) == grid  # 3 draws over 2 rates: both
    [reference] = [row for row in result.tuning if row["candidate"] == "reference"]  # at the task's rate
    assert {name: reference[name] for name in tuning.space("reinforce")} == tuning.reference_configuration(
        "reinforce", 0.08
    )
    best = max(result.tuning, key=lambda row: row["auc_mean"])
    assert result.settings == {name: best[name] for name in tuning.space("reinforce")}
    overrides = tuning.as_overrides(result.settings, BUDGET["num_iterations"])
    trainer = make_train(TrainConfig.for_env("bandit", algorithm="reinforce", **BUDGET, **overrides))
    _, (_, evaluation) = trainer.train(jax.random.key(3))
    np.testing.assert_allclose(result.curves[0], evaluation["return"], rtol=1e-6)
    assert result.updates.shape == (1, 2)
    table = tuning_table(comparison).splitlines()
    # Name, blank, header, rule, a row per configuration; then how the choice was made.
    assert table[0] == "reinforce:" and len(table) >= 4 + 4 + 2 and table[8] == ""
    assert table[4].startswith(f"| **{best['learning_rate']:g}** |")  # best first, in bold
    by_final = max(result.tuning, key=lambda row: row["final_mean"])
    assert ("the same configuration" in table[9]) == (by_final is best)
    assert (best["learning_rate"] == 0.3) == any("is an edge of the grid 0.03…0.3" in line for line in table)
    others = [name for name in tuning.ends(result.settings, drawn) if name != "learning_rate"]
    noted = [line for line in table if line.startswith("Other chosen settings at an end of the values drawn")]
    assert len(noted) == bool(others) and all(f"{name} " in noted[0] for name in others)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ftw"])  # groups whose survivors have smaller N, J, C, K than the group
def test_successive_halving_goes_on_from_the_runs_it_promotes(algorithm, tmp_path):
    """Rung 2 continues rung 1's runs in their program: the chosen configuration's curves on the tuning seeds are
    those it has when run whole on its own, whether rung 1's checkpoints are there or gone (it reruns)."""
    overrides = {**BUDGET, "eval_every": 6}
    search = dict(seeds=[3], search=4, search_seed=2, tuning_seeds=[7, 8], overrides=overrides)
    comparison = compare("bandit", [algorithm], checkpoint_folder=tmp_path, rungs=3, **search)
    [result] = comparison.results
    # 4 configurations drawn and the reference: 5, then 3, then 2.
    assert sorted(row["iterations"] for row in result.tuning) == [6, 6, 12, 24, 24]
    best = max((row for row in result.tuning if row["iterations"] == 24), key=lambda row: row["auc_mean"])
    assert result.settings == {name: best[name] for name in tuning.space(algorithm)}  # chosen in the last rung
    alone = compare(
        "bandit", [algorithm], seeds=[7, 8], overrides={**overrides, **tuning.as_overrides(result.settings, 24)}
    )
    np.testing.assert_array_equal(alone.results[0].auc, best["auc_per_seed"])
    assert alone.results[0].final.mean() == best["final_mean"]
    for path in tmp_path.iterdir():  # keep rung 1's records only: rung 2 must rerun rung 1 to go on from it
        if "rung1" in path.name or "rung2" in path.name or (path.is_dir() and "rung0" in path.name):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        elif path.name.startswith(f"{algorithm}-report"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    again = compare("bandit", [algorithm], checkpoint_folder=tmp_path, rungs=3, **search)
    assert again.results[0].tuning == result.tuning
    np.testing.assert_array_equal(again.results[0].curves, result.curves)
    with pytest.raises(ValueError, match="rungs=2 applies to a random search"):
        compare("bandit", [algorithm], seeds=[3], rungs=2, overrides=BUDGET)


def test_compare_search_refuses_an_unfair_protocol():
    with pytest.raises(ValueError, match=r"learning rates must be distinct, got \[0.01, 0.01\]"):
        compare("bandit", ["ftw"], seeds=[0], search=2, learning_rates=[0.01, 0.01], tuning_seeds=[7], overrides=BUDGET)
    with pytest.raises(ValueError, match="random search of 2 configurations needs tuning seeds"):
        compare("bandit", ["ftw"], seeds=[0], search=2, overrides=BUDGET)
    with pytest.raises(
        ValueError, match=r"grpo: a searched configuration: .* must be a multiple of group_size \(G=16\)"
    ):
        compare("bandit", ["grpo"], seeds=[0], search=6, tuning_seeds=[7], overrides=BUDGET)  # B = 8 < 16
    with pytest.raises(ValueError, match="kl_coef is/are searched for ftw"):
        compare("bandit", ["ftw"], seeds=[0], search=2, tuning_seeds=[7], overrides={**BUDGET, "kl_coef": 0.1})


def test_tuning_rows_of_several_algorithms_make_one_csv(tmp_path):
    from ftw_jax.running.run_files import write_csv

    rows = [
        {"algorithm": "ftw", "learning_rate": 0.003, "batch_size": 16, "auc_mean": 0.5},
        {"algorithm": "ppo", "learning_rate": 0.001, "num_minibatches": 4, "auc_mean": 0.6},
    ]
    write_csv(tmp_path / "tuning.csv", rows)
    assert (tmp_path / "tuning.csv").read_text().splitlines() == [
        "algorithm,learning_rate,batch_size,auc_mean,num_minibatches",
        "ftw,0.003,16,0.5,",
        "ppo,0.001,,0.6,4",
    ]

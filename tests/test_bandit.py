"""The bandit reproduction: learning on a short budget, seeds, and the command line."""

import json
import re

import jax
import numpy as np
import pytest

from ftw_jax import cli
from ftw_jax.envs import GaussianBandit
from ftw_jax.lab.reproduction import (
    kl_fixed_point_probability,
    make_run,
    protocol_config,
    run_seeds,
    winners_only_probability,
)

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")


def test_one_seed_reuses_no_key():
    with jax.debug_key_reuse(True):
        curves = jax.jit(make_run(protocol_config(num_iterations=12)))(jax.random.key(0))
    assert curves["best_arm_probability"].shape == (13,)


SHORT = ["--iterations", "60", "--no-plot"]


@pytest.mark.slow
def test_short_run_learns_the_best_arm_and_seeds_differ():
    curves = run_seeds(protocol_config(num_iterations=60), [0, 1, 2, 3])
    best = np.asarray(curves["best_arm_probability"])
    assert best.shape == (4, 61)
    np.testing.assert_allclose(best[:, 0], 0.5, rtol=1e-6)
    assert np.all(best[:, -1] > 0.8)
    assert len({round(float(x), 6) for x in best[:, -1]}) > 1  # different seeds, different runs
    applied = np.asarray(curves["metrics"]["applied"])
    assert not applied[:, :4].any() and applied[:, 4:].all()  # updates start at the 5th pull (C = 5)


def test_same_seed_same_run():
    first = run_seeds(protocol_config(num_iterations=30), [7, 7])["best_arm_probability"]
    np.testing.assert_array_equal(first[0], first[1])


def test_json_output(capsys):
    assert cli.main(["bandit", "--json", "--seeds", "42,43", *SHORT]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["seeds"] == [42, 43]
    assert len(result["best_arm_probability_final"]) == 2
    assert all(0.5 < p <= 1 for p in result["best_arm_probability_final"])
    # Throughput as a researcher sees it: the seeds' run timed apart from tracing and compiling.
    assert 0 < result["compile_seconds"] < result["seconds"] and result["seeds_per_second"] > 2 / result["seconds"]


@pytest.mark.slow
def test_num_seeds_and_table_and_plot(capsys, tmp_path):
    assert cli.main(["bandit", "--num-seeds", "2", "--iterations", "20", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "42" in out and "43" in out and "P(best) final" in out
    assert re.search(
        r"2 seed\(s\) in [0-9.]+ s: [0-9.]+ s tracing and compiling, then [0-9]+ ms running \([0-9,]+ seeds/s", out
    )
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-K", "6"], "--num-elites (K=6) must be"),  # the library names the setting, the command line its flag
        (["-C", "200"], "--batch-size (C=200) must be"),
        (["--arm-means", "1.0"], "arm_means"),
        (["--learning-rate", "0"], "--learning-rate must be > 0"),
        (["--iterations", "0"], "--iterations must be an int >= 1"),
    ],
)
def test_bad_options_give_a_clear_error(capsys, argv, message):
    assert cli.main(["bandit", *argv, "--no-plot"]) == 2
    assert message in capsys.readouterr().err


def test_the_protocol_takes_the_bandit_s_training_settings_and_refuses_others():
    config = protocol_config(batch_size=4, kl_coef=0.1)
    assert (config.algorithm_config.batch_size, config.kl_coef, config.learning_rate) == (4, 0.1, 0.08)
    with pytest.raises(ValueError, match=r"does not take \['updates_per_iteration'\]"):
        protocol_config(updates_per_iteration=2)
    with pytest.raises(ValueError, match="one pull per iteration and SGD"):
        make_run(config.replace(optimizer="adam"))
    assert kl_fixed_point_probability(config, GaussianBandit(arm_means=(0.1, 0.9, 0.5))) < 1.0


def test_malformed_seeds_are_rejected(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bandit", "--seeds", "4x"])
    assert "comma-separated integers" in capsys.readouterr().err


@pytest.mark.slow
def test_final_probability_is_capped_by_the_winners_only_recurrence():
    """The jitted runs end at most where the numpy recurrence (every kept pull the best arm) ends, and the
    luckiest seeds end exactly there; the mean is the reference implementation's ~0.968."""
    config = protocol_config()
    final = np.asarray(run_seeds(config, list(range(42, 42 + 64)))["best_arm_probability"])[:, -1]
    ceiling = winners_only_probability(config)
    assert abs(ceiling - 0.968875) < 1e-6
    assert np.all(final <= ceiling + 2e-6)
    assert np.sum(np.abs(final - ceiling) < 2e-6) >= 10  # ~40% of seeds keep only best-arm pulls
    assert abs(final.mean() - 0.968) < 0.002


def test_kl_fixed_point_is_stationary():
    p = kl_fixed_point_probability(protocol_config(kl_coef=1.0))
    assert abs(p * np.log(p / (1 - p)) - 1.0) < 1e-9  # two arms: β p logit(p) = 1

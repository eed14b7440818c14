"""The training program: one compile, chunks equal one scan, seeds differ, it learns, the CLI."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_golden import SMALL

from ftw_jax import cli
from ftw_jax.lab.rollout import Player, rollout
from ftw_jax.lab.train import TrainConfig, make_train
from ftw_jax.running import loop as run_loop

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")
SMALL_CARTPOLE = dict(num_iterations=4, eval_every=1, episodes_per_iteration=4, eval_episodes=4)  # 4 periods


@pytest.fixture(scope="module")
def cartpole():
    return make_train(TrainConfig.for_env("cartpole", **SMALL_CARTPOLE))


@pytest.mark.slow
def test_chunks_give_the_same_result_as_one_scan_and_compile_once(cartpole):
    # Chunks of two periods: a chunk of one is a loop XLA removes, and the code around it can then fuse (and
    # round) differently under some code generators (the suite's, conftest.py), so equal only to rounding there.
    carry = jax.jit(cartpole.init)(jax.random.key(0))
    whole, (metrics, evaluation) = cartpole.run(carry, 4)
    first, (_, first_evaluation) = cartpole.run(carry, 2)
    cache_before = cartpole.run._cache_size()
    second, (_, second_evaluation) = cartpole.run(first, 2)
    assert cartpole.run._cache_size() == cache_before  # the second chunk reuses the first compile
    jax.tree.map(np.testing.assert_array_equal, whole.learner.policy.params, second.learner.policy.params)
    np.testing.assert_array_equal(
        evaluation["return"], np.concatenate([first_evaluation["return"], second_evaluation["return"]])
    )
    assert metrics["return_mean"].shape == (4, 1)
    assert int(whole.iteration) == 4 and int(whole.env_steps) == int(metrics["env_steps"][-1, -1])


@pytest.mark.slow
def test_vmapped_seeds_differ_and_match_single_runs(cartpole):
    keys = jnp.stack([jax.random.key(1), jax.random.key(2)])
    carries, (_, evaluation) = jax.vmap(cartpole.run, in_axes=(0, None))(jax.jit(jax.vmap(cartpole.init))(keys), 2)
    assert not np.array_equal(carries.env_steps[0], carries.env_steps[1])
    single, (_, single_evaluation) = cartpole.run(jax.jit(cartpole.init)(jax.random.key(2)), 2)
    np.testing.assert_allclose(evaluation["return"][1], single_evaluation["return"], rtol=1e-5)


@pytest.mark.slow
def test_looped_members_equal_the_vmapped_ones(cartpole):
    """One program that loops over its members (the CPU default) gives the same runs as the vmapped one."""
    carries = jax.jit(jax.vmap(cartpole.init))(jnp.stack([jax.random.key(1), jax.random.key(2)]))
    results = {
        loop: jax.jit(run_loop.over_members(cartpole.run, loop), static_argnums=1)(carries, 2)
        for loop in ("vmap", "map")
    }
    (vmapped, (_, vmapped_evaluation)), (looped, (_, looped_evaluation)) = results["vmap"], results["map"]
    np.testing.assert_array_equal(looped.env_steps, vmapped.env_steps)
    np.testing.assert_allclose(looped_evaluation["return"], vmapped_evaluation["return"], rtol=1e-5)


def test_the_member_loop_is_map_on_one_cpu_and_can_be_chosen(monkeypatch):
    monkeypatch.delenv("FTW_JAX_MEMBER_LOOP", raising=False)
    assert run_loop.member_loop() == ("map" if jax.default_backend() == "cpu" and jax.device_count() == 1 else "vmap")
    monkeypatch.setenv("FTW_JAX_MEMBER_LOOP", "vmap")
    assert run_loop.member_loop() == "vmap"
    monkeypatch.setenv("FTW_JAX_MEMBER_LOOP", "batched")
    with pytest.raises(ValueError, match="FTW_JAX_MEMBER_LOOP must be one of .* got 'batched'"):
        run_loop.member_loop()


@pytest.mark.slow
def test_cartpole_learns_on_a_small_budget():
    trainer = make_train(TrainConfig.for_env("cartpole", num_iterations=30, eval_every=15, eval_episodes=16))
    _, (_, evaluation) = trainer.train(jax.random.key(3))
    returns = np.asarray(evaluation["return"])
    assert returns[-1] > 100 and returns[-1] > 2 * 22  # a uniform policy balances ~22 steps


def initial_success(trainer, key, num_episodes):
    """Success rate of the untrained policy on the evaluation tasks."""
    carry = jax.jit(trainer.init)(key)
    env = trainer.env
    policy_state = carry.learner.policy
    eval_params = env.evaluation_params(env.default_params())
    player = Player(env, eval_params, trainer.policy, policy_state.params, policy_state.version)
    _, success = jax.jit(jax.vmap(rollout, in_axes=(0, None)))(jax.random.split(key, num_episodes), player)
    return float(jnp.mean(success))


@pytest.mark.slow
def test_sokoban_learns_on_a_small_budget():
    trainer = make_train(TrainConfig.for_env("sokoban", num_iterations=20, eval_every=20, eval_episodes=512))
    _, (_, evaluation) = trainer.train(jax.random.key(6))
    before, after = initial_success(trainer, jax.random.key(7), 512), float(evaluation["success"][-1])
    assert after > before + 0.06, (before, after)  # held-out levels; ~0.29 -> ~0.41, each ± 0.02 (sd)


@pytest.mark.slow
def test_search_learns_to_search_on_a_small_budget():
    trainer = make_train(TrainConfig.for_env("search", num_iterations=40, eval_every=40))
    _, (_, evaluation) = trainer.train(jax.random.key(8))
    chance = 1 / trainer.env.num_values  # answering without searching
    before, after = initial_success(trainer, jax.random.key(9), 256), float(evaluation["success"][-1])
    assert before < 1.5 * chance and after > 2.5 * chance, (before, after)  # 0.07 -> 0.56; chance 0.125


@pytest.mark.slow
def test_bandit_through_the_training_program_matches_the_reproduction():
    trainer = make_train(TrainConfig.for_env("bandit"))
    carry, (metrics, evaluation) = trainer.train(jax.random.key(4))
    probabilities = jax.nn.softmax(carry.learner.policy.params["params"]["logits"])
    assert probabilities[0] > 0.95  # the reproduction's best-arm probability after 240 pulls is ~0.968
    assert int(carry.env_steps) == 240


@pytest.mark.slow
def test_kl_coef_decays_linearly_to_its_final_value():
    trainer = make_train(TrainConfig.for_env("cartpole", **SMALL_CARTPOLE, kl_coef=0.5, kl_coef_final=0.0))
    _, (metrics, _) = trainer.train(jax.random.key(5))
    np.testing.assert_allclose(np.ravel(metrics["kl_coef"]), np.linspace(0.5, 0.0, 4), atol=1e-7)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(kl_coef_final=-0.1), "kl_coef_final"),
        (dict(num_iterations=7, eval_every=3), "multiple of eval_every"),
        (dict(episodes_per_iteration=100), "episodes_per_iteration"),
        (dict(optimizer="rmsprop"), "optimizer"),
        (dict(num_elites=20), "num_elites"),
        (dict(eval_episodes=0), "eval_episodes"),
    ],
)
def test_bad_config_raises(overrides, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.for_env("cartpole", **overrides)


@pytest.mark.slow
def test_train_cli_json_and_run_folder(capsys, tmp_path):
    # The golden CartPole FTW run's settings, so that its compiled program is read from the suite's cache.
    small = [arg for arg in SMALL if arg != "--no-plot"]
    argv = ["train", "--env", "cartpole", *small, "--out", str(tmp_path), "--json"]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["seeds"] == [0, 1] and len(result["return"]) == 2 and len(result["env_steps"]) == 2
    assert 0 < result["compile_seconds"] < result["seconds"] and result["env_steps_per_second"] > 0
    (folder,) = tmp_path.iterdir()
    assert {p.name for p in folder.iterdir()} == {
        "config.json",
        "metrics.jsonl",
        "evaluation.jsonl",
        "summary.json",
        "learning_curve.png",
        "checkpoints",
        "tensorboard",
    }
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["1", "2"]  # after each period
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 2 and rows[-1]["iteration"] == 4 and rows[-1]["seed"] == 1
    assert json.loads((folder / "summary.json").read_text())["return"] == result["return"]
    # The code that ran, beside the fingerprint (tests/test_provenance.py): in the summary and in config.json.
    assert result["provenance"]["command"] == ["ftw-jax", *argv] and "jax" in result["provenance"]["versions"]
    assert json.loads((folder / "config.json").read_text())["provenance"] == [result["provenance"]]


@pytest.mark.slow
def test_train_cli_sokoban_reports_success_and_rejects_unknown_env_options(capsys, tmp_path):
    # With task filtering on: 8 tasks probed twice each before the period, their steps counted.
    argv = [
        "train",
        "--env",
        "sokoban",
        "--seeds",
        "0",
        "--iterations",
        "2",
        "--eval-every",
        "2",
        "--episodes-per-iteration",
        "8",
        "--eval-episodes",
        "8",
        "--pool-capacity",
        "64",
        "--probe-tasks",
        "8",
        "--probes-per-task",
        "2",
        "--env-options",
        "reward=binary,num_train_levels=50",
        "--out",
        str(tmp_path),
        "--json",
        "--no-plot",
    ]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env_options"] == {"reward": "binary", "num_train_levels": 50}
    assert len(result["success"]) == 1 and 0.0 <= result["success"][0] <= 1.0
    assert result["return"] == result["success"]  # binary reward: the return is 1 exactly when solved
    [evaluation] = [json.loads(line) for line in (pathlib.Path(result["run_folder"]) / "evaluation.jsonl").open()]
    [metrics] = [json.loads(line) for line in (pathlib.Path(result["run_folder"]) / "metrics.jsonl").open()][:1]
    assert 16 <= evaluation["probe_env_steps"] <= 16 * 20 and 0 <= evaluation["informative_tasks"] <= 1
    # The first iteration's count already includes the probes, played before it.
    assert metrics["env_steps"] >= evaluation["probe_env_steps"] + 8
    assert cli.main(["train", "--env", "sokoban", "--env-options", "rewrd=binary", "--out", str(tmp_path)]) == 2
    assert "rewrd" in capsys.readouterr().err


def test_cli_reports_a_missing_optional_dependency_without_a_traceback(capsys, monkeypatch, tmp_path):
    def make(name, **options):
        raise ImportError("gymnax environments need gymnax: pip install 'ftw_jax[gymnax]'")

    monkeypatch.setattr("ftw_jax.envs.make", make)
    assert cli.main(["train", "--env", "cartpole", "--out", str(tmp_path)]) == 2
    assert "pip install 'ftw_jax[gymnax]'" in capsys.readouterr().err


def test_the_defaults_table_names_each_setting_where_it_is_declared():
    from ftw_jax import algos, envs
    from ftw_jax.algos import defaults
    from ftw_jax.core.settings import describe

    run_settings = {item.name for item in describe(TrainConfig)}
    declared = {name: {item.name for item in describe(entry.config)} for name, entry in algos.ALGORITHMS.items()}
    for env, entry in defaults.DEFAULTS.items():
        assert env in envs.ENVIRONMENTS
        assert set(entry.run) <= run_settings, env
        for setting in entry.every_algorithm:  # declared by every algorithm, so none goes without it
            assert all(setting in own for own in declared.values()), (env, setting)
        for algorithm, settings in entry.algorithms.items():
            assert set(settings) <= declared[algorithm], (env, algorithm)


def test_a_setting_every_algorithm_takes_reaches_one_registered_later(monkeypatch):
    import dataclasses

    from ftw_jax import algos
    from ftw_jax.algos import defaults

    fifth = dataclasses.replace(algos.ALGORITHMS["grpo"], name="grpo_again")
    monkeypatch.setitem(algos.ALGORITHMS, "grpo_again", fifth)
    assert defaults.of("sokoban", "grpo_again")["updates_per_iteration"] == 4
    assert TrainConfig.for_env("search", algorithm="grpo_again").algorithm_config.updates_per_iteration == 4


def test_each_pair_starts_from_its_own_defaults_and_an_environment_names_no_algorithm_setting():
    import dataclasses

    from ftw_jax import envs

    assert [field.name for field in dataclasses.fields(envs.EnvEntry)] == ["make", "policies"]
    assert TrainConfig.for_env("bandit").algorithm_config.pool_capacity == 128  # FTW's N on the bandit
    ppo = TrainConfig.for_env("bandit", algorithm="ppo")
    assert ppo.algorithm_config.num_minibatches == 1 and ppo.num_iterations == 240  # its own, and the run's
    assert TrainConfig.for_env("cartpole", algorithm="reinforce").algorithm_config.updates_per_iteration == 1
    assert TrainConfig.for_env("sokoban", algorithm="reinforce").algorithm_config.updates_per_iteration == 4
    assert TrainConfig.for_env("cartpole", algorithm="ppo").algorithm_config.num_minibatches == 4  # the field's

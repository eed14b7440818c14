"""Probe-based task filtering: the informative-task statistics, per-task probing, drawing from the kept tasks."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ftw_jax.envs.base import Environment
from ftw_jax.lab.probes import draw_tasks, informative_probability, keep_informative, probe
from ftw_jax.lab.rollout import Player
from ftw_jax.lab.train import TrainConfig, make_train
from ftw_jax.policies import TabularPolicy

pytestmark = pytest.mark.usefixtures("unchecked_key_reuse")


@dataclasses.dataclass(frozen=True)
class CoinTask(Environment):
    """One step; the task (drawn from the reset key) is a success probability p; an episode succeeds w.p. p.

    `chances` = None: p is one of 0, 0.5, 1 by task; a number: every task has that p.
    """

    chances: float | None = None
    has_success = True

    @property
    def num_actions(self):
        return 2

    @property
    def max_steps(self):
        return 1

    def default_params(self):
        return jnp.zeros(())

    def reset(self, key, params):
        p = jax.random.choice(key, jnp.array([0.0, 0.5, 1.0])) if self.chances is None else jnp.float32(self.chances)
        return jnp.zeros((), jnp.int32), p

    def step(self, key, state, action, params):
        solved = jax.random.bernoulli(key, state)
        return jnp.zeros((), jnp.int32), state, solved.astype(jnp.float32), jnp.ones((), bool), {"solved": solved}


def run_probes(env, num_tasks, num_probes, seed=0):
    policy = TabularPolicy(num_actions=2)
    params = policy.init(jax.random.key(0), jnp.zeros((1,), jnp.int32))
    task_keys = jax.random.split(jax.random.key(seed + 1), num_tasks)
    successes, steps = jax.jit(
        lambda key: probe(key, Player(env, env.default_params(), policy, params, jnp.int32(0)), task_keys, num_probes)
    )(jax.random.key(seed))
    return task_keys, np.asarray(successes), int(steps)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_the_kept_fraction_is_one_minus_p_to_the_n_minus_one_minus_p_to_the_n(p):
    num_tasks, num_probes = 20_000, 4
    _, successes, steps = run_probes(CoinTask(chances=p), num_tasks, num_probes)
    assert steps == num_tasks * num_probes and successes.min() >= 0 and successes.max() <= num_probes
    kept = np.asarray(keep_informative(jnp.asarray(successes), num_probes)).mean()
    expected = float(informative_probability(p, num_probes))
    assert expected == pytest.approx(1 - p**4 - (1 - p) ** 4)
    assert abs(kept - expected) < 4 * np.sqrt(expected * (1 - expected) / num_tasks)


def test_probes_are_grouped_by_task_and_only_sometimes_solved_tasks_are_kept():
    env = CoinTask()
    task_keys, successes, _ = run_probes(env, 3000, 6, seed=2)
    chances = np.asarray(jax.vmap(lambda key: env.reset(key, env.default_params())[1])(task_keys))
    np.testing.assert_array_equal(successes[chances == 0.0], 0)
    np.testing.assert_array_equal(successes[chances == 1.0], 6)
    kept = np.asarray(keep_informative(jnp.asarray(successes), 6))
    assert set(np.unique(chances[kept])) == {0.5}
    assert kept[chances == 0.5].mean() == pytest.approx(1 - 2 * 0.5**6, abs=0.03)


def test_draw_tasks_takes_kept_tasks_only_or_all_when_none_is_kept():
    task_keys = jax.random.split(jax.random.key(0), 5)
    kept = jnp.array([False, True, False, True, False])
    drawn = draw_tasks(jax.random.key(1), task_keys, kept, 400)
    data, drawn_data = np.asarray(jax.random.key_data(task_keys)), np.asarray(jax.random.key_data(drawn))
    which = [int(np.flatnonzero((data == row).all(axis=1))[0]) for row in drawn_data]
    assert set(which) == {1, 3} and 0.4 < np.mean(np.array(which) == 1) < 0.6
    fallback = draw_tasks(jax.random.key(1), task_keys, jnp.zeros(5, bool), 400)
    assert len({tuple(row) for row in np.asarray(jax.random.key_data(fallback))}) == 5


def test_bad_filtering_options_raise():
    with pytest.raises(ValueError, match="probes_per_task must be an int >= 2"):
        TrainConfig.for_env("sokoban", probe_tasks=8, probes_per_task=1)
    with pytest.raises(ValueError, match="probe_tasks needs an environment with a notion of success; bandit has none"):
        make_train(TrainConfig.for_env("bandit", probe_tasks=8))


@dataclasses.dataclass(frozen=True)
class SeenCoinTask(CoinTask):
    """`CoinTask` with its task's success probability p as the observation, so a trajectory shows its task."""

    def reset(self, key, params):
        _, p = super().reset(key, params)
        return p[None], p

    def step(self, key, state, action, params):
        _, state, reward, done, info = super().step(key, state, action, params)
        return state[None], state, reward, done, info


@pytest.mark.slow
def test_training_episodes_start_from_the_kept_tasks_only(monkeypatch):
    """Tasks with p = 0 or 1 are never kept (their probes agree), p = 0.5 ones are (8 probes disagree with
    probability 1 − 2⁻⁷); so with filtering every pooled training episode is a p = 0.5 task, where without it
    two in three would not be."""
    monkeypatch.setattr("ftw_jax.envs.make", lambda name, **options: SeenCoinTask())
    config = TrainConfig.for_env(
        "cartpole",
        num_iterations=4,
        eval_every=2,
        episodes_per_iteration=8,
        eval_episodes=4,
        pool_capacity=16,
        num_batches=4,
        batch_size=4,
        num_elites=1,
        probe_tasks=24,
        probes_per_task=8,
        hidden_sizes=(4,),
    )
    carry, (_, evaluation) = make_train(config).train(jax.random.key(0))
    played = np.asarray(carry.learner.pool.trajectories.observation)[:, 0, 0]  # each pooled episode's p: 16 of period 2
    np.testing.assert_array_equal(played, 0.5)
    # About a third of the candidates are p = 0.5 tasks, and (nearly) all of those are kept.
    assert 0.1 < float(evaluation["informative_tasks"][-1]) < 0.6
    with pytest.raises(ValueError, match="`probes_per_task` 8 takes effect only with `probe_tasks` > 0"):
        dataclasses.replace(config, probe_tasks=0)  # issue 35: a setting that would be ignored is refused
    unfiltered = make_train(dataclasses.replace(config, probe_tasks=0, probes_per_task=4)).train(jax.random.key(0))[0]
    assert (np.asarray(unfiltered.learner.pool.trajectories.observation)[:, 0, 0] != 0.5).sum() >= 4

"""Defaults per (environment or LLM task, algorithm): one table each, as rejax keeps one config per pair.

    settings = defaults.of("sokoban", "ppo")                       # the lab's run on sokoban, PPO's own there
    settings = defaults.of("retrieval-qa", "grpo", LM_TASKS)       # the agent's learner on retrieval QA, GRPO's

Each entry holds the settings of a run that every algorithm shares there (`run`: B, iterations, the network,
the optimizer, evaluation; fields of `ftw_jax.lab.train.TrainConfig`, or of the agent's
`ftw_jax.agent.learner.LearnConfig`), those that every algorithm declaring them takes alike (`every_algorithm`:
U, the updates per iteration), and each algorithm's own (fields of its config) under its name: together they
train it in seconds to minutes on 2 CPU cores. An environment missing here, or an algorithm missing from an
entry, runs on the settings' own defaults. A new environment or algorithm adds its line here; the environment's
registry entry (`ftw_jax.envs`) names no algorithm's settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ftw_jax import algos
from ftw_jax.core.settings import describe

DEFAULT_ALGORITHM = "ftw"  # what every program runs when no algorithm is named


@dataclasses.dataclass(frozen=True)
class Defaults:
    """One environment's (or LLM task's) defaults: the run's, the algorithms' alike, and each algorithm's own."""

    run: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # settings of the run, every algorithm's
    every_algorithm: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # of each config declaring them
    algorithms: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)  # name -> its config's


DEFAULTS: dict[str, Defaults] = {
    "bandit": Defaults(
        run=dict(
            num_iterations=240,
            episodes_per_iteration=1,
            optimizer="sgd",
            learning_rate=0.08,
            kl_coef=0.05,
            eval_every=24,
            eval_episodes=64,
        ),
        algorithms={
            "ftw": dict(pool_capacity=128, num_batches=4, batch_size=5, num_elites=1),
            "ppo": dict(num_minibatches=1),  # one episode per iteration cannot be split
        },
    ),
    "cartpole": Defaults(),  # the settings' own defaults
    "sokoban": Defaults(
        run=dict(
            num_iterations=300,
            episodes_per_iteration=64,
            optimizer="adam",
            learning_rate=3e-3,
            kl_coef=0.0,
            eval_every=20,
            # One episode per test level (num_test_levels=1000): evaluation episode i plays test level i. A
            # 40-iteration run timed alike with 256 and with 1,000 (about 17 s after compiling, 2 CPU cores).
            eval_episodes=1000,
            conv_channels=(16, 16),
            hidden_sizes=(128,),
        ),
        every_algorithm=dict(updates_per_iteration=4),  # PPO's: epochs over the batch
        algorithms={"ftw": dict(pool_capacity=512, num_batches=128, batch_size=4, num_elites=1)},
    ),
    "search": Defaults(
        run=dict(
            num_iterations=400,
            episodes_per_iteration=128,
            optimizer="adam",
            learning_rate=3e-3,
            kl_coef=0.5,
            kl_coef_final=0.0,
            eval_every=40,
            eval_episodes=256,
        ),
        every_algorithm=dict(updates_per_iteration=4),
        algorithms={"ftw": dict(pool_capacity=512, num_batches=32, batch_size=32, num_elites=1)},
    ),
    "text-search": Defaults(
        run=dict(
            num_iterations=100,
            episodes_per_iteration=64,
            optimizer="adam",
            learning_rate=1e-3,
            kl_coef=0.1,
            eval_every=10,
            eval_episodes=256,
            warm_start_demonstrations=2048,
        ),
        every_algorithm=dict(updates_per_iteration=2),
        algorithms={"ftw": dict(pool_capacity=256, num_batches=16, batch_size=16, num_elites=1)},
    ),
}


# The baselines as Search-R1 runs them on its LLM search agent (train_grpo.sh, train_ppo.sh, over its verl's
# ppo_trainer.yaml): G = 5 episodes per question; GRPO's KL the k3 estimate in the loss; PPO's KL in the rewards,
# gamma = lambda = 1, one epoch of two minibatches (512 questions a batch, 256 a step), the critic at 10x the
# policy's learning rate; an entropy bonus of 0.001. `lm learn` and retrieval QA start the baselines from these.
SEARCH_R1: dict[str, dict[str, Any]] = {
    "grpo": dict(group_size=5, kl_estimate="k3", entropy_coef=0.001),
    "reinforce": dict(leave_one_out=5),
    "ppo": dict(
        kl_in_reward=True,
        discount=1.0,
        gae_lambda=1.0,
        num_minibatches=2,
        updates_per_iteration=1,
        entropy_coef=0.001,
        critic_learning_rate_scale=10.0,
    ),
}


# FTW in the LM commands (`lm learn`, retrieval QA): the trust-region monitor on 4 pool entries, not 16. Each
# entry costs two forward passes of the model after the update: with 16, FTW's step over 8 kept sequences of 256
# tokens took 1.41x as long as with the monitor off, with 4 1.14x (experiments/lm/lm_vs_tunix.py).
LM_FTW: dict[str, Any] = {"monitor_entries": 4}

# The agent's learner (`ftw_jax.agent.learner.LearnConfig.for_task`) on each LLM task. "episodes": an engine's
# episodes read from files (`lm learn`). "retrieval-qa": Search-R1's learning rate and KL weight for 3B models,
# bfloat16 compute over float32 master weights, B = 64 conversations a batch (their KV cache, at the protocol's
# 4,548 slots, is 10.0 GiB for Qwen2.5-3B in bfloat16); FTW's `beat_minimum`, as exact match is 0 or 1, so most
# minibatches hold tied returns and `top_k` would imitate failures among them (the collapse binary Sokoban shows).
LM_TASKS: dict[str, Defaults] = {
    "episodes": Defaults(algorithms={"ftw": LM_FTW, **SEARCH_R1}),
    "retrieval-qa": Defaults(
        run=dict(episodes_per_iteration=64, learning_rate=1e-6, kl_coef=1e-3, dtype="bfloat16"),
        algorithms={"ftw": {"elite_rule": "beat_minimum", **LM_FTW}, **SEARCH_R1},
    ),
}


def of(name: str, algorithm: str, table: Mapping[str, Defaults] = DEFAULTS) -> dict[str, Any]:
    """The settings a run of `algorithm` on environment (or LLM task) `name` starts from: the entry's run
    defaults, those every algorithm declaring them takes, and the algorithm's own there (empty where the table
    has none). A task missing from `LM_TASKS` is refused; an environment missing from `DEFAULTS` runs on the
    settings' own defaults."""
    if table is not DEFAULTS and name not in table:
        raise ValueError(f"the task must be one of {tuple(table)}, got {name!r}.")
    entry = table.get(name, Defaults())
    declared = {item.name for item in describe(algos.get(algorithm).config)}
    alike = {setting: value for setting, value in entry.every_algorithm.items() if setting in declared}
    return {**entry.run, **alike, **entry.algorithms.get(algorithm, {})}


def shown(env: str, name: str) -> str | None:
    """`name`'s default on `env` as a flag's help shows it ("4"; "ftw 4, ppo 1" where algorithms differ); None where
    the table does not set it."""
    return shown_in(DEFAULTS.get(env, Defaults()), name)


def shown_in(entry: Defaults, name: str) -> str | None:
    """`shown` for any table's entry (an LLM task's: `LM_TASKS["retrieval-qa"]`)."""
    if name in entry.run:
        return _text(entry.run[name])
    if name in entry.every_algorithm:
        return _text(entry.every_algorithm[name])
    values = {algorithm: _text(settings[name]) for algorithm, settings in entry.algorithms.items() if name in settings}
    if len(set(values.values())) == 1:
        return next(iter(values.values()))
    return ", ".join(f"{algorithm} {value}" for algorithm, value in values.items()) or None


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)

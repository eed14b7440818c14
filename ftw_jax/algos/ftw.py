"""FTW (Algorithm 2) as the training program runs it: every batch goes into the pool, then U updates.

Each update selects from the whole pool (`ftw_jax.core.update.make_update`), so the learner state is the policy
and the pool; the sweepable sizes N, J, C, K arrive as `Hyperparameters.algorithm` (a `Sizes`). Of the U
updates' metrics, only the last carries the pool-wide diagnostics (staleness, the monitor); the others hold NaN
(-1) there.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from ftw_jax.algos.base import Algorithm, Context, Hyperparameters, Learner, updates_per_iteration_setting
from ftw_jax.core import pool as pool_lib
from ftw_jax.core.checks import check_positive_int
from ftw_jax.core.state import PolicyState
from ftw_jax.core.update import Sizes, UpdateConfig, make_update


@dataclasses.dataclass(frozen=True)
class FTWConfig(UpdateConfig):
    """The update's settings (`UpdateConfig`) and how many updates follow each batch."""

    updates_per_iteration: int = updates_per_iteration_setting()

    def __post_init__(self):
        super().__post_init__()
        check_positive_int("updates_per_iteration", self.updates_per_iteration)


class FTWHyperparameters(flax.struct.PyTreeNode):
    """FTW's sweepable sizes as int32 arrays inside the config's (`Hyperparameters.algorithm`)."""

    pool_capacity: jax.Array  # N: the pool's slots in use (`pool.init`'s `slots_in_use`)
    sizes: Sizes  # J, C, K of every update


class FTWLearnerState(flax.struct.PyTreeNode):
    policy: PolicyState
    pool: pool_lib.Pool


def make_learner(config: FTWConfig, context: Context) -> Learner:
    policy = context.policy
    update = make_update(policy.apply, config, markov=policy.markov, chunked=policy.chunked_logits())

    def init(key: jax.Array, observation, hyperparameters: Hyperparameters, start=None) -> FTWLearnerState:
        pool = pool_lib.init(
            config.pool_capacity, context.example, slots_in_use=hyperparameters.algorithm.pool_capacity
        )
        return FTWLearnerState(policy=context.init_policy(key, observation, hyperparameters, start), pool=pool)

    def learn(state: FTWLearnerState, batch, key: jax.Array, hyperparameters: Hyperparameters):
        pool = pool_lib.add(state.pool, batch)
        last = config.updates_per_iteration - 1

        def step(policy, inputs):
            key, u = inputs  # the pool-wide diagnostics only on the last update, the one a run reports
            return update(policy, pool, key, hyperparameters.algorithm.sizes, u == last if last else True)

        policy, metrics = jax.lax.scan(
            step,
            state.policy,
            (jax.random.split(key, config.updates_per_iteration), jnp.arange(config.updates_per_iteration)),
        )
        return FTWLearnerState(policy=policy, pool=pool), metrics

    return Learner(init=init, learn=learn, steps_per_batch=config.updates_per_iteration)


def hyperparameters(config: FTWConfig) -> FTWHyperparameters:
    as_array = lambda size: jnp.asarray(size, jnp.int32)  # noqa: E731
    return FTWHyperparameters(
        pool_capacity=as_array(config.pool_capacity), sizes=jax.tree.map(as_array, Sizes.of(config))
    )


def check(config: FTWConfig, episodes_per_iteration: int) -> None:
    if episodes_per_iteration > config.pool_capacity:
        raise ValueError(
            f"episodes_per_iteration (B={episodes_per_iteration}) must be <= pool_capacity (N={config.pool_capacity})."
        )


ALGORITHM = Algorithm(
    name="ftw",
    config=FTWConfig,
    make_learner=make_learner,
    hyperparameters=hyperparameters,
    check=check,
    search_space={
        "pool_capacity": (256, 512, 1024),
        "num_batches": (32, 64, 128),
        "batch_size": (4, 8, 16, 32),
        "num_elites": (1, 2, 4),
        "elite_rule": ("top_k", "beat_minimum"),
    },
    # The reference implementation's run (its two-armed bandit): N 128, J 4, C 5, K 1, β 0.05 throughout.
    reference={
        "kl_coef": 0.05,
        "kl_decay_fraction": None,
        "pool_capacity": 128,
        "num_batches": 4,
        "batch_size": 5,
        "num_elites": 1,
        "elite_rule": "top_k",
    },
)

"""Where one iteration of our CartPole PPO spends its time, at short and at full-length episodes.

    python experiments/benchmarks/ppo_iteration_profile.py          # ~1 minute on 2 cores

rejax's recommended config as `ppo_throughput_vs_rejax.py` runs it (B = 10 episodes per iteration, 5 epochs ×
5 minibatches, 10 seeds vmapped). For the untrained policy's batch (episodes of ~24 steps) and for the same
batch with every step alive (500-step episodes, as at the end of training), it times the rollout, the learner's
whole `learn` (its 25 policy and critic steps) with the step-wise path (`ftw_jax.core.stepwise`, the alive steps
alone) and with the dense one (every episode padded to T = 500), and one policy and one critic step alone.
Each is jitted, run once untimed, then the median of 7 calls; env steps/s = the batch's alive steps over
rollout + learn.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
from rejax_ppo_cartpole import OURS  # noqa: E402

from ftw_jax import policies  # noqa: E402
from ftw_jax.lab.rollout import Player, rollouts  # noqa: E402
from ftw_jax.lab.train import TrainConfig, make_train  # noqa: E402

SEEDS, EPISODES = 10, 10


def milliseconds(fn, *args: Any) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(7):
        started = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def profile(config: TrainConfig, markov: bool) -> tuple[float, list[tuple[str, int, float]]]:
    """(rollout ms, [(batch, alive steps, learn ms)]) with the MLP declared Markov (the step-wise learner) or
    not (the dense one)."""
    policies.MLPPolicy.markov = markov
    try:
        trainer = make_train(config)
    finally:
        policies.MLPPolicy.markov = True
    env, env_params = trainer.env, trainer.env.default_params()
    keys = jax.random.split(jax.random.key(0), SEEDS)
    carry = jax.jit(jax.vmap(trainer.init))(keys)

    def play(carry, key):
        policy = carry.learner.policy
        return rollouts(key, Player(env, env_params, trainer.policy, policy.params, policy.version), EPISODES)[0]

    def learn(carry, batch, key):
        return trainer.learner.learn(carry.learner, batch, key, carry.hyperparameters)

    play, learn = jax.jit(jax.vmap(play)), jax.jit(jax.vmap(learn))
    short = play(carry, keys)
    full = short.replace(mask=jnp.ones_like(short.mask), alive=jnp.ones_like(short.alive))
    rows = [
        (name, int(batch.alive.sum()), milliseconds(learn, carry, batch, keys))
        for name, batch in (("untrained (short episodes)", short), ("every step alive (T = 500)", full))
    ]
    return milliseconds(play, carry, keys), rows


def main() -> None:
    settings = {name: value for name, value in OURS.items() if name != "eval_episodes"}
    config = TrainConfig.for_env("cartpole", **settings, episodes_per_iteration=EPISODES, num_iterations=80)
    rollout_ms, stepwise_rows = profile(config, markov=True)
    _, dense_rows = profile(config, markov=False)
    print(
        f"CartPole PPO, rejax's config, {SEEDS} seeds × B = {EPISODES} episodes; rollout of the untrained policy "
        f"{rollout_ms:.0f} ms\n"
    )
    print("| batch | learner path | alive steps | learn (25 policy + 25 critic steps) ms | µs per alive step |")
    print("|---|---|---:|---:|---:|")
    for path, rows in (("step-wise", stepwise_rows), ("dense", dense_rows)):
        for name, steps, learn_ms in rows:
            print(f"| {name} | {path} | {steps:,} | {learn_ms:.0f} | {1000 * learn_ms / steps:.1f} |")


if __name__ == "__main__":
    main()

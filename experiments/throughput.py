"""Env steps per second on this machine: each environment alone (random actions), and each default training program."""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax import envs
from ftw_jax.train import ENV_DEFAULTS, TrainConfig, make_train

NUM_ENVS = 1024  # parallel environments for the env-only measurement
ENV_STEPS = 64  # steps each of them takes per timed call


def env_only_steps_per_second(name: str) -> float:
    """Steps/s of `NUM_ENVS` environments in a vmap, uniform random actions, auto-reset left out (done is ignored)."""
    env = envs.make(name)
    params = env.default_params()

    @jax.jit
    def play(key):
        reset_keys = jax.random.split(key, NUM_ENVS)
        _, states = jax.vmap(env.reset, in_axes=(0, None))(reset_keys, params)

        def step(states, step_key):
            action_key, env_key = jax.random.split(step_key)
            actions = jax.random.randint(action_key, (NUM_ENVS,), 0, env.num_actions)
            keys = jax.random.split(env_key, NUM_ENVS)
            _, states, reward, _, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, states, actions, params)
            return states, reward

        _, rewards = jax.lax.scan(step, states, jax.random.split(key, ENV_STEPS))
        return rewards

    play(jax.random.key(0)).block_until_ready()  # compile
    started = time.perf_counter()
    play(jax.random.key(1)).block_until_ready()
    return NUM_ENVS * ENV_STEPS / (time.perf_counter() - started)


def training_throughput(name: str, num_seeds: int, num_periods: int) -> dict:
    """Compile time, and training env steps/s over `num_periods` evaluation periods of the default program."""
    config = TrainConfig.for_env(name)
    trainer = make_train(config)
    carry = jax.vmap(trainer.init)(jnp.stack([jax.random.key(seed) for seed in range(num_seeds)]))
    started = time.perf_counter()
    run_period = jax.jit(jax.vmap(trainer.run, in_axes=(0, None)), static_argnums=1).lower(carry, 1).compile()
    compile_seconds = time.perf_counter() - started
    steps_before = int(np.asarray(carry.env_steps).sum())
    started = time.perf_counter()
    for _ in range(num_periods):
        carry, _ = run_period(carry)
    jax.block_until_ready(carry)
    seconds = time.perf_counter() - started
    steps_per_second = (int(np.asarray(carry.env_steps).sum()) - steps_before) / seconds
    return dict(
        compile_seconds=compile_seconds,
        iterations_per_second=num_periods * config.eval_every / seconds,
        steps_per_second=steps_per_second,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--envs", default=",".join(ENV_DEFAULTS), help="comma-separated (default: all)")
    parser.add_argument("--num-seeds", type=int, default=3, help="seeds vmapped in the training program")
    parser.add_argument("--periods", type=int, default=2, help="evaluation periods timed after the compile")
    args = parser.parse_args()
    print(f"{jax.devices()[0].device_kind}; training: {args.num_seeds} seeds vmapped, the first {args.periods} "
          f"evaluation periods of each default program (evaluations included in the time, not in the steps)\n")
    print("| env | env alone: steps/s | training: compile s | iterations/s | env steps/s |")
    print("|---|---:|---:|---:|---:|")
    for name in args.envs.split(","):
        alone = env_only_steps_per_second(name)
        train = training_throughput(name, args.num_seeds, args.periods)
        print(f"| {name} | {alone:,.0f} | {train['compile_seconds']:.1f} | {train['iterations_per_second']:.1f} | "
              f"{train['steps_per_second']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()

"""Env steps per second of each environment alone (no policy): 1024 copies in a vmap, uniform random actions.

The training programs' own throughput (policy, pool and updates included) is what `ftw-jax train` reports.
"""

from __future__ import annotations

import argparse
import time

import jax

from ftw_jax import envs
from ftw_jax.envs import ENVIRONMENTS
from ftw_jax.running import threefry

threefry.use_unrolled()


def env_steps_per_second(name: str, num_envs: int, num_steps: int, repeats: int = 3) -> float:
    """Best of `repeats` timed calls, each `num_steps` steps of `num_envs` environments (done is ignored)."""
    env = envs.make(name)
    params = env.default_params()

    @jax.jit
    def play(key):
        reset_key, steps_key = jax.random.split(key)
        _, states = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs), params)

        def step(states, step_key):
            action_key, env_key = jax.random.split(step_key)
            actions = jax.random.randint(action_key, (num_envs,), 0, env.num_actions)
            keys = jax.random.split(env_key, num_envs)
            _, states, reward, _, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, states, actions, params)
            return states, reward

        return jax.lax.scan(step, states, jax.random.split(steps_key, num_steps))[1]

    play(jax.random.key(0)).block_until_ready()  # compile
    best = float("inf")
    for repeat in range(repeats):
        started = time.perf_counter()
        play(jax.random.key(1 + repeat)).block_until_ready()
        best = min(best, time.perf_counter() - started)
    return num_envs * num_steps / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--envs", default=",".join(ENVIRONMENTS), help="comma-separated (default: all)")
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--num-steps", type=int, default=64)
    args = parser.parse_args()
    print(f"{jax.devices()[0].device_kind}: {args.num_envs} environments in a vmap, {args.num_steps} steps per call\n")
    print("| env | env steps/s |")
    print("|---|---:|")
    for name in args.envs.split(","):
        print(f"| {name} | {env_steps_per_second(name, args.num_envs, args.num_steps):,.0f} |", flush=True)


if __name__ == "__main__":
    main()

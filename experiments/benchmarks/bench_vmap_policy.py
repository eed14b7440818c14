"""The conv policy's gradient on one batch of steps, alone and vmapped over members with their own weights.

    python experiments/benchmarks/bench_vmap_policy.py

Why vmapped seeds are slow on a CPU: with per-member weights every matrix product becomes a batched
`dot_general`, which XLA:CPU runs more slowly than the plain one. Medians of 10 calls, compile excluded.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from ftw_jax.policies import ConvPolicy
from ftw_jax.running import threefry

threefry.use_unrolled()

STEPS = 2560  # J·K·T of Sokoban's defaults: 128 elites of 20 steps


def median_ms(function, *args, repeats: int = 10) -> float:
    jax.block_until_ready(function(*args))
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(function(*args))
        samples.append(time.perf_counter() - started)
    return 1e3 * statistics.median(samples)


def main() -> None:
    policy = ConvPolicy(num_actions=4)
    observation = jnp.zeros((STEPS, 6, 6, 5), jnp.float32)
    params = policy.init(jax.random.key(0), observation[:1])
    grad = jax.grad(lambda p, o: jnp.sum(policy.apply(p, o) ** 2))
    stack = lambda tree, count: jax.tree.map(lambda leaf: jnp.stack([leaf] * count), tree)  # noqa: E731
    vmapped = jax.jit(jax.vmap(grad))
    print(f"conv policy gradient on {STEPS} steps, {jax.devices()[0].platform}, ms per member:")
    print(f"  alone:                  {median_ms(jax.jit(grad), params, observation):.1f}")
    print(f"  vmapped over 1 member:  {median_ms(vmapped, stack(params, 1), observation[None]):.1f}")
    print(f"  vmapped over 3 members: {median_ms(vmapped, stack(params, 3), stack(observation, 3)) / 3:.1f}")


if __name__ == "__main__":
    main()

"""S seeds in one vmapped program, in one program that loops over them (`lax.map`, the CPU default of the CLI:
`ftw_jax.running.loop.member_loop`), and run one after another: throughput ratios, memory per member.

Both sides run the same training program (the environment's defaults, a few iterations, one evaluation at
the end), compiled ahead of time; each compiled program runs once untimed first, so the timings exclude
compiling and first-call set-up. Memory is XLA's own account of the compiled program (arguments + outputs +
temporaries); per member is its growth from S = 1 to the largest S. Batched and unbatched kernels may round
differently, and a rounding difference can flip a sampled action, so the two sides' returns are compared
(largest difference) rather than required to be equal.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from ftw_jax.lab.train import TrainConfig, make_train
from ftw_jax.running import threefry
from ftw_jax.running.checkpoints import with_raw_keys
from ftw_jax.running.loop import over_members, seed_keys
from ftw_jax.running.timing import wall_seconds

threefry.use_unrolled()


def program_bytes(compiled) -> int:
    """Arguments + outputs + temporaries of a compiled program, minus what outputs alias in the arguments."""
    memory = compiled.memory_analysis()
    return (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        + memory.temp_size_in_bytes
        - memory.alias_size_in_bytes
    )


def carry_bytes(carry) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(with_raw_keys(carry)))


def measure(trainer, num_seeds: int) -> dict:
    """Seeds 0..S−1: vmapped in one program, then one at a time through the single-seed program."""
    keys = seed_keys(list(range(num_seeds)))
    carries = jax.vmap(trainer.init)(keys)
    compile_seconds, vmapped = wall_seconds(
        lambda: jax.jit(jax.vmap(trainer.run, in_axes=(0, None)), static_argnums=1).lower(carries, 1).compile()
    )
    wall_seconds(vmapped, carries)  # warm-up
    vmapped_seconds, (vmapped_carries, (_, evaluation)) = wall_seconds(vmapped, carries)
    looped_compile_seconds, looped = wall_seconds(
        lambda: jax.jit(over_members(trainer.run, "map"), static_argnums=1).lower(carries, 1).compile()
    )
    wall_seconds(looped, carries)  # warm-up
    looped_seconds, (_, (_, looped_evaluation)) = wall_seconds(looped, carries)
    carries = vmapped_carries

    single_init = jax.jit(trainer.init)
    single = jax.jit(trainer.run, static_argnums=1).lower(single_init(keys[0]), 1).compile()
    wall_seconds(single, single_init(keys[0]))  # warm-up
    sequential_seconds, sequential_returns = 0.0, []
    for key in keys:
        seconds, (carry, (_, alone)) = wall_seconds(single, single_init(key))
        sequential_seconds += seconds
        sequential_returns.append(float(alone["return"][0]))
    steps = int(np.asarray(carries.env_steps).sum())
    return {
        "seeds": num_seeds,
        "compile_seconds": compile_seconds,
        "vmapped_seconds": vmapped_seconds,
        "sequential_seconds": sequential_seconds,
        "vmapped_steps_per_second": steps / vmapped_seconds,
        "sequential_steps_per_second": steps / sequential_seconds,
        "speedup": sequential_seconds / vmapped_seconds,
        "looped_seconds": looped_seconds,
        "looped_compile_seconds": looped_compile_seconds,
        "looped_steps_per_second": steps / looped_seconds,
        "looped_speedup": sequential_seconds / looped_seconds,
        "looped_largest_return_difference": float(
            np.max(np.abs(np.asarray(looped_evaluation["return"])[:, 0] - sequential_returns))
        ),
        "largest_return_difference": float(np.max(np.abs(np.asarray(evaluation["return"])[:, 0] - sequential_returns))),
        "program_bytes": program_bytes(vmapped),
        "looped_program_bytes": program_bytes(looped),
        "carry_bytes": carry_bytes(carries),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env", default="sokoban", help="default sokoban (JAX-native, no extra needed)")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--seeds", default="1,8,64", help="values of S (default 1,8,64)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per S")
    args = parser.parse_args()
    config = TrainConfig.for_env(args.env, num_iterations=args.iterations, eval_every=args.iterations)
    trainer = make_train(config)
    ftw = config.algorithm_config
    print(
        f"{jax.devices()[0].device_kind} x {jax.device_count()}: {args.env}, {args.iterations} iterations of "
        f"B={config.episodes_per_iteration} episodes, U={ftw.updates_per_iteration} updates "
        f"(N={ftw.pool_capacity}, J={ftw.num_batches}, C={ftw.batch_size}, K={ftw.num_elites}); "
        "compile excluded\n",
        flush=True,
    )
    rows = []
    if not args.json:
        print(
            "| S | vmapped env steps/s | looped (lax.map) env steps/s | sequential env steps/s "
            "| vmapped: sequential time / its time | looped: sequential time / its time "
            "| largest return difference (vmapped, looped) | compile s (vmapped, looped) |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for num_seeds in (int(s) for s in args.seeds.split(",")):
        row = measure(trainer, num_seeds)
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(
                f"| {num_seeds} | {row['vmapped_steps_per_second']:,.0f} | {row['looped_steps_per_second']:,.0f} "
                f"| {row['sequential_steps_per_second']:,.0f} | {row['speedup']:.2f}x | {row['looped_speedup']:.2f}x "
                f"| {row['largest_return_difference']:.3g}, {row['looped_largest_return_difference']:.3g} "
                f"| {row['compile_seconds']:.1f}, {row['looped_compile_seconds']:.1f} |",
                flush=True,
            )
    if len(rows) > 1 and not args.json:
        first, last = rows[0], rows[-1]
        extra = last["seeds"] - first["seeds"]
        per_member = (last["program_bytes"] - first["program_bytes"]) / extra
        print(
            f"\nmemory per member: {per_member / 2**20:.2f} MiB of compiled program (arguments + outputs + "
            f"temporaries, growth from S={first['seeds']} to S={last['seeds']}); the carry alone (params, "
            f"optimizer state, pool, keys) {last['carry_bytes'] / last['seeds'] / 2**20:.2f} MiB; looped: "
            f"{(last['looped_program_bytes'] - first['looped_program_bytes']) / extra / 2**20:.2f} MiB per member"
        )


if __name__ == "__main__":
    main()

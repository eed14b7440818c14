"""How held out Sokoban's test levels are: training draws that are test levels, with and without the exclusion.

    python experiments/held_out_levels.py [--draws 4000] [--test-levels 1000]

Prints, for the default 6×6 one-box levels, the share of training resets whose level is one of the test levels
and the share of test levels that some training reset made: with `num_test_levels=N` (training resets draw
again on a test level) and, for comparison, the same training stream without the exclusion.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from ftw_jax.envs.sokoban import Sokoban, held_out_hashes, level_hash
from ftw_jax.running import threefry

threefry.use_unrolled()  # opt in, as the command line does: the same random bits, compiled and run faster on CPU


def training_hashes(env: Sokoban, draws: int, seed: int) -> list[tuple[int, int]]:
    keys = jax.random.split(jax.random.key(seed), draws)
    _, states = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(keys, env.default_params())
    return [tuple(row) for row in np.asarray(jax.vmap(level_hash)(states.level)).tolist()]


def main() -> None:
    parser = argparse.ArgumentParser(description="How held out Sokoban's test levels are.")
    parser.add_argument("--draws", type=int, default=4000, help="training resets")
    parser.add_argument("--test-levels", type=int, default=1000, help="num_test_levels")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    held_out = Sokoban(num_test_levels=args.test_levels)
    test = {tuple(row) for row in held_out_hashes(held_out).tolist()}
    print(f"{args.test_levels} test levels ({len(test)} distinct), {args.draws} training resets:")
    for label, env in (("excluded (default)", held_out), ("not excluded", Sokoban(num_test_levels=0))):
        drawn = training_hashes(env, args.draws, args.seed)
        in_test = sum(level in test for level in drawn)
        seen = len(test & set(drawn))
        print(
            f"  {label:>18}: {in_test} of the training resets are test levels ({in_test / args.draws:.1%}); "
            f"{seen} of the distinct test levels were drawn in training ({seen / len(test):.1%})"
        )


if __name__ == "__main__":
    main()

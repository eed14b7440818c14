"""How held out Sokoban's test levels are: training resets with a test level's room or start, with and without
the exclusion.

    python experiments/protocol/held_out_levels.py [--draws 19200] [--test-levels 1000]

A level's room is its walls, targets and boxes (everything but the player); the policy sees only the board, so
a training level with a test level's room is that test level's board up to where the player stands. Prints, for
the default 6×6 one-box levels, the share of training resets whose room (and whose level, player included) is a
test level's, and how many of the test levels' rooms (and starts) some training reset made: with
`num_test_levels=N` (training resets draw again on a test level's room) and, for comparison, the same training
stream without the exclusion. The default 19,200 resets are a default run's (300 iterations × 64 episodes).
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from ftw_jax.envs.sokoban import Sokoban, held_out_levels, held_out_rooms, level_hash, room_hash
from ftw_jax.running import threefry

threefry.use_unrolled()


def training_draws(env: Sokoban, draws: int, seed: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(room hashes, level hashes) of `draws` training resets."""
    keys = jax.random.split(jax.random.key(seed), draws)
    _, states = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(keys, env.default_params())
    rooms, levels = (np.asarray(jax.vmap(hashed)(states.level)).tolist() for hashed in (room_hash, level_hash))
    return [tuple(row) for row in rooms], [tuple(row) for row in levels]


def main() -> None:
    parser = argparse.ArgumentParser(description="How held out Sokoban's test levels are.")
    parser.add_argument("--draws", type=int, default=19200, help="training resets")
    parser.add_argument("--test-levels", type=int, default=1000, help="num_test_levels")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    held_out = Sokoban(num_test_levels=args.test_levels)
    test_rooms = {tuple(row) for row in held_out_rooms(held_out).tolist()}
    test_starts = {tuple(row) for row in np.asarray(jax.vmap(level_hash)(held_out_levels(held_out))).tolist()}
    print(
        f"{args.test_levels} test levels ({len(test_starts)} distinct, {len(test_rooms)} distinct rooms), "
        f"{args.draws} training resets:"
    )
    for label, env in (("excluded (default)", held_out), ("not excluded", Sokoban(num_test_levels=0))):
        rooms, starts = training_draws(env, args.draws, args.seed)
        for kind, drawn, test in (("room", rooms, test_rooms), ("start", starts, test_starts)):
            hits = sum(level in test for level in drawn)
            seen = len(test & set(drawn))
            print(
                f"  {label:>18}: {hits} training resets have a test level's {kind} ({hits / args.draws:.1%}); "
                f"{seen} of the {len(test)} distinct test {kind}s drawn in training ({seen / len(test):.1%})"
            )


if __name__ == "__main__":
    main()

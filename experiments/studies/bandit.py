"""Reproduces the bandit result over many seeds and shows where its final best-arm probability comes from.

python experiments/studies/bandit.py                 # 1000 seeds (42..1041) of the default protocol
python experiments/studies/bandit.py --seeds 42,43,44 --kl-coef 0.1   # any `ftw-jax bandit` option
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

from ftw_jax import cli
from ftw_jax.lab.reproduction import kl_fixed_point_probability, run_seeds, winners_only_probability
from ftw_jax.running import threefry
from ftw_jax.running.plots import save_histogram

threefry.use_unrolled()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_bandit_arguments(parser)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/bandit_seeds"))
    parser.set_defaults(num_seeds=1000)
    args = parser.parse_args(argv)
    seeds = cli.seeds_of(args)
    config, env = cli.bandit_protocol(args)

    started = time.perf_counter()
    curves = run_seeds(config, seeds, env)
    best = np.asarray(curves["best_arm_probability"], np.float64)
    seconds = time.perf_counter() - started
    cli.print_bandit_table(seeds, best, np.asarray(curves["expected_reward"], np.float64), max_rows=5)

    final = best[:, -1]
    winners_only = winners_only_probability(config, env)
    fixed_point = kl_fixed_point_probability(config, env)
    on_path = np.abs(final - winners_only) < 1e-5
    print(f"\n{len(seeds)} seeds in {seconds:.1f} s (one jit, compile included)")
    print(f"if every kept action were the best arm (numpy recurrence): P(best) = {winners_only:.6f}")
    print(f"seeds ending there (within 1e-5): {on_path.mean():.1%}; the rest kept the worse arm at least once")
    print(f"never above it: {bool(np.all(final <= winners_only + 1e-5))}")
    print(f"stationary point of CE + {config.kl_coef}*KL(pi || uniform): P(best) = 1 - {1 - fixed_point:.3g}")
    path = save_histogram(
        args.out / "final_probability_histogram.png",
        final,
        title=f"final P(best arm) over {len(seeds)} seeds",
        xlabel="P(best arm) after the last iteration",
        markers={"winners-only path": winners_only, "mean": float(final.mean())},
    )
    print(f"histogram: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

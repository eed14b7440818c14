"""The bandit main job's throughput once started, against plain NumPy, over 1, 100 and 10,000 seeds in one process.

    python experiments/benchmarks/bandit_seeds_vs_numpy.py  # ~6 minutes on 2 cores (NumPy's 10,000 seeds)
    python experiments/benchmarks/bandit_seeds_vs_numpy.py --seeds 1,100   # quicker

For each number of seeds S (seeds 42, 43, …, as `ftw-jax bandit`): the JAX program of the command
(`reproduction.seeds_program`, the one metric it reports, threefry unrolled as the command line has it, no
compilation cache) traced and compiled once (timed apart), then run 3 times (median); the NumPy protocol
(`bandit_numpy.py`, one seed after another) run once over the same S seeds. The start-up floor is said apart:
whole processes of `python -c "import jax"` and of the package's bandit imports (median of 3), which every JAX
process pays before its first compile and which no change to this package can remove.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import jax
import numpy as np
from bandit_numpy import FIRST_SEED, PROTOCOL  # noqa: E402
from bandit_numpy import run as numpy_run  # noqa: E402

from ftw_jax.lab.reproduction import protocol_config, seeds_program  # noqa: E402
from ftw_jax.running import threefry  # noqa: E402

threefry.use_unrolled()


def process_seconds(code: str, repeats: int = 3) -> float:
    """Median wall time of `python -c CODE` as a whole process."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def jax_seconds(num_seeds: int) -> tuple[float, float, np.ndarray]:
    """(trace + compile seconds, median run seconds, final best-arm probabilities) of the command's program."""
    seeds = list(range(FIRST_SEED, FIRST_SEED + num_seeds))
    started = time.perf_counter()
    program, seed_array = seeds_program(protocol_config(), seeds, metric_names=("applied",))
    compile_seconds = time.perf_counter() - started
    runs, curves = [], None
    for _ in range(3):
        started = time.perf_counter()
        curves = jax.block_until_ready(program(seed_array))
        runs.append(time.perf_counter() - started)
    assert curves is not None
    return compile_seconds, statistics.median(runs), np.asarray(curves["best_arm_probability"])[:, -1]


def numpy_seconds(num_seeds: int) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    final = np.array([numpy_run(seed, **PROTOCOL) for seed in range(FIRST_SEED, FIRST_SEED + num_seeds)])
    return time.perf_counter() - started, final


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", default="1,100,10000", help="comma-separated numbers of seeds")
    args = parser.parse_args()
    counts = [int(count) for count in args.seeds.split(",")]
    import_jax = process_seconds("import jax")
    import_package = process_seconds("import ftw_jax.cli, ftw_jax.lab.reproduction")
    print(
        f"start-up floor (whole processes, median of 3): import jax {import_jax:.2f} s; "
        f"ftw_jax's bandit imports (jax included) {import_package:.2f} s\n"
    )
    print(
        "| seeds | JAX trace + compile s | JAX run s | JAX seeds/s | NumPy s | NumPy seeds/s | run: NumPy / JAX "
        "| compile + run: NumPy / JAX | final P(best) mean JAX / NumPy |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for count in counts:
        compile_seconds, run_seconds, jax_final = jax_seconds(count)
        numpy_total, numpy_final = numpy_seconds(count)
        print(
            f"| {count:,} | {compile_seconds:.2f} | {run_seconds:.4f} | {count / run_seconds:,.0f} | "
            f"{numpy_total:.2f} | {count / numpy_total:,.0f} | {numpy_total / run_seconds:,.1f}x | "
            f"{numpy_total / (compile_seconds + run_seconds):.2f}x | "
            f"{jax_final.mean():.6f} / {numpy_final.mean():.6f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

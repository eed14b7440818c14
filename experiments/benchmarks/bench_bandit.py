"""Whole-process time of `ftw-jax bandit` against plain NumPy (bandit_numpy.py), and whether the two agree.

    python experiments/benchmarks/bench_bandit.py                # 1000 seeds, 5 processes of each
    python experiments/benchmarks/bench_bandit.py --num-seeds 100 --repeats 3 --json
    # a change
    git worktree add /tmp/before HEAD~1 && python experiments/benchmarks/bench_bandit.py --baseline /tmp/before

Each repeat runs, one after another: `ftw-jax bandit --json --no-plot --num-seeds S` twice, cold
(FTW_JAX_COMPILE_CACHE=off) and with a warm compilation cache (a temporary folder, filled by one untimed run
first; with it, the command reads its traced program and most of its compile from the cache), then
`bandit_numpy.py --num-seeds S --json`, then `python -c "import jax"` (the floor of any JAX process), then a
process that does what `ftw-jax bandit` does step by step, with no cache, and times it: startup (launch to its
first line), import (ftw_jax.cli and ftw_jax.lab.reproduction), trace (the keys made from the seeds and the
vmapped `make_run(..., ("applied",))`, the one metric the command reports, as `run_seeds`, lowered), compile
(`.compile()`), run (the compiled call, `block_until_ready`) and the rest of its wall time (copying out,
exit). --no-plot only skips creating runs/bandit (nothing is drawn under --json). With `--baseline CHECKOUT`,
the command of that checkout's ftw_jax runs in the same rotation, cold and with a warm cache of its own.
Medians over the repeats.

The distribution check compares the final best-arm probabilities of the two (their random streams differ):
mean, quantiles and a two-sample Kolmogorov–Smirnov test. Seeds that keep the best arm in every minibatch end
on one deterministic value (`winners_only_probability`), which float32 (JAX) and float64 (NumPy) reach a few
1e-8 apart, so values are compared rounded to 1e-6 (the spread of the rest is ~1e-3).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
RESOLUTION_DECIMALS = 6

SPLIT = r"""
import json, sys, time
launched, started = float(sys.argv[2]), time.time()
import argparse, jax, jax.numpy as jnp, numpy as np
from ftw_jax import cli
from ftw_jax.lab.reproduction import make_run
from ftw_jax.running.loop import seed_keys
from ftw_jax.running import threefry

threefry.use_unrolled()
imported = time.time()
parser = argparse.ArgumentParser()
cli.add_bandit_arguments(parser)
args = parser.parse_args(["--num-seeds", sys.argv[1]])
config, env = cli.bandit_protocol(args)
seeds = np.asarray(cli.seeds_of(args), np.uint32)
run = make_run(config, env, ("applied",))
lowered = jax.jit(lambda seeds: jax.vmap(run)(seed_keys(seeds))).lower(seeds)
traced = time.time()
compiled = lowered.compile()
compiled_at = time.time()
curves = jax.block_until_ready(compiled(seeds))
ran = time.time()
np.asarray(curves["best_arm_probability"])[:, -1].tolist()
print(json.dumps({"startup": started - launched, "import": imported - started, "trace": traced - imported,
                  "compile": compiled_at - traced, "run": ran - compiled_at}))
"""


def jax_command(num_seeds: int) -> list[str]:
    script = pathlib.Path(sys.executable).with_name("ftw-jax")  # the console script (pyproject's ftw-jax)
    entry = [str(script)] if script.exists() else [sys.executable, "-m", "ftw_jax.cli"]
    return entry + ["bandit", "--json", "--no-plot", "--num-seeds", str(num_seeds)]


def timed(command: list[str], cache: str = "off", checkout: pathlib.Path | None = None) -> tuple[float, dict]:
    """Seconds of the whole process and its last line as JSON; `checkout`: import ftw_jax from there."""
    started = time.perf_counter()
    environment = {**os.environ, "FTW_JAX_COMPILE_CACHE": cache}
    if checkout is not None:
        environment["PYTHONPATH"] = str(checkout)  # ahead of this environment's ftw_jax
    # `python -m` puts the working folder first on the path: the checkout's, for the checkout's ftw_jax.
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False, cwd=checkout)
    seconds = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"{' '.join(command[:3])} ... failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout.splitlines()[-1])


def check_protocol() -> float:
    """Raises SystemExit if bandit_numpy.py's settings are not the package's; returns the winners-only value."""
    import bandit_numpy

    from ftw_jax import cli
    from ftw_jax.lab.reproduction import winners_only_probability

    parser = argparse.ArgumentParser()
    cli.add_bandit_arguments(parser)
    config, env = cli.bandit_protocol(parser.parse_args([]))
    update = config.algorithm_config
    package = dict(
        arm_means=tuple(env.arm_means),
        noise_sd=env.noise_sd,
        num_iterations=config.num_iterations,
        pool_capacity=update.pool_capacity,
        num_batches=update.num_batches,
        batch_size=update.batch_size,
        num_elites=update.num_elites,
        kl_coef=config.kl_coef,
        learning_rate=config.learning_rate,
    )
    options = (
        update.reference,
        update.kl_direction,
        update.elite_rule,
        update.max_staleness,
        update.importance_weight_cap,
        config.optimizer,
    )
    if package != bandit_numpy.PROTOCOL or options != ("initial", "policy_to_reference", "top_k", None, None, "sgd"):
        sys.exit(f"bandit_numpy.py is out of date: the package's protocol is {package}, {options}")
    return winners_only_probability(config, env)


def ks_two_sample(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(D, asymptotic p-value) of the two-sample Kolmogorov–Smirnov test (conservative with ties)."""
    points = np.concatenate([a, b])

    def ecdf(sample):
        return np.searchsorted(np.sort(sample), points, side="right") / len(sample)

    statistic = float(np.max(np.abs(ecdf(a) - ecdf(b))))
    effective = len(a) * len(b) / (len(a) + len(b))
    lam = (np.sqrt(effective) + 0.12 + 0.11 / np.sqrt(effective)) * statistic
    if lam < 0.2:  # p = 1 to 6 digits there, where the series converges slowly
        return statistic, 1.0
    k = np.arange(1, 101)
    return statistic, float(np.clip(2 * np.sum((-1.0) ** (k - 1) * np.exp(-2 * (k * lam) ** 2)), 0, 1))


def distribution(jax_final: np.ndarray, numpy_final: np.ndarray, winners_only: float) -> dict:
    rows = {}
    for name, final in (("jax", jax_final), ("numpy", numpy_final)):
        rows[name] = {
            "mean": float(final.mean()),
            **{f"q{q}": float(np.quantile(final, q / 100)) for q in (10, 50, 90)},
            "winners_only_fraction": float(np.mean(np.abs(final - winners_only) < 10**-RESOLUTION_DECIMALS)),
        }
    statistic, p_value = ks_two_sample(*(np.round(x, RESOLUTION_DECIMALS) for x in (jax_final, numpy_final)))
    return {
        **rows,
        "winners_only_value": winners_only,
        "ks_statistic": statistic,
        "ks_p_value": p_value,
        "agree": p_value >= 0.05,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-seeds", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5, help="processes of each (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--baseline", type=pathlib.Path, help="a checkout of another revision, timed alongside")
    args = parser.parse_args()
    winners_only = check_protocol()
    jax_run = jax_command(args.num_seeds)
    numpy_run = [sys.executable, str(HERE / "bandit_numpy.py"), "--num-seeds", str(args.num_seeds), "--json"]
    import_jax = [sys.executable, "-c", "import jax; print('{}')"]
    splits, outputs = [], {}
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as baseline_cache:
        timed(jax_run, cache)  # fills the cache
        runs = {
            "jax": (jax_run, "off", None),
            "jax_cached": (jax_run, cache, None),
            "numpy": (numpy_run, "off", None),
            "import_jax": (import_jax, "off", None),
        }
        if args.baseline is not None:
            baseline_run = [sys.executable, "-m", "ftw_jax.cli", *jax_run[jax_run.index("bandit") :]]
            timed(baseline_run, baseline_cache, args.baseline)
            runs["baseline"] = (baseline_run, "off", args.baseline)
            runs["baseline_cached"] = (baseline_run, baseline_cache, args.baseline)
        seconds = {name: [] for name in runs}
        for repeat in range(args.repeats):
            for name, (command, folder, checkout) in runs.items():
                elapsed, outputs[name] = timed(command, folder, checkout)
                seconds[name].append(elapsed)
            elapsed, split = timed([sys.executable, "-c", SPLIT, str(args.num_seeds), repr(time.time())])
            splits.append({**split, "rest": elapsed - sum(split.values()), "whole": elapsed})
            if not args.json:
                print(
                    f"repeat {repeat + 1}/{args.repeats}: "
                    + ", ".join(f"{name} {values[-1]:.1f} s" for name, values in seconds.items())
                    + f", split {elapsed:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    median = {name: statistics.median(values) for name, values in seconds.items()}
    split = {part: statistics.median(row[part] for row in splits) for part in splits[0]}
    check = distribution(
        *(np.asarray(outputs[name]["best_arm_probability_final"]) for name in ("jax", "numpy")), winners_only
    )
    summary = {
        "num_seeds": args.num_seeds,
        "repeats": args.repeats,
        "seconds": seconds,
        "median": median,
        "ratio_numpy_over_jax": {name: median["numpy"] / median[name] for name in median if name != "numpy"},
        "ten_times_numpy_seconds": median["numpy"] / 10,
        "jax_split_median": split,
        "distribution": check,
    }
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{args.num_seeds} seeds, median of {args.repeats} whole processes ({' '.join(jax_run[1:])}):")
    for name, label in (
        ("jax", "JAX, no compilation cache"),
        ("jax_cached", "JAX, warm compilation cache"),
        ("numpy", "NumPy, bandit_numpy.py"),
        ("import_jax", "python -c 'import jax'"),
        ("baseline", f"{args.baseline}, no cache"),
        ("baseline_cached", f"{args.baseline}, warm cache"),
    ):
        if name in median:
            ratio = "" if name == "numpy" else f"   NumPy / this: {summary['ratio_numpy_over_jax'][name]:.2f}x"
            print(f"  {label:<28} {median[name]:6.2f} s{ratio}")
    print(f"  (10x the NumPy peer would be {summary['ten_times_numpy_seconds']:.2f} s)")
    print(
        f"JAX split (median over the split processes, whole {split['whole']:.2f} s): "
        + ", ".join(f"{part} {split[part]:.2f} s" for part in ("startup", "import", "trace", "compile", "run", "rest"))
    )
    print(f"\nfinal P(best arm)   {'JAX':>10} {'NumPy':>10}")
    for row in ("mean", "q10", "q50", "q90", "winners_only_fraction"):
        print(f"  {row:<22}{check['jax'][row]:>10.6f} {check['numpy'][row]:>10.6f}")
    print(
        f"  (winners-only value {winners_only:.8f}); KS D = {check['ks_statistic']:.4f}, p = "
        f"{check['ks_p_value']:.3f} (values to 1e-{RESOLUTION_DECIMALS}): "
        f"{'agree' if check['agree'] else 'DISAGREE'} at the 5% level"
    )


if __name__ == "__main__":
    main()

"""Pool capacity N on Sokoban: how staleness grows with N, and what it does to learning and to each update's KL.

One compiled sweep over N × seeds (the other settings are Sokoban's defaults). Per update it keeps the pool's
and the elites' staleness (policy versions between the current policy and the one that played), the
elites' importance-weight ESS and the trust-region monitor's KL(π_old ‖ π_new); it prints a markdown table and
writes three PNGs (held-out success, per-update KL, elite staleness).
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

from ftw_jax.lab.sweep import make_sweep, parse_grid, run_sweep
from ftw_jax.running import threefry
from ftw_jax.running.plots import save_learning_curves

threefry.use_unrolled()

METRICS = ("policy_kl_mean", "pool_staleness_mean", "elite_staleness_mean", "elite_ess_fraction", "ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pool-capacities", default="128,256,512,1024")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--env-options", default="", help="e.g. reward=binary")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/pool_staleness"))
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    env_options = dict(item.split("=") for item in args.env_options.split(",") if item)
    sweep = make_sweep(
        "sokoban",
        parse_grid(f"N={args.pool_capacities}"),
        seeds,
        env_options,
        num_iterations=args.iterations,
        eval_every=args.eval_every,
    )

    def progress(period, row):
        print(
            f"  iteration {(period + 1) * args.eval_every}/{args.iterations}: held-out success "
            f"{row['success'].mean():.1%} (mean of {len(sweep.members)} members)",
            flush=True,
        )

    results = run_sweep(sweep, progress, metric_names=METRICS)
    capacities = sweep.grid["N"]
    by_capacity = {n: [i for i, m in enumerate(sweep.members) if m["N"] == n] for n in capacities}

    def mean_over_updates(name: str, members: list[int]) -> float:
        """The metric averaged over the updates that ran (pool ready), then over seeds."""
        values, ready = results[f"metrics/{name}"][members], results["metrics/ready"][members].astype(bool)
        return float(np.mean([row[mask].mean() for row, mask in zip(values, ready)]))

    print(
        f"\nSokoban ({env_options or 'shaped'}), {args.iterations} iterations, seeds {seeds}; "
        "averages over the updates that ran\n"
    )
    print(
        "| N | held-out success (mean ± sd) | AUC | pool staleness | elite staleness | elite ESS fraction "
        "| KL(π_old ‖ π_new) per update |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, members in by_capacity.items():
        final = results["success"][members, -1]
        print(
            f"| {n} | {final.mean():.1%} ± {final.std():.1%} | {results['success'][members].mean():.1%} "
            f"| {mean_over_updates('pool_staleness_mean', members):.1f} "
            f"| {mean_over_updates('elite_staleness_mean', members):.1f} "
            f"| {mean_over_updates('elite_ess_fraction', members):.3f} "
            f"| {mean_over_updates('policy_kl_mean', members):.2e} |"
        )

    args.out.mkdir(parents=True, exist_ok=True)
    labels = [f"N = {n}" for n in capacities]
    mean_of = lambda array: np.stack([array[m].mean(axis=0) for m in by_capacity.values()])  # noqa: E731
    paths = [
        save_learning_curves(
            args.out / "success.png",
            mean_of(results["success"]),
            labels,
            x=mean_of(results["env_steps"]),
            xlabel="env steps per seed",
            ylabel="held-out success",
            title=f"Sokoban: pool capacity N (mean of {len(seeds)} seeds)",
            show_mean=False,
        ),
        save_learning_curves(
            args.out / "kl.png",
            mean_of(results["metrics/policy_kl_mean"]),
            labels,
            ylabel="KL(π_old ‖ π_new), last update",
            title="per-update policy change",
            show_mean=False,
        ),
        save_learning_curves(
            args.out / "staleness.png",
            mean_of(results["metrics/elite_staleness_mean"]),
            labels,
            ylabel="mean elite staleness (versions)",
            title="how old the imitated data is",
            show_mean=False,
        ),
    ]
    print("\n" + "\n".join(str(path) for path in paths))


if __name__ == "__main__":
    main()

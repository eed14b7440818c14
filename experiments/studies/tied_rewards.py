"""Binary-reward Sokoban: how many kept elites are failures (measured vs E[max(0, K−S)]/K), and the tie-aware rule.

For each elite rule ("top_k", "beat_minimum") one compiled sweep over C × K × seeds. Per update it records
the share of kept elites that failed (binary return 0) and the pool's successes, from which the
prediction for top-K selection is E[max(0, K − S)] / K with S ~ Hypergeometric(pool size, successes, C)
(`ftw_jax.expected_failure_share`), averaged over the same updates as the measurement.
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

import ftw_jax
from ftw_jax.lab.sweep import make_sweep, parse_grid, run_sweep
from ftw_jax.running import threefry
from ftw_jax.running.plots import save_learning_curves

threefry.use_unrolled()


def run_rule(rule: str, grid: str, seeds: list[int], iterations: int, eval_every: int) -> list[dict]:
    sweep = make_sweep(
        "sokoban",
        parse_grid(grid),
        seeds,
        {"reward": "binary"},
        num_iterations=iterations,
        eval_every=eval_every,
        elite_rule=rule,
    )

    def progress(period, row):
        print(
            f"  {rule}: iteration {(period + 1) * eval_every}/{iterations}, mean held-out success "
            f"{row['success'].mean():.1%}",
            flush=True,
        )

    names = ("elite_return_mean", "pool_return_mean", "pool_filled", "kept_fraction", "ready")
    results = run_sweep(sweep, progress, metric_names=names)
    metrics = {name: results[f"metrics/{name}"] for name in names}  # [M, iterations]
    rows = []
    for index, member in enumerate(sweep.members):
        ready = metrics["ready"][index].astype(bool)
        pool_filled = metrics["pool_filled"][index][ready]
        successes = np.rint(metrics["pool_return_mean"][index][ready] * pool_filled).astype(int)
        predicted = [
            float(ftw_jax.expected_failure_share(int(n), int(m), member["C"], member["K"]))
            for n, m in zip(pool_filled, successes)
        ]
        rows.append(
            {
                "rule": rule,
                "C": member["C"],
                "K": member["K"],
                "seed": member["seed"],
                "final_success": float(results["success"][index, -1]),
                "success_curve": results["success"][index],
                "env_steps": results["env_steps"][index],
                "failure_share": float(np.mean(1.0 - metrics["elite_return_mean"][index][ready])),
                "predicted_top_k": float(np.mean(predicted)),
                "kept_fraction": float(np.mean(metrics["kept_fraction"][index][ready])),
                "pool_success": float(np.mean(metrics["pool_return_mean"][index][ready])),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grid", default="C=4,5 K=1,3", help="C and K axes (default 'C=4,5 K=1,3')")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--rules", default="top_k,beat_minimum")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/tied_rewards"))
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    rows = [
        row
        for rule in args.rules.split(",")
        for row in run_rule(rule, args.grid, seeds, args.iterations, args.eval_every)
    ]

    print(
        f"\nbinary Sokoban, {args.iterations} iterations, seeds {seeds}; failure share = kept elites that failed, "
        "averaged over updates (prediction: top-K selection from the pool's successes at each update)\n"
    )
    print(
        "| rule | C | K | held-out success (mean ± sd) | failure share of kept elites | predicted for top-K "
        "| kept fraction | pool success rate |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["rule"], row["C"], row["K"]), []).append(row)
    for (rule, c, k), group in groups.items():
        mean = lambda name: np.mean([row[name] for row in group])  # noqa: E731, B023 (used in this iteration)
        spread = np.std([row["final_success"] for row in group])
        print(
            f"| {rule} | {c} | {k} | {mean('final_success'):.1%} ± {spread:.1%} | {mean('failure_share'):.3f} "
            f"| {mean('predicted_top_k'):.3f} | {mean('kept_fraction'):.3f} | {mean('pool_success'):.3f} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    labels = [f"{rule} C={c} K={k}" for rule, c, k in groups]
    curves = np.stack([np.mean([row["success_curve"] for row in group], axis=0) for group in groups.values()])
    steps = np.stack([np.mean([row["env_steps"] for row in group], axis=0) for group in groups.values()])
    path = save_learning_curves(
        args.out / "success.png",
        curves,
        labels,
        x=steps,
        xlabel="env steps per seed",
        ylabel="held-out success",
        title=f"binary Sokoban, mean of {len(seeds)} seeds",
        show_mean=False,
    )
    print(f"\nlearning curves: {path}")


if __name__ == "__main__":
    main()

"""Probe-based task filtering on Sokoban: held-out success against env steps (probes included), with and without.

Two programs (no filtering; `probe_tasks` M with `probes_per_task` n), each with its seeds in one vmap, the
other settings Sokoban's defaults. Prints a markdown table (final success, AUC, env steps of which probes,
share of probed tasks kept) and writes a PNG of the learning curves against env steps.
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

from ftw_jax.lab.sweep import make_sweep, run_sweep
from ftw_jax.lab.train import TrainConfig
from ftw_jax.running import threefry
from ftw_jax.running.plots import save_learning_curves

threefry.use_unrolled()


def run(name: str, seeds: list[int], env_options: dict, **overrides) -> dict:
    """Evaluation curves [S, periods] of one variant (its seeds as one sweep over the default learning rate)."""
    sweep = make_sweep(
        "sokoban", {"lr": [TrainConfig.for_env("sokoban").learning_rate]}, seeds, env_options, **overrides
    )

    def progress(period, row):
        print(
            f"  {name}: iteration {(period + 1) * sweep.config.eval_every}/{sweep.config.num_iterations}, "
            f"held-out success {row['success'].mean():.1%}",
            flush=True,
        )

    return run_sweep(sweep, progress)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--probe-tasks", type=int, default=64, help="M candidate tasks per evaluation period")
    parser.add_argument("--probes-per-task", type=int, default=4, help="n probes per task")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--env-options", default="reward=binary")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/task_filtering"))
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    env_options = dict(item.split("=") for item in args.env_options.split(",") if item)
    budget = dict(num_iterations=args.iterations, eval_every=args.eval_every)
    filtering = dict(probe_tasks=args.probe_tasks, probes_per_task=args.probes_per_task)
    results = {
        "no filtering": run("no filtering", seeds, env_options, **budget),
        f"filtering (M={args.probe_tasks}, n={args.probes_per_task})": run(
            "filtering", seeds, env_options, **budget, **filtering
        ),
    }

    print(f"\nSokoban ({env_options or 'shaped'}), FTW defaults, {args.iterations} iterations, seeds {seeds}\n")
    print("| variant | held-out success (mean ± sd) | AUC | env steps / seed | of which probes | probed tasks kept |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, result in results.items():
        final = result["success"][:, -1]
        probes = result["probe_env_steps"].sum(axis=1).mean() if "probe_env_steps" in result else 0
        kept = f"{result['informative_tasks'].mean():.1%}" if "informative_tasks" in result else "-"
        print(
            f"| {name} | {final.mean():.1%} ± {final.std():.1%} | {result['success'].mean():.1%} "
            f"| {result['env_steps'][:, -1].mean():,.0f} | {probes:,.0f} | {kept} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = save_learning_curves(
        args.out / "success.png",
        np.stack([r["success"].mean(axis=0) for r in results.values()]),
        list(results),
        x=np.stack([r["env_steps"].mean(axis=0) for r in results.values()]),
        xlabel="env steps per seed (probes included)",
        ylabel="held-out success",
        title=f"Sokoban: task filtering (mean of {len(seeds)} seeds)",
        show_mean=False,
    )
    print(f"\nlearning curves: {path}")


if __name__ == "__main__":
    main()

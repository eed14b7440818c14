"""The `ftw-jax` command."""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

import numpy as np

DEFAULT_SEEDS = (42, 43, 44)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one integer, got {text!r}")
    return values


def _float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_bandit_arguments(parser: argparse.ArgumentParser) -> None:
    """The bandit protocol's options (shared with experiments/bandit.py)."""
    from ftw_jax.bandit import BanditConfig

    defaults = BanditConfig()
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=_int_list, help="comma-separated seeds (default 42,43,44)")
    seeds.add_argument("--num-seeds", type=_positive_int, help="run seeds 42, 43, ..., 42 + N - 1")
    parser.add_argument("--arm-means", type=_float_list, default=defaults.arm_means, help="default 1.0,0.3")
    parser.add_argument("--noise-sd", type=float, default=defaults.noise_sd)
    parser.add_argument("--iterations", type=int, default=defaults.num_iterations, help="pulls (one per iteration)")
    parser.add_argument("--pool-capacity", "-N", type=int, default=defaults.pool_capacity)
    parser.add_argument("--batch-size", "-C", type=int, default=defaults.batch_size)
    parser.add_argument("--num-elites", "-K", type=int, default=defaults.num_elites)
    parser.add_argument("--num-batches", "-J", type=int, default=defaults.num_batches)
    parser.add_argument("--kl-coef", type=float, default=defaults.kl_coef)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)


def bandit_seeds(args) -> list[int]:
    if args.seeds:
        return args.seeds
    return [DEFAULT_SEEDS[0] + i for i in range(args.num_seeds)] if args.num_seeds else list(DEFAULT_SEEDS)


def bandit_config(args):
    from ftw_jax.bandit import BanditConfig

    return BanditConfig(
        arm_means=args.arm_means,
        noise_sd=args.noise_sd,
        num_iterations=args.iterations,
        pool_capacity=args.pool_capacity,
        batch_size=args.batch_size,
        num_elites=args.num_elites,
        num_batches=args.num_batches,
        kl_coef=args.kl_coef,
        learning_rate=args.learning_rate,
    )


def _add_bandit_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bandit",
        help="reproduce the two-armed bandit result (the main job)",
        description="FTW on a Gaussian bandit, all seeds in one vmapped jit. Defaults are the paper's protocol.",
    )
    add_bandit_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/bandit"),
                        help="folder for the learning-curve PNG (default runs/bandit)")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.set_defaults(handler=_run_bandit)


def _run_bandit(args) -> int:
    from ftw_jax.bandit import run_seeds

    seeds = bandit_seeds(args)
    config = bandit_config(args)
    print(f"running {len(seeds)} seed(s) x {config.num_iterations} iterations in one jit...", file=sys.stderr)
    started = time.perf_counter()
    curves = run_seeds(config, seeds)
    best = np.asarray(curves["best_arm_probability"], dtype=np.float64)  # [S, I + 1]
    reward = np.asarray(curves["expected_reward"], dtype=np.float64)
    seconds = time.perf_counter() - started
    if not np.all(np.isfinite(best)):
        print("error: non-finite policy probabilities; the run is not trustworthy.", file=sys.stderr)
        return 1
    final = best[:, -1]
    result = {
        "seeds": seeds,
        "best_arm": config.best_arm,
        "best_arm_probability_initial": best[:, 0].tolist(),
        "best_arm_probability_final": final.tolist(),
        "expected_reward_final": reward[:, -1].tolist(),
        "best_arm_probability_final_mean": float(final.mean()),
        "updates_applied": np.asarray(curves["metrics"]["applied"]).sum(axis=1).tolist(),
        "seconds": seconds,
        "config": dataclasses.asdict(config),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print_bandit_table(seeds, best, reward)
    print(f"\n{len(seeds)} seed(s) in {seconds:.1f} s (compile included)")
    if not args.no_plot:
        from ftw_jax.plots import save_learning_curves

        path = save_learning_curves(
            args.out / "learning_curve.png", best, [f"seed {seed}" for seed in seeds],
            title=f"FTW bandit: best arm probability (C={config.batch_size}, K={config.num_elites}, "
            f"J={config.num_batches}, beta={config.kl_coef})",
            ylabel="P(best arm)",
        )
        print(f"learning curve: {path}")
    return 0


def print_bandit_table(seeds, best, reward, max_rows: int = 20) -> None:
    print(f"{'seed':>8}  {'P(best) initial':>15}  {'P(best) final':>13}  {'E[reward] final':>15}")
    for seed, curve, rewards in list(zip(seeds, best, reward))[:max_rows]:
        print(f"{seed:>8}  {curve[0]:>15.6f}  {curve[-1]:>13.6f}  {rewards[-1]:>15.6f}")
    if len(seeds) > max_rows:
        print(f"{'...':>8}  ({len(seeds) - max_rows} more seeds)")
    final = best[:, -1]
    print(f"{'mean':>8}  {best[:, 0].mean():>15.6f}  {final.mean():>13.6f}  {reward[:, -1].mean():>15.6f}")
    if len(seeds) > 1:
        quantiles = np.quantile(final, [0.0, 0.05, 0.25, 0.5, 0.75, 1.0])
        at_max = np.mean(final >= final.max() - 1e-6)
        print("\nfinal P(best) over seeds: sd {:.6f}; min {:.6f}, 5% {:.6f}, 25% {:.6f}, median {:.6f}, "
              "75% {:.6f}, max {:.6f}".format(final.std(), *quantiles))
        print(f"share of seeds within 1e-6 of the max: {at_max:.1%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftw-jax", description="Follow the Winners (FTW) in JAX.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_bandit_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

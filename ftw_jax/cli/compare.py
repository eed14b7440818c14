"""`ftw-jax compare`: FTW and the baselines at a matched budget and matched tuning; curves, tables, statistics."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ftw_jax.cli import outputs
from ftw_jax.cli.flags import (
    Session,
    add_env,
    add_run_folder_arguments,
    add_seeds,
    add_settings,
    checkpoint_settings,
    given_settings,
    logger,
    one_seed,
    open_run_folder,
    positive_int,
    rate_list,
    seed_list,
    seeds_of,
    training_settings,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from ftw_jax.algos import ALGORITHMS

    parser = subparsers.add_parser(
        "compare",
        help="FTW and the baselines (PPO, GRPO, REINFORCE) at a matched budget: curves with CIs, a table",
        description="Every algorithm runs the environment's defaults with the same overrides (same iterations x "
        "episodes, policy network, optimizer, evaluation) and the same tuning on the --tuning-seeds, keeping the "
        "best mean AUC: every learning rate of --learning-rates, or --search N configurations drawn from each "
        "algorithm's space (ftw_jax.lab.tuning). Each algorithm takes the flags that are its settings. Writes "
        "table.md, results.csv, differences.csv, seeds.csv, tuning.csv and tuning.md, curves.npz and curves against "
        "episodes, env steps and gradient steps.",
    )
    add_env(parser)
    parser.add_argument(
        "--algos", default=",".join(ALGORITHMS), help=f"comma-separated, from {','.join(ALGORITHMS)} (default: all)"
    )
    add_seeds(parser, count=5)
    _add_tuning_arguments(parser)
    add_settings(
        parser,
        [item for item in training_settings() if item.name not in ("algorithm", "learning_rate")],
        env_defaults=True,
    )
    parser.add_argument(
        "--metric",
        choices=["return", "success"],
        default=None,
        help="what the curves and table report (default: success where defined, else return)",
    )
    add_run_folder_arguments(parser)
    parser.set_defaults(handler=run)


def _add_tuning_arguments(parser) -> None:
    """How each algorithm's settings are chosen: a learning-rate grid or a random search, with successive halving."""
    parser.add_argument(
        "--learning-rates",
        type=rate_list,
        default=None,
        help="the tuning grid (default: the environment's learning rate alone, no tuning); with --search, the "
        "rates it draws from (default: ftw_jax.lab.tuning.LEARNING_RATES, the half-decades 1e-4...1e-1)",
    )
    parser.add_argument(
        "--search",
        type=positive_int,
        default=0,
        help="tune by random search: this many configurations per algorithm from its space "
        "(learning rate, beta and its horizon, its own knobs), and its reference recipe at the environment's "
        "learning rate beside them (default: off)",
    )
    parser.add_argument("--search-seed", type=one_seed, default=0, help="the seed that draws the configurations")
    parser.add_argument(
        "--tuning-iterations",
        type=positive_int,
        default=None,
        help="iterations of each tuning run (default: those of the reported runs)",
    )
    parser.add_argument(
        "--rungs",
        type=positive_int,
        default=1,
        help="successive halving of --search: every configuration runs the first rung, the better half by mean AUC "
        "so far goes on to the next, the last reaching the tuning horizon; rung r of R ends at 1/2^(R-r) of it, "
        "schedules on the whole (default 1: every configuration runs it whole)",
    )
    parser.add_argument(
        "--tuning-seeds",
        type=seed_list,
        default=None,
        help="seeds that choose the settings (default 1000,1001,1002 with --search; 1000,1001 "
        "when the grid has several learning rates)",
    )


def run(args: argparse.Namespace, session: Session) -> int:
    from ftw_jax.lab.compare import PhasePeriod, compare
    from ftw_jax.running import run_files

    seeds = seeds_of(args)
    search = {
        "search": args.search,
        "search_seed": args.search_seed,
        "tuning_iterations": args.tuning_iterations,
        **({"rungs": args.rungs} if args.rungs != 1 else {}),  # absent from the runs made before it existed
    }
    fingerprint = _fingerprint(args, seeds, search)
    # Each algorithm's phases checkpoint in folders of their own below the run's, at the same cadence.
    checkpoints = checkpoint_settings(args)
    folder = open_run_folder(args, session, f"compare-{args.env}", fingerprint)
    log = logger(args)
    log(f"comparing {', '.join(fingerprint['algorithms'])} on {args.env} over seeds {seeds}; run folder {folder}")
    started = time.perf_counter()
    board = outputs.event_writer(args, folder, log, [], None)

    def progress(period: PhasePeriod) -> None:
        values, skipped = period.evaluation[period.metric], period.skipped
        log(
            f"{period.algorithm:>10} {period.phase:>6}  period {period.period + 1:>3}  eval mean {values.mean():8.3f} "
            f"(min {values.min():.3f}, max {values.max():.3f})  skipped {skipped[0]:,}/{skipped[1]:,}"
            f"  {time.perf_counter() - started:7.1f} s"
        )
        if board:
            outputs.phase_events(board, period)

    try:
        comparison = compare(
            args.env,
            fingerprint["algorithms"],
            seeds,
            learning_rates=fingerprint["learning_rates"],
            tuning_seeds=fingerprint["tuning_seeds"],
            **search,
            env_options=args.env_options,
            overrides=fingerprint["overrides"],
            metric=args.metric,
            checkpoint_folder=folder / "checkpoints",
            checkpoints=checkpoints,
            on_period=progress,
            log=log,
            provenance=session.provenance(),
        )
    finally:
        if board:
            board.close()
    options = ", ".join(f"{name}={value}" for name, value in args.env_options.items())
    title = f"{args.env}{f' ({options})' if options else ''}: mean of {len(seeds)} seeds, 95% bootstrap CI"
    table = outputs.save_comparison(folder, comparison, title)
    summary = _summary(args, comparison, fingerprint, search, time.perf_counter() - started, folder)
    summary["provenance"] = session.provenance()
    if summary["warning"]:
        log(summary["warning"])
    run_files.write_json(folder / "summary.json", summary)
    if args.json:
        print(json.dumps(summary))
    else:
        outputs.print_comparison(table, summary)
    return 0


def _fingerprint(args, seeds: list[int], search: dict) -> dict:
    """What the comparison is: its algorithms, seeds, tuning and settings (a resume must give the same)."""
    learning_rates = list(args.learning_rates) if args.learning_rates else None
    tuned = args.search or (learning_rates and len(learning_rates) > 1)
    return {
        "algorithms": [name.strip() for name in args.algos.split(",") if name.strip()],
        "seeds": seeds,
        "learning_rates": learning_rates,
        "tuning_seeds": args.tuning_seeds or ([1000, 1001, 1002] if args.search else [1000, 1001] if tuned else []),
        "overrides": given_settings(args, training_settings()),
        "env_options": args.env_options,
        "metric": args.metric,
        **({"search": search} if args.search or args.tuning_iterations else {}),
    }


def _summary(args, comparison, fingerprint: dict, search: dict, seconds: float, folder) -> dict:
    """summary.json: the table's rows, the differences, the tuning and the updates of every algorithm."""
    from ftw_jax.lab.comparison_tables import difference_rows, summary_rows, updates_per_algorithm

    seeds = fingerprint["seeds"]
    return {
        "env": args.env,
        "metric": comparison.metric,
        "seeds": seeds,
        "env_options": args.env_options,
        "overrides": fingerprint["overrides"],
        "seconds": seconds,
        "run_folder": str(folder),
        "algorithms": summary_rows(comparison),
        "differences": difference_rows(comparison),
        "tuning_seeds": fingerprint["tuning_seeds"],
        **search,
        "chosen": {r.algorithm: r.settings for r in comparison.results},
        "tuning": {r.algorithm: r.tuning for r in comparison.results},
        "updates": updates_per_algorithm(comparison),
        "warning": outputs.applied_warning(
            np.concatenate([r.applied_share for r in comparison.results]),
            [f"{r.algorithm} seed {s}" for r in comparison.results for s in seeds],
        ),
    }

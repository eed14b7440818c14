"""`ftw-jax sweep`: a grid of settings x seeds as the members of one compiled program, over devices and hosts."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time

import numpy as np

from ftw_jax.cli import outputs
from ftw_jax.cli.cluster import add_cluster_arguments, native_output_to_stderr, start_processes
from ftw_jax.cli.flags import (
    Session,
    add_env,
    add_run_folder_arguments,
    add_seeds,
    add_settings,
    default_metric,
    logger,
    open_checkpointed_run,
    seeds_of,
    train_overrides,
    training_settings,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from ftw_jax.lab.sweep import all_axes

    parser = subparsers.add_parser(
        "sweep",
        help="run a grid of N, J, C, K, beta, learning rate x seeds as one compiled program",
        description="Every grid point and seed is one member of one jitted program (vmapped; looped on a single CPU "
        "device), sharded over the visible devices. Settings not in the grid keep the environment's defaults or "
        "the flags' values.",
    )
    add_env(parser)
    parser.add_argument(
        "--grid", required=True, help=f"e.g. 'C=4,5,8 K=1,2,3 kl=0.01,0.05' (axes: {' '.join(all_axes())})"
    )
    add_seeds(parser)
    add_settings(parser, training_settings(), env_defaults=True)
    parser.add_argument(
        "--metric",
        choices=["return", "success"],
        default=None,
        help="final metric of the table and heatmap (default: success where defined, else return)",
    )
    parser.add_argument("--heatmap", default=None, help="two grid axes, e.g. 'C,K' (default: the grid's first two)")
    add_run_folder_arguments(parser)
    add_cluster_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, session: Session) -> int:
    import jax

    from ftw_jax.lab.sweep import make_sweep, parse_grid
    from ftw_jax.running import run_files

    grid = parse_grid(args.grid)
    seeds = seeds_of(args)
    heatmap_axes = args.heatmap.split(",") if args.heatmap else list(grid)[:2]
    if len(heatmap_axes) not in (1, 2) or any(axis not in grid for axis in heatmap_axes):
        raise ValueError(f"--heatmap must name one or two grid axes among {list(grid)}, got {args.heatmap!r}.")
    sweep = make_sweep(args.env, grid, seeds, args.env_options, **train_overrides(args, logger(args)))
    with native_output_to_stderr() if args.json else contextlib.nullcontext():
        start_processes(args)
        run, metric, folder, started = _run_members(args, session, sweep, seeds)
        results = run.results()  # gathers from every process: all of them must take part
    if jax.process_index() != 0:  # the main process writes the files and prints
        return 0
    if not np.all(np.isfinite(results["return"])):
        logger(args)("warning: some members' evaluation returns are not finite (see results.csv).")
    summary = outputs.save_sweep(args.env, sweep, seeds, results, folder, metric, heatmap_axes)
    applied_share = results["updates_applied_share"]
    summary.update(
        updates_applied=results["updates_applied"][:, -1].tolist(),  # per member, in the order of results.csv
        **{name: counts.tolist() for name, counts in run.updates_skipped().items()},
        updates_applied_share=applied_share.tolist(),
        warning=outputs.applied_warning(applied_share, run.labels),
        seconds=time.perf_counter() - started,
        compile_seconds=run.compile_seconds,
        env_steps_per_second=run.throughput(),
        devices=jax.device_count(),
        processes=jax.process_count(),
        provenance=session.provenance(),
    )
    if summary["warning"]:
        print(summary["warning"], file=sys.stderr)
    run_files.write_json(folder / "summary.json", summary)
    if args.json:
        print(json.dumps(summary))
    else:
        outputs.print_sweep_table(summary)
    return 0


def _run_members(args, session: Session, sweep, seeds: list[int]):
    """Runs the sweep's members in the run folder, process 0 logging each period; (run, metric, folder, the
    clock's start: after the processes joined and the folder opened, before the members' state is made)."""
    import jax

    from ftw_jax.lab.train import make_train
    from ftw_jax.running.loop import MemberRun

    trainer = make_train(sweep.config, **sweep.env_options)
    metric = default_metric(args, trainer.env)
    main_process = jax.process_index() == 0  # the one that writes files and prints
    fingerprint = {"grid": sweep.grid, "seeds": seeds, "env_options": sweep.env_options}
    folder, checkpointer = open_checkpointed_run(
        args,
        session,
        f"sweep-{args.env}",
        {**fingerprint, "maxima": dataclasses.asdict(sweep.config)},
        writer=main_process,
    )
    log = logger(args) if main_process else (lambda message: None)
    log(
        f"sweep {args.env}: {len(sweep.members)} members ({len(sweep.members) // len(seeds)} grid points x "
        f"{len(seeds)} seeds) in one program on {jax.device_count()} device(s) in {jax.process_count()} "
        f"process(es); run folder {folder}"
    )
    axes = list(sweep.grid)
    labels = [", ".join([*(f"{axis}={m[axis]}" for axis in axes), f"seed {m['seed']}"]) for m in sweep.members]
    runs = [outputs.member_run(member, [*axes, "seed"]) for member in sweep.members]
    started, board = time.perf_counter(), None
    try:
        run = MemberRun(trainer, sweep.keys(), sweep.hyperparameters(), checkpointer, labels=labels)
        board = outputs.event_writer(args, folder, log, runs, run) if main_process else None
        for metrics, evaluation in run.periods():
            if board:
                board.period(runs, metrics, evaluation)
            values = evaluation[metric]
            log(
                f"iteration {evaluation['iteration'][0]:>5}/{sweep.config.num_iterations}  eval {metric} mean "
                f"{values.mean():9.3f} (min {values.min():.3f}, max {values.max():.3f})  {outputs.skipped_text(run)}"
                f"  {time.perf_counter() - started:7.1f} s"
            )
    finally:  # waits for the checkpoint writes in flight
        if checkpointer:
            checkpointer.close()
        if board:
            board.close()
    return run, metric, folder, started

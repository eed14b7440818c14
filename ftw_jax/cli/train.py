"""`ftw-jax train`: FTW (or a baseline) on one environment, all seeds in one jitted program, in a run folder."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import sys
import time

import numpy as np

from ftw_jax.cli import outputs
from ftw_jax.cli.flags import (
    Session,
    add_env,
    add_run_folder_arguments,
    add_seeds,
    add_settings,
    given_settings,
    logger,
    note_other_algorithms,
    open_checkpointed_run,
    seeds_of,
    training_settings,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train FTW (or a baseline) on an environment (all seeds in one jitted program)",
        description="Every option defaults to a setting that trains on a 2-core CPU (ftw_jax.envs.ENVIRONMENTS).",
    )
    add_env(parser)
    add_seeds(parser)
    add_settings(parser, training_settings(), env_defaults=True)
    add_run_folder_arguments(parser)
    parser.add_argument("--no-plot", action="store_true", help="do not write the learning-curve PNG")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, session: Session) -> int:
    from ftw_jax.algos.defaults import DEFAULT_ALGORITHM
    from ftw_jax.lab.train import TrainConfig, make_train
    from ftw_jax.running import run_files
    from ftw_jax.running.loop import MemberRun, seed_keys

    log = logger(args)
    seeds = seeds_of(args)
    given = given_settings(args, training_settings())
    algorithm = given.get("algorithm", DEFAULT_ALGORITHM)
    config = TrainConfig.for_env(args.env, on_other_algorithms=note_other_algorithms(algorithm, log), **given)
    trainer = make_train(config, **args.env_options)
    folder, checkpointer = open_checkpointed_run(
        args, session, args.env, {"seeds": seeds, "env_options": args.env_options, **dataclasses.asdict(config)}
    )
    log(f"training {args.env} for {config.num_iterations} iterations x {len(seeds)} seed(s); run folder {folder}")
    started, board, runs = time.perf_counter(), None, [f"seed_{seed}" for seed in seeds]  # a TensorBoard run each
    try:
        run = MemberRun(trainer, seed_keys(seeds), checkpointer=checkpointer, labels=[f"seed {s}" for s in seeds])
        board = outputs.event_writer(args, folder, log, runs, run)
        if run.periods_done_before:
            log(f"resumed from the checkpoint after iteration {run.periods_done_before * config.eval_every}")
        done = run.periods_done_before * config.eval_every
        for log_file, every in (("metrics.jsonl", 1), ("evaluation.jsonl", config.eval_every)):
            # rows written after that checkpoint come again; those it counts must all be there
            run_files.keep_rows_up_to(folder / log_file, done, list(range(every, done + 1, every)), seeds)
        start = _starting_evaluation(trainer, run, seeds, folder, log) if config.warm_start_demonstrations else None
        to_board = functools.partial(board.period, runs) if board else None
        if not _train(run, config, seeds, folder, log, trainer.env.has_success, to_board):
            return 1
    finally:  # waits for the checkpoint writes in flight
        if checkpointer:
            checkpointer.close()
        if board:
            board.close()
    seconds = time.perf_counter() - started
    summary = outputs.train_summary(
        args.env, args.env_options, config, seeds, run, folder, seconds, trainer.env.has_success
    )
    if start is not None:
        summary["start"] = start
    summary["provenance"] = session.provenance()
    run_files.write_json(folder / "summary.json", summary)
    if summary["warning"]:
        print(summary["warning"], file=sys.stderr)
    if not args.no_plot:
        title = f"{config.algorithm.upper()} on {args.env}: evaluation return"
        outputs.save_train_curve(folder, title, seeds, run, start)
    if args.json:
        print(json.dumps(summary))
        return 0
    outputs.print_train_table(summary, seeds)
    print(
        f"\n{summary['seconds']:.1f} s ({run.compile_seconds:.1f} s compiling), "
        f"{summary['env_steps_per_second'] or 0:,.0f} env steps/s (all seeds, training steps, compile excluded); "
        f"run folder {folder}"
    )
    return 0


def _train(run, config, seeds: list[int], folder: pathlib.Path, log, has_success: bool, to_board) -> bool:
    """Runs the periods left, logging each (and giving its rows `to_board`, unless None); False when an
    evaluation return is not finite."""
    for metrics, evaluation in run.periods():
        if len(run.clock) == 1:
            log(f"compiled in {run.compile_seconds:.1f} s")
        metrics = outputs.write_period_logs(folder, metrics, evaluation, seeds, config.eval_every)
        if to_board:
            to_board(metrics, evaluation)
        success = f"  eval success {evaluation['success'].mean():6.1%}" if has_success else ""
        log(
            f"iteration {evaluation['iteration'][0]:>5}/{config.num_iterations}  env steps {run.clock[-1][1]:>10,}"
            f"  train return {metrics['return_mean'][:, -1].mean():9.3f}"
            f"  eval return {evaluation['return'].mean():9.3f}"
            f"{success}  {outputs.skipped_text(run)}  {run.throughput():9,.0f} env steps/s"
        )
        if not np.all(np.isfinite(evaluation["return"])):
            log("error: non-finite evaluation return; stopping (the run folder keeps what was done).")
            return False
    return True


def _starting_evaluation(trainer, run, seeds: list[int], folder: pathlib.Path, log) -> dict:
    """The evaluation of each seed's starting policy (after its warm start), before any update: computed on a fresh
    run and kept in start.json for a resumed one. {"return": [S], "success": [S]}, and with --eval-greedy the
    most likely actions' "greedy_return" and "greedy_success"."""
    import jax

    from ftw_jax.running import run_files
    from ftw_jax.running.loop import seed_keys

    path = folder / "start.json"
    if run.periods_done_before and path.exists():
        return run_files.read_json(path)
    if run.periods_done_before:  # a run started before start.json was written: its start is gone
        return {}
    keys = jax.vmap(lambda key: jax.random.fold_in(key, 1))(seed_keys(seeds))  # not a key the run itself draws
    evaluation = run.starting_evaluation(keys)
    names = ("return", "success", "greedy_return", "greedy_success")
    start = {name: evaluation[name].tolist() for name in names if name in evaluation}
    run_files.write_json(path, start)
    success = ""
    if trainer.env.has_success:
        success = f", success {np.mean(start['success']):.1%}"
        if "greedy_success" in start:
            success += f" (greedy {np.mean(start['greedy_success']):.1%})"
    log(f"starting policy (after the warm start): eval return {np.mean(start['return']):.3f}{success}")
    return start

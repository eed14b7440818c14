"""`ftw-jax bandit`: the two-armed bandit result of the paper (the main job), all seeds in one vmapped jit."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import typing

import numpy as np

from ftw_jax.cli import outputs
from ftw_jax.cli.flags import Session, add_seeds, add_settings, given_settings, seeds_of, training_settings

if typing.TYPE_CHECKING:
    from ftw_jax.envs import GaussianBandit
    from ftw_jax.lab.train import TrainConfig


def _protocol_settings():
    from ftw_jax.lab.reproduction import PROTOCOL_SETTINGS

    return [item for item in training_settings() if item.name in PROTOCOL_SETTINGS]


def add_bandit_arguments(parser: argparse.ArgumentParser) -> None:
    """The bandit protocol's options: its seeds, the bandit's and the training settings it reads
    (experiments/studies/bandit.py takes them too)."""
    from ftw_jax.core.settings import describe
    from ftw_jax.envs import GaussianBandit

    add_seeds(parser)
    add_settings(parser, describe(GaussianBandit))
    add_settings(parser, _protocol_settings(), env_defaults="bandit")


def bandit_protocol(args: argparse.Namespace) -> tuple[TrainConfig, GaussianBandit]:
    """(TrainConfig, GaussianBandit) of the bandit command's flags."""
    from ftw_jax.core.settings import describe
    from ftw_jax.envs import GaussianBandit
    from ftw_jax.lab.reproduction import protocol_config

    env = GaussianBandit(**given_settings(args, describe(GaussianBandit)))
    return protocol_config(**given_settings(args, _protocol_settings())), env


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bandit",
        help="reproduce the two-armed bandit result (the main job)",
        description="FTW on a Gaussian bandit, all seeds in one vmapped jit. Defaults are the paper's protocol.",
    )
    add_bandit_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path("runs/bandit"),
        help="folder for the learning-curve PNG (default runs/bandit)",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, session: Session) -> int:
    import jax

    from ftw_jax.lab.reproduction import seeds_program

    seeds = seeds_of(args)
    config, env = bandit_protocol(args)
    if not args.no_plot:  # before the work, not after it
        from ftw_jax.running.run_files import make_folder

        make_folder(args.out)
    print(f"running {len(seeds)} seed(s) x {config.num_iterations} iterations in one jit...", file=sys.stderr)
    started = time.perf_counter()
    program, seed_array = seeds_program(config, seeds, env, metric_names=("applied",))  # the one metric it reports
    compiled = time.perf_counter()
    curves = jax.block_until_ready(program(seed_array))
    running = time.perf_counter() - compiled
    best = np.asarray(curves["best_arm_probability"], dtype=np.float64)  # [S, I + 1]
    if not np.all(np.isfinite(best)):
        print("error: non-finite policy probabilities; the run is not trustworthy.", file=sys.stderr)
        return 1
    result = outputs.bandit_result(config, env, seeds, curves, time.perf_counter() - started)
    result.update(compile_seconds=compiled - started, seeds_per_second=len(seeds) / running)
    if result["warning"]:
        print(result["warning"], file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 0
    outputs.print_bandit_table(seeds, best, np.asarray(curves["expected_reward"], dtype=np.float64))
    print(
        f"\n{len(seeds)} seed(s) in {result['seconds']:.1f} s: {result['compile_seconds']:.1f} s tracing and "
        f"compiling, then {running * 1e3:.0f} ms running ({result['seeds_per_second']:,.0f} seeds/s, "
        f"{len(seeds) * config.num_iterations / running:,.0f} iterations/s)"
    )
    if not args.no_plot:
        print(f"learning curve: {outputs.save_bandit_curve(args.out, config, seeds, best)}")
    return 0

"""`ftw-jax lm`: the LLM-agent learner (`learn`, from an engine's episodes) and the text search agent (`train`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib

from ftw_jax.cli import outputs
from ftw_jax.cli import train as train_command
from ftw_jax.cli.cluster import add_cluster_arguments, native_output_to_stderr, start_processes
from ftw_jax.cli.flags import (
    Session,
    add_run_folder_arguments,
    add_seeds,
    add_settings,
    env_options,
    given_settings,
    logger,
    open_run,
    training_settings,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "lm",
        help="the LLM-agent learner: FTW from a rollout engine's episodes, or the text search agent in-process",
        description="FTW for language-model agents (docs/lm.md). `learn` reads episodes an engine wrote and writes "
        "versioned weights for it to reload (--model PATH: the Hugging Face checkpoint it starts from; "
        "--mesh and jax.distributed for several devices and hosts); `train` runs the text search "
        "agent's whole loop here, on a tiny fresh LM or on a checkpoint (--model PATH).",
    )
    commands = parser.add_subparsers(dest="lm_command", required=True, metavar="{learn,train}")
    _add_learn_parser(commands)
    _add_train_parser(commands)


def _add_learn_parser(commands) -> None:
    from ftw_jax.algos.ftw import FTWConfig
    from ftw_jax.core.settings import describe
    from ftw_jax.episode_learner import LearnConfig

    learn = commands.add_parser(
        "learn",
        help="FTW updates from episodes in a JSON Lines file; weights written as Hugging Face folders",
        description="Reads episodes (one JSON object per line: tokens, the spans the model wrote with their policy "
        "version and log-probs, the reward; schema in docs/lm.md), B at a time into the pool, each "
        "batch followed by U FTW updates, and writes RUN/weights/version-NNNNNN/ (model.safetensors, "
        "config.json, the tokenizer files) every --save-every iterations, RUN/weights/latest.json "
        "naming the newest.",
    )
    learn.add_argument(
        "--episodes",
        type=pathlib.Path,
        required=True,
        metavar="FILE.jsonl",
        help="the episodes, one JSON object per line",
    )
    learn.add_argument(
        "--model",
        type=pathlib.Path,
        required=True,
        metavar="PATH",
        help="a Hugging Face Llama/Qwen2 folder: the starting weights and the KL's reference",
    )
    learn.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="leave out lines that break the schema (each named) instead of refusing the file",
    )
    learn.add_argument(
        "--mesh",
        type=_mesh,
        default=None,
        metavar="DATAxMODEL",
        help="shard the weights over DATA x MODEL devices (of every process), e.g. 2x4: fully sharded "
        "data parallel over DATA, tensor parallel over MODEL (default: one device)",
    )
    add_settings(learn, [*describe(LearnConfig), *describe(FTWConfig)])
    add_run_folder_arguments(learn)
    add_cluster_arguments(learn)
    learn.set_defaults(handler=run_learn)


def _add_train_parser(commands) -> None:
    train = commands.add_parser(
        "train",
        help="the text search agent in-process: a warm start on demonstrations, then FTW (or a baseline)",
        description="`ftw-jax train --env text-search`: a tiny Qwen2-shaped LM fitted to the demonstrator's "
        "episodes (--warm-start-demonstrations), then trained by --algorithm on its own rollouts.",
    )
    add_seeds(train)
    train.add_argument(
        "--env-options",
        type=env_options,
        default={},
        help="options of the text search task, e.g. 'two_hop_fraction=1.0,guess_rate=0.8'",
    )
    add_settings(train, training_settings(), env_defaults="text-search")
    add_run_folder_arguments(train)
    train.add_argument("--no-plot", action="store_true", help="do not write the learning-curve PNG")
    train.set_defaults(handler=train_command.run, env="text-search")


def _mesh(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise argparse.ArgumentTypeError(f"expected DATAxMODEL with positive integers, e.g. 2x4, got {text!r}")
    return int(parts[0]), int(parts[1])


def run_learn(args: argparse.Namespace, session: Session) -> int:
    from ftw_jax.algos.ftw import FTWConfig
    from ftw_jax.core.settings import describe
    from ftw_jax.episode_learner import LearnConfig, learn_from_file

    own = given_settings(args, describe(LearnConfig))
    config = LearnConfig(**own, algorithm_config=FTWConfig(**given_settings(args, describe(FTWConfig))))
    fingerprint = {
        "episodes": str(args.episodes.resolve()),  # resolved: a resume may name them relative or absolute
        "model": str(args.model.resolve()),
        "skip_bad_lines": args.skip_bad_lines,
        "mesh": args.mesh,
        **dataclasses.asdict(config),
    }
    with native_output_to_stderr() if args.json else contextlib.nullcontext():
        start_processes(args)
        import jax

        main_process = jax.process_index() == 0  # the one that writes files and prints
        folder, checkpointer = open_run(args, session, "lm-learn", fingerprint, writer=main_process)
        report = outputs.LearnOutputs(
            folder,
            log=logger(args) if main_process else (lambda message: None),
            updates=config.algorithm_config.updates_per_iteration,
            writer=main_process,
        )
        try:
            summary = learn_from_file(
                config,
                args.episodes,
                args.model,
                folder,
                checkpointer,
                report,
                skip_bad_lines=args.skip_bad_lines,
                mesh=args.mesh,
            )
        finally:
            if checkpointer:
                checkpointer.close()
        report.finished(summary)
    if not main_process:
        return 0
    if args.json:
        print(json.dumps(summary))
    else:
        outputs.print_learn_summary(summary)
    return 0

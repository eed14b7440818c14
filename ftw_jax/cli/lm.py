"""`ftw-jax lm`: the LLM-agent learner (`learn`, from an engine's episodes) and the text search agent (`train`)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib
import typing

from ftw_jax.cli import outputs
from ftw_jax.cli import train as train_command
from ftw_jax.cli.cluster import add_cluster_arguments, native_output_to_stderr, start_processes
from ftw_jax.cli.flags import (
    Session,
    add_run_folder_arguments,
    add_seeds,
    add_settings,
    applicable_settings,
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
    from ftw_jax.agent.learner import LearnConfig
    from ftw_jax.core.settings import describe

    learn = commands.add_parser(
        "learn",
        help="FTW (or a baseline) updates from episodes in a JSON Lines file; weights written as Hugging Face folders",
        description="Reads episodes (one JSON object per line: tokens, the spans the model wrote with their policy "
        "version and log-probs, the reward, the prompt's group; schema in docs/lm.md), B at a time, each "
        "batch followed by --algorithm's updates (FTW: into the pool, then U updates; GRPO, REINFORCE (RLOO) "
        "and PPO as Search-R1 runs them), and writes RUN/weights/version-NNNNNN/ (model.safetensors, "
        "config.json, the tokenizer files) every --save-every iterations, RUN/weights/latest.json "
        "naming the newest.",
    )
    learn.add_argument(
        "--episodes",
        type=pathlib.Path,
        required=True,
        metavar="PATH",
        help="the episodes, one JSON object per line: a .jsonl file, or a folder of *.jsonl files (one per engine "
        "worker, each appended to by that worker alone), read in name order",
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
        help="leave out lines that break the schema (each named) instead of refusing the file; a --resume may "
        "turn it on, to go on past a torn line",
    )
    learn.add_argument(
        "--mesh",
        type=_mesh,
        default=None,
        metavar="DATAxMODEL",
        help="shard the weights over DATA x MODEL devices (of every process), e.g. 2x4: fully sharded "
        "data parallel over DATA, tensor parallel over MODEL (default: one device)",
    )
    add_settings(learn, describe(LearnConfig))
    add_settings(learn, _algorithm_settings(), defaults_here=_algorithm_defaults_shown(_learn_algorithm_defaults()))
    add_run_folder_arguments(learn)
    add_cluster_arguments(learn)
    learn.set_defaults(handler=run_learn)


def _algorithm_settings() -> list:
    """Every algorithm's settings, FTW's first (a name several declare is one flag)."""
    from ftw_jax import algos
    from ftw_jax.core.settings import describe

    return [item for entry in algos.ALGORITHMS.values() for item in describe(entry.config)]


def _algorithm_defaults_shown(table: dict[str, dict]) -> dict[str, str]:
    """{setting: its default for each algorithm that declares it, as the help shows it ("grpo 5, ppo 1")} where
    the command's `table` (algorithm -> its settings) differs from the configs' own defaults."""
    from ftw_jax import algos
    from ftw_jax.core.settings import describe

    declared = {
        name: {item.name: item.default for item in describe(entry.config)} for name, entry in algos.ALGORITHMS.items()
    }
    shown = {}
    for setting in {item.name for item in _algorithm_settings()}:
        if any(setting in table.get(name, {}) for name in declared):
            values = {
                name: table.get(name, {}).get(setting, own[setting]) for name, own in declared.items() if setting in own
            }
            shown[setting] = ", ".join(f"{name} {value}" for name, value in values.items())
    return shown


def algorithm_config(
    args: argparse.Namespace, algorithm: str, defaults: dict, log: typing.Callable[[str], None]
) -> object:
    """`algorithm`'s config: the command's defaults for it, then the flags given; the flags given that only other
    algorithms declare are named and left out."""
    from ftw_jax import algos

    given = applicable_settings(given_settings(args, _algorithm_settings()), algorithm, log)
    return algos.get(algorithm).config(**{**defaults.get(algorithm, {}), **given})


def _add_train_parser(commands) -> None:
    train = commands.add_parser(
        "train",
        help="an LLM agent's whole loop in-process: the text search agent, or retrieval QA in Search-R1's protocol",
        description="--task text-search (default): `ftw-jax train --env text-search`, a tiny Qwen2-shaped LM fitted "
        "to the demonstrator's episodes (--warm-start-demonstrations), then trained by --algorithm on its own "
        "rollouts. --task retrieval-qa: a Hugging Face checkpoint (--model PATH) answers Search-R1's questions "
        "(--questions, --test-questions) with a BM25 retriever over --corpus between its turns, trained by FTW on "
        "exact match; greedy test exact match every --eval-every iterations (docs/lm.md, Retrieval QA).",
    )
    train.add_argument(
        "--task", choices=("text-search", "retrieval-qa"), default="text-search", help="the task (default text-search)"
    )
    add_seeds(train)
    train.add_argument(
        "--env-options",
        type=env_options,
        default={},
        help="options of the text search task, e.g. 'two_hop_fraction=1.0,guess_rate=0.8'",
    )
    add_settings(train, training_settings(), env_defaults="text-search")
    _add_retrieval_arguments(train)
    add_run_folder_arguments(train)
    train.add_argument("--no-plot", action="store_true", help="do not write the learning-curve PNG")
    train.set_defaults(handler=_run_train, env="text-search")


def _retrieval_settings() -> list:
    """The settings `--task retrieval-qa` reads: its run's, the protocol's, the learner's (`lm learn`'s but what an
    in-process run sets itself) and every algorithm's."""
    from ftw_jax.agent.retrieval_qa.learner import RetrievalTrainConfig
    from ftw_jax.agent.retrieval_qa.task import RetrievalQASettings
    from ftw_jax.core.settings import describe

    return [
        *describe(RetrievalTrainConfig),
        *describe(RetrievalQASettings),
        *_learner_settings(),
        *_algorithm_settings(),
    ]


def _learner_settings() -> list:
    """`lm learn`'s settings that `--task retrieval-qa` takes: all but those an in-process run sets itself."""
    from ftw_jax.agent.learner import LearnConfig
    from ftw_jax.core.settings import describe

    return [item for item in describe(LearnConfig) if item.name not in _SET_BY_THE_RUN]


_SET_BY_THE_RUN = ("max_length", "follow", "idle_timeout", "poll_seconds")  # LearnConfig's, for `lm learn` alone
_RETRIEVAL_FILES = {
    "questions": "the training questions: Search-R1's train.parquet, or a FlashRAG-style .jsonl",
    "test_questions": "the questions test exact match is measured on (test.parquet or .jsonl)",
    "corpus": "the passages, JSON Lines of {id, contents: '\"Title\"\\ntext'} (e.g. wiki-18.jsonl)",
    "index": "the BM25 index folder (default: beside the corpus, CORPUS.bm25; built there the first time)",
    "demonstrations": "questions whose rows carry `demonstration` (the turns to imitate), fitted before FTW",
}


def _add_retrieval_arguments(train: argparse.ArgumentParser) -> None:
    from ftw_jax.agent.retrieval_qa.learner import LEARNER_DEFAULTS

    shown = {item.name: item.default for item in _retrieval_settings()}
    shown.update({**LEARNER_DEFAULTS, **_algorithm_defaults_shown(_retrieval_algorithm_defaults())})
    shared = {item.name: item.flag for item in training_settings()}
    group = train.add_argument_group(
        "retrieval-qa",
        "with --task retrieval-qa; flags above that it shares take these defaults: "
        + ", ".join(f"{flag} {shown[name]}" for name, flag in shared.items() if name in shown and name != "model"),
    )
    for name, help in _RETRIEVAL_FILES.items():
        group.add_argument(f"--{name.replace('_', '-')}", type=pathlib.Path, metavar="PATH", help=help)
    add_settings(group, [item for item in _retrieval_settings() if item.name not in shared], defaults_here=shown)


def _learn_algorithm_defaults() -> dict[str, dict]:
    """Each algorithm's settings in `lm learn` where they are not its config's own: FTW's monitor on fewer
    entries, the baselines as Search-R1 runs them."""
    from ftw_jax.algos.defaults import LM_FTW, SEARCH_R1

    return {"ftw": LM_FTW, **SEARCH_R1}


def _retrieval_algorithm_defaults() -> dict[str, dict]:
    """Each algorithm's settings in retrieval QA where they are not its config's own: FTW's `beat_minimum` on
    exact match, the baselines as Search-R1 runs them."""
    from ftw_jax.agent.retrieval_qa.learner import FTW_DEFAULTS
    from ftw_jax.algos.defaults import SEARCH_R1

    return {"ftw": FTW_DEFAULTS, **SEARCH_R1}


def _run_train(args: argparse.Namespace, session: Session) -> int:
    if args.task == "text-search":
        given = [name for name in (*_RETRIEVAL_FILES, *_retrieval_only()) if getattr(args, name, None) is not None]
        if given:
            raise ValueError(f"`{given[0]}` is a setting of --task retrieval-qa, not of the text search task.")
        return train_command.run(args, session)
    names = {item.name for item in _retrieval_settings()}
    text_search_only = [item.name for item in training_settings() if item.name not in names and item.name != "model"]
    given = [name for name in text_search_only if getattr(args, name, None) is not None]
    if given or args.env_options or args.seeds:
        what = f"`{given[0]}`" if given else "--env-options" if args.env_options else "--seeds"
        raise ValueError(f"{what} is a setting of the text search task, not of --task retrieval-qa (it takes `seed`).")
    return _run_retrieval_qa(args, session)


def _retrieval_only() -> list[str]:
    shared = {item.name for item in training_settings()}
    return [item.name for item in _retrieval_settings() if item.name not in shared]


def _run_retrieval_qa(args: argparse.Namespace, session: Session) -> int:
    from ftw_jax.agent.learner import LearnConfig
    from ftw_jax.agent.retrieval_qa.learner import (
        LEARNER_DEFAULTS,
        RetrievalFiles,
        RetrievalTrainConfig,
        train_retrieval_qa,
    )
    from ftw_jax.agent.retrieval_qa.task import RetrievalQASettings
    from ftw_jax.core.settings import describe

    for name in ("questions", "test_questions", "corpus", "model"):
        if getattr(args, name) is None:
            raise ValueError(f"--task retrieval-qa needs `{name}`.")
    task = RetrievalQASettings(**given_settings(args, describe(RetrievalQASettings)))
    learner_settings = {**LEARNER_DEFAULTS, **given_settings(args, _learner_settings())}
    algorithm = learner_settings.get("algorithm", "ftw")
    learn = LearnConfig(
        **learner_settings,
        max_length=task.max_length,
        algorithm_config=algorithm_config(args, algorithm, _retrieval_algorithm_defaults(), logger(args)),
    )
    config = RetrievalTrainConfig(**given_settings(args, describe(RetrievalTrainConfig)), learn=learn, task=task)
    paths = {name: getattr(args, name) for name in _RETRIEVAL_FILES}
    files = RetrievalFiles(**{name: path and path.resolve() for name, path in paths.items()})
    model = pathlib.Path(args.model).resolve()
    fingerprint = {"model": str(model), **{k: str(v) for k, v in dataclasses.asdict(files).items()}}
    folder, checkpointer = open_run(args, session, "retrieval-qa", {**fingerprint, **dataclasses.asdict(config)})
    report = outputs.LearnOutputs(
        folder,
        log=logger(args),
        updates=config.learn.steps_per_batch,
        provenance=session.provenance(),
        board=outputs.event_writer(args, folder, logger(args), [], None),
    )
    try:
        summary = train_retrieval_qa(config, files, model, folder, checkpointer, report)
    finally:
        if checkpointer:
            checkpointer.close()
    report.finished(summary)
    if not args.no_plot:
        outputs.save_exact_match_curve(folder, summary["evaluations"])
    if args.json:
        print(json.dumps(summary))
    else:
        outputs.print_retrieval_summary(summary)
    return 0


def _mesh(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise argparse.ArgumentTypeError(f"expected DATAxMODEL with positive integers, e.g. 2x4, got {text!r}")
    return int(parts[0]), int(parts[1])


def run_learn(args: argparse.Namespace, session: Session) -> int:
    from ftw_jax.agent.learner import LearnConfig
    from ftw_jax.agent.lm_learn import learn_from_file
    from ftw_jax.core.settings import describe

    own = given_settings(args, describe(LearnConfig))
    algorithm = own.get("algorithm", "ftw")
    defaults = _learn_algorithm_defaults()
    config = LearnConfig(**own, algorithm_config=algorithm_config(args, algorithm, defaults, logger(args)))
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
            updates=config.steps_per_batch,
            writer=main_process,
            provenance=session.provenance(),
            board=outputs.event_writer(args, folder, logger(args), [], None) if main_process else None,
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

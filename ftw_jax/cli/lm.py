"""`ftw-jax lm`: the LLM-agent learner, one subcommand per way of feeding it: `learn` (an engine's episodes),
`text-search` (the text search agent, in-process) and `retrieval-qa` (Search-R1's task, in-process)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib
import sys
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
    open_checkpointed_run,
    training_settings,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "lm",
        help="the LLM-agent learner: FTW from a rollout engine's episodes, or an agent's task in-process",
        description="FTW for language-model agents (docs/lm.md). `learn` reads episodes an engine wrote and writes "
        "versioned weights for it to reload (--model PATH: the Hugging Face checkpoint it starts from; "
        "--mesh and jax.distributed for several devices and hosts); `text-search` runs the text search "
        "agent's whole loop here, on a tiny fresh LM or on a checkpoint (--model PATH); `retrieval-qa` "
        "trains a checkpoint on Search-R1's questions with a retriever between its turns; `evaluate` measures "
        "a checkpoint (or any version a run saved) on Search-R1's test sets as the paper reports them.",
    )
    commands = parser.add_subparsers(
        dest="lm_command", required=True, metavar="{learn,text-search,retrieval-qa,evaluate}"
    )
    _add_learn_parser(commands)
    _add_text_search_parser(commands)
    _add_retrieval_qa_parser(commands)
    _add_evaluate_parser(commands)


def current_spelling(argv: list[str], log: typing.Callable[[str], None] | None = None) -> list[str]:
    """`argv` with 0.7's `lm train [--task TASK]` written as `lm TASK` (`text-search` where no task is given), said
    once on stderr; any other command line as it is."""
    positional = [index for index, token in enumerate(argv) if not token.startswith("-")]
    if len(positional) < 2 or [argv[i] for i in positional[:2]] != ["lm", "train"]:
        return argv
    rest, task = list(argv[positional[1] + 1 :]), "text-search"
    for index, token in enumerate(rest):
        if token == "--task" and index + 1 < len(rest):
            task = rest.pop(index + 1)
            rest.pop(index)
            break
        if token.startswith("--task="):
            task = rest.pop(index).partition("=")[2]
            break
    (log or (lambda message: print(message, file=sys.stderr)))(
        f"note: `ftw-jax lm train --task {task}` is now `ftw-jax lm {task}`."
    )
    return [*argv[: positional[1]], task, *rest]


def _add_learn_parser(commands) -> None:
    from ftw_jax.agent.feed import FeedSettings
    from ftw_jax.algos.defaults import LM_TASKS
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
    add_settings(learn, [*_learner_settings("episodes"), *describe(FeedSettings)])
    add_settings(learn, _algorithm_settings(), defaults_here=_algorithm_defaults_shown(LM_TASKS["episodes"].algorithms))
    add_run_folder_arguments(learn)
    add_cluster_arguments(learn)
    learn.set_defaults(handler=run_learn)


def _algorithm_settings() -> list:
    """Every algorithm's settings, FTW's first (a name several declare is one flag)."""
    from ftw_jax import algos
    from ftw_jax.core.settings import describe

    return [item for entry in algos.ALGORITHMS.values() for item in describe(entry.config)]


def _algorithm_defaults_shown(table: typing.Mapping[str, typing.Mapping]) -> dict[str, str]:
    """{setting: its default for each algorithm that declares it, as the help shows it ("grpo 5, ppo 1")} where
    the task's `table` (algorithm -> its settings) differs from the configs' own defaults."""
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


def _learner_settings(task: str) -> list:
    """The LM learner's settings that the command for `task` takes: all but `max_length`, which an in-process task
    sets from its own lengths."""
    from ftw_jax.agent.learner import LearnConfig
    from ftw_jax.core.settings import describe

    return [item for item in describe(LearnConfig) if task == "episodes" or item.name != "max_length"]


def _learn_config(args: argparse.Namespace, task: str, **fixed: typing.Any):
    """The LM learner's config for `task` (`LearnConfig.for_task`) from the flags given: those of the learner and
    of the algorithm run; those only other algorithms take are named and left out."""
    from ftw_jax.agent.learner import LEARN_FIELDS, LearnConfig
    from ftw_jax.algos.defaults import DEFAULT_ALGORITHM

    given = {**given_settings(args, _learner_settings(task)), **given_settings(args, _algorithm_settings())}
    algorithm = given.get("algorithm", DEFAULT_ALGORITHM)
    return LearnConfig.for_task(task, **applicable_settings(given, algorithm, logger(args), LEARN_FIELDS), **fixed)


# The text search task's settings that an LLM user has no use for: its policy is the LM.
_NOT_FOR_AN_LM = ("policy", "hidden_sizes", "conv_channels")


def _add_text_search_parser(commands) -> None:
    text_search = commands.add_parser(
        "text-search",
        help="the text search agent's whole loop in-process: a tiny LM or a checkpoint, trained on its own rollouts",
        description="`ftw-jax train --env text-search`: a tiny Qwen2-shaped LM (or --model PATH) fitted to the "
        "demonstrator's episodes (--warm-start-demonstrations), then trained by --algorithm on its own rollouts.",
    )
    add_seeds(text_search)
    text_search.add_argument(
        "--env-options",
        type=env_options,
        default={},
        help="options of the text search task, e.g. 'two_hop_fraction=1.0,guess_rate=0.8'",
    )
    settings = [item for item in training_settings() if item.name not in _NOT_FOR_AN_LM]
    add_settings(text_search, settings, env_defaults="text-search")
    add_run_folder_arguments(text_search)
    text_search.add_argument("--no-plot", action="store_true", help="do not write the learning-curve PNG")
    text_search.set_defaults(handler=train_command.run, env="text-search")


def _retrieval_settings() -> list:
    """The settings `lm retrieval-qa` reads: its run's, the protocol's, the learner's and every algorithm's."""
    from ftw_jax.agent.retrieval_qa.learner import RetrievalTrainConfig
    from ftw_jax.agent.retrieval_qa.task import RetrievalQASettings
    from ftw_jax.core.settings import describe

    return [*describe(RetrievalTrainConfig), *describe(RetrievalQASettings), *_learner_settings("retrieval-qa")]


_RETRIEVAL_FILES = {
    "questions": "the training questions: Search-R1's train.parquet, or a FlashRAG-style .jsonl",
    "test_questions": "the questions test exact match is measured on (test.parquet or .jsonl)",
    "corpus": "the passages, JSON Lines of {id, contents: '\"Title\"\\ntext'} (e.g. wiki-18.jsonl)",
    "index": "the BM25 index folder (default: beside the corpus, CORPUS.bm25; built there the first time)",
    "demonstrations": "questions whose rows carry `demonstration` (the turns to imitate), fitted before FTW",
}
_RETRIEVAL_NEEDS = ("questions", "test_questions", "model")


def _add_retrieval_qa_parser(commands) -> None:
    from ftw_jax.algos.defaults import LM_TASKS

    retrieval = commands.add_parser(
        "retrieval-qa",
        help="retrieval QA in Search-R1's protocol: a checkpoint answers its questions with a retriever between turns",
        description="A Hugging Face checkpoint (--model PATH) answers Search-R1's questions (--questions, "
        "--test-questions) with a BM25 retriever over --corpus between its turns, trained by --algorithm on exact "
        "match; greedy test exact match every --eval-every iterations (docs/lm.md, Retrieval QA).",
    )
    retrieval.add_argument(
        "--model", metavar="PATH", help="a Hugging Face Llama/Qwen2 folder: the starting weights and the KL's reference"
    )
    for name, help in _RETRIEVAL_FILES.items():
        if name not in ("corpus", "index"):
            retrieval.add_argument(f"--{name.replace('_', '-')}", type=pathlib.Path, metavar="PATH", help=help)
    _add_retriever_arguments(retrieval)
    entry = LM_TASKS["retrieval-qa"]
    add_settings(retrieval, _retrieval_settings(), defaults_here=dict(entry.run))
    add_settings(retrieval, _algorithm_settings(), defaults_here=_algorithm_defaults_shown(entry.algorithms))
    add_run_folder_arguments(retrieval)
    retrieval.add_argument("--no-plot", action="store_true", help="do not write the exact-match curve PNG")
    retrieval.add_argument(
        "--plan", action="store_true", help="print the run's memory plan (GiB a device, term by term) and exit"
    )
    retrieval.add_argument(
        "--device-memory",
        type=float,
        metavar="GIB",
        help="the device's memory the plan must fit (default: what JAX reports for a GPU; on a CPU, unchecked)",
    )
    retrieval.set_defaults(handler=_run_retrieval_qa)


def _run_retrieval_qa(args: argparse.Namespace, session: Session) -> int:
    from ftw_jax.agent.retrieval_qa.learner import RetrievalFiles, RetrievalTrainConfig, train_retrieval_qa
    from ftw_jax.agent.retrieval_qa.task import RetrievalQASettings
    from ftw_jax.core.settings import describe

    for name in ("model",) if args.plan else _RETRIEVAL_NEEDS:  # the plan reads the model's config.json alone
        if getattr(args, name) is None:
            raise ValueError(f"lm retrieval-qa needs `{name}`.")
    task = RetrievalQASettings(**given_settings(args, describe(RetrievalQASettings)))
    config = RetrievalTrainConfig(
        **given_settings(args, describe(RetrievalTrainConfig)),
        learn=_learn_config(args, "retrieval-qa", max_length=task.max_length),
        task=task,
    )
    model = pathlib.Path(args.model).resolve()
    if _planned(args, config, model):
        return 0
    paths = {name: getattr(args, name) for name in _RETRIEVAL_FILES}
    files = RetrievalFiles(
        **{name: path and path.resolve() for name, path in paths.items()}, retriever_url=args.retriever_url
    )
    # The retriever's URL is among the settings a resume may change (`CHANGEABLE_ON_RESUME`): never compared.
    fingerprint = {"model": str(model), **{k: str(v) for k, v in dataclasses.asdict(files).items()}}
    folder, checkpointer = open_checkpointed_run(
        args, session, "retrieval-qa", {**fingerprint, **dataclasses.asdict(config)}
    )
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
    if report.writer:
        outputs.save_test_table(folder, summary["final_test"])
    if not args.no_plot:
        outputs.save_exact_match_curve(folder, summary["evaluations"])
    if args.json:
        print(json.dumps(summary))
    else:
        outputs.print_retrieval_summary(summary)
    return 0


def _planned(args: argparse.Namespace, config: typing.Any, model: pathlib.Path) -> bool:
    """With --plan, prints the run's memory plan (True: nothing more to do). Otherwise refuses, before anything is
    loaded or compiled, a run whose plan exceeds the device's memory: --device-memory, else a GPU's as JAX reports
    it (a CPU's is left unchecked)."""
    import jax

    from ftw_jax.agent.memory_plan import memory_plan
    from ftw_jax.lm.config import pretrained_config
    from ftw_jax.running.memory import device_limits

    if args.device_memory is not None and not args.device_memory > 0:
        raise ValueError(f"--device-memory must be a positive number of GiB, got {args.device_memory!r}.")
    learn = config.learn
    plan = memory_plan(
        learn, pretrained_config(str(model)), rollout_rows=learn.episodes_per_iteration, rollout_slots=learn.max_length
    )
    limits = device_limits()  # a GPU's allocator limit; None on a CPU
    device = limits[0] if limits else None
    if args.device_memory is not None:
        device = int(args.device_memory * 2**30)
    if args.plan:
        print(f"memory plan of {model.name} on {jax.local_devices()[0].device_kind}, one device:")
        print(plan.table(device), end="")
        return True
    if device is not None:
        plan.check(device)
    return False


def _add_retriever_arguments(parser: argparse.ArgumentParser) -> None:
    for name in ("corpus", "index"):
        parser.add_argument(f"--{name}", type=pathlib.Path, metavar="PATH", help=_RETRIEVAL_FILES[name])
    parser.add_argument(
        "--retriever-url",
        metavar="URL",
        help="Search-R1's retrieval server instead of --corpus: its POST /retrieve (e.g. "
        "http://127.0.0.1:8000/retrieve, started by its retrieval_launch.sh: E5 over wiki-18), asked once a turn "
        "for every query",
    )


def _add_evaluate_parser(commands) -> None:
    from ftw_jax.agent.retrieval_qa.task import RetrievalQASettings
    from ftw_jax.core.settings import describe

    evaluate = commands.add_parser(
        "evaluate",
        help="greedy exact match of a checkpoint on Search-R1's test sets: each source's and their mean",
        description="The paper's evaluation of --model (a Hugging Face checkpoint, or any weights folder a "
        "retrieval-qa run wrote) on --test-questions: greedy exact match per data_source and the mean over "
        "sources, printed as the paper's table (docs/lm.md, Retrieval QA).",
    )
    evaluate.add_argument("--model", metavar="PATH", required=True, help="a Hugging Face Llama/Qwen2 folder")
    evaluate.add_argument(
        "--test-questions", type=pathlib.Path, metavar="PATH", required=True, help=_RETRIEVAL_FILES["test_questions"]
    )
    _add_retriever_arguments(evaluate)
    evaluate.add_argument(
        "--eval-questions", type=int, metavar="N", help="N questions drawn evenly across sources (default: all)"
    )
    evaluate.add_argument("--batch", type=int, default=64, metavar="B", help="questions played at once (64)")
    evaluate.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype")
    evaluate.add_argument("--out", type=pathlib.Path, metavar="DIR", help="write evaluation.json and test_table.md")
    evaluate.add_argument("--json", action="store_true", help="print the evaluation as one JSON line")
    add_settings(evaluate, [item for item in describe(RetrievalQASettings) if item.name not in _TRAINING_ONLY])
    evaluate.set_defaults(handler=_run_evaluate)


# The protocol's settings of training rollouts alone: evaluation is greedy.
_TRAINING_ONLY = ("temperature", "top_p")


def _run_evaluate(args: argparse.Namespace, session: Session) -> int:
    from ftw_jax.agent.retrieval_qa.evaluation import paper_table
    from ftw_jax.agent.retrieval_qa.learner import evaluate_checkpoint, open_retriever
    from ftw_jax.agent.retrieval_qa.task import RetrievalQASettings
    from ftw_jax.core.settings import describe
    from ftw_jax.running import run_files

    settings = RetrievalQASettings(**given_settings(args, describe(RetrievalQASettings)))
    log = logger(args)
    retriever = open_retriever(args.corpus, args.index, args.retriever_url, log)
    model = pathlib.Path(args.model).resolve()
    row = evaluate_checkpoint(
        model,
        args.test_questions,
        retriever,
        settings,
        questions=args.eval_questions,
        batch=args.batch,
        dtype=args.dtype,
        log=log,
    )
    table = paper_table([(model.name, row)])
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        run_files.write_json(args.out / "evaluation.json", row)
        (args.out / "test_table.md").write_text(table)
    print(json.dumps(row) if args.json else table, end="\n" if args.json else "")
    return 0


def _mesh(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise argparse.ArgumentTypeError(f"expected DATAxMODEL with positive integers, e.g. 2x4, got {text!r}")
    return int(parts[0]), int(parts[1])


def run_learn(args: argparse.Namespace, session: Session) -> int:
    from ftw_jax.agent.feed import FeedSettings
    from ftw_jax.agent.lm_learn import learn_from_file
    from ftw_jax.core.settings import describe

    config = _learn_config(args, "episodes")
    feed = FeedSettings(**given_settings(args, describe(FeedSettings)))
    fingerprint = {
        "episodes": str(args.episodes.resolve()),  # resolved: a resume may name them relative or absolute
        "model": str(args.model.resolve()),
        "skip_bad_lines": args.skip_bad_lines,
        "mesh": args.mesh,
        **dataclasses.asdict(config),
        **dataclasses.asdict(feed),  # never compared: a resume may follow the file, or stop following it
    }
    with native_output_to_stderr() if args.json else contextlib.nullcontext():
        start_processes(args)
        import jax

        main_process = jax.process_index() == 0  # the one that writes files and prints
        folder, checkpointer = open_checkpointed_run(args, session, "lm-learn", fingerprint, writer=main_process)
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
                feed_settings=feed,
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

"""Retrieval QA in Search-R1's protocol, trained in one process: the model's turns on the device, the retriever
on the host between them, and the LM learner's FTW updates on the episodes (`ftw-jax lm retrieval-qa
retrieval-qa`).

    summary = train_retrieval_qa(config, files, model_path, run_folder, checkpointer, report)

Each iteration plays B training questions (sampled at `temperature`, in a fresh order each pass over the file),
adds their episodes to the pool and runs U FTW updates (`ftw_jax.agent.learner`: the same learner `lm learn`
runs on an engine's episodes). Greedy exact match on the test questions is measured before the first iteration,
every `eval_every` iterations and after the last, by `data_source`, as the paper reports it. With demonstrations,
the model is first fitted to them (cross-entropy on the demonstrator's turns) and the result is where learning
starts and the KL's reference.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ftw_jax.agent.episodes import episode_of, sample_records, to_trajectories
from ftw_jax.agent.learner import EpisodeLearner, LearnConfig, load_for_learning
from ftw_jax.agent.lm_learn import (
    LatestVersion,
    LearnReport,
    learn_batch,
    save_weights,
    stop_after_iteration,
)
from ftw_jax.agent.retrieval_qa.data import Question, read_demonstrations, read_questions
from ftw_jax.agent.retrieval_qa.evaluation import evaluate, evaluation_questions
from ftw_jax.agent.retrieval_qa.remote import RemoteRetriever
from ftw_jax.agent.retrieval_qa.retriever import BM25Retriever, Retriever
from ftw_jax.agent.retrieval_qa.task import RetrievalQA, RetrievalQASettings
from ftw_jax.algos.base import with_learning_rate
from ftw_jax.algos.defaults import DEFAULT_ALGORITHM
from ftw_jax.core.checks import check_positive_int
from ftw_jax.core.settings import check_settings, setting
from ftw_jax.envs.retrieval_qa.answers import final_answer
from ftw_jax.policies.lm import as_model_params, as_policy_params
from ftw_jax.running import skips
from ftw_jax.running.checkpoints import Checkpointer, save_then_stop
from ftw_jax.running.host import host_array


@dataclasses.dataclass(frozen=True)
class RetrievalTrainConfig:
    """The run's own settings; the learner's are `learn` (its `max_length` the task's), the protocol's `task`."""

    num_iterations: int = setting(100, "iterations: each plays B training questions, then U updates", flag="iterations")
    eval_every: int = setting(10, "greedy exact match on the test questions every this many iterations")
    eval_questions: int | None = setting(
        None,
        "evaluate on this many test questions drawn evenly across their sources, the same in every run (None: all)",
    )
    warmup_ratio: float = setting(
        0.285, "the learning rate rises linearly from 0 over this share of the iterations (Search-R1's; 0: constant)"
    )
    final_test: bool = setting(
        True, "after the last iteration, evaluate on every test question (with `eval_questions`)"
    )
    warm_start_steps: int = setting(0, "Adam steps of cross-entropy on the demonstrations before reinforcement")
    warm_start_learning_rate: float = setting(1e-3, "the warm start's Adam learning rate")
    warm_start_batch_size: int = setting(16, "demonstrations per warm-start step, drawn with replacement")
    learn: LearnConfig = dataclasses.field(
        default_factory=lambda: LearnConfig.for_task("retrieval-qa", max_length=RetrievalQASettings().max_length)
    )
    task: RetrievalQASettings = dataclasses.field(default_factory=RetrievalQASettings)

    @classmethod
    def for_algorithm(cls, algorithm: str = DEFAULT_ALGORITHM, **overrides: Any) -> RetrievalTrainConfig:
        """The task's defaults for `algorithm` (`ftw_jax.algos.defaults.LM_TASKS["retrieval-qa"]`) with
        `overrides`, each a field of this class, of the protocol's `RetrievalQASettings`, of the learner's
        `LearnConfig` (its `max_length` is the task's) or of the algorithm's config."""
        task_fields = {field.name for field in dataclasses.fields(RetrievalQASettings)}
        own_fields = {field.name for field in dataclasses.fields(cls)} - {"learn", "task"}
        task = RetrievalQASettings(**{name: value for name, value in overrides.items() if name in task_fields})
        learn = {name: value for name, value in overrides.items() if name not in task_fields | own_fields}
        return cls(
            **{name: value for name, value in overrides.items() if name in own_fields},
            learn=LearnConfig.for_task("retrieval-qa", algorithm=algorithm, max_length=task.max_length, **learn),
            task=task,
        )

    def __post_init__(self):
        check_settings(self)
        for name in ("num_iterations", "eval_every", "warm_start_batch_size"):
            check_positive_int(name, getattr(self, name))
        if self.eval_questions is not None:
            check_positive_int("eval_questions", self.eval_questions)
        if not (isinstance(self.warm_start_steps, int) and self.warm_start_steps >= 0):
            raise ValueError(f"warm_start_steps must be an int >= 0, got {self.warm_start_steps!r}.")
        if not 0 <= self.warmup_ratio <= 1:
            raise ValueError(f"warmup_ratio must be in [0, 1], got {self.warmup_ratio!r}.")
        if not self.warm_start_learning_rate > 0:
            raise ValueError(f"warm_start_learning_rate must be > 0, got {self.warm_start_learning_rate!r}.")
        if self.learn.max_length != self.task.max_length:
            raise ValueError(
                f"the learner's `max_length` ({self.learn.max_length}) must be the task's longest episode "
                f"({self.task.max_length}: `prompt_tokens` + turns x `response_tokens` + searches x "
                "`information_tokens`)."
            )


@dataclasses.dataclass(frozen=True)
class RetrievalFiles:
    """Where the data is: Search-R1's question files, and the passages: a corpus searched in-process by BM25 (its
    index beside it or at `index`), or Search-R1's retrieval server at `retriever_url`; optionally demonstrations."""

    questions: pathlib.Path
    test_questions: pathlib.Path
    corpus: pathlib.Path | None = None
    index: pathlib.Path | None = None
    demonstrations: pathlib.Path | None = None
    retriever_url: str | None = None

    def __post_init__(self):
        check_retriever_choice(self.corpus, self.index, self.retriever_url)

    def retriever(self, log: Callable[[str], None]) -> Retriever:
        return open_retriever(self.corpus, self.index, self.retriever_url, log)


def check_retriever_choice(corpus: pathlib.Path | None, index: pathlib.Path | None, url: str | None) -> None:
    """Refuses anything but one retriever: a corpus (with its index, optionally) or a server's URL."""
    if (corpus is None) == (url is None):
        raise ValueError(
            "give `corpus` (searched in-process by BM25) or `retriever_url` (Search-R1's retrieval server), "
            "one of the two."
        )
    if index is not None and corpus is None:
        raise ValueError("`index` is the in-process BM25's, over `corpus`; the retrieval server keeps its own.")


def open_retriever(
    corpus: pathlib.Path | None, index: pathlib.Path | None, url: str | None, log: Callable[[str], None]
) -> Retriever:
    """The retriever named (`check_retriever_choice`): Search-R1's server at `url` (its client, checked with a
    probe query), or BM25 over `corpus` (its index at `index` or beside it, built the first time)."""
    check_retriever_choice(corpus, index, url)
    if corpus is None:
        assert url is not None  # checked
        retriever = RemoteRetriever.open(url)
        log(f"retrieving from {url}")
        return retriever
    return BM25Retriever.open(corpus, index, log=log)


def _check_prompts(
    task: RetrievalQA, path: pathlib.Path, questions: list[Question], log: Callable[[str], None]
) -> None:
    """`task.check`s the questions of the file at `path`, and says how many prompts it will left-truncate."""
    longer = task.check(questions)
    if longer:
        log(
            f"{path}: {longer} of {len(questions)} prompts are longer than `prompt_tokens` "
            f"({task.settings.prompt_tokens}); they keep their last tokens, as Search-R1's do"
        )


def warmup_factor(config: RetrievalTrainConfig, iteration: int) -> float:
    """The share of the learning rate iteration `iteration` (from 0) learns at: verl's constant schedule with
    warm-up (`get_constant_schedule_with_warmup`, stepped once an iteration) over W = int(`warmup_ratio` x
    iterations) iterations, min(1, i / max(1, W)): 0 at the first; 1 throughout without warm-up."""
    if config.warmup_ratio == 0:
        return 1.0
    return min(1.0, iteration / max(1, int(config.warmup_ratio * config.num_iterations)))


def _demonstrations(task: RetrievalQA, path: pathlib.Path, vocab_size: int, max_length: int) -> Any:
    """The demonstrations in `path` played through the task (`RetrievalQA.demonstration`): trajectories [D, T]."""
    records = [task.demonstration(question, turns) for question, turns in read_demonstrations(path)]
    episodes = [episode_of(record, vocab_size=vocab_size, max_length=max_length) for record in records]
    return to_trajectories(episodes, max_length)


def _warm_started(config: RetrievalTrainConfig, learner: EpisodeLearner, params: dict, demos: Any, log) -> dict:
    """The CausalLM params fitted to the demonstrations [D, T] (`algos.imitation.fit_trajectories`)."""
    from ftw_jax.algos.imitation import WarmStart, fit_trajectories

    count, steps = demos.action.shape[0], config.warm_start_steps
    settings = WarmStart(count, steps, config.warm_start_learning_rate, config.warm_start_batch_size)
    fit = jax.jit(lambda key, params, demos: fit_trajectories(key, learner.policy, params, demos, settings))
    fitted, losses = fit(jax.random.key(config.learn.seed), as_policy_params(params), demos)
    losses = np.asarray(losses)
    log(f"warm start: {count} demonstrations, {steps} steps, cross-entropy {losses[0]:.3f} -> {losses[-1]:.3f}")
    return as_model_params(fitted)


def _order(seed: int, count: int, iteration: int, batch: int) -> list[int]:
    """The training questions of an iteration: passes over the file, each in its own order (a key per pass)."""
    orders, indices = {}, []
    for slot in range(iteration * batch, (iteration + 1) * batch):
        epoch, offset = divmod(slot, count)
        if epoch not in orders:
            orders[epoch] = np.asarray(jax.random.permutation(jax.random.fold_in(jax.random.key(seed), epoch), count))
        indices.append(int(orders[epoch][offset]))
    return indices


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """What a run reads and builds before it learns: every file checked, the model loaded."""

    task: RetrievalQA
    train_questions: list[Question]
    test_questions: list[Question]  # every one; the evaluations during the run use a sample
    model: Any
    params: dict
    learner: EpisodeLearner
    demonstrations: Any  # trajectories [D, T] to fit before learning, or None


def _prepared(config: RetrievalTrainConfig, files: RetrievalFiles, model_path: pathlib.Path, log) -> _Prepared:
    """Reads and checks the tokenizer, the question files, the corpus (its index built or read) and the prompts,
    then loads the model: a bad file is refused before anything compiles."""
    from ftw_jax.lm.tokenizer import load_tokenizer

    if (files.demonstrations is None) != (config.warm_start_steps == 0):
        raise ValueError("`demonstrations` and `warm_start_steps` (above 0) go together: give both or neither.")
    tokenizer = load_tokenizer(model_path)
    train_questions, test_questions = read_questions(files.questions, log), read_questions(files.test_questions, log)
    task = RetrievalQA(tokenizer, files.retriever(log), config.task)
    _check_prompts(task, files.questions, train_questions, log)
    _check_prompts(task, files.test_questions, test_questions, log)
    model, params = load_for_learning(model_path, config.learn)
    if model.config.vocab_size < tokenizer.vocab_size:
        raise ValueError(
            f"{model_path}: the model's vocabulary ({model.config.vocab_size}) is smaller than its tokenizer's "
            f"({tokenizer.vocab_size})."
        )
    demos = None
    if files.demonstrations is not None and config.warm_start_steps:
        demos = _demonstrations(task, files.demonstrations, model.config.vocab_size, config.learn.max_length)
    learner = EpisodeLearner.build(config.learn, model.config)
    return _Prepared(task, train_questions, test_questions, model, params, learner, demos)


def _play_and_learn(
    run: _Prepared, config: RetrievalTrainConfig, sampler: Any, state: Any, iteration: int, files, skipped: dict
) -> tuple[Any, dict, dict]:
    """One iteration: B training questions played (B/G questions G times each where the algorithm compares an
    episode with its group's), then the algorithm's updates on their episodes: (state, its row, the skipped-update
    totals)."""
    batch, learn, group_size = config.learn.episodes_per_iteration, config.learn, run.learner.learner.group_size
    chosen = _order(learn.seed, len(run.train_questions), iteration, batch // group_size)  # G episodes of each
    groups = [index for index in chosen for _ in range(group_size)]
    questions = [run.train_questions[index] for index in groups]
    version = int(host_array(state.policy.version))
    key = jax.random.fold_in(jax.random.key(learn.seed + 1), iteration)
    started = time.perf_counter()
    played = run.task.play(sampler, run.learner.model_params(state), key, questions)
    played_seconds = time.perf_counter() - started
    # the model's own log-probs, not the nucleus's: the learner's ratios compare the model with itself (as verl's)
    records = sample_records(played.sample, played.rewards, version, log_probs="model_logp")
    vocab = run.model.config.vocab_size
    episodes = [
        episode_of({**record, "group": index}, vocab_size=vocab, max_length=learn.max_length)
        for record, index in zip(records, groups)
    ]
    learning_rate = learn.learning_rate * warmup_factor(config, iteration)
    state = with_learning_rate(state, learning_rate)  # every optimizer in the state: PPO's critic's too
    state, row, skipped = learn_batch(
        run.learner, state, lambda tree: tree, episodes, iteration, files.questions, skipped
    )
    row.update(
        searches_mean=float(played.searches.mean()),
        answered=float(np.mean([final_answer(text) is not None for text in played.responses])),  # the model's own
        learning_rate=learning_rate,
        rollout_seconds=played_seconds,
        learn_seconds=time.perf_counter() - started - played_seconds,
    )
    return state, row, skipped


def _starting_state(run: _Prepared, config: RetrievalTrainConfig, checkpointer: Checkpointer | None, log):
    """(iterations done, learner state, evaluations so far, skipped-update totals): the checkpointer's latest, else
    a new run's, from the warm start where there are demonstrations."""
    state = run.learner.init(run.params)
    restored = checkpointer.restore(state) if checkpointer else None
    if restored:
        done, state, record = restored
        log(f"resumed after iteration {done}")
        return done, state, record["evaluations"], {**dict.fromkeys(skips.TOTALS, 0), **record["skipped"]}
    if run.demonstrations is not None:
        state = run.learner.init(_warm_started(config, run.learner, run.params, run.demonstrations, log))
    return 0, state, [], dict.fromkeys(skips.TOTALS, 0)


def _evaluation(
    run: _Prepared,
    greedy: Any,
    state: Any,
    questions: list[Question],
    iteration: int,
    report: LearnReport,
    name: str = "eval",
) -> dict:
    """Greedy exact match of `state`'s policy on `questions` (`evaluation.evaluate`'s row, after `iteration`
    iterations), logged and reported as `name` ("eval", or "final_test" on every test question)."""
    params, batch = run.learner.model_params(state), run.learner.config.episodes_per_iteration
    row = {"iteration": iteration, **evaluate(run.task, greedy, params, questions, batch)}
    sources = [f"{key.removeprefix('test_em/')} {value:.1%}" for key, value in row.items() if "test_em/" in key]
    shown = f"; {', '.join(sources)}" if len(sources) > 1 else ""
    what = "final test, every question" if name == "final_test" else f"iteration {iteration:>4}"
    report.log(f"{what}  test exact match {row['test_em']:.1%} ({len(questions)} questions{shown})")
    report.evaluation(row, name)
    return row


def train_retrieval_qa(
    config: RetrievalTrainConfig,
    files: RetrievalFiles,
    model_path: pathlib.Path,
    run_folder: pathlib.Path,
    checkpointer: Checkpointer | None,
    report: LearnReport,
) -> dict:
    """`ftw-jax lm retrieval-qa` (see the module's docstring). Every file is read and checked before
    anything compiles; resumes from the checkpointer's latest. Returns the run's summary, each evaluation's row
    (`evaluations`) in it."""
    started, log, batch = time.perf_counter(), report.log, config.learn.episodes_per_iteration
    run = _prepared(config, files, model_path, log)
    done, state, evaluations, skipped = _starting_state(run, config, checkpointer, log)
    report.resumed(done)
    sampler, greedy = run.task.turn_sampler(run.model), run.task.turn_sampler(run.model, greedy=True)
    sample = evaluation_questions(run.test_questions, config.eval_questions)
    if not evaluations:
        evaluations.append(_evaluation(run, greedy, state, sample, 0, report))

    questions = len(run.train_questions)
    log(f"{config.num_iterations} iterations of {batch} of {questions} questions; run folder {run_folder}")
    weights, latest = None, LatestVersion(run_folder, checkpointer)
    with latest.named_on_stop():  # a stop anywhere in the loop, between iterations too, names the latest version
        for iteration in range(done, config.num_iterations):
            latest.publish_unless_stopped()
            state, row, skipped = _play_and_learn(run, config, sampler, state, iteration, files, skipped)
            report.iteration(
                {"iteration": iteration + 1, "episodes": (iteration + 1) * batch, **row}, config.num_iterations
            )
            last = iteration + 1 == config.num_iterations
            if (iteration + 1) % config.eval_every == 0 or last:
                evaluations.append(_evaluation(run, greedy, state, sample, iteration + 1, report))
            if (iteration + 1) % config.learn.save_every == 0 or last:
                weights = save_weights(run_folder, run.learner, state, model_path)
                latest.written(iteration + 1, int(host_array(state.policy.version)))
            stop = stop_after_iteration(config.learn, row, iteration + 1, batch, skipped)
            record = {"evaluations": evaluations, "skipped": skipped}
            save_then_stop(checkpointer, iteration + 1, state, record, last=last, stop=stop)
    if weights is None:  # resumed after its last iteration: the newest weights, found (written) again
        weights = save_weights(run_folder, run.learner, state, model_path)
        latest.written(config.num_iterations, int(host_array(state.policy.version)))
    latest.finish()
    final = evaluations[-1]
    if len(sample) < len(run.test_questions) and config.final_test:
        final = _evaluation(run, greedy, state, run.test_questions, config.num_iterations, report, "final_test")
    return {
        "iterations": config.num_iterations,
        "version": int(host_array(state.policy.version)),
        "test_em_start": evaluations[0]["test_em"],
        "test_em_final": evaluations[-1]["test_em"],
        "test_em_best": max(row["test_em"] for row in evaluations),
        "test_questions": len(sample),
        "evaluations": evaluations,
        "final_test": final,
        **{name: skipped[name] for name in ("updates_skipped", "updates_nonfinite")},
        "weights": str(weights),
        "seconds": time.perf_counter() - started,
    }


def evaluate_checkpoint(
    model_path: pathlib.Path,
    test_questions: pathlib.Path,
    retriever: Retriever,
    settings: RetrievalQASettings,
    *,
    questions: int | None = None,
    batch: int = 64,
    dtype: str = "float32",
    log: Callable[[str], None] = print,
) -> dict:
    """The paper's evaluation of a saved model (any version a run wrote, or a Hugging Face checkpoint): greedy
    exact match on `questions` of the `test_questions` file drawn evenly across sources (all: None), each source's
    and their mean (`evaluation.evaluate`'s row, with "questions" and "model")."""
    from ftw_jax.lm.load import load
    from ftw_jax.lm.tokenizer import load_tokenizer

    check_positive_int("batch", batch)
    tokenizer = load_tokenizer(model_path)
    test = evaluation_questions(read_questions(test_questions, log), questions)
    task = RetrievalQA(tokenizer, retriever, settings)
    _check_prompts(task, test_questions, test, log)
    model, params = load(model_path, dtype=dtype)
    log(f"evaluating {model_path} on {len(test)} questions")
    row = evaluate(task, task.turn_sampler(model, greedy=True), params, test, min(batch, len(test)))
    return {"model": str(model_path), "questions": len(test), **row}

"""`ftw-jax lm learn`: the LM learner (`ftw_jax.agent.learner`) over the episodes of a JSON Lines file an engine
writes (or a folder of them, one per engine worker), B at a time, with versioned weights for the engine to reload,
checkpoints and an exact resume.

    summary = learn_from_file(config, episodes_path, model_path, run_folder, checkpointer, report)

`learn_batch` is one iteration on a list of episodes, shared with the in-process retrieval-QA loop
(`ftw_jax.agent.retrieval_qa.learner`); `save_weights` writes a version as a Hugging Face folder.
"""

from __future__ import annotations

import contextlib
import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import jax
import numpy as np

from ftw_jax.agent.episodes import (
    Episode,
    check_versions,
    grouped,
    stale_episodes,
    tied_group_share,
    to_trajectories,
)
from ftw_jax.agent.feed import EpisodeFeed, EpisodeFiles, FeedSettings
from ftw_jax.agent.learner import EpisodeLearner, LearnConfig, LearnerState, load_for_learning
from ftw_jax.lm.config import read_json
from ftw_jax.running import run_files, skips
from ftw_jax.running.checkpoints import Checkpointer, save_then_stop
from ftw_jax.running.host import host_array
from ftw_jax.running.signals import Interrupted, raise_if_stopped
from ftw_jax.running.skips import StoppedRun


def metrics_row(metrics: dict) -> dict:
    """The last update's scalar metrics as Python numbers (a JSONL row)."""
    row = {}
    for name, value in metrics.items():
        value = host_array(value)[-1]
        if value.ndim == 0:
            row[name] = value.item()
    return row


def iteration_counts(metrics: dict) -> dict[str, int]:
    """`skips.COUNTS` of one iteration's U updates (metrics leaves [U]) as Python ints."""
    names = [name for name in ("applied", "ready", "nonfinite") if name in metrics]
    counts = skips.update_counts({name: host_array(metrics[name]) for name in names})
    return {name: int(value) for name, value in counts.items()}


def sampler_gap_row(metrics: dict) -> dict:
    """The iteration's sampler gap over its U updates (metrics leaves [U]; each measures the episodes of its own
    version): `sampler_gap` in nats per token (None where no kept episode was the current version's) and
    `sampler_tokens`, the tokens it was measured on."""
    tokens = host_array(metrics["sampler_tokens"]).astype(np.int64)
    measured = int(tokens.sum())
    gap = float(np.sum(host_array(metrics["sampler_gap"]) * tokens) / measured) if measured else None
    return {"sampler_gap": gap, "sampler_tokens": measured}


def stop_for_sampler(config: LearnConfig, row: dict, iteration: int, total: int) -> StoppedRun | None:
    """The error that stops a run whose engine did not sample from the policy it names (`sampler_gap_limit`), or
    whose episodes were mostly too stale for the pool to select (`stale_share_limit`), after iteration `iteration`
    on `total` episodes (`row`: its `learn_batch` row); None otherwise."""
    gap, limit = row["sampler_gap"], config.sampler_gap_limit
    if limit and gap is not None and not gap <= limit:  # NaN stops too
        return StoppedRun(
            f"iteration {iteration}: the engine's log-probs are {gap:.3g} nats per token from the learner's own "
            f"on the {row['sampler_tokens']} tokens that the learner's current version wrote (`sampler_gap_limit` "
            f"{limit}): the engine does not sample from the weights it names. Likely: a temperature other than 1, "
            "top-p or top-k, log-probs processed after sampling, weights other than weights/latest.json's, or another "
            "dtype. Sample at temperature 1 with no top-p/top-k and send the raw log-probs.",
            go_on="`sampler_gap_limit` 0",
        )
    stale, share = row.get("episodes_stale", 0), config.stale_share_limit
    if stale > share * total:
        return StoppedRun(
            f"iteration {iteration}: {stale} of its {total} episodes were written more than "
            f"{config.algorithm_config.max_staleness} versions before the learner's (`max_staleness`), more than "
            f"`stale_share_limit` {share}: the pool never selects them. The engine is not reloading "
            "weights/latest.json, or reloads it too seldom.",
            go_on="`stale_share_limit` 1",
        )
    return None


def stop_after_iteration(
    config: LearnConfig, row: dict, iteration: int, total: int, skipped: dict
) -> StoppedRun | None:
    """Why the run stops after `iteration` (`row` its `learn_batch` row, on `total` episodes; `skipped` the
    skipped-update totals): its engine's sampler (`stop_for_sampler`), or updates skipped past
    `stop_after_skipped`; None to go on."""
    limit = skips.limit_of(config.stop_after_skipped, config.steps_per_batch)
    whole = "a whole iteration" if config.stop_after_skipped is None else ""
    return stop_for_sampler(config, row, iteration, total) or skips.stop_for_skips(
        ["the learner"], skipped, limit, whole=whole, nonfinite_advice=NONFINITE_ADVICE
    )


def weights_folder(run_folder: pathlib.Path, version: int) -> pathlib.Path:
    """Where the weights of policy version `version` go: `weights/version-000012` (sorted by name = by version)."""
    return run_folder / "weights" / f"version-{version:06d}"


class LatestVersion:
    """`weights/latest.json`, the version an engine should play: moved only to a version whose checkpoint (or a
    later one) is whole on disk, so that a learner killed at any moment resumes at or past it and the file never
    names an older version after a restart; nor a version the restarted learner is behind (its episodes would be
    ahead of the learner). Without checkpoints, each version as soon as it is written."""

    def __init__(self, run_folder: pathlib.Path, checkpointer: Checkpointer | None):
        self.path, self.checkpointer = run_folder / "weights" / "latest.json", checkpointer
        self.waiting: list[tuple[int, int]] = []  # (iteration, version) written, not named yet

    def written(self, iteration: int, version: int) -> None:
        """The weights of `version` are written, after `iteration`; named as soon as a checkpoint covers them."""
        self.waiting.append((iteration, version))
        self.publish()

    def publish(self) -> None:
        """Names the newest written version a durable checkpoint covers, if any is new (cheap: call it often)."""
        durable = self.checkpointer.durable_step() if self.checkpointer else None
        covered = [pair for pair in self.waiting if self.checkpointer is None or (durable or 0) >= pair[0]]
        if covered and jax.process_index() == 0:  # one writer
            version = max(version for _, version in covered)
            run_files.write_json(
                self.path, {"version": version, "path": weights_folder(self.path.parent.parent, version).name}
            )
        self.waiting = [pair for pair in self.waiting if pair not in covered]

    def publish_unless_stopped(self) -> None:
        """Between two iterations and while a follower waits: raises `Interrupted` where a stop was asked for,
        else names a version whose checkpoint the wait let finish (an engine may be waiting for it)."""
        raise_if_stopped()
        self.publish()

    @contextlib.contextmanager
    def named_on_stop(self) -> Iterator[None]:
        """Around the loop a run may stop in (a stop signal, `StoppedRun`): the version the stopped run's last
        checkpoint covers is named before it ends."""
        try:
            yield
        except (StoppedRun, Interrupted):
            self.finish()
            raise

    def finish(self) -> None:
        """Waits for the checkpoints in flight, then names the newest version written."""
        if self.checkpointer:
            self.checkpointer.wait()
        self.publish()


def save_weights(
    run_folder: pathlib.Path, learner: EpisodeLearner, state: LearnerState, model_path: pathlib.Path
) -> pathlib.Path:
    """Writes the state's weights as a Hugging Face folder (once per version; atomic) in the dtype the model
    computes in (what the learner's log-probs were computed with), with the starting checkpoint's config.json
    and tokenizer files (`LatestVersion` names it in `weights/latest.json` once a checkpoint covers it)."""
    from ftw_jax.lm.load import TOKENIZER_FILES, save

    version = int(host_array(state.policy.version))
    folder = weights_folder(run_folder, version)
    params = jax.tree.map(host_array, learner.model_params(state))  # every process takes part in gathering
    if jax.process_index() == 0:  # one writer
        if not folder.exists():
            save(
                folder,
                learner.model_config,
                params,
                config_json=read_json(model_path / "config.json"),
                copy_files=[model_path / name for name in TOKENIZER_FILES if (model_path / name).is_file()],
                dtype=learner.model_config.dtype,
            )
    return folder


# What a learner that stops applying updates for non-finite values should try first: the model's dtypes.
NONFINITE_ADVICE = "try `param_dtype` float32 or `dtype` float32, " + skips.NONFINITE_ADVICE.removeprefix("try ")


class LearnReport(Protocol):
    """Where `learn_from_file` tells what it does: the command line's (`ftw_jax.cli.outputs.LearnOutputs`) logs it
    and writes metrics.jsonl."""

    @property
    def log(self) -> Callable[[str], None]: ...

    def resumed(self, iterations: int) -> None:
        """The run goes on after iteration `iterations`: what was reported of later ones is dropped."""

    def iteration(self, row: dict, total: int | None) -> None:
        """One iteration's metrics (`row["iteration"]` of `total`, None while following)."""

    def evaluation(self, row: dict, name: str) -> None:
        """One evaluation's metrics after `row["iteration"]` iterations, `name` the kind ("eval", "final_test")."""


def _resumed(
    checkpointer: Checkpointer | None, state: LearnerState, log: Callable[[str], None]
) -> tuple[int, LearnerState, int, dict, dict | None]:
    """(iterations done, state, episodes learnt from, skipped-update totals, those learnt from of each file of a
    folder or None): the checkpointer's latest, else a new run's."""
    restored = checkpointer.restore(state) if checkpointer else None
    if not restored:
        rows = checkpointer.directory.parent / "metrics.jsonl" if checkpointer else None
        if rows and rows.is_file() and rows.stat().st_size:  # a run that learnt, stopped before its first checkpoint
            log(f"no checkpoint in {rows.parent / 'checkpoints'}: the run starts again from iteration 0")
        return 0, state, 0, dict.fromkeys(skips.TOTALS, 0), None
    done, state, record = restored
    used = record["episodes_used"]
    log(f"resumed after iteration {done} ({used} episodes learnt from)")
    # "skipped" is absent from checkpoints written before skips were counted
    skipped = {**dict.fromkeys(skips.TOTALS, 0), **record.get("skipped", {})}
    return done, state, used, skipped, record.get("episodes_used_per_file")


def learn_batch(
    learner: EpisodeLearner,
    state: LearnerState,
    place: Callable[[Any], Any],
    episodes: list[Episode],
    iteration: int,
    path: pathlib.Path,
    skipped: dict,
) -> tuple[LearnerState, dict, dict]:
    """One iteration on a batch of episodes of the file at `path`: (state, its metrics row, the skipped-update
    totals: `skipped`, those before it, with its own added)."""
    version_before = int(host_array(state.policy.version))
    check_versions(episodes, version_before, path)
    group_size = learner.learner.group_size
    if group_size > 1:
        episodes = grouped(episodes, group_size, path)
    batch = to_trajectories(episodes, learner.config.max_length)
    state, metrics = learner.step(state, place(batch), iteration)
    max_staleness = getattr(learner.config.algorithm_config, "max_staleness", None)  # FTW's; the others learn all
    row = {
        "reward_mean": float(np.mean([episode.reward for episode in episodes])),
        **(
            {"episodes_stale": stale_episodes(batch, version_before, max_staleness)}
            if max_staleness is not None
            else {}
        ),
        **({"groups_tied": tied_group_share(episodes, group_size)} if group_size > 1 else {}),
        **metrics_row(metrics),
        **sampler_gap_row(metrics),
        **iteration_counts(metrics),
    }
    one_iteration = {name: [row[name]] for name in skips.COUNTS}  # [I = 1]
    return state, row, {name: int(value) for name, value in skips.totals_after(skipped, one_iteration).items()}


def _placed_model(model_path: pathlib.Path, config: LearnConfig, mesh: tuple[int, int] | None):
    """(model, params, place): the checkpoint, its weights laid out over `mesh` (data, model) of this host's
    devices if given (FSDP over "data", tensor parallel over "model"; the jitted step keeps the layout), and
    what puts a host batch where the step reads it."""
    model, params = load_for_learning(model_path, config)
    if jax.process_count() > 1 and mesh is None:
        raise ValueError(
            f"{jax.process_count()} processes need `mesh` DATAxMODEL over all {jax.device_count()} devices."
        )
    if mesh is None:
        return model, params, lambda tree: tree  # one process: numpy batches go to the step as they are
    from ftw_jax.lm.sharding import make_mesh, replicated, shard_params

    device_mesh = make_mesh(*mesh)
    return model, shard_params(params, device_mesh), lambda tree: replicated(tree, device_mesh)


def _warn_if_all_tied(config: LearnConfig, iterations: int, tied: int, log: Callable[[str], None]) -> None:
    """A warning where every group of every iteration this run had equal rewards: a group-relative algorithm
    then had no advantage to learn from (only the KL moved the weights), though every step was applied."""
    if iterations and tied == iterations:
        log(
            f"warning: every group's rewards were tied in all {iterations} iterations: {config.algorithm} had no "
            "advantage to learn from (`groups_tied` in metrics.jsonl); rewards that differ within a group are needed"
        )


def _say_what_waits(config: LearnConfig, feed: FeedSettings, waiting: int, log: Callable[[str], None]) -> int:
    """Logs why a follower stopped, and why `waiting` episodes read were not learnt from (a follower's idle
    timeout, or a short last batch the algorithm cannot learn from); returns how many."""
    if feed.follow:  # a follower ends here only when `idle_timeout` passed (a stop signal raises)
        rest = f"; {waiting} episodes wait for a whole batch" if waiting else ""
        log(f"stopped following: no new line for {feed.idle_timeout} s (`idle_timeout`){rest}")
    elif waiting:
        log(
            f"{waiting} episodes wait: {config.algorithm} learns from no batch of {waiting} with these settings; a "
            "resume learns them with the lines appended since"
        )
    return waiting


def _feed(files: EpisodeFiles, config: LearnConfig, settings: FeedSettings, log: Callable[[str], None]) -> EpisodeFeed:
    """The episodes of `files`, B at a time, read once or followed as `settings` say."""
    return EpisodeFeed(
        files, config.episodes_per_iteration, settings.follow, settings.idle_timeout, settings.poll_seconds, log,
        short_batch_ok=config.learns_a_batch_of,
    )  # fmt: skip


def learn_from_file(
    config: LearnConfig,
    episodes_path: pathlib.Path,
    model_path: pathlib.Path,
    run_folder: pathlib.Path,
    checkpointer: Checkpointer | None,
    report: LearnReport,
    *,
    feed_settings: FeedSettings = FeedSettings(),
    skip_bad_lines: bool = False,
    mesh: tuple[int, int] | None = None,
) -> dict:
    """`ftw-jax lm learn`: the episodes of a JSONL file (or of a folder's, one file per engine worker, in name
    order: `ftw_jax.agent.feed`), B at a time in file order, each batch into the pool and then U FTW updates;
    weights written every `save_every` iterations and after the last. Resumes from the checkpointer's latest,
    with the episodes after those it had learnt from (an engine may have appended more; of a folder, per file).
    With `feed_settings.follow` it then learns the lines an engine appends, a whole batch of B at a time, until a stop
    is asked for (SIGINT, SIGTERM) or `idle_timeout` passes without a new line.
    `mesh` (data, model) lays the weights out over that many of this host's devices (`lm.sharding`).
    Returns the run's summary."""
    started = time.perf_counter()
    model, params, place = _placed_model(model_path, config, mesh)
    files = EpisodeFiles(
        episodes_path, vocab_size=model.config.vocab_size, max_length=config.max_length, skip_bad_lines=skip_bad_lines
    )
    feed = _feed(files, config, feed_settings, report.log)
    learner = EpisodeLearner.build(config, model.config)
    done, state, used, skipped, used_per_file = _resumed(checkpointer, learner.init(params), report.log)
    feed.start_after(used, used_per_file)
    report.resumed(done)
    total, plan = feed.plan(done)
    report.log(f"{plan}; run folder {run_folder}")
    weights, iteration, tied = None, done, 0
    latest = LatestVersion(run_folder, checkpointer)
    with latest.named_on_stop():  # a stopped run names the version its last checkpoint covers
        for chunk in feed.batches(before_each=latest.publish_unless_stopped):
            state, row, skipped = learn_batch(learner, state, place, chunk, iteration, episodes_path, skipped)
            used, iteration, tied = used + len(chunk), iteration + 1, tied + (row.get("groups_tied") == 1.0)
            report.iteration({"iteration": iteration, "episodes": used, **row}, total)
            last = iteration == total
            stop = stop_after_iteration(config, row, iteration, len(chunk), skipped)
            if iteration % config.save_every == 0 or last:
                weights = save_weights(run_folder, learner, state, model_path)
                latest.written(iteration, int(host_array(state.policy.version)))
            record = {"episodes_used": used, "skipped": skipped, **feed.position()}
            save_then_stop(checkpointer, iteration, state, record, last=last, stop=stop)
    if feed.follow and checkpointer and iteration > done and iteration % checkpointer.every:
        checkpointer.save(iteration, state, {"episodes_used": used, "skipped": skipped, **feed.position()}, final=True)
    version = int(host_array(state.policy.version))
    if weights != weights_folder(run_folder, version):  # the newest version, written once
        weights = save_weights(run_folder, learner, state, model_path)
        latest.written(iteration, version)
    latest.finish()
    _warn_if_all_tied(config, iteration - done, tied, report.log)
    return {
        "episodes": used,
        "episodes_waiting": _say_what_waits(config, feed_settings, len(feed.pending), report.log),
        "bad_lines_skipped": len(files.report.skipped),
        "iterations": iteration,
        "version": version,
        "updates_applied": version,
        **{name: skipped[name] for name in ("updates_skipped", "updates_nonfinite")},
        "weights": str(weights),
        "devices": jax.device_count(),
        "seconds": time.perf_counter() - started,
    }

"""Token episodes as a rollout engine writes them (JSON Lines), and as the pool holds them (`Trajectory`).

One line per multi-turn episode (schema version 1; fields not listed are ignored):

    {"tokens": [1, 9, 10, ...],          # the whole episode: prompt, the model's turns, the tools' turns
     "spans": [{"start": 12, "end": 15, "version": 3, "logprobs": [-0.11, -0.52, -0.02]}, ...],
     "reward": 1.0,                      # the terminal reward (the pool ranks by it)
     "group": "q17",                     # optional for FTW: the prompt (a string or an int) the engine sampled G
                                         # episodes for; GRPO and RLOO compare each episode with its group's
     "id": "any string"}                 # optional, named in messages

Each span is a stretch `tokens[start:end]` the model wrote, with the policy version that wrote it (weights an
engine hot-loads mid-episode make several versions in one episode) and the engine's log-probability of each of
its tokens under the distribution it sampled from. Every other token (the prompt, tool output) is the
environment's: outside the loss and the KL. Spans are in order, do not overlap, and start at 1 or later (the
first token has no context to be written from).

As a `Trajectory` of T = max_length − 1 steps: observation t is token t, action t is token t + 1, and step t
is the model's (mask True) when token t + 1 lies in a span; its behaviour log-prob and version are that
token's. Steps past the episode's end are padding (alive False). This is what `ftw_jax.rollout` records, so
the same learner reads both.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np

from ftw_jax.core import diagnostics
from ftw_jax.core.pool import Trajectory

if TYPE_CHECKING:
    import numpy.typing as npt

    from ftw_jax.lm.sampler import Sample


@dataclasses.dataclass(frozen=True)
class Episode:
    """One validated episode: tokens [L], and per token whether the model wrote it, its log-prob and version."""

    tokens: np.ndarray  # [L] int32
    written: np.ndarray  # [L] bool
    logprobs: np.ndarray  # [L] float32 (0 where not written)
    versions: np.ndarray  # [L] int32 (0 where not written)
    reward: float
    id: str | None = None
    span_versions: tuple[int, ...] = ()  # [spans] the version that wrote each span
    line: int | None = None  # its line in the file it was read from
    group: str | None = None  # the prompt it was sampled for, one of G (`"group"`; an int is kept as its digits)


class BadEpisode(ValueError):
    """A line that does not follow the schema; the message names the line and the field."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _is_number(value) -> bool:
    """A finite number that stays finite as the float32 it is learned as (1e300 would become infinity)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) <= _FLOAT32_MAX
    )


def _checked_span(where: str, span: Any, previous_end: int, length: int) -> tuple[int, int, int, list]:
    """(start, end, version, logprobs) of a span that begins at or after `previous_end` in an episode of `length`
    tokens; `BadEpisode` naming the field otherwise."""
    if not isinstance(span, dict) or any(name not in span for name in ("start", "end", "version", "logprobs")):
        raise BadEpisode(f"{where}: expected an object with start, end, version and logprobs")
    start, end, version, values = span["start"], span["end"], span["version"], span["logprobs"]
    if not (_is_int(start) and _is_int(end) and previous_end <= start < end <= length):
        raise BadEpisode(
            f"{where}: start {start!r}, end {end!r} must satisfy {previous_end} <= start < end <= "
            f"{length} (spans in order, not overlapping, after the first token)"
        )
    if not (_is_int(version) and 0 <= version < 2**31):
        raise BadEpisode(f"{where}.version: {version!r} is not an int >= 0")
    if not isinstance(values, list) or len(values) != end - start:
        raise BadEpisode(
            f"{where}.logprobs: expected {end - start} numbers (one per token), got "
            f"{len(values) if isinstance(values, list) else type(values).__name__}"
        )
    bad = next((value for value in values if not (_is_number(value) and value <= 0)), None)
    if bad is not None:
        raise BadEpisode(f"{where}.logprobs: {bad!r} is not a log-probability (a finite float32 number <= 0)")
    return start, end, version, values


def parse_episode(line: str, *, vocab_size: int, max_length: int) -> Episode:
    """The episode of one JSONL line; `BadEpisode` naming the field otherwise."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:  # some of json's messages end in "at" ("Unterminated string starting at")
        raise BadEpisode(f"not JSON ({error.msg.removesuffix(' at')} at column {error.pos + 1})") from None
    return episode_of(record, vocab_size=vocab_size, max_length=max_length)


def episode_of(record: Any, *, vocab_size: int, max_length: int) -> Episode:
    """The episode of one record (a line's JSON value); `BadEpisode` naming the field otherwise."""
    if not isinstance(record, dict):
        raise BadEpisode(f"expected a JSON object, got {type(record).__name__}")
    for field in ("tokens", "spans", "reward"):
        if field not in record:
            raise BadEpisode(f"{field}: missing")
    tokens = record["tokens"]
    if not isinstance(tokens, list) or not tokens:
        raise BadEpisode("tokens: expected a non-empty list of token ids")
    if len(tokens) > max_length:
        raise BadEpisode(f"tokens: {len(tokens)} tokens, more than the maximum length {max_length}")
    for index, token in enumerate(tokens):
        if not (_is_int(token) and 0 <= token < vocab_size):
            raise BadEpisode(f"tokens[{index}]: {token!r} is not a token id in [0, {vocab_size})")
    if not _is_number(record["reward"]):
        raise BadEpisode(f"reward: {record['reward']!r} is not a finite float32 number")
    spans = record["spans"]
    if not isinstance(spans, list):
        raise BadEpisode("spans: expected a list of {start, end, version, logprobs} objects")
    if not spans:
        raise BadEpisode("spans: empty: the model wrote none of the tokens, so there is nothing to learn")
    written = np.zeros(len(tokens), bool)
    logprobs = np.zeros(len(tokens), np.float32)
    versions = np.zeros(len(tokens), np.int32)
    previous_end = 1
    for index, span in enumerate(spans):
        start, end, version, values = _checked_span(f"spans[{index}]", span, previous_end, len(tokens))
        written[start:end], logprobs[start:end], versions[start:end] = True, values, version
        previous_end = end
    episode_id, group = record.get("id"), record.get("group")
    if group is not None and not (isinstance(group, str) or _is_int(group)):
        raise BadEpisode(f"group: {group!r} is not a string or an int (the prompt the episode was sampled for)")
    return Episode(
        tokens=np.asarray(tokens, np.int32),
        written=written,
        logprobs=logprobs,
        versions=versions,
        reward=float(record["reward"]),
        id=None if episode_id is None else str(episode_id),
        span_versions=tuple(span["version"] for span in spans),
        group=None if group is None else str(group),
    )


@dataclasses.dataclass
class ReadReport:
    """What `read_episodes` found: how many lines it kept and, for each it skipped, 'line N: why'."""

    kept: int = 0
    skipped: list[str] = dataclasses.field(default_factory=list)


def _decoded(raw: bytes) -> str:
    """One line as text, its line break dropped (so a JSON error's column counts from the line's start)."""
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as error:
        raise BadEpisode(f"not UTF-8 text (byte {raw[error.start]:#04x} at column {error.start + 1})") from None


def read_episodes(
    path: str | os.PathLike[str], *, vocab_size: int, max_length: int, skip_bad_lines: bool = False
) -> tuple[list[Episode], ReadReport]:
    """Every episode of a JSONL file, in order. A bad line raises ValueError naming its line and field, before
    anything is learnt from the file, or with `skip_bad_lines` is left out and listed in the report. Blank lines are
    skipped silently."""
    tail = EpisodeTail(path, vocab_size=vocab_size, max_length=max_length, skip_bad_lines=skip_bad_lines)
    episodes = tail.read(complete=True)
    return episodes, tail.report


class EpisodeTail:
    """A JSONL file of episodes that an engine appends to, read as it grows: each `read()` parses the whole lines
    written since the last one (a line still being written, with no newline yet, waits for the next read). The
    report counts every line read so far; bad lines are refused or skipped as `read_episodes` does."""

    def __init__(self, path: str | os.PathLike[str], *, vocab_size: int, max_length: int, skip_bad_lines: bool = False):
        self.path = pathlib.Path(path)
        if not self.path.is_file():
            raise ValueError(f"no episodes file at {self.path}.")
        self.vocab_size, self.max_length, self.skip_bad_lines = vocab_size, max_length, skip_bad_lines
        self.offset, self.lines = 0, 0  # bytes and lines read
        self.report = ReadReport()

    def read(self, complete: bool = False) -> list[Episode]:
        """The episodes of the lines appended since the last read; `complete`: the file is whole, so a last line
        without a newline is read too."""
        size = self.path.stat().st_size
        if size < self.offset:
            raise ValueError(f"{self.path} shrank to {size:,} bytes after {self.offset:,} were read; append only.")
        with self.path.open("rb") as file:
            file.seek(self.offset)
            data = file.read()
        end = len(data) if complete else data.rfind(b"\n") + 1
        self.offset += end
        episodes = []
        for raw in data[:end].splitlines():
            self.lines += 1
            if not raw.strip():
                continue
            try:  # decoded line by line, so a line that is not UTF-8 is named like any bad line
                episode = parse_episode(_decoded(raw), vocab_size=self.vocab_size, max_length=self.max_length)
                episodes.append(dataclasses.replace(episode, line=self.lines))
            except BadEpisode as error:
                problem = f"{self.path}:{self.lines}: {error}"
                if not self.skip_bad_lines:
                    raise ValueError(f"{problem} (pass `skip_bad_lines` to leave such lines out).") from None
                self.report.skipped.append(problem)
        self.report.kept += len(episodes)
        return episodes


def check_versions(episodes: list[Episode], learner_version: int, path: str | os.PathLike[str]) -> None:
    """ValueError naming the file, line and span of the first episode written by a policy version ahead of the
    learner's as it learns them: an engine plays only weights the learner has written, so such a version is a bug
    in its bookkeeping (and would make staleness negative)."""
    for episode in episodes:
        for index, version in enumerate(episode.span_versions):
            if version > learner_version:
                raise ValueError(
                    f"{path}:{episode.line}: spans[{index}].version: {version} is ahead of the learner, at version "
                    f"{learner_version} when it learns this line (an engine writes the version of the weights it "
                    "played with: at most weights/latest.json's)."
                )


def grouped(episodes: list[Episode], group_size: int, path: str | os.PathLike[str]) -> list[Episode]:
    """A batch's episodes group by group (groups in the order they first appear, each in file order), for an
    algorithm that compares each episode with the other G − 1 of its prompt (GRPO, RLOO). ValueError naming the
    file and line of an episode without a `group`, or of the first of a group that has other than G episodes in
    the batch (an engine writes a prompt's G episodes together, and B is a multiple of G)."""
    groups: dict[str, list[Episode]] = {}
    for episode in episodes:
        if episode.group is None:
            raise ValueError(
                f"{path}:{episode.line}: group: missing; GRPO and RLOO compare each episode with the others sampled "
                f"for its prompt, so every episode names it (groups of G={group_size})."
            )
        groups.setdefault(episode.group, []).append(episode)
    for name, members in groups.items():
        if len(members) != group_size:
            raise ValueError(
                f"{path}:{members[0].line}: group {name!r} has {len(members)} episodes in a batch of {len(episodes)}, "
                f"expected G={group_size}: an engine writes a prompt's G episodes together, and B is a multiple of G."
            )
    return [episode for members in groups.values() for episode in members]


def tied_group_share(episodes: list[Episode], group_size: int) -> float:
    """The share of a grouped batch's groups (`grouped`) whose G rewards are all equal: their group-relative
    advantages are 0, so they teach GRPO and RLOO nothing."""
    rewards = np.asarray([episode.reward for episode in episodes]).reshape(-1, group_size)
    return float(np.mean(np.all(rewards == rewards[:, :1], axis=1)))


def stale_episodes(batch: Trajectory, version: int, max_staleness: int | None) -> int:
    """How many of a batch's episodes [B, T] were written by a policy more than `max_staleness` versions before
    `version` (their oldest model token's, `diagnostics.staleness`): the pool never selects them
    (`--max-staleness`). 0 without a bound."""
    if max_staleness is None:
        return 0
    staleness = diagnostics.staleness(jnp.int32(version), batch.behaviour_version, batch.mask)
    return int(np.sum(np.asarray(staleness) > max_staleness))


def to_trajectories(episodes: list[Episode], max_length: int) -> Trajectory:
    """Episodes as a batch of trajectories [E, T = max_length − 1] (numpy; the pool's dtypes)."""
    steps = max_length - 1
    count = len(episodes)
    observation = np.zeros((count, steps), np.int32)
    action = np.zeros((count, steps), np.int32)
    mask = np.zeros((count, steps), bool)
    logp = np.zeros((count, steps), np.float32)
    version = np.zeros((count, steps), np.int32)
    reward = np.zeros((count, steps), np.float32)
    alive = np.zeros((count, steps), bool)
    for row, episode in enumerate(episodes):
        n = len(episode.tokens) - 1  # steps of this episode
        observation[row, :n], action[row, :n] = episode.tokens[:-1], episode.tokens[1:]
        mask[row, :n], logp[row, :n], version[row, :n] = episode.written[1:], episode.logprobs[1:], episode.versions[1:]
        alive[row, :n] = True
        if n:
            reward[row, n - 1] = episode.reward
    host: dict[str, Any] = dict(  # NumPy arrays, on the host (annotated as jax.Array in Trajectory)
        observation=observation,
        action=action,
        mask=mask,
        behaviour_logp=logp,
        behaviour_version=version,
        episode_return=np.asarray([e.reward for e in episodes], np.float32),
        reward=reward,
        alive=alive,
    )
    return Trajectory(**host)


def episode_records(trajectories: Trajectory) -> Iterable[dict]:
    """The JSONL records of a batch of trajectories [E, T] (as `rollout` plays them): the inverse of
    `to_trajectories` on the steps before each episode's end. Each maximal run of model-written tokens of one
    version is a span."""
    arrays = {
        name: np.asarray(getattr(trajectories, name))
        for name in ("observation", "action", "mask", "behaviour_logp", "behaviour_version", "alive", "episode_return")
    }
    for row in range(arrays["action"].shape[0]):
        steps = int(arrays["alive"][row].sum())
        tokens = [int(arrays["observation"][row, 0])] + [int(token) for token in arrays["action"][row, :steps]]
        spans, start = [], None
        for t in range(steps + 1):
            inside = t < steps and bool(arrays["mask"][row, t])
            same = (
                start is not None
                and inside
                and arrays["behaviour_version"][row, t] == arrays["behaviour_version"][row, start]
            )
            if start is not None and not same:
                spans.append(
                    {
                        "start": start + 1,
                        "end": t + 1,
                        "version": int(arrays["behaviour_version"][row, start]),
                        "logprobs": [float(value) for value in arrays["behaviour_logp"][row, start:t]],
                    }
                )
                start = None
            if inside and start is None:
                start = t
        yield {"tokens": tokens, "spans": spans, "reward": float(arrays["episode_return"][row])}


def write_episodes(path: str | os.PathLike[str], records: Iterable[dict]) -> int:
    """Appends records to a JSONL file, one line each; returns how many."""
    count = 0
    with pathlib.Path(path).open("a") as file:
        for record in records:
            file.write(json.dumps(record) + "\n")
            count += 1
    return count


def sample_records(sample: Sample, rewards: npt.ArrayLike, version: int) -> list[dict]:
    """The JSONL records of the in-process sampler's continuations (`lm.make_sampler`'s `Sample` [B, P + M], or a
    conversation's, `lm.turns`): each row's real tokens (padding and holes dropped), each run of tokens it generated
    as a span written by `version` with the log-probs they were sampled with, and its reward ([B] floats, e.g. from
    a verifier)."""
    arrays = {name: np.asarray(getattr(sample, name)) for name in ("tokens", "generated", "logp", "attention_mask")}
    records = []
    for row, reward in enumerate(np.asarray(rewards, np.float64).tolist()):
        real = arrays["attention_mask"][row]
        tokens, generated, logp = (arrays[name][row][real] for name in ("tokens", "generated", "logp"))
        edges = np.flatnonzero(np.diff(np.concatenate([[False], generated, [False]]).astype(np.int8)))
        spans = [
            {"start": int(start), "end": int(end), "version": int(version), "logprobs": logp[start:end].tolist()}
            for start, end in zip(edges[::2], edges[1::2])
        ]
        records.append({"tokens": [int(token) for token in tokens], "spans": spans, "reward": float(reward)})
    return records


class EpisodeFeed:
    """The episodes of a file still to learn from, `batch_size` at a time in file order: those read, then
    (`follow`) those an engine appends, until `idle_timeout` seconds pass without a new line. Without `follow` the
    last batch may be short where `short_batch_ok(size)` says the algorithm learns from one of that size; else
    its episodes wait (`pending`) for a resume with more lines."""

    def __init__(
        self,
        tail: EpisodeTail,
        batch_size: int,
        follow: bool,
        idle_timeout: float | None,
        poll_seconds: float,
        log: Callable[[str], None],
        short_batch_ok: Callable[[int], bool] = lambda size: True,
    ):
        self.tail, self.batch_size, self.follow, self.log = tail, batch_size, follow, log
        self.short_batch_ok = short_batch_ok
        self.idle_timeout, self.poll_seconds = idle_timeout, poll_seconds
        self.pending = tail.read(complete=not follow)  # read, not learnt from yet (a follower waits for a last
        self._log_bad_lines(0)  # line's newline)
        if not self.pending and not follow:
            raise ValueError(f"{tail.path} holds no usable episode.")
        self.to_skip = 0  # lines learnt from before a restart, not read yet
        self.idle_since, self.handed_out = time.monotonic(), False  # idle: waiting, not learning

    def start_after(self, used: int) -> None:
        """Leaves out the first `used` episodes, which the run learnt from before it was resumed."""
        # The run's next episode is the (used + 1)-th: a rewritten file has none (a follower may lack one last
        # line that a run without `follow` learnt before its newline came).
        if used - len(self.pending) > (1 if self.follow else 0):
            raise ValueError(
                f"{self.tail.path} now holds {len(self.pending)} usable episodes, fewer than the {used} this run has "
                "learnt from: an engine appends to the file, never rewrites it; resume with the whole file, or start "
                "a new run."
            )
        self.pending, self.to_skip = self.pending[used:], max(used - len(self.pending), 0)
        self.idle_since = time.monotonic()  # the run is ready to learn: waiting counts from here

    def plan(self, done: int) -> tuple[int | None, str]:
        """(the iteration the run ends at after `done`, None while following; what it will learn from, in words)."""
        whole, rest = divmod(len(self.pending), self.batch_size)
        total = None if self.follow else done + whole + int(rest > 0 and self.short_batch_ok(rest))
        plan = (
            f"then those appended to {self.tail.path} as they come, {self.batch_size} an iteration"
            if total is None
            else f"in {total - done} iterations of up to {self.batch_size}"
        )
        skipped = len(self.tail.report.skipped)
        return total, f"learning from {len(self.pending)} new episodes ({skipped} bad lines skipped) {plan}"

    def _log_bad_lines(self, reported: int) -> None:
        problems = self.tail.report.skipped[reported:]
        for problem in problems[:10]:
            self.log(f"skipped {problem}")
        if len(problems) > 10:
            self.log(f"... and {len(problems) - 10} more bad lines skipped")

    def batches(self, before_each: Callable[[], None] = lambda: None) -> Iterator[list[Episode]]:
        """Every batch, in order (`next_batch`'s until it has none), calling `before_each` before each read, poll
        included: a stop asked for while a follower waits is seen within one poll."""
        while True:
            before_each()
            batch = self.next_batch()
            if batch is None:
                return
            if batch:
                yield batch

    def next_batch(self) -> list[Episode] | None:
        """The next batch (without `follow` the last may be short; a follower learns from whole ones only); [] when
        a follower has none yet (after a poll: ask again); None when all are learnt from, or the idle timeout
        passed without a new line."""
        if self.handed_out:  # the last batch has been learnt from: idle from now
            self.idle_since, self.handed_out = time.monotonic(), False
        if self.follow and len(self.pending) < self.batch_size:
            reported = len(self.tail.report.skipped)
            new = self.tail.read()
            self._log_bad_lines(reported)
            dropped = min(self.to_skip, len(new))
            new, self.to_skip = new[dropped:], self.to_skip - dropped
            if new or dropped:
                self.pending, self.idle_since = self.pending + new, time.monotonic()
            elif self.idle_timeout is not None and time.monotonic() - self.idle_since >= self.idle_timeout:
                return None
            else:
                time.sleep(self.poll_seconds)
            return []
        if not self.pending or (len(self.pending) < self.batch_size and not self.short_batch_ok(len(self.pending))):
            return None
        batch, self.pending = self.pending[: self.batch_size], self.pending[self.batch_size :]
        self.handed_out = True
        return batch

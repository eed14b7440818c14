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
token's. Steps past the episode's end are padding (alive False). This is what `ftw_jax.lab.rollout` records, so
the same learner reads both.

Files of episodes, read as an engine appends to them, are `ftw_jax.agent.feed`'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

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
    file: str | None = None  # the file it was read from (messages name it; `ftw_jax.agent.feed`)


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


def check_versions(episodes: list[Episode], learner_version: int, path: str | os.PathLike[str]) -> None:
    """ValueError naming the file (the episode's, else `path`), line and span of the first episode written by a
    policy version ahead of the learner's as it learns them: an engine plays only weights the learner has written,
    so such a version is a bug in its bookkeeping (and would make staleness negative)."""
    for episode in episodes:
        for index, version in enumerate(episode.span_versions):
            if version > learner_version:
                raise ValueError(
                    f"{episode.file or path}:{episode.line}: spans[{index}].version: {version} is ahead of the "
                    f"learner, at version {learner_version} when it learns this line (an engine writes the version of "
                    "the weights it played with: at most weights/latest.json's)."
                )


def grouped(episodes: list[Episode], group_size: int, path: str | os.PathLike[str]) -> list[Episode]:
    """A batch's episodes group by group (groups in the order they first appear, each in file order), for an
    algorithm that compares each episode with the other G − 1 of its prompt (GRPO, RLOO). ValueError naming the
    file (the episode's, else `path`) and line of an episode without a `group`, or of the first of a group that has
    other than G episodes in the batch (an engine writes a prompt's G episodes together, and B is a multiple of G)."""
    groups: dict[str, list[Episode]] = {}
    for episode in episodes:
        if episode.group is None:
            raise ValueError(
                f"{episode.file or path}:{episode.line}: group: missing; GRPO and RLOO compare each episode with the "
                f"others sampled for its prompt, so every episode names it (groups of G={group_size})."
            )
        groups.setdefault(episode.group, []).append(episode)
    for name, members in groups.items():
        if len(members) != group_size:
            raise ValueError(
                f"{members[0].file or path}:{members[0].line}: group {name!r} has {len(members)} episodes in a batch "
                f"of {len(episodes)}, expected G={group_size}: an engine writes a prompt's G episodes together, and B "
                "is a multiple of G."
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


def sample_records(
    sample: Sample, rewards: npt.ArrayLike, version: int, log_probs: Literal["logp", "model_logp"] = "logp"
) -> list[dict]:
    """The JSONL records of the in-process sampler's continuations (`lm.make_sampler`'s `Sample` [B, P + M], or a
    conversation's, `lm.turns`): each row's real tokens (padding and holes dropped), each run of tokens it generated
    as a span written by `version` with its log-probs, and its reward ([B] floats, e.g. from a verifier). The
    log-probs are those of the distribution sampled from (`logp`), or the plain model's (`model_logp`: what a
    learner that samples within a nucleus but computes its ratios on the model's own probabilities records, as
    verl does)."""
    arrays = {name: np.asarray(getattr(sample, name)) for name in ("tokens", "generated", "attention_mask")}
    arrays["logp"] = np.asarray(getattr(sample, log_probs))
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

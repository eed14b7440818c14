"""Episode files as an engine appends to them, read as they grow, and handed to the learner B at a time in an
order a resume can take up exactly.

    files = EpisodeFiles(path, vocab_size=V, max_length=L)    # a JSONL file, or a folder of *.jsonl files
    feed = EpisodeFeed(files, batch_size, settings.follow, settings.idle_timeout, settings.poll_seconds, log)
    feed.start_after(used, used_per_file)                       # what a checkpoint's record says was learnt
    for batch in feed.batches(): ...                            # record {"episodes_used": n, **feed.position()}

A folder holds one file per engine worker, each appended to by that worker alone (two writers appending to one
file tear each other's lines). Its files are read in name order (Python's `sorted`: `w10` before `w2`, so pad
numbers); each read takes every file's new whole lines, file after file, and a file that appears later joins
in at its place in that order. Without `follow` that is the files concatenated in name order. A checkpoint
counts the episodes learnt from each file (`position`), so a resume goes on with exactly those not learnt yet.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from ftw_jax.agent.episodes import BadEpisode, Episode, parse_episode
from ftw_jax.core.settings import check_settings, check_takes_effect, setting


@dataclasses.dataclass(frozen=True)
class FeedSettings:
    """How `lm learn` reads its episode files: once, or followed as an engine appends to them. They decide when a
    run stops reading, not what it learns, so a resume may change them."""

    follow: bool = setting(
        False,
        "keep the learner running: after the file's episodes, learn from the lines an engine appends, a batch of B "
        "as soon as B are there (stop with Ctrl-C or SIGTERM, resumable, or `idle_timeout`)",
    )
    idle_timeout: float | None = setting(None, "with `follow`: stop after this many seconds without a new line")
    poll_seconds: float = setting(0.5, "with `follow`: how often to look for new lines")

    def __post_init__(self):
        check_settings(self)
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise ValueError(f"idle_timeout must be None or > 0 seconds, got {self.idle_timeout!r}.")
        if not self.poll_seconds > 0:
            raise ValueError(f"poll_seconds must be > 0, got {self.poll_seconds!r}.")
        for name in ("idle_timeout", "poll_seconds"):
            check_takes_effect(self, name, self.follow, "`follow`")


_SEEN_BYTES = 64  # of a followed file's last bytes read, kept to notice a rewrite in place


@dataclasses.dataclass
class ReadReport:
    """What `read_episodes` found: how many lines it kept and, for each it skipped, 'path:line: why'."""

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
    """Every episode of a JSONL file (or of a folder's, in name order), in order. A bad line raises ValueError
    naming its file, line and field, before anything is learnt, or with `skip_bad_lines` is left out and listed in
    the report. Blank lines are skipped silently."""
    files = EpisodeFiles(path, vocab_size=vocab_size, max_length=max_length, skip_bad_lines=skip_bad_lines)
    episodes = files.read(complete=True)
    return episodes, files.report


class EpisodeTail:
    """A JSONL file of episodes that an engine appends to, read as it grows: each `read()` parses the whole lines
    written since the last one (a line still being written, with no newline yet, waits for the next read). The
    report counts every line read so far; bad lines are refused or skipped as `read_episodes` does. A file that
    is no longer the one read (another under its name, one shorter than what was read, or one whose bytes read
    changed) is refused in one line: it is never read on from the old offset."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        vocab_size: int,
        max_length: int,
        skip_bad_lines: bool = False,
        report: ReadReport | None = None,
    ):
        self.path = pathlib.Path(path)
        if not self.path.is_file():
            raise ValueError(f"no episodes file at {self.path}.")
        self.vocab_size, self.max_length, self.skip_bad_lines = vocab_size, max_length, skip_bad_lines
        self.offset, self.lines = 0, 0  # bytes and lines read
        self.report = ReadReport() if report is None else report  # a folder's tails share one
        self.identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file read
        self.seen = b""  # the last bytes read, before `offset`

    def read(self, complete: bool = False) -> list[Episode]:
        """The episodes of the lines appended since the last read; `complete`: the file is whole, so a last line
        without a newline is read too."""
        try:
            with self.path.open("rb") as file:
                data = self._new_bytes(file)
        except FileNotFoundError:
            raise ValueError(self._not_the_file_read("was removed")) from None
        end = len(data) if complete else data.rfind(b"\n") + 1
        self.offset += end
        self.seen = (self.seen + data[:end])[-_SEEN_BYTES:]
        episodes = []
        for raw in data[:end].splitlines():
            self.lines += 1
            if not raw.strip():
                continue
            try:  # decoded line by line, so a line that is not UTF-8 is named like any bad line
                episode = parse_episode(_decoded(raw), vocab_size=self.vocab_size, max_length=self.max_length)
                episodes.append(dataclasses.replace(episode, line=self.lines, file=str(self.path)))
            except BadEpisode as error:
                problem = f"{self.path}:{self.lines}: {error}"
                if not self.skip_bad_lines:
                    raise ValueError(f"{problem} (pass `skip_bad_lines` to leave such lines out).") from None
                self.report.skipped.append(problem)
        self.report.kept += len(episodes)
        return episodes

    def _new_bytes(self, file) -> bytes:
        """The bytes after `offset` of the open `file`, once it is known to be the file read so far: the same
        device and inode, at least `offset` bytes, and its last bytes read unchanged."""
        status = os.fstat(file.fileno())
        identity = (status.st_dev, status.st_ino)
        self.identity = self.identity or identity
        if identity != self.identity:
            raise ValueError(self._not_the_file_read("was replaced (another file now has its name)"))
        if status.st_size < self.offset:
            how = f"was rewritten (it holds {status.st_size:,} bytes, fewer than the {self.offset:,} read)"
            raise ValueError(self._not_the_file_read(how))
        file.seek(self.offset - len(self.seen))
        data = file.read()
        if not data.startswith(self.seen):
            raise ValueError(self._not_the_file_read("was rewritten (the bytes read have changed)"))
        return data[len(self.seen) :]

    def _not_the_file_read(self, how: str) -> str:
        return (
            f"{self.path} {how} after {self.lines} lines were read; an engine appends to the file, never rewrites "
            "it; if the file now under that name begins with the lines read, `resume` reads it from its start, "
            "else start a new run."
        )


def episode_file(episode: Episode) -> str:
    """The name of the file an episode was read from (its key in `EpisodeFeed.position`)."""
    return pathlib.PurePath(episode.file or "").name


class EpisodeFiles:
    """The episodes of one JSONL file, or of a folder of them (`*.jsonl`, one per engine worker, each appended to
    by that worker alone), each file read by its own `EpisodeTail` into one report. A read takes each file's new
    whole lines in name order; a file that appears in the folder later joins in."""

    def __init__(self, path: str | os.PathLike[str], *, vocab_size: int, max_length: int, skip_bad_lines: bool = False):
        self.path = pathlib.Path(path)
        self.folder = self.path.is_dir()
        if not (self.folder or self.path.is_file()):
            raise ValueError(f"no episodes file or folder at {self.path}.")
        self.options: dict[str, Any] = dict(vocab_size=vocab_size, max_length=max_length, skip_bad_lines=skip_bad_lines)
        self.report = ReadReport()
        self.tails: dict[str, EpisodeTail] = {}  # by file name, in name order
        if not self.folder:
            self.tails[self.path.name] = EpisodeTail(self.path, **self.options, report=self.report)

    def where(self, name: str) -> pathlib.Path:
        """The path of the file called `name` (of the folder, or the file itself)."""
        return self.path / name if self.folder else self.path

    def read(self, complete: bool = False) -> list[Episode]:
        """The episodes of the lines appended since the last read, file after file in name order (`complete`: the
        files are whole, so a last line without a newline is read too)."""
        if self.folder:
            found = {path.name for path in self.path.glob("*.jsonl") if path.is_file()}
            for name in found - set(self.tails):
                if not name.startswith("."):  # hidden: an editor's or a copy's temporary file
                    self.tails[name] = EpisodeTail(self.path / name, **self.options, report=self.report)
            self.tails = dict(sorted(self.tails.items()))
        return [episode for tail in self.tails.values() for episode in tail.read(complete)]


def _without_first(episodes: list[Episode], counts: dict[str, int]) -> list[Episode]:
    """`episodes` without the first `counts[name]` of each file (`counts` is counted down by those left out)."""
    kept = []
    for episode in episodes:
        name = episode_file(episode)
        if counts.get(name, 0) > 0:
            counts[name] -= 1
        else:
            kept.append(episode)
    return kept


class EpisodeFeed:
    """The episodes of a file or folder still to learn from, `batch_size` at a time in the order they are read:
    those read, then (`follow`) those engines append, until `idle_timeout` seconds pass without a new line.
    Without `follow` the last batch may be short where `short_batch_ok(size)` says the algorithm learns from one
    of that size; else its episodes wait (`pending`) for a resume with more lines."""

    def __init__(
        self,
        files: EpisodeFiles,
        batch_size: int,
        follow: bool,
        idle_timeout: float | None,
        poll_seconds: float,
        log: Callable[[str], None],
        short_batch_ok: Callable[[int], bool] = lambda size: True,
    ):
        self.files, self.batch_size, self.follow, self.log = files, batch_size, follow, log
        self.short_batch_ok = short_batch_ok
        self.idle_timeout, self.poll_seconds = idle_timeout, poll_seconds
        self.pending = files.read(complete=not follow)  # read, not learnt from yet (a follower waits for a last
        self._log_bad_lines(0)  # line's newline)
        if not self.pending and not follow:
            raise ValueError(f"{files.path} holds no usable episode.")
        self.used: dict[str, int] = {}  # episodes of each file handed out to learn from, those before a resume too
        self.to_skip: dict[str, int] = {}  # of each file: lines learnt from before a restart, not read yet
        self.idle_since, self.handed_out = time.monotonic(), False  # idle: waiting, not learning

    def start_after(self, used: int, used_per_file: dict[str, int] | None = None) -> None:
        """Leaves out the episodes the run learnt from before it was resumed: the file's first `used`, or the first
        `used_per_file[name]` of each file of a folder."""
        if used_per_file is None and self.files.folder and used:
            raise ValueError(
                f"{self.files.path}: the checkpoint counts {used} episodes learnt but not those of each file (a run "
                "over one file wrote it); resume with that file, or start a new run."
            )
        counts = used_per_file if used_per_file is not None else {self.files.path.name: used} if used else {}
        read = {name: 0 for name in counts}
        for episode in self.pending:
            read[episode_file(episode)] = read.get(episode_file(episode), 0) + 1
        for name, count in sorted(counts.items()):
            # The run's next episode of a file is its (count + 1)-th: a rewritten file has none (a follower may
            # lack one last line that a run without `follow` learnt before its newline came).
            if count - read[name] > (1 if self.follow else 0):
                raise ValueError(
                    f"{self.files.where(name)} now holds {read[name]} usable episodes, fewer than the {count} this "
                    "run has learnt from: an engine appends to the file, never rewrites it; resume with the whole "
                    "file, or start a new run."
                )
        self.used = dict(counts)
        self.pending = _without_first(self.pending, dict(counts))
        self.to_skip = {name: max(count - read[name], 0) for name, count in counts.items()}
        self.idle_since = time.monotonic()  # the run is ready to learn: waiting counts from here

    def position(self) -> dict:
        """What a checkpoint's record keeps beside the total `episodes_used`: for a folder, how many episodes of
        each file the run has learnt from (`episodes_used_per_file`, {name: count})."""
        return {"episodes_used_per_file": dict(sorted(self.used.items()))} if self.files.folder else {}

    def plan(self, done: int) -> tuple[int | None, str]:
        """(the iteration the run ends at after `done`, None while following; what it will learn from, in words)."""
        whole, rest = divmod(len(self.pending), self.batch_size)
        total = None if self.follow else done + whole + int(rest > 0 and self.short_batch_ok(rest))
        where = f"the *.jsonl files of {self.files.path}" if self.files.folder else str(self.files.path)
        plan = (
            f"then those appended to {where} as they come, {self.batch_size} an iteration"
            if total is None
            else f"in {total - done} iterations of up to {self.batch_size}"
        )
        skipped = len(self.files.report.skipped)
        return total, f"learning from {len(self.pending)} new episodes ({skipped} bad lines skipped) {plan}"

    def _log_bad_lines(self, reported: int) -> None:
        problems = self.files.report.skipped[reported:]
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
            reported = len(self.files.report.skipped)
            read = self.files.read()
            self._log_bad_lines(reported)
            if read:  # new lines, those learnt from before a restart (left out here) included
                self.pending, self.idle_since = self.pending + _without_first(read, self.to_skip), time.monotonic()
            elif self.idle_timeout is not None and time.monotonic() - self.idle_since >= self.idle_timeout:
                return None
            else:
                time.sleep(self.poll_seconds)
            return []
        if not self.pending or (len(self.pending) < self.batch_size and not self.short_batch_ok(len(self.pending))):
            return None
        batch, self.pending = self.pending[: self.batch_size], self.pending[self.batch_size :]
        for episode in batch:
            self.used[episode_file(episode)] = self.used.get(episode_file(episode), 0) + 1
        self.handed_out = True
        return batch

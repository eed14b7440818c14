"""Episode files as engines append to them (`ftw_jax.agent.feed`): a folder of one file per worker read in name
order and resumed per file, torn lines from two writers sharing a file named by file and line, and a followed
file that is replaced refused rather than read on from the old offset."""

import json
import os
import pathlib

import pytest

from ftw_jax.agent.feed import EpisodeFeed, EpisodeFiles, EpisodeTail, episode_file, read_episodes

VOCAB, LENGTH = 64, 16


def record(name: str, length: int = 6) -> dict:
    """A valid episode of `length` tokens (the model wrote the last three), its id `name`."""
    return {
        "tokens": [1, *range(9, 8 + length)],
        "spans": [{"start": length - 3, "end": length, "version": 0, "logprobs": [-0.5, -1.0, -0.1]}],
        "reward": 1.0,
        "id": name,
    }


def lines(*names: str) -> str:
    return "".join(json.dumps(record(name)) + "\n" for name in names)


def ids(episodes) -> list[str]:
    return [episode.id for episode in episodes]


def feed_of(path: pathlib.Path, batch_size: int, follow: bool = False) -> EpisodeFeed:
    files = EpisodeFiles(path, vocab_size=VOCAB, max_length=LENGTH)
    return EpisodeFeed(files, batch_size, follow, idle_timeout=0.0, poll_seconds=0.0, log=lambda message: None)


def test_a_folder_is_read_file_after_file_in_name_order_and_a_file_that_appears_joins_in(tmp_path):
    (tmp_path / "w1.jsonl").write_text(lines("b1", "b2"))
    (tmp_path / "w0.jsonl").write_text(lines("a1") + json.dumps(record("a2"))[:20])  # a2 half written
    (tmp_path / ".w2.jsonl").write_text("{not an episode\n")  # hidden (a copy's or an editor's): left alone
    (tmp_path / "notes.txt").write_text("{not an episode\n")  # not *.jsonl
    files = EpisodeFiles(tmp_path, vocab_size=VOCAB, max_length=LENGTH)
    first = files.read()
    assert ids(first) == ["a1", "b1", "b2"]
    assert [(episode_file(e), e.line) for e in first] == [("w0.jsonl", 1), ("w1.jsonl", 1), ("w1.jsonl", 2)]
    with (tmp_path / "w0.jsonl").open("a") as file:
        file.write(json.dumps(record("a2"))[20:] + "\n")
    (tmp_path / "w00.jsonl").write_text(lines("c1"))  # a worker that starts later, between w0 and w1 by name
    with (tmp_path / "w1.jsonl").open("a") as file:
        file.write(lines("b3"))
    assert ids(files.read()) == ["a2", "c1", "b3"] and files.read() == []
    episodes, report = read_episodes(tmp_path, vocab_size=VOCAB, max_length=LENGTH)  # the files concatenated
    assert ids(episodes) == ["a1", "a2", "c1", "b1", "b2", "b3"] and report.kept == 6
    with (tmp_path / "w1.jsonl").open("a") as file:
        file.write("{not json\n")
    with pytest.raises(ValueError, match=f"^{tmp_path / 'w1.jsonl'}:4: not JSON"):
        files.read()


def test_a_folder_feed_resumed_per_file_hands_out_each_episode_once_in_the_uninterrupted_order(tmp_path):
    """Batches of 3 over w0 (4 lines) and w1 (2, then 3 more): stopped after two batches and resumed from the
    per-file counts, the batches are those of one feed over the finished files (w2, new, joins in)."""
    (tmp_path / "w0.jsonl").write_text(lines("a1", "a2", "a3", "a4"))
    (tmp_path / "w1.jsonl").write_text(lines("b1", "b2"))
    feed = feed_of(tmp_path, 3)
    done = [ids(feed.next_batch() or []) for _ in range(2)]
    assert done == [["a1", "a2", "a3"], ["a4", "b1", "b2"]]
    position = feed.position()
    assert position == {"episodes_used_per_file": {"w0.jsonl": 4, "w1.jsonl": 2}}
    with (tmp_path / "w1.jsonl").open("a") as file:
        file.write(lines("b3", "b4", "b5"))
    (tmp_path / "w2.jsonl").write_text(lines("c1"))
    resumed = feed_of(tmp_path, 3)
    resumed.start_after(6, position["episodes_used_per_file"])
    rest = list(map(ids, resumed.batches()))
    assert rest == [["b3", "b4", "b5"], ["c1"]]
    assert resumed.position() == {"episodes_used_per_file": {"w0.jsonl": 4, "w1.jsonl": 5, "w2.jsonl": 1}}
    whole = list(map(ids, feed_of(tmp_path, 3).batches()))
    assert whole == [*done, *rest]


def test_a_resumed_folder_follower_waits_for_a_last_line_learnt_before_its_newline(tmp_path):
    """A run without `follow` learnt w0's last line before its newline came; a follower resumed from that
    checkpoint leaves the line out when its newline comes, and learns what follows it once."""
    half = json.dumps(record("a2"))
    (tmp_path / "w0.jsonl").write_text(lines("a1") + half)
    (tmp_path / "w1.jsonl").write_text(lines("b1"))
    first = feed_of(tmp_path, 3)
    assert ids(first.next_batch() or []) == ["a1", "a2", "b1"]
    follower = feed_of(tmp_path, 2, follow=True)
    follower.start_after(3, first.position()["episodes_used_per_file"])
    assert follower.pending == [] and follower.to_skip == {"w0.jsonl": 1, "w1.jsonl": 0}
    with (tmp_path / "w0.jsonl").open("a") as file:
        file.write("\n" + lines("a3"))
    with (tmp_path / "w1.jsonl").open("a") as file:
        file.write(lines("b2"))
    assert follower.next_batch() == [] and ids(follower.pending) == ["a3", "b2"]
    assert ids(follower.next_batch() or []) == ["a3", "b2"]


def test_a_resume_refuses_a_folder_file_with_fewer_episodes_than_were_learnt_naming_it(tmp_path):
    (tmp_path / "w0.jsonl").write_text(lines("a1"))
    (tmp_path / "w1.jsonl").write_text(lines("b1"))
    with pytest.raises(ValueError, match=f"^{tmp_path / 'w1.jsonl'} now holds 1 usable episodes, fewer than the 3 "):
        feed_of(tmp_path, 2).start_after(4, {"w0.jsonl": 1, "w1.jsonl": 3})
    with pytest.raises(ValueError, match="counts 2 episodes learnt but not those of each file"):
        feed_of(tmp_path, 2).start_after(2, None)  # a checkpoint of a run over one file


def torn_appends(path: pathlib.Path, first: list[str], second: list[str], cuts: list[tuple[int, int]]) -> None:
    """Two unsynchronised buffered appenders of one file: each writer's lines go out in chunks (a buffer flushed
    when full, wherever that falls), `cuts[i]` = (its line, the byte in it) where its i-th chunk ends, and the
    chunks of the two interleave: the first's, the second's, the first's, ..."""
    streams = []
    for written, ends in ((first, [cut[0] for cut in cuts]), (second, [cut[1] for cut in cuts])):
        text = "".join(written)
        offsets = [len("".join(written[:line])) + byte for line, byte in ends] + [len(text)]
        streams.append([text[start:end] for start, end in zip([0, *offsets], offsets)])
    with path.open("a") as file:
        for one, other in zip(*streams):
            file.write(one)
            file.flush()
            file.write(other)
            file.flush()


def test_two_writers_tearing_one_file_are_named_by_line_and_skipped_keeping_every_intact_line(tmp_path):
    """Two workers' buffers flushed into one file, each once in the middle of its second line, tear lines 2
    (a1's head and b0), 3 and 6 (b1's head and a1's tail, b1's tail). Line 3, cut after the tokens, is valid
    JSON, caught by the schema. Refused at the first torn line naming file and line; with skip_bad_lines each
    is named, and every intact episode kept once."""
    first = [json.dumps(record(f"a{i}", length=12)) + "\n" for i in range(4)]
    second = [json.dumps(record(f"b{i}", length=4)) + "\n" for i in range(4)]
    after_tokens = lambda line: line.index(', "spans"')  # noqa: E731
    path = tmp_path / "episodes.jsonl"
    torn_appends(path, first, second, [((1, after_tokens(first[1])), (1, after_tokens(second[1])))])
    torn = path.read_text().splitlines()
    assert json.loads(torn[2])["id"] == "a1"  # b1's tokens and a1's spans: it parses
    with pytest.raises(ValueError, match=f"^{path}:2: not JSON .*pass `skip_bad_lines`"):
        read_episodes(path, vocab_size=VOCAB, max_length=LENGTH)
    episodes, report = read_episodes(path, vocab_size=VOCAB, max_length=LENGTH, skip_bad_lines=True)
    assert ids(episodes) == ["a0", "a2", "a3", "b2", "b3"] and len(torn) == 8
    assert [problem.split(": ")[0] for problem in report.skipped] == [f"{path}:{line}" for line in (2, 3, 6)]
    assert report.skipped[1] == f"{path}:3: spans[0]: start 9, end 12 must satisfy 1 <= start < end <= 4 " + (
        "(spans in order, not overlapping, after the first token)"
    )


@pytest.mark.parametrize("how", ["replaced by a longer file", "replaced by a shorter file", "truncated", "rewritten"])
def test_a_followed_file_no_longer_the_one_read_is_refused_naming_it(tmp_path, how):
    """The tail read 2 lines; then the file under its name is another (a new inode: longer or shorter than
    what was read, written on since), or the same one cut shorter or rewritten in place. Never read on from the
    old offset (which would skip the new file's first lines, or start mid-line): one line naming the file."""
    path = tmp_path / "episodes.jsonl"
    path.write_text(lines("a1", "a2"))
    tail = EpisodeTail(path, vocab_size=VOCAB, max_length=LENGTH)
    assert ids(tail.read()) == ["a1", "a2"]
    other = tmp_path / "other.jsonl"
    if how == "replaced by a longer file":
        other.write_text(lines("n1", "n2", "n3"))
    elif how == "replaced by a shorter file":
        other.write_text(lines("n1"))
    if how.startswith("replaced"):
        os.replace(other, path)
        with path.open("a") as file:  # the engine writes on: the shorter file grows past the old offset
            file.write(lines("n4", "n5"))
        what = r"was replaced \(another file now has its name\)"
    elif how == "truncated":
        path.write_text(lines("a1")[:10])
        what = r"was rewritten \(it holds 10 bytes, fewer than the \d+ read\)"
    else:
        path.write_text(lines("x1", "x2", "x3"))  # the same inode, as long as before and more: its bytes differ
        what = r"was rewritten \(the bytes read have changed\)"
    with pytest.raises(ValueError, match=f"^{path} {what} after 2 lines were read; an engine appends to the file, "):
        tail.read()

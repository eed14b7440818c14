"""Search-R1's files: questions (parquet or JSON Lines) and a corpus of passages (JSON Lines), read and checked.

    questions = read_questions("nq_hotpotqa_train/train.parquet")   # or FlashRAG's train.jsonl
    corpus = Corpus.open("wiki-18.jsonl")                           # passages read from disk as they are needed
    corpus[17].title, corpus[17].text

A question row is any of the shapes Search-R1 and verl write: the answers are `golden_answers`, else
`reward_model.ground_truth.target`; the question is `question`, else `extra_info.question`, else the user message
of `prompt`. `data_source` (nq, hotpotqa, ...) and `id` are kept where given, and `prompt` (the chat messages
Search-R1's processed files carry) is the prompt where it asks for Search-R1's tags; otherwise (FlashRAG's rows,
verl's `<tool_call>` prompts) the task writes Search-R1's prompt around the question. Rows with no usable answer
are skipped and counted. A corpus line is `{"id": ..., "contents": "\"Title\"\ntext"}`: the first line of `contents`
is the title, the rest the text. A bad row is refused with its file, line (or row) and field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import types
import warnings
from collections.abc import Callable, Iterable, Iterator

import numpy as np


def required(module: str) -> types.ModuleType:
    """An optional dependency of retrieval QA, imported; an ImportError naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"retrieval QA needs {module} (bm25s, PyStemmer and pyarrow): pip install 'ftw_jax[retrieval]'."
        ) from None


class BadData(ValueError):
    """A file that does not hold what its reader expects; the message names the file, the line and the field."""


@dataclasses.dataclass(frozen=True)
class Question:
    question: str
    golden_answers: tuple[str, ...]
    data_source: str | None = None
    id: str | None = None
    messages: tuple[dict, ...] | None = None  # the file's own chat prompt (`prompt`), where it has one
    where: str = ""  # its file and line (or row), for messages


def _rows(path: pathlib.Path) -> Iterator[tuple[str, dict]]:
    """(where, row) for each row of a parquet or JSON Lines file; `where` names it in messages."""
    if path.suffix == ".parquet":
        parquet = required("pyarrow.parquet")
        try:
            table = parquet.read_table(path)
        except Exception as error:  # pyarrow's own errors: not parquet, truncated
            raise BadData(f"{path}: not a readable parquet file ({error}).") from None
        for index, row in enumerate(table.to_pylist()):
            yield f"{path} row {index}", row
        return
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            if raw.strip():
                yield f"{path} line {number}", _json_object(path, number, raw)


def _check_file(path: str | os.PathLike[str], suffixes: tuple[str, ...], what: str) -> pathlib.Path:
    path = pathlib.Path(path)
    if path.suffix not in suffixes:
        raise BadData(f"{path}: {what} must be a {' or '.join(suffixes)} file, got {path.suffix or 'no suffix'!r}.")
    if not path.is_file():
        raise BadData(f"{path}: no such file ({what}).")
    return path


def _messages(where: str, value) -> tuple[dict, ...] | None:
    if value is None:
        return None
    if isinstance(value, np.ndarray):  # pandas writes a list column as arrays
        value = value.tolist()
    if not (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
        )
    ):
        raise BadData(f"{where}: `prompt` must be a non-empty list of {{role, content}} messages, got {value!r:.80}.")
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


def _field(row: dict, path: str):
    """The value at a dotted path of nested dicts (`reward_model.ground_truth.target`), or None."""
    value = row
    for name in path.split("."):
        value = value.get(name) if isinstance(value, dict) else None
    return value


def _answers(where: str, row: dict) -> tuple[str, ...] | None:
    """The accepted answers: `golden_answers`, else `reward_model.ground_truth.target` (what Search-R1 scores
    against; its README's own-dataset rows and verl's have only that); None where there is no non-blank one."""
    field = "golden_answers" if row.get("golden_answers") is not None else "reward_model.ground_truth.target"
    value = _field(row, field)
    if value is None and isinstance(_field(row, "reward_model.ground_truth"), (list, str, np.ndarray)):
        field, value = "reward_model.ground_truth", _field(row, "reward_model.ground_truth")
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, str):
        value = [value]
    if value is None:
        return None
    if not (isinstance(value, list) and all(isinstance(answer, str) for answer in value)):
        raise BadData(f"{where}: `{field}` must be a list of strings, got {value!r:.80}.")
    return tuple(value) if any(answer.strip() for answer in value) else None


def _question_text(where: str, row: dict, messages: tuple[dict, ...] | None) -> str:
    """The question: `question`, else `extra_info.question` (verl's rows), else the last user message of `prompt`
    (the README's own-dataset rows)."""
    for field in ("question", "extra_info.question"):
        value = _field(row, field)
        if value is not None:
            if not isinstance(value, str) or not value.strip():
                raise BadData(f"{where}: `{field}` must be a non-empty string, got {value!r:.80}.")
            return value.strip()
    users = [message["content"] for message in messages or () if message["role"] == "user"]
    if not users or not users[-1].strip():
        raise BadData(f"{where}: no question (`question`, `extra_info.question` or a user message in `prompt`).")
    return users[-1].strip()


def asks_for_search(messages: tuple[dict, ...] | None) -> bool:
    """Whether a file's chat prompt tells the model Search-R1's tags (`<search>`); verl's asks for `<tool_call>`,
    which the task does not read."""
    return messages is not None and any("<search>" in message["content"] for message in messages)


def parse_question(where: str, row: dict) -> Question | None:
    """One question row, checked (`BadData` naming `where` and the field); None where it has no non-blank answer
    (Search-R1 would score it 0, or 1 for an empty answer: nothing to learn or measure)."""
    messages = _messages(where, row.get("prompt"))
    question = _question_text(where, row, messages)
    answers = _answers(where, row)
    if answers is None:
        return None
    source = row.get("data_source")
    if source is not None and not isinstance(source, str):
        raise BadData(f"{where}: `data_source` must be a string, got {source!r:.80}.")
    identifier = row.get("id", _field(row, "extra_info.index"))
    return Question(
        question=question,
        golden_answers=answers,
        data_source=source,
        id=None if identifier is None else str(identifier),
        messages=messages if asks_for_search(messages) else None,
        where=where,
    )


def read_questions(path: str | os.PathLike[str], log: Callable[[str], None] | None = None) -> list[Question]:
    """Every usable question of a `.parquet` or `.jsonl` file (Search-R1's processed files, its README's own-dataset
    rows, verl's Search-R1 files or FlashRAG's), in order. Rows without a usable answer are skipped and said once
    to `log` (by default a warning), naming the first; a file with none usable is refused."""
    path = _check_file(path, (".parquet", ".jsonl"), "a questions file")
    questions, skipped, replaced = [], [], 0
    for where, row in _rows(path):
        question = parse_question(where, row)
        if question is None:
            skipped.append(where)
            continue
        questions.append(question)
        replaced += question.messages is None and row.get("prompt") is not None
    if not questions:
        what = f"none of its {len(skipped)} rows has an answer" if skipped else "no questions in the file"
        raise BadData(f"{path}: {what}.")
    say = log or (lambda line: warnings.warn(line, stacklevel=3))
    if skipped:
        say(
            f"{path}: skipped {len(skipped)} of {len(skipped) + len(questions)} rows with no answer, "
            f"the first {skipped[0]}."
        )
    if replaced:
        say(
            f"{path}: {replaced} rows' `prompt` does not ask for <search> (verl's asks for <tool_call>): they get "
            "Search-R1's prompt around their question."
        )
    return questions


@dataclasses.dataclass(frozen=True)
class Passage:
    id: str
    contents: str  # "\"Title\"\ntext", as the corpus writes it

    @property
    def title(self) -> str:
        return self.contents.split("\n", 1)[0]

    @property
    def text(self) -> str:
        return self.contents.split("\n", 1)[1] if "\n" in self.contents else ""


def parse_passage(where: str, row: dict) -> Passage:
    contents = row.get("contents")
    if not isinstance(contents, str) or not contents.strip():
        raise BadData(f'{where}: `contents` must be a non-empty string ("Title"\\ntext), got {contents!r:.80}.')
    identifier = row.get("id")
    return Passage(id="" if identifier is None else str(identifier), contents=contents)


class Corpus:
    """A JSON Lines corpus on disk: each passage's byte offset is kept (8 bytes a passage: Wikipedia's 21 million
    take 168 MB), a passage read when it is asked for. `Corpus.open` reads the whole file once and checks every
    line."""

    def __init__(self, path: pathlib.Path, offsets: np.ndarray, sha256: str):
        self.path, self.offsets, self.sha256 = path, offsets, sha256  # the file's hash names the corpus to an index

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Corpus:
        path = _check_file(path, (".jsonl",), "the corpus")
        offsets, position, digest = [], 0, hashlib.sha256()
        with path.open("rb") as file:
            for number, raw in enumerate(file, start=1):
                digest.update(raw)
                if raw.strip():
                    parse_passage(f"{path} line {number}", _json_object(path, number, raw))
                    offsets.append(position)
                position += len(raw)
        if not offsets:
            raise BadData(f"{path}: the corpus has no passages.")
        return cls(path, np.asarray(offsets, np.int64), digest.hexdigest())

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> Passage:
        return self.passages([index])[0]

    def passages(self, indices: Iterable[int]) -> list[Passage]:
        """The passages at these indices (corpus order is line order, blank lines not counted)."""
        with self.path.open("rb") as file:
            found = []
            for index in indices:
                file.seek(int(self.offsets[index]))
                found.append(parse_passage(f"{self.path} passage {index}", json.loads(file.readline())))
        return found

    def contents(self) -> Iterator[str]:
        """Every passage's `contents`, in order (what the index is built from)."""
        with self.path.open("rb") as file:
            for raw in file:
                if raw.strip():
                    yield json.loads(raw)["contents"]


def _json_object(path: pathlib.Path, number: int, raw: bytes) -> dict:
    try:
        row = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadData(f"{path} line {number}: not a JSON object ({error}).") from None
    if not isinstance(row, dict):
        raise BadData(f"{path} line {number}: expected a JSON object, got {type(row).__name__}.")
    return row


def read_demonstrations(path: str | os.PathLike[str]) -> list[tuple[Question, list]]:
    """(question, its `demonstration`: the turns a demonstrator writes) of each row of a questions file whose rows
    carry one (`synthetic.write_synthetic`'s do); the turns are checked where they are played
    (`RetrievalQA.demonstration`)."""
    path = _check_file(path, (".parquet", ".jsonl"), "a demonstrations file")
    found = []
    for where, row in _rows(path):
        if "demonstration" not in row:
            raise BadData(f"{where}: no `demonstration` (a list of the turns a demonstrator writes).")
        question = parse_question(where, row)
        if question is None:
            raise BadData(f"{where}: a demonstration needs an answer (`golden_answers`).")
        found.append((question, row["demonstration"]))
    if not found:
        raise BadData(f"{path}: no demonstrations in the file.")
    return found

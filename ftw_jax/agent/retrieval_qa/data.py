"""Search-R1's files: questions (parquet or JSON Lines) and a corpus of passages (JSON Lines), read and checked.

    questions = read_questions("nq_hotpotqa_train/train.parquet")   # or FlashRAG's train.jsonl
    corpus = Corpus.open("wiki-18.jsonl")                           # passages read from disk as they are needed
    corpus[17].title, corpus[17].text

A question row has `question` (a string) and `golden_answers` (a list of strings); `data_source` (nq, hotpotqa,
...) and `id` are kept where given, and `prompt` (the chat messages Search-R1's processed files carry) is used as
the prompt where present. A corpus line is `{"id": ..., "contents": "\"Title\"\ntext"}`: the first line of
`contents` is the title, the rest the text. A bad row is refused with its file, line (or row) and field.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import types
from collections.abc import Iterable, Iterator

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
    if not (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
        )
    ):
        raise BadData(f"{where}: `prompt` must be a non-empty list of {{role, content}} messages, got {value!r:.80}.")
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


def parse_question(where: str, row: dict) -> Question:
    """One question row, checked (`BadData` naming `where` and the field)."""
    question = row.get("question")
    if not isinstance(question, str) or not question.strip():
        raise BadData(f"{where}: `question` must be a non-empty string, got {question!r:.80}.")
    answers = row.get("golden_answers")
    if answers is None:
        raise BadData(f"{where}: no `golden_answers` (a list of the accepted answers).")
    if isinstance(answers, np.ndarray):
        answers = answers.tolist()
    if not (isinstance(answers, list) and answers and all(isinstance(a, str) and a.strip() for a in answers)):
        raise BadData(f"{where}: `golden_answers` must be a non-empty list of non-empty strings, got {answers!r:.80}.")
    source, identifier = row.get("data_source"), row.get("id")
    if source is not None and not isinstance(source, str):
        raise BadData(f"{where}: `data_source` must be a string, got {source!r:.80}.")
    return Question(
        question=question.strip(),
        golden_answers=tuple(answers),
        data_source=source,
        id=None if identifier is None else str(identifier),
        messages=_messages(where, row.get("prompt")),
        where=where,
    )


def read_questions(path: str | os.PathLike[str]) -> list[Question]:
    """Every question of a `.parquet` or `.jsonl` file (Search-R1's processed files or FlashRAG's), in order."""
    path = _check_file(path, (".parquet", ".jsonl"), "a questions file")
    questions = [parse_question(where, row) for where, row in _rows(path)]
    if not questions:
        raise BadData(f"{path}: no questions in the file.")
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
        found.append((parse_question(where, row), row["demonstration"]))
    if not found:
        raise BadData(f"{path}: no demonstrations in the file.")
    return found

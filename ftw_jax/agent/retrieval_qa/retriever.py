"""BM25 over a corpus, with `bm25s` (sparse BM25 on numpy and scipy): the index built once, saved beside the corpus,
reused by every later run.

    retriever = BM25Retriever.open("wiki-18.jsonl")        # builds wiki-18.bm25/ the first time
    retriever.search(["capital of italy"], k=3)            # [[Passage, Passage, Passage]]
    information(passages)                                  # "Doc 1(Title: \"Rome\") Rome is ...\nDoc 2(..."

Search-R1's BM25 retriever is Lucene's (pyserini): k1 = 0.9, b = 0.4 and Lucene's English analyzer. These are the
defaults here (`RetrieverSettings`): words as Lucene's StandardTokenizer splits them (one-character ones kept), the
possessive 's dropped, lower case, Lucene's 33 English stop words, the Porter stemmer (PyStemmer's "porter", the
algorithm Lucene's PorterStemFilter implements), scored by bm25s's "lucene" variant of BM25. docs/lm.md says how
close its rankings come to Lucene's own. A query that matches no passage gets none, as Lucene returns no hit.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import re
import shutil
from collections.abc import Callable
from typing import Literal, Protocol

import numpy as np

from ftw_jax.agent.retrieval_qa.data import BadData, Corpus, Passage, required

INDEX_FORMAT = 2

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET, the stop words of pyserini's default analyzer.
LUCENE_STOP_WORDS = tuple(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these they "
    "this to was will with".split()
)
# A word as Lucene's StandardTokenizer reads one (Unicode's word boundaries, UAX #29): letters, digits and
# underscores, joined across one of `:.'’` between two letters ("U.S.A", "don't") and across one of `,;.'’` between
# two digits ("3.14", "1,000"); one character long or more.
_LUCENE_WORD = re.compile(r"\w+(?:(?:(?<=[^\W\d_])[:.'\u2019](?=[^\W\d_])|(?<=\d)[,;.'\u2019](?=\d))\w+)*")
_POSSESSIVE = re.compile(r"['\u2019][sS]$")


def lucene_words(text: str) -> list[str]:
    """The words of (lower-cased) text as Lucene's English analyzer splits them before its stop words and stemmer:
    StandardTokenizer's words, then EnglishPossessiveFilter's (a trailing 's dropped)."""
    words = (_POSSESSIVE.sub("", word) for word in _LUCENE_WORD.findall(text))
    return [word for word in words if word.strip("_")]  # underscores alone make no word


def lucene_porter(stem: Callable[[str], str]) -> Callable[[str], str]:
    """A Porter stemmer as Lucene's PorterStemFilter applies it: words of one or two characters kept whole, and
    Martin Porter's own step 2, which Lucene follows where Snowball's "porter" follows the 1980 paper: "-bli"
    becomes "-ble" (the paper: "-abli") and "-logi" becomes "-log" where the stem before them has measure > 0.
    Steps 1 and 2 leave a word ending in "-ble" as it is, so stemming it again takes it through the rest as his."""

    def stemmed(word: str) -> str:
        if len(word) <= 2:
            return word
        once = stem(word)
        if once.endswith("bli") and _measured(once[:-3]):
            return stem(once[:-3] + "ble")
        if once.endswith("logi") and _measured(once[:-4]):
            return once[:-1]
        return once

    return stemmed


def _measured(stem: str) -> bool:
    """Whether a stem's Porter measure is above 0: a vowel (y after a consonant counts) followed by a consonant."""
    return re.search(r"(?:[aeiou]|(?<=[^aeiou])y)[^aeiouy]", stem) is not None


@dataclasses.dataclass(frozen=True)
class RetrieverSettings:
    """How passages are scored: BM25's k1 and b, and the analyzer: how text splits into words ("lucene":
    `lucene_words`; "bm25s": words of two or more characters, bm25s's default), the stop words ("lucene":
    `LUCENE_STOP_WORDS`, or a bm25s list's name such as "en"), the stemmer (PyStemmer's name; None: none)."""

    k1: float = 0.9
    b: float = 0.4
    words: Literal["lucene", "bm25s"] = "lucene"
    stopwords: str = "lucene"
    stemmer: str | None = "porter"


def index_folder(corpus_path: str | os.PathLike[str]) -> pathlib.Path:
    """Where a corpus's index goes by default: beside it, `wiki-18.jsonl` -> `wiki-18.bm25/`."""
    return pathlib.Path(corpus_path).with_suffix(".bm25")


class Retriever(Protocol):
    """What the task asks of a retriever: the k best passages of each query, best first (`BM25Retriever`, or
    Search-R1's server through `ftw_jax.agent.retrieval_qa.remote.RemoteRetriever`)."""

    def search(self, queries: list[str], k: int = 3) -> list[list[Passage]]: ...


class BM25Retriever:
    """Top-k passages of a `Corpus` for text queries."""

    def __init__(self, corpus: Corpus, model, tokenizer, settings: RetrieverSettings):
        self.corpus, self.model, self.tokenizer, self.settings = corpus, model, tokenizer, settings

    @staticmethod
    def _tokenizer(settings: RetrieverSettings):
        tokenization, stemmers = required("bm25s.tokenization"), required("Stemmer")
        stemmer = None if settings.stemmer is None else stemmers.Stemmer(settings.stemmer).stemWord
        if stemmer is not None and settings.stemmer == "porter":  # Lucene's Porter, as its PorterStemFilter runs it
            stemmer = lucene_porter(stemmer)
        stopwords = list(LUCENE_STOP_WORDS) if settings.stopwords == "lucene" else settings.stopwords
        splitter = lucene_words if settings.words == "lucene" else r"(?u)\b\w\w+\b"
        return tokenization.Tokenizer(stopwords=stopwords, stemmer=stemmer, splitter=splitter)  # pyright: ignore[reportArgumentType] (None: no stemmer, as bm25s's default)

    @classmethod
    def open(
        cls,
        corpus_path: str | os.PathLike[str],
        index: str | os.PathLike[str] | None = None,
        settings: RetrieverSettings = RetrieverSettings(),
        log: Callable[[str], None] = lambda message: None,
    ) -> BM25Retriever:
        """The retriever of the corpus at `corpus_path` (every line checked), with the index in `index` (default
        `index_folder(corpus_path)`): read if it is there, else built and saved (atomically). An index built from
        another file or with other settings is refused, naming both."""
        bm25s = required("bm25s")
        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs each step at DEBUG where logging is set up so
        corpus = Corpus.open(corpus_path)
        folder = pathlib.Path(index) if index is not None else index_folder(corpus_path)
        expected = {
            "format": INDEX_FORMAT,
            "corpus_sha256": corpus.sha256,
            "passages": len(corpus),
            "settings": dataclasses.asdict(settings),
        }
        tokenizer = cls._tokenizer(settings)
        if folder.exists():
            _check_index(folder, expected, corpus.path)
            model = bm25s.BM25.load(str(folder), show_progress=False)
            tokenizer.load_vocab(str(folder))
            return cls(corpus, model, tokenizer, settings)
        log(f"building the BM25 index of {len(corpus):,} passages in {folder}")
        # a stream, so that the corpus's texts are never all in memory at once (bm25s reads it once, `length` long)
        contents = corpus.contents()
        tokens = tokenizer.tokenize(contents, length=len(corpus), return_as="tuple", show_progress=False)  # pyright: ignore[reportArgumentType]
        model = bm25s.BM25(k1=settings.k1, b=settings.b, method="lucene")
        model.index(tokens, show_progress=False)
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save(str(partial), show_progress=False)
        tokenizer.save_vocab(str(partial))
        (partial / "ftw_jax_index.json").write_text(json.dumps(expected, indent=2) + "\n")
        partial.rename(folder)  # a run stopped while building leaves only the .partial folder
        return cls(corpus, model, tokenizer, settings)

    def search(self, queries: list[str], k: int = 3) -> list[list[Passage]]:
        """The k best passages of each query, best first (fewer where fewer passages share a term with it)."""
        if not queries:
            return []
        k = min(k, len(self.corpus))
        ids = self.tokenizer.tokenize(queries, update_vocab=False, return_as="ids", show_progress=False)
        found, scores = self.model.retrieve(ids, k=k, show_progress=False, n_threads=1)
        return [
            self.corpus.passages([int(i) for i, score in zip(row, row_scores) if score > 0])
            for row, row_scores in zip(np.asarray(found), np.asarray(scores))
        ]


def _check_index(folder: pathlib.Path, expected: dict, corpus_path: pathlib.Path) -> None:
    record_path = folder / "ftw_jax_index.json"
    if not record_path.is_file():
        raise BadData(f"{folder}: not an index ftw_jax built (no ftw_jax_index.json); move it or name another.")
    record = json.loads(record_path.read_text())
    for field in ("format", "corpus_sha256", "passages", "settings"):
        if record.get(field) != expected[field]:
            raise BadData(
                f"{folder}: the index was built for another corpus or settings ({field} {record.get(field)!r}, "
                f"{corpus_path} has {expected[field]!r}); delete the folder to rebuild it."
            )


def information(passages: list[Passage]) -> str:
    """The passages as the model reads them between `<information>` tags: `Doc i(Title: title) text`, one a line."""
    return "".join(f"Doc {i}(Title: {p.title}) {p.text}\n" for i, p in enumerate(passages, start=1))

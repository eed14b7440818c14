"""A client of Search-R1's retrieval server: the retriever its users already run (E5 over wiki-18 behind a flat
FAISS index, started by its `retrieval_launch.sh`), asked over HTTP between the model's turns.

    retriever = RemoteRetriever.open("http://127.0.0.1:8000/retrieve")   # one probe query: it answers, in shape
    retriever.search(["capital of italy", "who wrote hamlet"], k=3)      # one request for every query of a turn

The API is the server's `POST /retrieve`: `{"queries": [...], "topk": k, "return_scores": true}` answered by
`{"result": [[{"document": {"id": ..., "contents": "\"Title\"\\ntext"}, "score": s}, ...], ...]}`, one list per
query, best first. A request that fails to connect, times out or gets a 5xx is tried again after a growing pause,
a bounded number of times; then, or on any other status or an answer of another shape, `RetrieverUnavailable`
says in one line which URL, what came back and what to start. It never hands the model an empty passage list in
place of an answer it did not get.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from typing import Any

from ftw_jax.agent.retrieval_qa.data import Passage

ANSWER_SHAPE = '{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}, one list per query'


class RetrieverUnavailable(OSError):
    """The retrieval server did not answer, or answered what Search-R1's `/retrieve` does not."""


@dataclasses.dataclass(frozen=True)
class RemoteRetriever:
    """Top-k passages for text queries from a server of Search-R1's `/retrieve` API."""

    url: str
    timeout: float = 60.0  # seconds a request may take: E5 encodes a turn's queries on the server's GPU
    attempts: int = 4  # tries of one request before the run stops
    backoff: float = 1.0  # seconds before the second try, doubled before each later one

    @classmethod
    def open(cls, url: str, **options: Any) -> RemoteRetriever:
        """A client of the server at `url`, checked with one probe query before anything compiles."""
        if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
            raise ValueError(f"retriever_url must be an http:// or https:// URL, got {url!r}.")
        retriever = cls(url, **options)
        retriever.search(["probe"], k=1)
        return retriever

    def search(self, queries: list[str], k: int = 3) -> list[list[Passage]]:
        """The k best passages of each query, best first: every query in one request."""
        if not queries:
            return []
        answer = self._post({"queries": list(queries), "topk": k, "return_scores": True})
        return self._passages(answer, len(queries))

    def _post(self, body: dict) -> Any:
        """The server's JSON answer to `body`, tried again on a connection error, a timeout or a 5xx."""
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
        )
        failure = ""
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    raw = response.read()
                break
            except urllib.error.HTTPError as error:
                failure = f"HTTP {error.code} {error.reason}"
                if error.code < 500:  # the request itself is wrong: asking again gets the same answer
                    raise self._unavailable(failure) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                failure = str(getattr(error, "reason", error))
        else:
            raise self._unavailable(f"no answer after {self.attempts} tries ({failure})")
        try:
            return json.loads(raw)
        except ValueError:
            raise self._unavailable(f"an answer that is not JSON ({raw[:80]!r})") from None

    def _passages(self, answer: Any, count: int) -> list[list[Passage]]:
        """The passages of each query in `answer`; refused where it is not shaped as `ANSWER_SHAPE` for `count`."""
        rows = answer.get("result") if isinstance(answer, dict) else None
        if not (isinstance(rows, list) and len(rows) == count and all(isinstance(row, list) for row in rows)):
            raise self._unavailable(f"an answer of another shape (expected {ANSWER_SHAPE} of {count}): {answer!r:.120}")
        found = []
        for row in rows:
            passages = []
            for hit in row:
                document = hit.get("document") if isinstance(hit, dict) else None
                if not (isinstance(document, dict) and isinstance(document.get("contents"), str)):
                    raise self._unavailable(f"a hit without document.contents (expected {ANSWER_SHAPE}): {hit!r:.120}")
                passages.append(Passage(str(document.get("id", "")), document["contents"]))
            found.append(passages)
        return found

    def _unavailable(self, what: str) -> RetrieverUnavailable:
        return RetrieverUnavailable(
            f"the retriever at {self.url} gave {what}; start Search-R1's retrieval server there "
            "(its retrieval_launch.sh) or leave `retriever_url` out for the in-process BM25. A run's folder keeps "
            "its last checkpoint: `resume` it once the server answers."
        )

"""The client of Search-R1's retrieval server (`ftw_jax.agent.retrieval_qa.remote`), against a small server of the
same API on 127.0.0.1: one request per turn, its answer read as passages, failures retried a bounded number of
times and then said in one line naming the URL."""

import http.server
import json
import threading

import pytest

from ftw_jax.agent.retrieval_qa.remote import RemoteRetriever, RetrieverUnavailable

CORPUS = [
    {"id": "0", "contents": '"Rome"\nRome is the capital of Italy.'},
    {"id": "1", "contents": '"Hamlet"\nHamlet is a tragedy by William Shakespeare.'},
    {"id": "2", "contents": '"Paris"\nParis is the capital of France.'},
]


def ranked(corpus: list[dict], query: str, k: int) -> list[dict]:
    """The server's answer for one query: documents by shared words, best first (as its FAISS search ranks)."""
    words = set(query.lower().split())
    scored = [(len(words & set(doc["contents"].lower().split())), doc) for doc in corpus]
    scored = sorted((pair for pair in scored if pair[0]), key=lambda pair: -pair[0])[:k]
    return [{"document": doc, "score": float(score)} for score, doc in scored]


class SearchR1Server:
    """`POST /retrieve` as Search-R1's retrieval_server.py answers it, over `corpus` (rows of {id, contents});
    `failures` queues statuses or shapes to give first ("500", "404", "shape"), and from the `fail_from`-th request
    on it answers 500 (a server gone wrong mid-run)."""

    def __init__(self, corpus: list[dict] = CORPUS, fail_from: int | None = None):
        self.requests, self.failures, self.fail_from = [], [], fail_from
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append((self.path, body))
                failure = owner.failures.pop(0) if owner.failures else None
                if owner.fail_from is not None and len(owner.requests) > owner.fail_from:
                    failure = "500"
                if failure in ("500", "404"):
                    self.send_error(int(failure))
                    return
                result = (
                    {"oops": []}
                    if failure == "shape"
                    else {"result": [ranked(corpus, q, body["topk"]) for q in body["queries"]]}
                )
                data = json.dumps(result).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/retrieve"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    running = SearchR1Server()
    yield running
    running.stop()


def test_a_turns_queries_go_in_one_request_and_come_back_as_passages(server):
    retriever = RemoteRetriever.open(server.url, backoff=0.01)
    found = retriever.search(["capital of italy", "tragedy by shakespeare"], k=2)
    assert [[p.title for p in passages] for passages in found] == [['"Rome"', '"Paris"'], ['"Hamlet"']]
    assert found[0][0].text == "Rome is the capital of Italy." and found[0][0].id == "0"
    path, body = server.requests[-1]  # the probe of `open` first, then the turn's one request
    assert len(server.requests) == 2 and path == "/retrieve"
    assert body == {"queries": ["capital of italy", "tragedy by shakespeare"], "topk": 2, "return_scores": True}
    assert retriever.search([], k=3) == [] and len(server.requests) == 2


def test_a_server_error_is_tried_again_and_a_bad_request_is_not(server):
    retriever = RemoteRetriever(server.url, backoff=0.01)
    server.failures[:] = ["500", "500"]
    assert [p.id for p in retriever.search(["paris france"], k=1)[0]] == ["2"]
    assert len(server.requests) == 3
    server.failures[:] = ["404"]
    with pytest.raises(RetrieverUnavailable, match=r"gave HTTP 404"):
        retriever.search(["paris"], k=1)
    assert len(server.requests) == 4  # not asked again


def test_an_answer_of_another_shape_is_refused_in_one_line_naming_the_url(server):
    server.failures[:] = ["shape"]
    with pytest.raises(RetrieverUnavailable) as refused:
        RemoteRetriever(server.url, backoff=0.01).search(["rome"], k=1)
    message = str(refused.value)
    assert server.url in message and "another shape" in message and '"result"' in message and "\n" not in message


def test_a_server_that_is_down_is_named_with_what_to_start_after_bounded_tries(server):
    url = server.url
    server.stop()
    with pytest.raises(RetrieverUnavailable) as refused:
        RemoteRetriever.open(url, attempts=3, backoff=0.01)
    message = str(refused.value)
    assert message.startswith(f"the retriever at {url} gave no answer after 3 tries (")
    assert "retrieval_launch.sh" in message and "`retriever_url`" in message and "\n" not in message
    with pytest.raises(ValueError, match="retriever_url must be an http:// or https:// URL, got 'localhost:8000'"):
        RemoteRetriever.open("localhost:8000")

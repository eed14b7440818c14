"""experiments/search_r1/engine_driver.py's rounds against a stand-in engine on 127.0.0.1 that writes scripted turns
through `/v1/completions` as vLLM answers: the driver applies the task's rules (Search-R1's) to what the engine
wrote, as `ftw-jax lm retrieval-qa` does in-process."""

import http.server
import importlib.util
import json
import pathlib
import threading

import pytest
from test_retrieval_qa import SMALL, small_world

from ftw_jax import lm
from ftw_jax.agent.retrieval_qa import BM25Retriever, RetrievalQA, read_questions
from ftw_jax.agent.retrieval_qa.task import INVALID_ACTION

world = pytest.fixture(small_world, scope="module", name="world")
_DRIVER = pathlib.Path(__file__).parents[1] / "experiments" / "search_r1" / "engine_driver.py"


def driver():
    spec = importlib.util.spec_from_file_location("engine_driver", _DRIVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ScriptedEngine:
    """`/v1/completions` writing row r's t-th turn from `script[r][t]` (the row found by its prompt's first
    tokens), stopped at the request's first stop string as an engine stops, each token's log-prob -0.5."""

    def __init__(self, tokenizer, prompts: list[list[int]], script: list[list[str]]):
        self.requests = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(request)
                choices = []
                for index, prompt in enumerate(request["prompt"]):
                    row = next(r for r, start in enumerate(prompts) if prompt[: len(start)] == start)
                    turns = sum(
                        1 for asked in owner.requests for p in asked["prompt"] if p[: len(prompts[row])] == prompts[row]
                    )
                    text = script[row][turns - 1]
                    for stop in request["stop"]:
                        if stop in text:
                            text = text[: text.index(stop) + len(stop)]
                    ids = tokenizer.encode(text)
                    if text == script[row][turns - 1] and text.endswith("<|im_end|>"):
                        ids = tokenizer.encode(text.removesuffix("<|im_end|>")) + [tokenizer.eos_id]
                    logprobs = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}
                    choices.append({"index": index, "logprobs": logprobs})
                data = json.dumps({"choices": choices}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_round_follows_search_r1s_rules_on_what_the_engine_wrote(world):
    tokenizer = lm.load_tokenizer(world["model"])
    task = RetrievalQA(tokenizer, BM25Retriever.open(world["corpus"]), SMALL)
    questions = read_questions(world["test_jsonl"])[:2]
    right = questions[0].golden_answers[0]
    script = [
        ["no action<|im_end|>", f"<answer> {right} </answer> then <search> more </search> and on"],
        [f"<search> {questions[1].question} </search> after", "<answer> wrong </answer>"],
    ]
    prompts = [tokenizer.encode(task.prompt(question)) for question in questions]
    engine = ScriptedEngine(tokenizer, prompts, script)
    records = driver().play_round(engine.url, task, questions, version=3, seed=None)
    assert engine.requests[0]["stop"] == ["</search>"] and engine.requests[0]["top_p"] == 0.95
    first, second = records
    invalid = tokenizer.encode(INVALID_ACTION)
    start = next(i for i in range(len(first["tokens"])) if first["tokens"][i : i + len(invalid)] == invalid)
    assert first["tokens"][start - 1] != tokenizer.eos_id  # the end-of-sequence token went before the reply
    assert first["reward"] == 1.0  # the answer before the search decides, and is read from the whole episode
    assert [span["end"] - span["start"] for span in first["spans"]] == [len(s["logprobs"]) for s in first["spans"]]
    assert tokenizer.decode(first["tokens"]).endswith("<search> more </search>")  # the engine stopped there
    assert second["reward"] == 0.0 and len(second["spans"]) == 2
    assert all(span["version"] == 3 for record in records for span in record["spans"])

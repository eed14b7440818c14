"""The rollout side of retrieval QA beside an engine: an OpenAI-compatible server (vLLM, SGLang, or
`completions_server.py` here) writes the model's turns, this driver runs the retriever between them and appends
each episode to a JSON Lines file that `ftw-jax lm learn --follow` learns from; when the learner writes a new
version, the engine is told to load it.

    python experiments/search_r1/engine_driver.py --server http://127.0.0.1:8011 --model START \\
        --questions train.parquet --corpus corpus.jsonl --episodes episodes.jsonl --learner-run runs/learner \\
        --rounds 10 --batch 16 --response-tokens 500 --information-tokens 500 --prompt-tokens 2048 [--group-size 4]

Each turn is one `/v1/completions` request for every conversation still going: the prompt as token ids, the stop
string `</search>` kept in the output, the tokens back as ids with the log-probability of each
(`return_tokens_as_token_ids`, `logprobs`, which vLLM and SGLang give from the plain model), sampled at temperature 1
within top-p 0.95. The task's rules are `ftw-jax lm retrieval-qa`'s, Search-R1's by default (`RetrievalQASettings`;
docs/lm.md): the turn cut after its first `</search>`, else its first `</answer>` (`RetrievalQA.turn_kept`), the
end-of-sequence token dropped before a reply, the reply `RetrievalQA.respond`'s, the answer read from the whole episode
(`RetrievalQA.answer`); an episode is one span per turn, written by the version the engine had loaded. New weights:
`RUN/weights/latest.json` (the learner's) is read before each round and, when it names a newer version, the engine
gets `POST /update_weights_from_disk {"model_path": ...}` (SGLang's endpoint; for vLLM, restart it on the folder or
use its own reload). With `--ahead 0` each round waits until the learner has learnt from every earlier round.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
import urllib.request

from ftw_jax.agent.retrieval_qa import BM25Retriever, RetrievalQA, RetrievalQASettings, read_questions
from ftw_jax.envs.retrieval_qa.answers import STOP_STRINGS, reward
from ftw_jax.lm.tokenizer import load_tokenizer


def post(url: str, payload: dict, timeout: float = 600) -> dict:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def play_round(server: str, task: RetrievalQA, questions: list, version: int, seed: int | None) -> list[dict]:
    """One episode record per question (`ftw_jax.agent.episodes`' schema), its turns written by the engine (`seed` None:
    the engine's own draws, so that a question asked G times gets G different episodes)."""
    tokenizer, settings = task.tokenizer, task.settings
    conversations = [tokenizer.encode(task.prompt(question)) for question in questions]
    spans: list[list[dict]] = [[] for _ in questions]
    responses = [""] * len(questions)
    active = list(range(len(questions)))
    # the task's rules (`RetrievalQASettings`): Search-R1's by default, the turn's end found in its text
    stops = list(STOP_STRINGS) if settings.turn_end == "first-tag" else ["</search>"]
    for turn in range(settings.search_turns + 1):
        request = {
            "prompt": [conversations[row] for row in active],
            "max_tokens": settings.response_tokens,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "stop": stops,
            "include_stop_str_in_output": True,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            **({} if seed is None else {"seed": seed * 1000 + turn}),
        }
        choices = post(f"{server}/v1/completions", request)["choices"]
        texts = {}
        for row, choice in zip(active, sorted(choices, key=lambda choice: choice["index"])):
            ids = [int(token.removeprefix("token_id:")) for token in choice["logprobs"]["tokens"]]
            keep, texts[row] = task.turn_kept(ids)
            start = len(conversations[row])
            spans[row].append(
                {
                    "start": start,
                    "end": start + keep,
                    "version": version,
                    "logprobs": choice["logprobs"]["token_logprobs"][:keep],
                }
            )
            conversations[row] += ids[:keep]
            responses[row] += texts[row]
        replies = task.respond(texts, last=turn == settings.search_turns)
        for row, (tokens, _) in replies.items():
            if not settings.keep_eos and spans[row][-1]["end"] > spans[row][-1]["start"]:
                if conversations[row][-1] == tokenizer.eos_id:  # dropped before a reply, as Search-R1 does
                    conversations[row].pop()
                    spans[row][-1]["end"] -= 1
                    spans[row][-1]["logprobs"].pop()
            conversations[row] += tokens
        active = sorted(replies)
        if not active:
            break
    return [
        {
            "tokens": conversations[row],
            "spans": [span for span in spans[row] if span["end"] > span["start"]],
            "reward": reward(task.answer(conversations[row], responses[row]), list(question.golden_answers)),
            "id": question.id,
        }
        for row, question in enumerate(questions)
    ]


def iterations_learnt(run: pathlib.Path) -> int:
    """The learner's iterations so far: the rows of its metrics.jsonl (one an iteration, each B episodes)."""
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def latest_version(run: pathlib.Path) -> tuple[int, pathlib.Path | None]:
    """(version, folder) of the learner's newest weights; (0, None) before it wrote any."""
    path = run / "weights" / "latest.json"
    if not path.is_file():
        return 0, None
    latest = json.loads(path.read_text())
    return latest["version"], run / "weights" / latest["path"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="the engine's base URL, e.g. http://127.0.0.1:8011")
    parser.add_argument("--model", type=pathlib.Path, required=True, help="the starting checkpoint (its tokenizer)")
    parser.add_argument("--questions", type=pathlib.Path, required=True)
    parser.add_argument("--corpus", type=pathlib.Path, required=True)
    parser.add_argument("--episodes", type=pathlib.Path, required=True, help="the JSON Lines file to append to")
    parser.add_argument("--learner-run", type=pathlib.Path, required=True, help="lm learn's run folder")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16, help="episodes a round (lm learn's B)")
    parser.add_argument(
        "--group-size",
        type=int,
        default=1,
        help="G: each question asked G times a round, its episodes a `group` (GRPO, RLOO; Search-R1: 5)",
    )
    parser.add_argument("--ahead", type=int, default=0, help="rounds the engine may run ahead of the learner")
    parser.add_argument("--seed", type=int, default=0)
    for name in ("search_turns", "response_tokens", "information_tokens", "prompt_tokens", "top_k"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(RetrievalQASettings(), name))
    args = parser.parse_args()
    if args.group_size < 1 or args.batch % args.group_size:
        raise ValueError(f"--batch ({args.batch}) must be a multiple of --group-size ({args.group_size}).")
    settings = RetrievalQASettings(
        **{name: getattr(args, name) for name in ("search_turns", "response_tokens", "information_tokens")},
        prompt_tokens=args.prompt_tokens,
        top_k=args.top_k,
    )
    task = RetrievalQA(load_tokenizer(args.model), BM25Retriever.open(args.corpus), settings)
    questions = read_questions(args.questions)
    task.check(questions)
    loaded = 0
    for number in range(args.rounds):
        while iterations_learnt(args.learner_run) < number - args.ahead:  # each round before, but `ahead`, learnt
            time.sleep(0.2)
        version, folder = latest_version(args.learner_run)
        if folder is not None and version != loaded:
            post(f"{args.server}/update_weights_from_disk", {"model_path": str(folder)})
            loaded = version
        asked = args.batch // args.group_size
        chosen = [questions[(number * asked + i // args.group_size) % len(questions)] for i in range(args.batch)]
        started = time.perf_counter()
        seed = args.seed + number if args.group_size == 1 else None  # one seed would give a group G equal episodes
        records = play_round(args.server, task, chosen, loaded, seed)
        for slot, record in enumerate(records):
            record["group"] = f"{number}-{slot // args.group_size}"  # this round's, so a question asked again is new
        with args.episodes.open("a") as file:
            file.writelines(json.dumps(record) + "\n" for record in records)
        mean = sum(record["reward"] for record in records) / len(records)
        print(
            f"round {number + 1}: version {loaded}, reward {mean:.3f}, {time.perf_counter() - started:.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    try:
        main()
    except ValueError as error:  # bad input (BadData among them): one line, as the ftw-jax commands print it
        raise SystemExit(f"error: {error}") from None

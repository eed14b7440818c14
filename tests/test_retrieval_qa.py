"""Retrieval QA in Search-R1's protocol: the answer's normalisation, the readers and their refusals, the BM25
retriever against bm25s called directly, the turn sampler's stops, holes and log-probs, the turn loop's replies
and rewards, and the command line end to end (on a small world written in the same file formats)."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ftw_jax import cli, lm
from ftw_jax.agent.episodes import episode_of, sample_records, to_trajectories
from ftw_jax.agent.retrieval_qa import (
    BadData,
    BM25Retriever,
    RetrievalQA,
    RetrievalQASettings,
    read_questions,
)
from ftw_jax.agent.retrieval_qa.data import Corpus, read_demonstrations
from ftw_jax.agent.retrieval_qa.learner import RetrievalTrainConfig
from ftw_jax.agent.retrieval_qa.synthetic import tokenizer_texts, write_synthetic
from ftw_jax.agent.retrieval_qa.task import INVALID_ACTION
from ftw_jax.envs.retrieval_qa import exact_match, final_answer, normalize_answer, turn_action
from ftw_jax.envs.retrieval_qa.answers import reward
from ftw_jax.lm.sampler import SamplingConfig
from ftw_jax.lm.tiny import write_tiny_checkpoint
from ftw_jax.lm.turns import make_turn_sampler

QWEN = pathlib.Path(__file__).parent / "data" / "lm" / "qwen2-untied"
SMALL = RetrievalQASettings(response_tokens=16, information_tokens=64, prompt_tokens=256, search_turns=2)


def small_world(tmp_path_factory) -> dict:
    """A small world in Search-R1's formats and a tiny chat checkpoint whose BPE tokenizer was trained on it."""
    folder = tmp_path_factory.mktemp("world")
    paths = write_synthetic(folder, people=40, distractors=20, seed=1)
    paths["model"] = write_tiny_checkpoint(folder / "model", tokenizer_texts(paths, ("train_jsonl",)), 1000)
    return paths


world = pytest.fixture(small_world, scope="module", name="world")


# ------------------------------------------------------------------------------------------------------ answers


@pytest.mark.parametrize(
    "text, normalised",
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("an apple, a pear", "apple pear"),
        ("theatre", "theatre"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("Rock 'n' Roll", "rock n roll"),
        ("the-end", "theend"),  # punctuation goes first, so "the" is no longer a word of its own
        ("  \t many \n spaces ", "many spaces"),
        ("Ünïcode Café", "ünïcode café"),  # lower-cased, accents kept (the SQuAD script keeps them)
    ],
)
def test_answers_are_normalised_as_the_squad_script_does(text, normalised):
    assert normalize_answer(text) == normalised


def test_exact_match_takes_any_golden_answer_after_normalisation():
    assert exact_match("Paris", ["Lyon", "paris"])
    assert exact_match("the paris, france", ["Paris France"])
    assert not exact_match("Paris France", ["Paris"])  # exact, not a substring
    assert not exact_match("", ["Paris"])
    with pytest.raises(TypeError, match="list of strings"):
        exact_match("Paris", "Paris")


def test_the_last_answer_counts_and_a_missing_one_scores_zero():
    assert final_answer("<answer> Lyon </answer> no: <answer>\nThe Paris </answer>") == "The Paris"
    assert reward(final_answer("<search> x </search> <answer> The Paris </answer>"), ["paris"]) == 1.0
    assert reward(final_answer("I think it is Paris."), ["paris"]) == 0.0
    assert reward(final_answer("<answer>Lyon</answer>"), ["paris"]) == 0.0
    assert turn_action("hmm <search> eiffel\ntower </search> <answer> x </answer>") == ("search", "eiffel\ntower")
    assert turn_action("<search> unclosed <answer> x </answer>") == ("answer", "x")
    assert turn_action("<search> mismatched </answer>") == (None, "")


# ------------------------------------------------------------------------------------------------------ files


def test_questions_read_alike_from_parquet_and_json_lines(world):
    from_parquet, from_lines = read_questions(world["train"]), read_questions(world["train_jsonl"])
    assert len(from_parquet) == len(from_lines) > 0
    for a, b in zip(from_parquet, from_lines):
        assert (a.question, a.golden_answers, a.data_source, a.id) == (
            b.question,
            b.golden_answers,
            b.data_source,
            b.id,
        )
    assert from_parquet[3].where.endswith("train.parquet row 3")
    assert all(question.messages is None for question in from_parquet)


def test_a_files_own_chat_prompt_is_the_prompt(world, tmp_path):
    row = {"question": "q?", "golden_answers": ["a"], "prompt": [{"role": "user", "content": "Own <search> words. q?"}]}
    path = tmp_path / "processed.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (question,) = read_questions(path)
    task = RetrievalQA(lm.load_tokenizer(world["model"]), None, SMALL)  # pyright: ignore[reportArgumentType]
    assert task.prompt(question) == "<|im_start|>user\nOwn <search> words. q?<|im_end|>\n<|im_start|>assistant\n"


def write_lines(path: pathlib.Path, rows: list) -> pathlib.Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


GOOD = {"question": "who?", "golden_answers": ["me"]}


@pytest.mark.parametrize(
    "rows, message",
    [
        ([GOOD, {"question": "who?", "golden_answers": [1]}], r"bad\.jsonl line 2: `golden_answers` must be a list of"),
        ([GOOD, {"golden_answers": ["me"]}], r"line 2: no question \(`question`, `extra_info\.question` or a user"),
        ([{"question": "", "golden_answers": ["x"]}], r"line 1: `question` must be a non-empty string"),
        ([{"extra_info": {"question": 3}, "golden_answers": ["x"]}], r"line 1: `extra_info\.question` must be a non"),
        ([GOOD, "{not json"], r"line 2: not a JSON object"),
        ([], r"bad\.jsonl: no questions in the file"),
        ([{**GOOD, "prompt": "a string"}], r"line 1: `prompt` must be a non-empty list"),
    ],
)
def test_a_bad_questions_file_is_refused_naming_file_line_and_field(tmp_path, rows, message):
    with pytest.raises(BadData, match=message):
        read_questions(write_lines(tmp_path / "bad.jsonl", rows))


def test_a_parquet_file_without_any_answer_is_refused(tmp_path):
    import pyarrow
    import pyarrow.parquet

    path = tmp_path / "train.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist([{"question": "a?", "data_source": "nq"}] * 2), path)
    with pytest.raises(BadData, match=r"train\.parquet: none of its 2 rows has an answer"):
        read_questions(path)
    with pytest.raises(BadData, match=r"must be a \.parquet or \.jsonl file, got '\.csv'"):
        read_questions(tmp_path / "train.csv")


@pytest.mark.parametrize(
    "rows, message",
    [
        ([], r"corpus\.jsonl: the corpus has no passages"),
        ([{"id": "0", "contents": '"T"\ntext'}, {"id": "1", "text": "no contents"}], r"line 2: `contents` must be"),
        ([{"id": "0", "contents": '"T"\ntext'}, "[1, 2]"], r"line 2: expected a JSON object, got list"),
    ],
)
def test_a_bad_corpus_is_refused_naming_file_line_and_field(tmp_path, rows, message):
    with pytest.raises(BadData, match=message):
        Corpus.open(write_lines(tmp_path / "corpus.jsonl", rows))


def test_passages_are_read_from_disk_by_index(tmp_path):
    rows = [{"id": "a", "contents": '"First"\none'}, {"id": "b", "contents": '"Second"\ntwo\nlines'}]
    corpus = Corpus.open(write_lines(tmp_path / "corpus.jsonl", [rows[0], "", rows[1]]))  # a blank line between
    assert len(corpus) == 2
    assert (corpus[1].id, corpus[1].title, corpus[1].text) == ("b", '"Second"', "two\nlines")


# ------------------------------------------------------------------------------------------------------ retriever


def test_bm25_top_k_is_bm25s_called_directly_on_lucenes_analysis(world, tmp_path):
    import bm25s
    import Stemmer

    from ftw_jax.agent.retrieval_qa.retriever import LUCENE_STOP_WORDS, lucene_porter, lucene_words

    stem = lucene_porter(Stemmer.Stemmer("porter").stemWord)

    def analyzed(text: str) -> list[str]:
        return [stem(word) for word in lucene_words(text.lower()) if word not in LUCENE_STOP_WORDS]

    corpus = [json.loads(line)["contents"] for line in world["corpus"].open()]
    direct = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    direct.index([analyzed(text) for text in corpus], show_progress=False)
    queries = [question.question for question in read_questions(world["test"])[:12]] + ["Lisbon painter"]
    found, scores = direct.retrieve([analyzed(query) for query in queries], k=3, show_progress=False)
    retriever = BM25Retriever.open(world["corpus"], tmp_path / "index")
    ours = retriever.search(queries, k=3)
    for row, passages in enumerate(ours):
        expected = [corpus[i] for i, score in zip(found[row], scores[row]) if score > 0]
        assert [passage.contents for passage in passages] == expected
    assert retriever.search(["zzzz qqqq"], k=3) == [[]]  # no shared term: no passage, as Lucene returns no hit


def test_the_index_is_built_once_and_refused_for_another_corpus(world, tmp_path):
    logged = []
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(world["corpus"].read_bytes())
    BM25Retriever.open(corpus, log=logged.append)
    assert (tmp_path / "corpus.bm25" / "ftw_jax_index.json").is_file() and len(logged) == 1
    BM25Retriever.open(corpus, log=logged.append)
    assert len(logged) == 1  # read, not built again
    with corpus.open("a") as file:
        file.write(json.dumps({"id": "new", "contents": '"New"\nA passage added later.'}) + "\n")
    with pytest.raises(BadData, match=r"corpus\.bm25: the index was built for another corpus or settings"):
        BM25Retriever.open(corpus)


# ------------------------------------------------------------------------------------------------------ turns


def test_turns_stop_on_a_sequence_leave_holes_and_log_probs_the_learner_computes():
    model, params = lm.load(QWEN)
    config = SamplingConfig(max_new_tokens=6, stop_sequences=((3, 4), (7,)))
    turns = make_turn_sampler(model, config, slots=32)
    talk = turns.start(
        params, jnp.array([[0, 5, 9, 2], [3, 8, 1, 7]]), jnp.array([[False, True, True, True]] + [[True] * 4])
    )
    talk = turns.generate(params, jax.random.key(0), talk, np.array([True, True]))
    block_mask = np.array([[False, False, True, True], [True] * 4])
    talk = turns.append(params, talk, np.array([[0, 0, 11, 12], [13, 14, 15, 16]]), block_mask)
    talk = turns.generate(params, jax.random.key(1), talk, np.array([True, False]))
    out = talk.sample
    tokens, real, generated = (np.asarray(x) for x in (out.tokens, out.attention_mask, out.generated))
    first_turn = generated[:, 4 : 4 + 6]
    for row in range(2):  # a turn ends at its first stop (sequence (3, 4) or token 7) or after 6 tokens
        written = tokens[row, 4 : 4 + 6][first_turn[row]].tolist()
        ends = [n for n in range(1, len(written) + 1) if written[n - 1] == 7 or written[max(0, n - 2) : n] == [3, 4]]
        assert len(written) == (ends[0] if ends else 6)
    assert not generated[1, int(talk.column) - 6 :].any()  # the inactive row wrote nothing in the second turn
    assert real.sum(axis=1).tolist() == np.asarray(talk.next_position).tolist()
    records = sample_records(out, [1.0, 0.0], version=0)
    assert len(records[0]["spans"]) == 2 and len(records[1]["spans"]) == 1  # one span per turn
    for record in records:
        ids = np.asarray(record["tokens"])
        log_probs = np.asarray(jax.nn.log_softmax(model.apply(params, jnp.asarray(ids)[None])[0]))
        for span in record["spans"]:
            chosen = log_probs[np.arange(span["start"] - 1, span["end"] - 1), ids[span["start"] : span["end"]]]
            np.testing.assert_allclose(chosen, span["logprobs"], atol=2e-5)
    with pytest.raises(ValueError, match="would not fit: .* of the conversation's 32 slots are used"):
        turns.append(params, talk, np.zeros((2, 32), np.int32), np.ones((2, 32), bool))


def test_a_turn_ends_where_a_stop_sequence_is_written():
    """Greedy turns written once without stops; then with the pair of tokens each row wrote second and third as a
    stop sequence, each row's turn is those three tokens, the rest holes."""
    model, params = lm.load(QWEN)
    prompts, mask = jnp.array([[0, 5, 9, 2], [3, 8, 1, 7]]), jnp.ones((2, 4), bool)

    def turn(stops):
        turns = make_turn_sampler(model, SamplingConfig(max_new_tokens=6, temperature=0.0, stop_sequences=stops), 16)
        talk = turns.generate(params, jax.random.key(0), turns.start(params, prompts, mask), np.array([True, True]))
        return np.asarray(talk.tokens)[:, 4:10], np.asarray(talk.generated)[:, 4:10]

    free, _ = turn(())
    for row in range(2):
        stop = tuple(int(token) for token in free[row, 1:3])
        if tuple(free[row, 0:2]) == stop:  # the pair ends the turn one token earlier
            continue
        never = (model.config.vocab_size - 1,) * 3  # a longer sequence beside it: stops of two lengths
        tokens, generated = turn((stop, never))
        assert generated[row].tolist() == [True] * 3 + [False] * 3
        np.testing.assert_array_equal(tokens[row, :3], free[row, :3])


class ScriptedTurns:
    """The real turn sampler's start and append, with turns written from a script instead of drawn from the model
    (the host loop is what is tested): row r's t-th turn is `script[r][t]`, its tokens as the model's."""

    def __init__(self, turns, tokenizer, script):
        self.turns, self.tokenizer, self.script, self.count = turns, tokenizer, script, 0

    def start(self, *args):
        return self.turns.start(*args)

    def append(self, *args):
        return self.turns.append(*args)

    def generate(self, params, key, talk, active):
        width, column = self.turns.config.max_new_tokens, int(talk.column)
        tokens, generated = np.asarray(talk.tokens).copy(), np.zeros(np.shape(talk.generated), bool)
        for row in np.flatnonzero(active):
            ids = self.tokenizer.encode(self.script[row][self.count])[:width]
            tokens[row, column : column + len(ids)], generated[row, column : column + len(ids)] = ids, True
        self.count += 1
        return talk.replace(
            tokens=jnp.asarray(tokens),
            generated=talk.generated | generated,
            attention_mask=talk.attention_mask | generated,
            column=talk.column + width,
            next_position=talk.next_position + generated.sum(axis=1),
        )


@pytest.fixture(scope="module")
def task(world):
    return RetrievalQA(lm.load_tokenizer(world["model"]), BM25Retriever.open(world["corpus"]), SMALL)


def test_the_turn_loop_searches_answers_and_scores_as_the_protocol_says(world, task):
    model, params = lm.load(world["model"])
    questions = read_questions(world["test_jsonl"])[:4]
    person = questions[0].question.split(" of ")[-1].removesuffix("?") if "of" in questions[0].question else "x"
    answer = questions[1].golden_answers[0]
    script = [
        [f"<search> {person} </search> and then more", "<answer> wrong </answer>"],  # cut after </search>
        ["no action here", f"<answer> {answer} </answer>"],  # invalid, then right
        ["<search> a </search>", "<search> b </search>", "<search> c </search>"],  # the last turn's search: no reply
        [f"<answer> {questions[3].golden_answers[0]} </answer>"],
    ]
    sampler = ScriptedTurns(task.turn_sampler(model), task.tokenizer, script)
    played = task.play(sampler, params, jax.random.key(0), questions)  # pyright: ignore[reportArgumentType]
    assert played.rewards.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert played.searches.tolist() == [1, 0, 2, 0]
    assert played.responses[0] == f"<search> {person} </search><answer> wrong </answer>"
    # Search-R1 reads the answer from the whole episode, its prompt's two <answer> tags included (" and ", then the
    # example): an episode that never answers is read as the example's "Beijing"
    assert played.answers == ["wrong", answer, "Beijing", questions[3].golden_answers[0]]
    records = sample_records(played.sample, played.rewards, version=0)
    text = task.tokenizer.decode(records[0]["tokens"])
    passages = task.retriever.search([person], SMALL.top_k)[0]
    assert f"</search>\n\n<information>Doc 1(Title: {passages[0].title})" in text
    invalid = task.tokenizer.encode(INVALID_ACTION)[: SMALL.information_tokens]  # cut as every reply is
    assert task.tokenizer.decode(invalid) in task.tokenizer.decode(records[1]["tokens"])
    assert [len(record["spans"]) for record in records] == [2, 2, 3, 1]
    episodes = [
        episode_of(record, vocab_size=model.config.vocab_size, max_length=SMALL.max_length) for record in records
    ]
    assert to_trajectories(episodes, SMALL.max_length).mask.sum() == sum(e.written.sum() for e in episodes)


def test_a_demonstration_is_the_episode_the_turn_loop_plays(world, task):
    model, params = lm.load(world["model"])
    question, turns = read_demonstrations(world["demonstrations"])[0]
    played = task.play(
        ScriptedTurns(task.turn_sampler(model), task.tokenizer, [turns]), params, jax.random.key(0), [question]
    )
    (record,) = sample_records(played.sample, played.rewards, version=0)
    demonstration = task.demonstration(question, turns)
    assert demonstration["tokens"] == record["tokens"]
    assert [(s["start"], s["end"]) for s in demonstration["spans"]] == [(s["start"], s["end"]) for s in record["spans"]]
    assert played.rewards.tolist() == [1.0]  # the demonstrator is right


def test_a_prompt_over_the_budget_or_a_template_that_fails_is_refused_before_any_compile(world, task):
    import dataclasses

    long = read_questions(write_lines(world["corpus"].parent / "long.jsonl", [{**GOOD, "question": "why " * 300}]))
    assert task.check(long) == 1  # Search-R1's rule: kept, its last tokens
    refusing = RetrievalQA(task.tokenizer, task.retriever, dataclasses.replace(SMALL, long_prompts="refuse"))
    with pytest.raises(
        BadData, match=r"long\.jsonl line 1: `question`'s prompt is \d+ tokens, more than `prompt_tokens` 256"
    ):
        refusing.check(long)

    broken = dataclasses.replace(task.tokenizer, chat_template="{{ raise_exception('no user turns here') }}")
    with pytest.raises(
        BadData, match=r"line 1: the chat template does not render this question \(no user turns here\)"
    ):
        RetrievalQA(broken, task.retriever, SMALL).check(long)


# ------------------------------------------------------------------------------------------------------ command line


def retrieval_qa_argv(world, out, *, corpus=True):
    """`lm retrieval-qa` on the small world at small sizes, its run folder OUT/run; BM25 over the world's corpus, or
    (`corpus` False) no retriever yet: the caller names one."""
    argv = ["lm", "retrieval-qa", "--model", str(world["model"]), "--questions", str(world["train"])]
    argv += ["--test-questions", str(world["test"]), *(["--corpus", str(world["corpus"])] if corpus else [])]
    argv += ["--out", str(out), "--name", "run", "--response-tokens", "12", "--information-tokens", "48"]
    argv += ["--prompt-tokens", "256", "--dtype", "float32", "--episodes-per-iteration", "4", "--pool-capacity", "8"]
    argv += ["--num-batches", "2", "--batch-size", "4", "--num-elites", "1", "--monitor-entries", "4"]
    return [*argv, "--eval-questions", "4", "--json"]


def lm_train(world, out, *extra):
    return cli.main([*retrieval_qa_argv(world, out), *extra])


def test_the_command_refuses_bad_input_in_one_line(world, tmp_path, capsys):
    bad = write_lines(tmp_path / "bad.jsonl", [GOOD, {"question": "who?", "golden_answers": [1]}])
    assert lm_train({**world, "train": bad}, tmp_path) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    with pytest.raises(SystemExit):  # the text search task's flag: argparse's one line, exit 2
        lm_train(world, tmp_path, "--seeds", "1,2")
    assert "unrecognized arguments: --seeds 1,2" in capsys.readouterr().err
    assert lm_train(world, tmp_path, "--warm-start-steps", "3") == 2
    assert "--demonstrations and --warm-start-steps (above 0) go together" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # each task's command takes its own flags alone
        cli.main(["lm", "text-search", "--prompt-tokens", "64", "--iterations", "1"])
    assert "unrecognized arguments: --prompt-tokens 64" in capsys.readouterr().err


def test_the_older_spelling_lm_train_task_runs_the_tasks_own_command(capsys):
    from ftw_jax.cli.lm import current_spelling

    said = []
    assert current_spelling(["lm", "train", "--task", "retrieval-qa", "--seed", "1"], said.append) == [
        "lm",
        "retrieval-qa",
        "--seed",
        "1",
    ]
    assert current_spelling(["lm", "--no-compile-cache", "train", "--task=text-search"], said.append) == [
        "lm",
        "--no-compile-cache",
        "text-search",
    ]
    assert current_spelling(["lm", "train", "--iterations", "3"], said.append) == [
        "lm",
        "text-search",
        "--iterations",
        "3",
    ]
    assert (
        said[0] == "note: `ftw-jax lm train --task retrieval-qa` is now `ftw-jax lm retrieval-qa`." and len(said) == 3
    )
    for argv in (["lm", "learn", "--task", "x"], ["train", "--env", "bandit"], ["lm", "text-search"]):
        assert current_spelling(argv, said.append) == argv
    assert len(said) == 3


def test_a_missing_optional_dependency_is_named_and_leaves_no_run_folder(world, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if not installed: importing it raises ImportError
    assert lm_train(world, tmp_path / "runs") == 2
    assert "pip install 'ftw_jax[retrieval]'" in capsys.readouterr().err
    assert list((tmp_path / "runs").iterdir()) == []


@pytest.mark.slow
def test_lm_train_retrieval_qa_writes_weights_and_resumes_exactly(world, tmp_path, capsys, monkeypatch):
    """Two iterations whole, and the same run stopped by SIGTERM after the first and resumed: the same weights and
    the same evaluations. The stopped run names the weights its last checkpoint covers in latest.json, as `lm
    learn` does, for an engine to play."""
    import signal

    from ftw_jax.agent import lm_learn
    from ftw_jax.running.signals import Interrupted

    extra = ["--demonstrations", str(world["demonstrations"]), "--warm-start-steps", "4", "--iterations", "2"]
    extra += ["--elite-rule", "top_k"]  # a random model answers nothing right: beat_minimum would keep nothing
    assert lm_train(world, tmp_path / "whole", *extra) == 0
    whole = json.loads(capsys.readouterr().out)
    assert [row["iteration"] for row in whole["evaluations"]] == [0, 2]
    assert (tmp_path / "whole" / "run" / "exact_match.png").is_file()
    # the run evaluated 4 questions as it went, and every test question at its end: the paper's table
    tested = len(read_questions(world["test"]))
    assert whole["final_test"]["test_questions/synthetic"] == tested > 4
    rows = [json.loads(line) for line in (tmp_path / "whole" / "run" / "metrics.jsonl").read_text().splitlines()]
    rate = RetrievalTrainConfig.for_algorithm("ftw").learn.learning_rate
    assert [row["learning_rate"] for row in rows] == [0.0, rate]  # warmed up as verl does: W = 0, then all of it
    table = (tmp_path / "whole" / "run" / "test_table.md").read_text()
    assert table.startswith("| | synthetic (") and f"| {100 * whole['final_test']['test_em']:.1f} |" in table
    checks = []

    def stop_before_the_second():
        checks.append(None)
        if len(checks) == 2:
            raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(lm_learn, "raise_if_stopped", stop_before_the_second)  # checked between iterations
    assert (
        lm_train(world, tmp_path / "parts", *extra, "--eval-every", "1", "--final-test", "no") == 128 + signal.SIGTERM
    )
    assert "--resume" in capsys.readouterr().err
    monkeypatch.undo()
    run = tmp_path / "parts" / "run"
    (written,) = sorted((run / "weights").glob("version-*"))  # the first iteration's
    assert json.loads((run / "weights" / "latest.json").read_text())["path"] == written.name
    assert (
        lm_train(world, tmp_path / "parts", *extra, "--eval-every", "1", "--final-test", "no", "--resume", str(run))
        == 0
    )
    resumed = json.loads(capsys.readouterr().out)
    assert [row["iteration"] for row in resumed["evaluations"]] == [0, 1, 2]
    assert resumed["test_em_final"] == whole["test_em_final"]
    _, a = lm.load(pathlib.Path(whole["weights"]))
    _, b = lm.load(pathlib.Path(resumed["weights"]))
    for left, right in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(left, right)


@pytest.mark.slow
def test_lm_train_retrieval_qa_runs_grpo_on_groups_of_one_question(world, tmp_path, capsys):
    """--algorithm grpo: B = 4 episodes an iteration are 2 questions played G = 2 times each, grouped by question
    (a broken group would be refused); one update applied, the share of tied groups logged."""
    flags = ["--algorithm", "grpo", "--group-size", "2", "--iterations", "1", "--eval-questions", "2"]
    assert lm_train(world, tmp_path, *flags) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["version"] == 1
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 0 <= row["groups_tied"] <= 1 and "surrogate" in row and "elite_return_mean" not in row


@pytest.mark.slow
def test_lm_retrieval_qa_against_search_r1s_server_and_the_server_gone_mid_run(world, tmp_path, capsys, monkeypatch):
    """`--retriever-url`: the run retrieves from a server of Search-R1's API on 127.0.0.1 (the demonstrations'
    searches, one request a turn), learns and evaluates; a server that stops answering mid-run ends the command in
    one line naming its URL, no traceback, the last checkpoint kept; the server back at another address, the run
    resumes and finishes."""
    from test_retriever_server import SearchR1Server

    from ftw_jax.agent.retrieval_qa import learner as retrieval_learner

    corpus = [json.loads(line) for line in world["corpus"].read_text().splitlines()]
    argv = [*retrieval_qa_argv(world, tmp_path, corpus=False), "--elite-rule", "top_k"]
    argv += ["--demonstrations", str(world["demonstrations"]), "--warm-start-steps", "2"]
    # Each iteration searches once first (as the model's turns do when it searches); at the second the server
    # stops answering.
    played, iterations = retrieval_learner._play_and_learn, []

    def searching_first(run, *args):
        iterations.append(None)
        if len(iterations) == 2:
            server.fail_from = 0  # every request from now on a 500
        run.task.retriever.search(["who wrote it"], 3)
        return played(run, *args)

    monkeypatch.setattr(retrieval_learner, "_play_and_learn", searching_first)
    server = SearchR1Server(corpus)
    try:
        status = cli.main([*argv, "--retriever-url", server.url, "--iterations", "3"])
    finally:
        server.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1].startswith(f"error: the retriever at {server.url} gave no answer after 4 tries")
    assert "--resume" in err[-1] and not any("Traceback" in line for line in err)
    asked = [body for path, body in server.requests if path == "/retrieve"]
    assert asked[0] == {"queries": ["probe"], "topk": 1, "return_scores": True} and len(asked) > 3
    assert all(body["topk"] == 3 for body in asked[1:])  # the demonstrations' and the turns' searches: top 3
    run = tmp_path / "run"
    assert sorted(path.name for path in (run / "checkpoints").iterdir() if path.name.isdigit()) == ["1"]
    # The server back, at another address: the run resumes from its checkpoint and finishes.
    monkeypatch.undo()
    again = SearchR1Server(corpus)
    try:
        assert cli.main([*argv, "--retriever-url", again.url, "--iterations", "3", "--resume", str(run)]) == 0
    finally:
        again.stop()
    summary = json.loads(capsys.readouterr().out)
    assert summary["iterations"] == 3 and [row["iteration"] for row in summary["evaluations"]] == [0, 3]

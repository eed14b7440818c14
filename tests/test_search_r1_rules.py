"""Search-R1's own rules, pinned: every shape of question file it and verl write (built with the columns and nested
types their scripts write), its prompt, where a turn ends, the end-of-sequence token before a reply, the answer its
reward reads, left-truncated prompts, and top-p rollouts whose records carry the model's own log-probs."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_retrieval_qa import SMALL, ScriptedTurns, small_world

from ftw_jax import lm
from ftw_jax.agent.episodes import sample_records
from ftw_jax.agent.retrieval_qa import BadData, BM25Retriever, RetrievalQA, read_questions
from ftw_jax.agent.retrieval_qa.task import INVALID_ACTION, search_r1_prompt
from ftw_jax.envs.retrieval_qa import cut_turn, episode_answer, final_answer, turn_action

world = pytest.fixture(small_world, scope="module", name="world")


@pytest.fixture(scope="module")
def task(world):
    return RetrievalQA(lm.load_tokenizer(world["model"]), BM25Retriever.open(world["corpus"]), SMALL)


# ------------------------------------------------------------------------------------------------------ files

SEARCH_R1_USER = search_r1_prompt("who wrote hamlet")


def processed_row(index: int) -> dict:
    """A row of Search-R1's processed files (scripts/data_process/qa_search_*_merge.py): FlashRAG's columns kept,
    Search-R1's added."""
    return {
        "id": f"test_{index}",
        "question": "who wrote hamlet?",
        "golden_answers": ["Shakespeare", "William Shakespeare"],
        "data_source": "nq",
        "prompt": [{"role": "user", "content": SEARCH_R1_USER}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare", "William Shakespeare"]}},
        "extra_info": {"split": "test", "index": index},
    }


def own_dataset_row(index: int) -> dict:
    """A row in the shape Search-R1's README gives for "your own dataset": no `question`, no `golden_answers`."""
    row = processed_row(index)
    return {name: row[name] for name in ("data_source", "prompt", "ability", "reward_model", "extra_info")}


def verl_row(index: int) -> dict:
    """A row of verl's examples/data_preprocess/preprocess_search_r1_dataset.py: the question only in `extra_info`,
    a system message, and a prompt that asks for <tool_call> tags."""
    ground_truth = {"target": ["Shakespeare"]}
    user = "Answer the given question ... call a search engine by <tool_call> query </tool_call> ... Question: "
    return {
        "data_source": "searchR1_nq",
        "prompt": [
            {"role": "system", "content": "You are a helpful and harmless assistant."},
            {"role": "user", "content": user + "who wrote hamlet?"},
        ],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {
            "index": index,
            "need_tools_kwargs": True,
            "question": "who wrote hamlet?",
            "split": "train",
            "tools_kwargs": {
                "search": {"create_kwargs": {"ground_truth": ground_truth, "question": "who wrote hamlet?"}}
            },
        },
        "metadata": None,
    }


def write_parquet(path, rows):
    import pyarrow
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    return path


def test_search_r1s_processed_parquet_is_read_with_its_own_prompt(tmp_path):
    (question,) = read_questions(write_parquet(tmp_path / "test.parquet", [processed_row(0)]))
    assert question.question == "who wrote hamlet?"
    assert question.golden_answers == ("Shakespeare", "William Shakespeare")
    assert (question.data_source, question.id) == ("nq", "test_0")
    assert question.messages == ({"role": "user", "content": SEARCH_R1_USER},)


def test_the_readmes_own_dataset_rows_are_scored_against_reward_model_target(tmp_path):
    (question,) = read_questions(write_parquet(tmp_path / "own.parquet", [own_dataset_row(7)]))
    assert question.golden_answers == ("Shakespeare", "William Shakespeare")
    assert question.question == SEARCH_R1_USER.strip()  # the user message: all there is
    assert question.messages == ({"role": "user", "content": SEARCH_R1_USER},)
    assert question.id == "7"  # extra_info.index


def test_verls_rows_take_the_question_from_extra_info_and_get_search_r1s_prompt(tmp_path, world):
    path = write_parquet(tmp_path / "verl.parquet", [verl_row(0), verl_row(1)])
    said = []
    first, _ = read_questions(path, said.append)
    assert (first.question, first.golden_answers, first.data_source) == (
        "who wrote hamlet?",
        ("Shakespeare",),
        "searchR1_nq",
    )
    assert first.messages is None  # its <tool_call> prompt would teach tags the task does not read
    assert said == [
        f"{path}: 2 rows' `prompt` does not ask for <search> (verl's asks for <tool_call>): they get "
        "Search-R1's prompt around their question."
    ]
    task = RetrievalQA(lm.load_tokenizer(world["model"]), None, SMALL)  # pyright: ignore[reportArgumentType]
    assert task.prompt(first) == f"<|im_start|>user\n{SEARCH_R1_USER}<|im_end|>\n<|im_start|>assistant\n"


def test_flashrag_json_lines_get_search_r1s_prompt_with_its_question_mark(tmp_path, world):
    row = {"id": "dev_3", "question": " who wrote hamlet ", "golden_answers": ["Shakespeare"], "metadata": {}}
    path = tmp_path / "dev.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (question,) = read_questions(path)
    task = RetrievalQA(lm.load_tokenizer(world["model"]), None, SMALL)  # pyright: ignore[reportArgumentType]
    assert task.prompt(question) == f"<|im_start|>user\n{SEARCH_R1_USER}<|im_end|>\n<|im_start|>assistant\n"
    assert SEARCH_R1_USER.endswith("Question: who wrote hamlet?\n")


def test_rows_without_a_usable_answer_are_skipped_counted_and_the_first_named(tmp_path):
    rows = [processed_row(0), {**processed_row(1), "golden_answers": []}, processed_row(2)]
    rows.append({**processed_row(3), "golden_answers": [""]})
    said = []
    path = write_parquet(tmp_path / "test.parquet", rows)
    assert [q.id for q in read_questions(path, said.append)] == ["test_0", "test_2"]
    assert said == [f"{path}: skipped 2 of 4 rows with no answer, the first {path} row 1."]
    none = write_parquet(tmp_path / "none.parquet", rows[1::2])
    with pytest.raises(BadData, match=r"none\.parquet: none of its 2 rows has an answer\."):
        read_questions(none)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"reward_model": {"ground_truth": {"target": [3]}}, "golden_answers": None},
            r"row 0: `reward_model\.ground_truth\.target` must be a list of strings",
        ),
        ({"data_source": 5}, r"row 0: `data_source` must be a string"),
        ({"prompt": [{"role": "user"}]}, r"row 0: `prompt` must be a non-empty list of \{role, content\} messages"),
    ],
)
def test_a_bad_field_is_named_with_file_and_row(tmp_path, change, message):
    with pytest.raises(BadData, match=message):
        read_questions(write_parquet(tmp_path / "bad.parquet", [{**processed_row(0), **change}]))


# ------------------------------------------------------------------------------------------------------ turn rules


def test_a_turn_ends_at_its_first_search_if_it_wrote_one_else_at_its_first_answer():
    text = "<answer> a </answer> then <search> q </search> and more </answer>"
    assert cut_turn(text) == "<answer> a </answer> then <search> q </search>"
    assert turn_action(cut_turn(text)) == ("answer", "a")  # Search-R1's action: the first tag pair
    assert cut_turn(text, search_first=False) == "<answer> a </answer>"
    assert cut_turn("<answer> b </answer> more <answer> c </answer>") == "<answer> b </answer>"
    assert cut_turn("no tags at all") == "no tags at all"


def test_the_answer_is_read_from_the_whole_episode_as_search_r1s_reward_reads_it():
    prompt = SEARCH_R1_USER
    assert episode_answer(prompt) == "Beijing"  # the prompt alone has two: " and ", then its example
    assert episode_answer(prompt + "<answer> Paris </answer>") == "Paris"
    assert episode_answer("<answer> only one </answer>") is None  # a prompt of its own without an example
    # an answer split across two turns: Search-R1 reads the reply between them into it; the model's turns alone don't
    turns = ["<answer> Par", "is </answer>"]
    episode = prompt + turns[0] + "\n" + INVALID_ACTION + turns[1]
    assert episode_answer(episode) != "Paris"
    assert final_answer("".join(turns)) == "Paris"


def play_script(task, world, script, questions=None):
    model, params = lm.load(world["model"])
    questions = questions or read_questions(world["test_jsonl"])[: len(script)]
    sampler = ScriptedTurns(task.turn_sampler(model), task.tokenizer, script)
    return task.play(sampler, params, jax.random.key(0), questions)  # pyright: ignore[reportArgumentType]


def test_an_answer_before_a_search_in_one_turn_ends_the_episode_at_the_search(world, task):
    questions = read_questions(world["test_jsonl"])[:1]
    right = questions[0].golden_answers[0]
    played = play_script(task, world, [[f"<answer> {right} </answer> <search> x </search> tail"]], questions)
    assert played.responses == [f"<answer> {right} </answer> <search> x </search>"]
    assert played.searches.tolist() == [0] and played.rewards.tolist() == [1.0]
    first_tag = RetrievalQA(task.tokenizer, task.retriever, dataclasses.replace(SMALL, turn_end="first-tag"))
    played = play_script(first_tag, world, [[f"<answer> {right} </answer> <search> x </search> tail"]], questions)
    assert played.responses == [f"<answer> {right} </answer>"]


def test_the_end_of_sequence_token_is_dropped_before_a_reply_unless_kept(world, task):
    eos = task.tokenizer.decode([task.tokenizer.eos_id])
    script = [["no action" + eos, "<answer> x </answer>" + eos]]
    for keep, expected in ((False, 2), (True, 3)):  # the chat template's end of the user's turn is one
        played_task = RetrievalQA(task.tokenizer, task.retriever, dataclasses.replace(SMALL, keep_eos=keep))
        (record,) = sample_records(play_script(played_task, world, script).sample, [0.0], version=0)
        assert record["tokens"].count(task.tokenizer.eos_id) == expected  # the last turn's stays
        invalid = task.tokenizer.encode(INVALID_ACTION)
        start = next(i for i in range(len(record["tokens"])) if record["tokens"][i : i + len(invalid)] == invalid)
        assert (record["tokens"][start - 1] == task.tokenizer.eos_id) == keep


def test_a_long_prompt_keeps_its_last_tokens_and_is_counted(world, task):
    long = read_questions(world["test_jsonl"])[0]
    long = dataclasses.replace(long, question="why " * 300 + long.question)
    played = play_script(task, world, [["<answer> x </answer>"]], [long])
    (record,) = sample_records(played.sample, [0.0], version=0)
    prompt = task.tokenizer.encode(task.prompt(long))
    assert played.truncated_prompts == 1
    assert record["tokens"][: SMALL.prompt_tokens] == prompt[-SMALL.prompt_tokens :]


# ------------------------------------------------------------------------------------------------------ sampling


def test_rollouts_sample_within_the_nucleus_and_record_the_models_own_log_probs(world, task):
    model, params = lm.load(world["model"])
    sampler, greedy = task.turn_sampler(model), task.turn_sampler(model, greedy=True)
    assert (sampler.config.top_p, greedy.config.top_p) == (SMALL.top_p, 1.0) == (0.95, 1.0)
    played = task.play(sampler, params, jax.random.key(3), read_questions(world["test_jsonl"])[:2])
    sample = played.sample
    assert not np.allclose(
        np.asarray(sample.logp)[np.asarray(sample.generated)],
        np.asarray(sample.model_logp)[np.asarray(sample.generated)],
    )
    for record in sample_records(sample, played.rewards, version=0, log_probs="model_logp"):
        ids = np.asarray(record["tokens"])
        log_probs = np.asarray(jax.nn.log_softmax(model.apply(params, jnp.asarray(ids)[None])[0]))
        for span in record["spans"]:
            chosen = log_probs[np.arange(span["start"] - 1, span["end"] - 1), ids[span["start"] : span["end"]]]
            np.testing.assert_allclose(chosen, span["logprobs"], atol=5e-5)


# ------------------------------------------------------------------------------------------------------ evaluation


def sourced(counts: dict[str, int]) -> list:
    from ftw_jax.agent.retrieval_qa.data import Question

    return [
        Question(question=f"{source} {n}?", golden_answers=("a",), data_source=source, id=f"{source}_{n}")
        for source, count in counts.items()
        for n in range(count)
    ]


def test_evaluation_questions_are_drawn_evenly_across_sources_the_same_every_time():
    from ftw_jax.agent.retrieval_qa.evaluation import evaluation_questions

    questions = sourced({"nq": 50, "hotpotqa": 50, "bamboogle": 3})  # in Search-R1's merge order, NQ first
    drawn = evaluation_questions(questions, 21)
    counts = {source: sum(q.data_source == source for q in drawn) for source in ("nq", "hotpotqa", "bamboogle")}
    assert counts == {"nq": 9, "hotpotqa": 9, "bamboogle": 3}  # bamboogle runs out: its share goes to the others
    assert [q.data_source for q in drawn][:9] == ["nq"] * 9  # grouped, in the paper's order
    assert [q.id for q in evaluation_questions(questions, 21)] == [q.id for q in drawn]
    assert [q.id for q in drawn[:9]] != [f"nq_{n}" for n in range(9)]  # drawn, not the first rows
    assert evaluation_questions(questions, None) == questions == evaluation_questions(questions, 500)


class ScoredTask:
    """A task whose episodes score 1 where the question's id is in `right`."""

    def __init__(self, right):
        self.right = right

    def play(self, sampler, params, key, questions):
        from types import SimpleNamespace

        rewards = np.asarray([float(q.id in self.right) for q in questions], np.float32)
        return SimpleNamespace(rewards=rewards, searches=np.ones(len(questions), np.int64))


def test_the_paper_number_is_the_mean_over_sources_and_its_table_shows_each():
    from ftw_jax.agent.retrieval_qa.evaluation import evaluate, paper_table

    questions = sourced({"hotpotqa": 4, "nq": 2})
    row = evaluate(ScoredTask({"nq_0", "nq_1", "hotpotqa_0"}), None, None, questions, batch=4)
    assert row["test_em/nq"] == 1.0 and row["test_em/hotpotqa"] == 0.25
    assert row["test_em"] == 0.625  # (1 + 0.25) / 2: each source weighs alike, as the paper's average
    assert row["test_em_pooled"] == 0.5  # 3 of 6 questions
    assert (row["test_questions/nq"], row["test_questions/hotpotqa"]) == (2, 4)
    table = paper_table([("FTW", row)])
    assert table.splitlines()[0] == "| | NQ (2) | HotpotQA (4) | Avg. |"
    assert table.splitlines()[2] == "| FTW | 100.0 | 25.0 | 62.5 |"


@pytest.mark.slow
def test_lm_evaluate_measures_a_checkpoint_per_source_as_the_paper_reports(world, tmp_path, capsys):
    from ftw_jax import cli

    argv = ["lm", "evaluate", "--model", str(world["model"]), "--test-questions", str(world["test"])]
    argv += ["--corpus", str(world["corpus"]), "--eval-questions", "6", "--batch", "4", "--out", str(tmp_path)]
    argv += ["--response-tokens", "12", "--information-tokens", "48", "--prompt-tokens", "256"]
    assert cli.main([*argv, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["questions"] == 6 == row["test_questions/synthetic"]  # this world's test questions: one source
    assert json.loads((tmp_path / "evaluation.json").read_text()) == row
    assert (tmp_path / "test_table.md").read_text().splitlines()[0] == "| | synthetic (6) | Avg. |"
    assert cli.main(["lm", "evaluate", "--model", str(world["model"]), "--test-questions", str(world["test"])]) == 2
    assert "error: give --corpus (searched in-process by BM25) or --retriever-url" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------ BM25


def test_the_analyzer_splits_and_stems_as_lucenes_english_analyzer():
    """Lucene's words for this text, as Anserini 0.21.0's DefaultEnglishAnalyzer (Lucene 9.4, pyserini's) wrote
    them (`java -cp anserini-0.21.0-fatjar.jar experiments/search_r1/lucene/LuceneBM25.java analyze`): one-character
    words and numbers kept, possessives dropped, its 33 stop words, Martin Porter's stemmer."""
    from ftw_jax.agent.retrieval_qa.retriever import BM25Retriever, RetrieverSettings

    text = (
        "World War 2: the U.S.A's army, don't stop! 3.14 and 1,000 possibly; technology Notably_ _ __init__ os.path "
        "a:b It's Biology sensibly flies caresses ponies"
    )
    lucene = (
        "world war 2 u.s.a armi don't stop 3.14 1,000 possibl technolog notably_ __init__ os.path a:b biologi sensibl "
        "fli caress poni"
    )
    tokenizer = BM25Retriever._tokenizer(RetrieverSettings())
    assert list(tokenizer.tokenize([text], return_as="string", show_progress=False)[0]) == lucene.split()


def test_the_learning_rate_warms_up_as_verls_schedule_does():
    from ftw_jax.agent.retrieval_qa.learner import RetrievalTrainConfig, warmup_factor

    config = RetrievalTrainConfig.for_algorithm("ftw", num_iterations=1005)  # Search-R1's: W = int(0.285 x 1005)
    assert [warmup_factor(config, i) for i in (0, 143, 286, 1004)] == [0.0, 0.5, 1.0, 1.0]
    constant = RetrievalTrainConfig.for_algorithm("ppo", num_iterations=10, warmup_ratio=0.0)
    assert {warmup_factor(constant, i) for i in range(10)} == {1.0}
    with pytest.raises(ValueError, match="warmup_ratio must be in \\[0, 1\\], got 1.5"):
        RetrievalTrainConfig.for_algorithm("ftw", warmup_ratio=1.5)

"""The paper's evaluation: greedy exact match on each test source (`data_source`) and their mean, on a sample drawn
evenly across the sources or on all of them, as a row and as the paper's table.

    questions = evaluation_questions(read_questions("test.parquet"), 1000)    # as many of each source, seed fixed
    row = evaluate(task, greedy_sampler, params, questions, batch=64)
    row["test_em"], row["test_em/nq"], row["test_em_pooled"]
    print(paper_table([("FTW", row)]))

`test_em` is the mean over sources of each source's exact match, the number Search-R1's table averages (with one
source, the mean over questions); `test_em_pooled` is the mean over questions, which weighs a source by its size.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import jax
import numpy as np

from ftw_jax.agent.retrieval_qa.data import Question

# Search-R1's seven test sets in its table's order (scripts/data_process/qa_search_test_merge.py's names); a source
# outside them comes after, by name.
PAPER_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
_PAPER_NAMES = ("NQ", "TriviaQA", "PopQA", "HotpotQA", "2Wiki", "Musique", "Bamboogle")
# The draw of an evaluation sample: fixed, so that runs of any seed and any algorithm answer the same questions.
SAMPLE_SEED = 0


def source_of(question: Question) -> str:
    return question.data_source or "all"


def by_source(questions: list[Question]) -> dict[str, list[int]]:
    """The questions' indices grouped by source, the sources in the paper's order, then by name."""
    groups = defaultdict(list)
    for index, question in enumerate(questions):
        groups[source_of(question)].append(index)
    rank = {name: number for number, name in enumerate(PAPER_SOURCES)}
    return {name: groups[name] for name in sorted(groups, key=lambda name: (rank.get(name, len(rank)), name))}


def evaluation_questions(questions: list[Question], count: int | None) -> list[Question]:
    """`count` of the questions drawn evenly across their sources (each source's in a fixed random order, taken in
    turn, a source that runs out leaving its share to the others), grouped by source; all of them where `count`
    is None or at least their number."""
    if count is None or count >= len(questions):
        return questions
    rng = np.random.default_rng(SAMPLE_SEED)
    orders = [list(rng.permutation(indices)) for indices in by_source(questions).values()]
    taken: list[list[int]] = [[] for _ in orders]
    while sum(map(len, taken)) < count:
        for order, chosen in zip(orders, taken):
            if order and sum(map(len, taken)) < count:
                chosen.append(int(order.pop(0)))
    return [questions[index] for chosen in taken for index in sorted(chosen)]


def evaluate(task: Any, sampler: Any, params: Any, questions: list[Question], batch: int) -> dict:
    """Greedy exact match over the questions, in batches of `batch` (the last filled with repeats, left out of the
    count): {"test_em": mean over sources, "test_em_pooled": mean over questions, "test_em/<source>" and
    "test_questions/<source>" for each source, "test_searches": searches per question}."""
    rewards, searches = [], []
    for start in range(0, len(questions), batch):
        chunk = questions[start : start + batch]
        played = task.play(sampler, params, jax.random.key(0), chunk + [chunk[0]] * (batch - len(chunk)))
        rewards += played.rewards[: len(chunk)].tolist()
        searches += played.searches[: len(chunk)].tolist()
    groups = by_source(questions)
    each = {source: float(np.mean([rewards[index] for index in indices])) for source, indices in groups.items()}
    return {
        "test_em": float(np.mean(list(each.values()))),
        "test_em_pooled": float(np.mean(rewards)),
        **{f"test_em/{source}": value for source, value in each.items()},
        **{f"test_questions/{source}": len(indices) for source, indices in groups.items()},
        "test_searches": float(np.mean(searches)),
    }


def paper_table(rows: list[tuple[str, dict]]) -> str:
    """A Markdown table shaped like the paper's: a line per (name, evaluation row), a column per source (exact
    match in %, questions in the header) and their mean."""
    sources = [name.removeprefix("test_em/") for name in rows[0][1] if name.startswith("test_em/")]
    names = dict(zip(PAPER_SOURCES, _PAPER_NAMES))
    header = [f"{names.get(source, source)} ({rows[0][1][f'test_questions/{source}']})" for source in sources]
    lines = ["| | " + " | ".join([*header, "Avg."]) + " |", "|---|" + "---:|" * (len(sources) + 1)]
    for name, row in rows:
        cells = [f"{100 * row[f'test_em/{source}']:.1f}" for source in sources] + [f"{100 * row['test_em']:.1f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

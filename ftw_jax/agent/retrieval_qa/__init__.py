"""Retrieval QA in Search-R1's protocol: its files, a BM25 retriever, the chat template, tool calls between the
model's turns, exact match, and the loop that trains on it (docs/lm.md, "Retrieval QA").

    from ftw_jax.agent.retrieval_qa import exact_match, read_questions, BM25Retriever, RetrievalQA

Modules: `data` (questions and corpus files), `retriever` (bm25s, its index saved beside the corpus), `task`
(prompts and the turn loop), `synthetic` (a small world in the same formats), `learner` (the training loop);
the scoring rules are `ftw_jax.envs.retrieval_qa.answers`. The host runs the retriever between turns; the model's
turns run on the device.
"""

from ftw_jax.agent.retrieval_qa.data import BadData, Corpus, Passage, Question, read_questions
from ftw_jax.agent.retrieval_qa.retriever import BM25Retriever, RetrieverSettings, information
from ftw_jax.agent.retrieval_qa.task import Played, RetrievalQA, RetrievalQASettings
from ftw_jax.envs.retrieval_qa.answers import exact_match, final_answer, normalize_answer, turn_action

__all__ = [
    "BM25Retriever",
    "BadData",
    "Corpus",
    "Passage",
    "Played",
    "Question",
    "RetrievalQA",
    "RetrievalQASettings",
    "RetrieverSettings",
    "exact_match",
    "final_answer",
    "information",
    "normalize_answer",
    "read_questions",
    "turn_action",
]

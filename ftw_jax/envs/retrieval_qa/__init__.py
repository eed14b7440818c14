"""Retrieval QA's scoring rules: SQuAD's answer normalisation, exact match, and the model's actions read from its
text. They are what the task is judged by, so they sit with the environments; the task itself (its files, the
retriever, the turn loop) is the agent's (`ftw_jax.agent.retrieval_qa`).

    from ftw_jax.envs.retrieval_qa import exact_match
"""

from ftw_jax.envs.retrieval_qa.answers import (
    cut_turn,
    episode_answer,
    exact_match,
    final_answer,
    normalize_answer,
    turn_action,
)

__all__ = ["cut_turn", "episode_answer", "exact_match", "final_answer", "normalize_answer", "turn_action"]

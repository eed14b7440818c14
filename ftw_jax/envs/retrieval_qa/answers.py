"""What the model wrote, read as Search-R1 reads it: its action in a turn, its final answer, and exact match.

exact_match("The Eiffel Tower!", ["eiffel tower"])      # True: SQuAD's normalisation on both sides
turn_action("I should look. <search> eiffel </search>")  # ("search", "eiffel")
final_answer(response)                                  # the last <answer> … </answer>, or None
episode_answer(episode)                                 # Search-R1's: the last of at least two, or None
cut_turn("<answer> a </answer> <search> q </search>")   # up to Search-R1's end of a turn (after </search>)
"""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# The closing tags of the two actions: a turn ends after one of them (what the model wrote after it is not kept).
STOP_STRINGS = ("</search>", "</answer>")


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, ASCII punctuation removed, then the articles a/an/the, then white space
    collapsed to single spaces (in that order, as the SQuAD v1.1 evaluation script applies it)."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golden_answers: list[str]) -> bool:
    """Whether the prediction equals any golden answer once both are normalised (`normalize_answer`)."""
    if isinstance(golden_answers, str):
        raise TypeError(f"golden_answers must be a list of strings, got the string {golden_answers!r}.")
    predicted = normalize_answer(prediction)
    return any(predicted == normalize_answer(answer) for answer in golden_answers)


def turn_action(text: str) -> tuple[str | None, str]:
    """(action, content) of one turn the model wrote: its first `<search> … </search>` or `<answer> … </answer>`
    ("search" or "answer", the text between the tags, stripped); (None, "") where it wrote neither, an invalid
    action."""
    match = _ACTION.search(text)
    return (match.group(1), match.group(2).strip()) if match else (None, "")


def final_answer(response: str) -> str | None:
    """The episode's answer: the text of the last `<answer> … </answer>` in what the model wrote (stripped), or
    None where there is none (a format error, which scores 0)."""
    answers = _ANSWER.findall(response)
    return answers[-1].strip() if answers else None


def episode_answer(episode: str) -> str | None:
    """The answer as Search-R1's reward reads it (qa_em.py, `extract_solution`): over the whole episode's text, the
    prompt's and the replies' included, the last `<answer> … </answer>` (stripped) where there are at least two (its
    prompt's example is the first), else None."""
    answers = _ANSWER.findall(episode)
    return answers[-1].strip() if len(answers) >= 2 else None


def cut_turn(text: str, search_first: bool = True) -> str:
    """A turn's text up to where it ends: Search-R1's rule (generation.py, `_postprocess_responses`) ends it after
    the first `</search>` where it wrote one, else after the first `</answer>`; with `search_first` False, after
    whichever comes first. A turn with neither is kept whole."""
    ends = {stop: text.find(stop) + len(stop) for stop in STOP_STRINGS if stop in text}
    if search_first and "</search>" in ends:
        return text[: ends["</search>"]]
    return text[: min(ends.values())] if ends else text


def reward(answer: str | None, golden_answers: list[str]) -> float:
    """1.0 where an episode's answer (`episode_answer`'s or `final_answer`'s) matches a golden answer exactly
    (`exact_match`), else 0.0 (a missing answer, None, included)."""
    return float(answer is not None and exact_match(answer, golden_answers))

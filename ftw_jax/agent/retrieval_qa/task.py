"""The task in Search-R1's protocol: a question in the checkpoint's chat template, then turns of the model with a
retriever between them, then exact match.

    task = RetrievalQA(tokenizer, retriever, RetrievalQASettings())
    task.check(questions)                                   # every prompt renders and fits, before any compile
    sampler = task.turn_sampler(model)                      # compiled once; `greedy=True` for evaluation
    played = task.play(sampler, params, key, questions)    # B episodes: conversations, rewards, answers

Search-R1's rules by default (docs/lm.md lists each with the line of Search-R1 it follows and the setting that
changes it). A prompt longer than `prompt_tokens` keeps its last tokens. A turn is the model writing, sampled at
`temperature` within the `top_p` nucleus, until its end-of-turn token or `response_tokens`, cut after its first
`</search>` where it wrote one, else after its first `</answer>`. Its first action decides: `<search> query
</search>` gets `\\n\\n<information>Doc 1(Title: …) …</information>\\n\\n` (the top_k passages, cut to
`information_tokens`), `<answer> … </answer>` ends the episode, neither is told it was invalid and goes on; an
end-of-turn token before a reply is dropped. After `search_turns` turns with a tool reply, one last turn is the
model's (a search there gets no reply). The reward is 1 where the episode's answer (the last of at least two
`<answer>`s in its whole text, the prompt's example the first) matches a golden answer exactly. Everything but
the model's turns (the prompt, the replies) is the environment's: outside the loss and the KL.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal

import jax
import numpy as np

from ftw_jax.agent.retrieval_qa.data import BadData, Question
from ftw_jax.agent.retrieval_qa.retriever import Retriever, information
from ftw_jax.core.settings import check_settings, setting
from ftw_jax.envs.retrieval_qa.answers import (
    STOP_STRINGS,
    cut_turn,
    episode_answer,
    final_answer,
    reward,
    turn_action,
)

if TYPE_CHECKING:
    from ftw_jax.lm.model import CausalLM
    from ftw_jax.lm.sampler import Sample
    from ftw_jax.lm.tokenizer import Tokenizer
    from ftw_jax.lm.turns import Conversation, TurnSampler

# Search-R1's prompt and invalid-action reply, byte for byte (its scripts/data_process/nq_search.py `make_prefix`,
# template "base", and llm_agent/generation.py `execute_predictions`): the paper's numbers depend on these exact
# words, so these two texts are Search-R1's, not ours.
SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge needed, "
    "you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For "
    "example, <answer> Beijing </answer>. Question: {question}\n"
)
INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)


def search_r1_prompt(question: str) -> str:
    """The user message Search-R1 writes for a question: stripped, a question mark added where it ends otherwise,
    in `SEARCH_R1_PROMPT`."""
    question = question.strip()
    return SEARCH_R1_PROMPT.format(question=question if question.endswith("?") else question + "?")


@dataclasses.dataclass(frozen=True)
class RetrievalQASettings:
    """The protocol's sizes (Search-R1's defaults: `max_turns`, `max_response_length`, `max_obs_length`,
    `max_start_length`, `topk`)."""

    search_turns: int = setting(2, "turns whose search gets a reply; one last turn follows for the answer")
    response_tokens: int = setting(500, "the most tokens the model writes in one turn")
    information_tokens: int = setting(500, "the most tokens of retrieved passages a search gets (cut after)")
    prompt_tokens: int = setting(2048, "the longest prompt in tokens, chat template included")
    long_prompts: Literal["truncate", "refuse"] = setting(
        "truncate", "a prompt over `prompt_tokens`: keep its last tokens as Search-R1 does (counted), or refuse it"
    )
    top_k: int = setting(3, "passages a search returns")
    temperature: float = setting(1.0, "the sampling temperature of training rollouts (evaluation is greedy)")
    top_p: float = setting(
        0.95, "training rollouts sample within the fewest tokens holding this much probability (1: all of them)"
    )
    turn_end: Literal["search-first", "first-tag"] = setting(
        "search-first",
        "a turn ends after its first </search> if it wrote one, else its first </answer>; or after the first of either",
    )
    keep_eos: bool = setting(False, "keep the end-of-sequence token that ended a turn before the reply that follows")
    answer_from: Literal["episode", "turns"] = setting(
        "episode",
        "the answer: the episode's last <answer> of at least two (the prompt's example the first), or the model's "
        "turns' last",
    )

    def __post_init__(self):
        check_settings(self)
        for name in ("search_turns", "response_tokens", "information_tokens", "prompt_tokens", "top_k"):
            value, least = getattr(self, name), 0 if name == "search_turns" else 1
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}.")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for training rollouts, got {self.temperature!r}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1: the full distribution), got {self.top_p!r}.")

    @property
    def max_length(self) -> int:
        """The longest episode: the prompt, every turn and every reply at their most."""
        turns = self.search_turns + 1
        return self.prompt_tokens + turns * self.response_tokens + self.search_turns * self.information_tokens


@dataclasses.dataclass(frozen=True)
class Played:
    """B episodes of the task."""

    sample: Sample  # [B, max_length] columns, holes included (`ftw_jax.agent.episodes.sample_records` drops them)
    rewards: np.ndarray  # [B] float32: exact match of the final answer
    answers: list[str | None]  # the final answers (None: none given)
    searches: np.ndarray  # [B] int: searches that got a reply
    responses: list[str]  # what the model wrote, its turns joined
    truncated_prompts: int = 0  # prompts over `prompt_tokens` that lost their first tokens


class RetrievalQA:
    """The task over a tokenizer (the checkpoint's, with its chat template) and a retriever."""

    def __init__(self, tokenizer: Tokenizer, retriever: Retriever, settings: RetrievalQASettings):
        if tokenizer.pad_id is None or tokenizer.eos_id is None:
            raise ValueError("the tokenizer names no end-of-sequence token (`eos_token` in tokenizer_config.json).")
        self.tokenizer, self.retriever, self.settings = tokenizer, retriever, settings

    def prompt(self, question: Question) -> str:
        """The question as the model reads it: its chat messages (the file's, else Search-R1's prompt around the
        question) through the checkpoint's chat template, ending with the opening of the assistant's turn."""
        import jinja2

        messages = question.messages or ({"role": "user", "content": search_r1_prompt(question.question)},)
        try:
            return self.tokenizer.chat(list(messages))
        except (jinja2.TemplateError, ValueError) as error:  # the template raised, or there is none
            raise BadData(f"{question.where}: the chat template does not render this question ({error}).") from None

    def check(self, questions: list[Question]) -> int:
        """How many of the questions' prompts are longer than `prompt_tokens` (left-truncated when played); refuses
        (`BadData`, naming the file and line) a prompt that does not render, or, with `long_prompts` "refuse", one
        that is too long."""
        prompts = [self.prompt(question) for question in questions]
        encoded = self.tokenizer.backend.encode_batch(prompts, add_special_tokens=False)
        return sum(self._fitted(question, item.ids)[1] for question, item in zip(questions, encoded))

    def _fitted(self, question: Question, prompt: list[int]) -> tuple[list[int], bool]:
        """(the prompt's last `prompt_tokens` tokens, whether it had more), as Search-R1 keeps
        `initial_input_ids[:, -max_start_length:]`; `BadData` where `long_prompts` is "refuse"."""
        limit = self.settings.prompt_tokens
        if len(prompt) > limit and self.settings.long_prompts == "refuse":
            raise BadData(
                f"{question.where}: `question`'s prompt is {len(prompt)} tokens, more than `prompt_tokens` {limit}."
            )
        return prompt[-limit:], len(prompt) > limit

    def stop_sequences(self) -> tuple[tuple[int, ...], ...]:
        """The token ids that end a turn while it is written: each closing tag that ends it whatever follows
        (`</search>`; both tags with `turn_end` "first-tag") as it is written alone and after a space, a newline or a
        word (a byte-level tokenizer may merge what precedes it into its first token). A tag written otherwise, and
        `</answer>` under Search-R1's rule, is found in the turn's text (`play` cuts the turn there)."""
        found = set()
        for stop in STOP_STRINGS if self.settings.turn_end == "first-tag" else ("</search>",):
            for before in ("", " ", "\n", "x"):
                head, whole = self.tokenizer.encode(before), self.tokenizer.encode(before + stop)
                if whole[: len(head)] == head and len(whole) > len(head):
                    found.add(tuple(whole[len(head) :]))
        return tuple(sorted(found))

    def turn_sampler(self, model: CausalLM, greedy: bool = False) -> TurnSampler:
        from ftw_jax.lm.sampler import SamplingConfig
        from ftw_jax.lm.turns import make_turn_sampler

        assert self.tokenizer.eos_id is not None and self.tokenizer.pad_id is not None  # checked in __init__
        config = SamplingConfig(
            max_new_tokens=self.settings.response_tokens,
            temperature=0.0 if greedy else self.settings.temperature,
            top_p=1.0 if greedy else self.settings.top_p,
            stop_tokens=(self.tokenizer.eos_id,),
            pad_token=self.tokenizer.pad_id,
            stop_sequences=self.stop_sequences(),
        )
        return make_turn_sampler(model, config, self.settings.max_length)

    def _left_padded(self, rows: list[list[int]], width: int) -> tuple[np.ndarray, np.ndarray]:
        from ftw_jax.lm.tokenizer import left_pad

        assert self.tokenizer.pad_id is not None  # checked in __init__
        return left_pad(rows, width, self.tokenizer.pad_id)

    def play(self, sampler: TurnSampler, params: Any, key: jax.Array, questions: list[Question]) -> Played:
        """One episode per question, all in one batch (see the module's docstring); the key is consumed."""
        size = len(questions)
        fitted = [self._fitted(question, self.tokenizer.encode(self.prompt(question))) for question in questions]
        talk = sampler.start(params, *self._left_padded([prompt for prompt, _ in fitted], self.settings.prompt_tokens))
        active, searches = np.ones(size, bool), np.zeros(size, np.int64)
        responses = [""] * size
        for turn in range(self.settings.search_turns + 1):
            first = int(talk.column)
            talk = sampler.generate(params, jax.random.fold_in(key, turn), talk, active)
            talk, texts = self._cut_turns(talk, first, active)
            turns = {int(row): texts[row] for row in np.flatnonzero(active)}
            for row, text in turns.items():
                responses[row] += text
            replies = self.respond(turns, last=turn == self.settings.search_turns)
            for row in turns:
                active[row] = row in replies
                searches[row] += replies.get(row, (None, False))[1]
            if active.any():
                if not self.settings.keep_eos:
                    talk = self._without_end_of_turn(talk, first, active)
                blocks = [replies[row][0] if row in replies else [] for row in range(size)]
                talk = sampler.append(params, talk, *self._left_padded(blocks, self.settings.information_tokens))
        answers = self._answers(talk, responses)
        return Played(
            sample=talk.sample,
            rewards=np.asarray([reward(a, list(q.golden_answers)) for a, q in zip(answers, questions)], np.float32),
            answers=answers,
            searches=searches,
            responses=responses,
            truncated_prompts=sum(longer for _, longer in fitted),
        )

    def _answers(self, talk: Conversation, responses: list[str]) -> list[str | None]:
        tokens, real = np.asarray(talk.tokens), np.asarray(talk.attention_mask)
        return [self.answer(tokens[row][real[row]].tolist(), text) for row, text in enumerate(responses)]

    def _without_end_of_turn(self, talk: Conversation, first: int, going_on: np.ndarray) -> Conversation:
        """The conversations that go on with the end-of-sequence token that ended their turn dropped, as Search-R1
        decodes a turn without special tokens before it appends the reply."""
        columns = np.arange(first, int(talk.column))
        written = np.asarray(talk.generated[:, first : int(talk.column)])
        tokens = np.asarray(talk.tokens[:, first : int(talk.column)])
        drop = np.zeros(np.shape(talk.generated), bool)
        for row in np.flatnonzero(going_on & written.any(axis=1)):
            last = np.flatnonzero(written[row])[-1]
            drop[row, columns[last]] = tokens[row, last] == self.tokenizer.eos_id
        return talk.dropping(drop) if drop.any() else talk

    def respond(self, turns: dict[int, str], last: bool) -> dict[int, tuple[list[int], bool]]:
        """The environment's side of one turn: for each conversation (by any key) whose turn the model just wrote,
        the reply tokens and whether they are a search's, where the conversation goes on; the others (an answer, or
        the `last` turn) end. Searches run as one batch."""
        replies, queries = {}, {}
        for key, text in turns.items():
            action, content = turn_action(text)
            if action == "answer" or last:
                continue
            if action == "search":
                queries[key] = content
            else:
                replies[key] = (self.reply(None), False)
        for key, passages in zip(queries, self.retriever.search(list(queries.values()), self.settings.top_k)):
            replies[key] = (self.reply(passages), True)
        return replies

    def reply(self, passages: list | None) -> list[int]:
        """The tokens a turn gets: a search's passages between `<information>` tags, or (None: the turn had no action)
        `INVALID_ACTION`; cut to `information_tokens`, as Search-R1 cuts every observation."""
        text = (
            INVALID_ACTION
            if passages is None
            else f"\n\n<information>{information(passages).strip()}</information>\n\n"
        )
        return self.tokenizer.encode(text)[: self.settings.information_tokens]

    def demonstration(self, question: Question, turns: list[str]) -> dict:
        """The episode record (`ftw_jax.agent.episodes`' schema, reward 1, log-probs 0) of a demonstrator that writes
        these turns, with the replies `play` gives them: the prompt, then each turn and, after a search within
        `search_turns`, its passages (after an invalid turn, `INVALID_ACTION`)."""
        where = f"{question.where}: `demonstration`"
        if not (isinstance(turns, list) and turns and all(isinstance(turn, str) and turn for turn in turns)):
            raise BadData(f"{where} must be a non-empty list of the turns' texts, got {turns!r:.80}.")
        if len(turns) > self.settings.search_turns + 1:
            raise BadData(
                f"{where} has {len(turns)} turns, more than `search_turns` + 1 = {self.settings.search_turns + 1}."
            )
        tokens, spans = self.tokenizer.encode(self.prompt(question)), []
        for number, turn in enumerate(turns):
            written = self.tokenizer.encode(turn)
            if len(written) > self.settings.response_tokens:
                raise BadData(f"{where}: turn {number} is {len(written)} tokens, more than `response_tokens`.")
            spans.append(
                {
                    "start": len(tokens),
                    "end": len(tokens) + len(written),
                    "version": 0,
                    "logprobs": [0.0] * len(written),
                }
            )
            tokens += written
            action, content = turn_action(turn)
            if number < len(turns) - 1:
                if action == "answer":
                    raise BadData(f"{where}: turn {number} answers, yet more turns follow it.")
                passages = self.retriever.search([content], self.settings.top_k)[0] if action == "search" else None
                tokens += self.reply(passages)
        return {"tokens": tokens, "spans": spans, "reward": 1.0, "id": question.id}

    def turn_kept(self, ids: list[int]) -> tuple[int, str]:
        """(how many of a turn's tokens stand, their text): where its text goes on past where `turn_end` ends it (a
        tag the stop sequences did not catch, or an `</answer>` under Search-R1's rule), up to the token that
        completed the tag. The text is decoded without special tokens, as Search-R1 reads a turn."""
        search_first = self.settings.turn_end == "search-first"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = cut_turn(text, search_first)
        if len(cut) >= len(text.rstrip()):
            return len(ids), text
        decoded = (self.tokenizer.decode(ids[:n], skip_special_tokens=True) for n in range(1, len(ids) + 1))
        keep = next((n for n, prefix in enumerate(decoded, start=1) if cut_turn(prefix, search_first) == cut), len(ids))
        return keep, self.tokenizer.decode(ids[:keep], skip_special_tokens=True)

    def answer(self, episode: list[int], turns: str) -> str | None:
        """An episode's answer by `answer_from`: from its whole text (its tokens, prompt and replies included), or
        from the model's turns (their texts joined)."""
        if self.settings.answer_from == "turns":
            return final_answer(turns)
        return episode_answer(self.tokenizer.decode(episode))

    def _cut_turns(self, talk: Conversation, first: int, active: np.ndarray) -> tuple[Conversation, list[str]]:
        """(conversation, each row's turn as text), each turn cut as `turn_kept` says: the tokens after the cut
        dropped."""
        generated = np.asarray(talk.generated[:, first : int(talk.column)])
        tokens = np.asarray(talk.tokens[:, first : int(talk.column)])
        texts, drop = [], np.zeros(np.shape(talk.generated), bool)
        for row in range(len(active)):
            keep, text = self.turn_kept(tokens[row][generated[row]].tolist())
            drop[row, first + np.flatnonzero(generated[row])[keep:]] = True
            texts.append(text if active[row] else "")
        return (talk.dropping(drop) if drop.any() else talk), texts

"""Search-R1's protocol in miniature, in words: the agent calls a search tool in text and answers in text.

Every episode draws a fresh knowledge base: E people, each with a city, a colour and a friend (another of
them). The environment writes a question, one hop or two:

    <bos> question : what is the city of alice ?
    <bos> question : what is the colour of the friend of alice ?

and the model writes freely, one word a step. `<search> alice </search>` makes the environment append

    <information> alice : city paris , colour red , friend bob </information>

(a query that is not one name gets `<information> no result </information>`), and `<answer> paris </answer>`
ends the episode: reward 1 exactly when the answer is the one right word. Running out of steps, or writing
`<search>` more than `max_searches` times, ends it with 0. Everything the environment writes (the question,
each `<information>` block) is forced: recorded with mask False, outside the loss and the KL. Words outside
tags are allowed and ignored, as an LLM's reasoning is; nothing is constrained: the format has to be learnt,
by a supervised warm start on demonstrations (`expert_action`) and then by reinforcement.

The vocabulary is a word list (`WORDS`, one token per word), and `tokenizer()` is a Hugging Face word-level
tokenizer over it, so episodes read as text and a model trained here saves with its own `tokenizer.json`.
Observation at step t: the token written at step t − 1 (`<bos>` at t = 0). Actions: the vocabulary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

import flax.struct
import jax
import jax.numpy as jnp

from ftw_jax.envs.base import Environment

if TYPE_CHECKING:  # the tokenizer is imported where one is made
    from ftw_jax.lm.tokenizer import Tokenizer

SPECIAL = ("<pad>", "<bos>", "<unk>")
TAGS = ("<search>", "</search>", "<information>", "</information>", "<answer>", "</answer>")
GLUE = ("question", ":", "what", "is", "the", "of", "?", ",", "no", "result", "friend", "city", "colour")
NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar")
CITIES = ("paris", "rome", "oslo", "lima", "cairo", "tokyo", "quito", "delhi", "perth", "dakar", "hanoi", "sofia")
COLOURS = ("red", "blue", "green", "black", "white", "pink", "grey", "brown", "gold", "teal", "cyan", "plum")
WORDS = SPECIAL + TAGS + GLUE + NAMES + CITIES + COLOURS
_ID = {word: index for index, word in enumerate(WORDS)}
PAD, BOS = _ID["<pad>"], _ID["<bos>"]
SEARCH, END_SEARCH, INFORMATION, END_INFORMATION, ANSWER, END_ANSWER = (_ID[tag] for tag in TAGS)
_FIRST_NAME, _FIRST_CITY, _FIRST_COLOUR = _ID[NAMES[0]], _ID[CITIES[0]], _ID[COLOURS[0]]

_FREE, _IN_SEARCH, _IN_ANSWER = range(3)
QUESTION_WORDS = 12  # the longest question, "question : what is the colour of the friend of alice ?"
INFORMATION_WORDS = 12  # "<information> alice : city paris , colour red , friend bob </information>"
# What a model is told in the prompt when the task is written in its own tokens and chat template (`written_in`).
INSTRUCTIONS = (
    "Look people up with <search> name </search>; facts appear in <information> </information>. "
    "Reply <answer> word </answer>."
)


def _ids(text: str) -> list[int]:
    return [_ID[word] for word in text.split()]


@dataclasses.dataclass(frozen=True)
class Lexicon:
    """How the task is written in a model's tokens: each word of `WORDS` as its token ids, and the prompt's
    tokens before and after the question (a chat template's). The task's own word-level vocabulary is
    `Lexicon.words()`: every word one token, the prompt `<bos>` and the question; a model's is
    `Lexicon.of_tokenizer(its tokenizer, its vocabulary size)`, which keeps the tokenizer."""

    pieces: tuple[tuple[int, ...], ...]  # per word of WORDS
    vocab_size: int  # the model's: its actions
    prompt_prefix: tuple[int, ...]
    prompt_suffix: tuple[int, ...] = ()
    tokenizer: Tokenizer | None = dataclasses.field(default=None, compare=False, repr=False)  # None: the task's words

    @classmethod
    def words(cls) -> Lexicon:
        return cls(pieces=tuple((index,) for index in range(len(WORDS))), vocab_size=len(WORDS), prompt_prefix=(BOS,))

    @classmethod
    def of_tokenizer(cls, tokenizer: Tokenizer, vocab_size: int) -> Lexicon:
        """A model's lexicon: its tokenizer spells each word (after a space, as in running text), its chat
        template wraps the instructions and the question as the user's turn; `vocab_size` is the model's
        embedding rows (which may outnumber the tokenizer's tokens)."""
        mark = "QUESTION_GOES_HERE"
        prompt = tokenizer.chat([{"role": "user", "content": f"{INSTRUCTIONS} {mark}"}])
        before, after = prompt.split(mark)
        pieces = tuple(tuple(tokenizer.encode(" " + word)) for word in WORDS)
        spelled = {}
        for word, ids in zip(WORDS[len(SPECIAL) :], pieces[len(SPECIAL) :]):
            if not ids or ids in spelled:
                raise ValueError(
                    f"the model's tokenizer spells {word!r} as {list(ids)}, "
                    + (f"as it spells {spelled[ids]!r}" if ids in spelled else "no tokens")
                    + ": the task needs every word told apart."
                )
            spelled[ids] = word
        return cls(
            pieces=pieces,
            vocab_size=vocab_size,
            prompt_prefix=tuple(tokenizer.encode(before.rstrip(" "))),
            prompt_suffix=tuple(tokenizer.encode(after)),
            tokenizer=tokenizer,
        )

    @property
    def max_pieces(self) -> int:
        return max(map(len, self.pieces))

    def table(self) -> tuple[jax.Array, jax.Array]:
        """(token ids [W, P] padded with −1, lengths [W])."""
        table = [list(ids) + [-1] * (self.max_pieces - len(ids)) for ids in self.pieces]
        return jnp.array(table, jnp.int32), jnp.array([len(ids) for ids in self.pieces], jnp.int32)


class TextSearchState(flax.struct.PyTreeNode):
    friend: jax.Array  # [E] int32: each person's friend (a person index)
    city: jax.Array  # [E] int32: city index
    colour: jax.Array  # [E] int32: colour index
    asked: jax.Array  # [] int32: the person the question names
    two_hop: jax.Array  # [] bool
    answer: jax.Array  # [] int32: the right word (an index of WORDS)
    queue: jax.Array  # [Q] int32: tokens the environment writes next
    queue_length: jax.Array  # [] int32
    phase: jax.Array  # [] int32: free, inside <search>, inside <answer>
    recent: jax.Array  # [2P] int32: the model's last tokens, the newest last (tags and words are read off its end)
    since_open: jax.Array  # [] int32: the model's tokens since the open tag
    searches: jax.Array  # [] int32
    time: jax.Array  # [] int32
    # For the demonstrator only (`expert_action`): right searches so far, whether this episode it guesses and
    # what, and the word it is spelling (a model's word may be several tokens).
    progress: jax.Array  # [] int32
    guess: jax.Array  # [] bool
    guess_word: jax.Array  # [] int32
    expert_word: jax.Array  # [] int32
    expert_offset: jax.Array  # [] int32: its tokens written so far


@dataclasses.dataclass(frozen=True)
class TextSearchTask(Environment):
    """The text search agent's task. `two_hop_fraction`: the share of two-hop questions; `guess_rate`: how
    often a demonstration answers without searching (a guess), so that a model warm-started on them is right
    only part of the time and reinforcement has something to improve. `lexicon`: the tokens the task is written
    in, the task's own words unless a pretrained model's (`written_in`)."""

    has_success = True
    has_expert = True

    num_people: int = 6
    num_values: int = 6
    two_hop_fraction: float = 0.5
    step_limit: int = 64
    max_searches: int = 3
    guess_rate: float = 0.5
    lexicon: Lexicon = dataclasses.field(default=Lexicon.words(), metadata={"not_option": True})

    def __post_init__(self):
        if not isinstance(self.lexicon, Lexicon):
            raise ValueError(
                f"lexicon is a pretrained model's tokens (written_in), not an option; got {self.lexicon!r}."
            )
        if not 2 <= self.num_people <= len(NAMES):
            raise ValueError(f"num_people must be in [2, {len(NAMES)}], got {self.num_people!r}.")
        if not 2 <= self.num_values <= len(CITIES):
            raise ValueError(f"num_values must be in [2, {len(CITIES)}], got {self.num_values!r}.")
        for name in ("two_hop_fraction", "guess_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}.")
        needed = self.two_hop_steps
        if not needed <= self.step_limit <= 4096:
            raise ValueError(
                f"step_limit must be in [{needed}, 4096] (a two-hop episode takes {needed} steps), "
                f"got {self.step_limit!r}."
            )
        if not 2 <= self.max_searches <= 16:
            raise ValueError(f"max_searches must be in [2, 16] (two hops need two), got {self.max_searches!r}.")

    def written_in(self, tokenizer: Tokenizer, vocab_size: int) -> TextSearchTask:
        return dataclasses.replace(self, lexicon=Lexicon.of_tokenizer(tokenizer, vocab_size))

    @property
    def two_hop_steps(self) -> int:
        """The longest demonstration: the two-hop question, two searches with their results, the answer."""
        spelled = lambda text: sum(len(self.lexicon.pieces[_ID[word]]) for word in text.split())  # noqa: E731
        prompt = len(self.lexicon.prompt_prefix) + len(self.lexicon.prompt_suffix) - 1  # the first is observed
        search = spelled("<search> </search> <information> : city , colour , friend </information>")
        longest = lambda words: max(len(self.lexicon.pieces[_ID[word]]) for word in words)  # noqa: E731
        return (
            prompt
            + spelled("question : what is the colour of the friend of ?")
            + longest(NAMES)
            + 2 * (search + 3 * longest(NAMES) + 2 * longest(CITIES + COLOURS))
            + spelled("<answer> </answer>")
            + longest(CITIES + COLOURS)
        )

    @property
    def vocabulary_size(self) -> int:
        return self.lexicon.vocab_size

    @property
    def num_actions(self) -> int:
        return self.lexicon.vocab_size

    @property
    def max_steps(self) -> int:
        return self.step_limit

    def default_params(self) -> tuple[()]:
        return ()

    def tokenizer(self) -> Tokenizer:
        """The task's word-level Hugging Face tokenizer over `WORDS` (`ftw_jax.lm.Tokenizer`; ids = the
        environment's), or the model's own."""
        if self.lexicon.tokenizer is not None:
            return self.lexicon.tokenizer
        import tokenizers

        from ftw_jax.lm.tokenizer import Tokenizer

        backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(_ID, unk_token="<unk>"))
        backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
        backend.add_special_tokens(list(SPECIAL))
        return Tokenizer(
            backend=backend,
            chat_template=None,
            special_tokens={"bos_token": "<bos>", "pad_token": "<pad>"},
            eos_id=None,
            pad_id=PAD,
        )

    def _spell(self, words: jax.Array, count) -> tuple[jax.Array, jax.Array]:
        """The tokens of the first `count` of `words` [n] (indices of WORDS), one after another: [n·P], length."""
        table, lengths = self.lexicon.table()
        pieces = self.lexicon.max_pieces
        size = words.shape[0] * pieces
        word_lengths = jnp.where(jnp.arange(words.shape[0]) < count, lengths[words], 0)
        starts = jnp.cumsum(word_lengths) - word_lengths
        positions = starts[:, None] + jnp.arange(pieces)[None]
        used = jnp.arange(pieces)[None] < word_lengths[:, None]
        tokens = jnp.zeros(size, jnp.int32).at[jnp.where(used, positions, size)].set(table[words], mode="drop")
        return tokens, jnp.sum(word_lengths)

    @property
    def queue_size(self) -> int:
        """Q: the longest stretch the environment writes at once (the prompt, or an <information> block)."""
        prompt = (
            len(self.lexicon.prompt_prefix) + len(self.lexicon.prompt_suffix) + QUESTION_WORDS * self.lexicon.max_pieces
        )
        return max(prompt, INFORMATION_WORDS * self.lexicon.max_pieces)

    def _fit(self, tokens: jax.Array) -> jax.Array:
        return jnp.zeros(self.queue_size, jnp.int32).at[: tokens.shape[0]].set(tokens)

    def _prompt(self, asked, attribute, two_hop):
        """The prompt's tokens after the first (which is observed at reset): [Q], length."""
        one = _ids("question : what is the city of alice ?") + [PAD] * 3
        two = _ids("question : what is the city of the friend of alice ?")
        words = jnp.where(two_hop, jnp.array(two), jnp.array(one))
        count = jnp.where(two_hop, 12, 9)
        words = (
            words.at[5]
            .set(jnp.where(attribute == 0, _ID["city"], _ID["colour"]))
            .at[count - 2]
            .set(_FIRST_NAME + asked)
        )
        question, question_length = self._spell(words, count)
        prefix = jnp.array(self.lexicon.prompt_prefix[1:], jnp.int32)
        suffix = jnp.array(self.lexicon.prompt_suffix, jnp.int32)
        tokens = jnp.zeros(prefix.shape[0] + question.shape[0] + suffix.shape[0], jnp.int32)
        tokens = jax.lax.dynamic_update_slice(tokens.at[: prefix.shape[0]].set(prefix), question, (prefix.shape[0],))
        tokens = jax.lax.dynamic_update_slice(tokens, suffix, (prefix.shape[0] + question_length,))
        return self._fit(tokens), prefix.shape[0] + question_length + suffix.shape[0]

    def _information(self, state: TextSearchState, person, found):
        """The <information> block for `person` if `found`, else "no result": [Q], length."""
        person = jnp.clip(person, 0, self.num_people - 1)
        block = jnp.array(_ids("<information> alice : city paris , colour red , friend bob </information>"), jnp.int32)
        block = block.at[1].set(_FIRST_NAME + person).at[4].set(_FIRST_CITY + state.city[person])
        block = block.at[7].set(_FIRST_COLOUR + state.colour[person]).at[10].set(_FIRST_NAME + state.friend[person])
        nothing = jnp.array(_ids("<information> no result </information>") + [PAD] * 8, jnp.int32)
        tokens, length = self._spell(jnp.where(found, block, nothing), jnp.where(found, 12, 4))
        return self._fit(tokens), length

    def reset(self, key: jax.Array, params: tuple[()]) -> tuple[jax.Array, TextSearchState]:
        keys = jax.random.split(key, 8)
        people, values = self.num_people, self.num_values
        friend = jax.random.randint(keys[0], (people,), 0, people - 1)
        friend = jnp.where(friend >= jnp.arange(people), friend + 1, friend).astype(jnp.int32)  # never oneself
        city = jax.random.randint(keys[1], (people,), 0, values).astype(jnp.int32)
        colour = jax.random.randint(keys[2], (people,), 0, values).astype(jnp.int32)
        asked = jax.random.randint(keys[3], (), 0, people).astype(jnp.int32)
        attribute = jax.random.randint(keys[4], (), 0, 2)
        two_hop = jax.random.uniform(keys[5]) < self.two_hop_fraction
        target = jnp.where(two_hop, friend[asked], asked)
        answer = jnp.where(attribute == 0, _FIRST_CITY + city[target], _FIRST_COLOUR + colour[target])
        guess_value = jax.random.randint(keys[6], (), 0, values)
        guess_word = jnp.where(attribute == 0, _FIRST_CITY, _FIRST_COLOUR) + guess_value
        queue, length = self._prompt(asked, attribute, two_hop)
        zero = jnp.zeros((), jnp.int32)
        state = TextSearchState(
            friend=friend,
            city=city,
            colour=colour,
            asked=asked,
            two_hop=two_hop,
            answer=answer.astype(jnp.int32),
            queue=queue,
            queue_length=length.astype(jnp.int32),
            phase=zero,
            recent=jnp.full(2 * self.lexicon.max_pieces, -1, jnp.int32),
            since_open=zero,
            searches=zero,
            time=zero,
            progress=zero,
            guess=jax.random.uniform(keys[7]) < self.guess_rate,
            guess_word=guess_word.astype(jnp.int32),
            expert_word=zero,
            expert_offset=zero,
        )
        return jnp.int32(self.lexicon.prompt_prefix[0]), state

    def forced_action(self, state: TextSearchState, params: tuple[()]) -> tuple[jax.Array, jax.Array]:
        return state.queue_length > 0, state.queue[0]

    def _ends_with(self, recent: jax.Array, word, before: int | jax.Array = 0) -> jax.Array:
        """[...] bool: whether the model's tokens end with `word`'s (an index of WORDS, or [...] of them), followed
        by `before` more tokens."""
        table, lengths = self.lexicon.table()
        pieces = self.lexicon.max_pieces
        word = jnp.asarray(word)
        length = lengths[word]
        start = recent.shape[0] - before - length  # where the word's tokens begin in `recent`
        index = jnp.clip(start[..., None] + jnp.arange(pieces), 0, recent.shape[0] - 1)
        same = (recent[index] == table[word]) | (jnp.arange(pieces) >= length[..., None])
        return jnp.all(same, axis=-1) & (start >= 0)

    def step(
        self, key: jax.Array, state: TextSearchState, action: jax.Array, params: tuple[()]
    ) -> tuple[jax.Array, TextSearchState, jax.Array, jax.Array, dict[str, jax.Array]]:
        del key, params
        forced, forced_token = self.forced_action(state, ())
        token = jnp.where(forced, forced_token, action).astype(jnp.int32)
        recent = jnp.where(forced, state.recent, jnp.concatenate([state.recent[1:], token[None]]))
        free, in_search, in_answer = (~forced & (state.phase == phase) for phase in (_FREE, _IN_SEARCH, _IN_ANSWER))
        _, lengths = self.lexicon.table()
        since_open = state.since_open + 1  # counting this token
        # A closing tag's tokens after the opening tag's, with `content` tokens between them.
        closes_search = in_search & self._ends_with(recent, END_SEARCH) & (since_open >= lengths[END_SEARCH])
        closes_answer = in_answer & self._ends_with(recent, END_ANSWER) & (since_open >= lengths[END_ANSWER])
        content = since_open - jnp.where(in_search, lengths[END_SEARCH], lengths[END_ANSWER])
        people = _FIRST_NAME + jnp.arange(self.num_people)
        named = (content == lengths[people]) & self._ends_with(recent, people, before=lengths[END_SEARCH])
        found, person = jnp.any(named), jnp.argmax(named)
        opens_search = free & self._ends_with(recent, SEARCH)
        opens_answer = free & self._ends_with(recent, ANSWER)
        information, information_length = self._information(state, person, found)
        popped = jnp.concatenate([state.queue[1:], jnp.zeros((1,), jnp.int32)])
        queue = jnp.where(forced, popped, jnp.where(closes_search, information, state.queue))
        queue_length = jnp.where(
            forced, state.queue_length - 1, jnp.where(closes_search, information_length, state.queue_length)
        )
        phase = jnp.where(
            opens_search, _IN_SEARCH, jnp.where(opens_answer, _IN_ANSWER, jnp.where(closes_search, _FREE, state.phase))
        )
        target = jnp.where(state.progress == 0, state.asked, state.friend[state.asked])
        right_search = closes_search & found & (person == target)
        searches = state.searches + opens_search
        solved = (
            closes_answer
            & (content == lengths[state.answer])
            & self._ends_with(recent, state.answer, before=lengths[END_ANSWER])
        )
        time = state.time + 1
        done = closes_answer | (searches > self.max_searches) | (time >= self.step_limit)
        # The demonstrator's word in progress (see `expert_action`): a new one starts after the last is spelled.
        word = jnp.where(state.expert_offset == 0, self._expert_word(state), state.expert_word)
        offset = jnp.where(state.expert_offset + 1 >= lengths[word], 0, state.expert_offset + 1)
        new_state = state.replace(
            queue=queue,
            queue_length=queue_length.astype(jnp.int32),
            phase=phase.astype(jnp.int32),
            recent=recent,
            since_open=jnp.where(
                forced, state.since_open, jnp.where(opens_search | opens_answer, 0, since_open)
            ).astype(jnp.int32),
            searches=searches.astype(jnp.int32),
            time=time,
            progress=state.progress + right_search.astype(jnp.int32),
            expert_word=jnp.where(forced, state.expert_word, word).astype(jnp.int32),
            expert_offset=jnp.where(forced, state.expert_offset, offset).astype(jnp.int32),
        )
        return token, new_state, solved.astype(jnp.float32), done, {"solved": solved}

    def _expert_word(self, state: TextSearchState) -> jax.Array:
        """The demonstrator's next word: search the person the question names (and then their friend, for two
        hops), then answer; or, in the episodes it guesses, answer at once with a random value of the right kind."""
        needed = 1 + state.two_hop.astype(jnp.int32)
        target = jnp.where(state.progress == 0, state.asked, state.friend[state.asked])
        free = jnp.where(state.guess | (state.progress >= needed), ANSWER, SEARCH)
        in_search = jnp.where(state.since_open == 0, _FIRST_NAME + target, END_SEARCH)
        answer_word = jnp.where(state.guess, state.guess_word, state.answer)
        in_answer = jnp.where(state.since_open == 0, answer_word, END_ANSWER)
        return jnp.stack([free, in_search, in_answer])[state.phase].astype(jnp.int32)

    def expert_action(self, state: TextSearchState) -> jax.Array:
        """The demonstrator's next token at a step the model writes: the next of its word's tokens."""
        word = jnp.where(state.expert_offset == 0, self._expert_word(state), state.expert_word)
        table, _ = self.lexicon.table()
        return table[word, state.expert_offset]


def text(tokens: Iterable[int] | jax.Array) -> str:
    """The words of token ids (padding left out)."""
    return " ".join(WORDS[int(token)] for token in tokens if int(token) != PAD)

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

import flax.struct
import jax
import jax.numpy as jnp

from ftw_jax.envs.base import Environment

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
ATTRIBUTES = ("city", "colour")

_FREE, _IN_SEARCH, _IN_ANSWER = range(3)
_QUEUE = 12  # the longest forced stretch: a two-hop question, or an <information> block


def _ids(text: str) -> list[int]:
    return [_ID[word] for word in text.split()]


def _padded(ids: list[int]) -> jax.Array:
    return jnp.array(ids + [PAD] * (_QUEUE - len(ids)), jnp.int32)


@flax.struct.dataclass
class TextSearchState:
    friend: jax.Array  # [E] int32: each person's friend (a person index)
    city: jax.Array  # [E] int32: city index
    colour: jax.Array  # [E] int32: colour index
    asked: jax.Array  # [] int32: the person the question names
    two_hop: jax.Array  # [] bool
    answer: jax.Array  # [] int32: the right word's token
    queue: jax.Array  # [_QUEUE] int32: words the environment writes next
    queue_length: jax.Array  # [] int32
    phase: jax.Array  # [] int32: free, inside <search>, inside <answer>
    first_word: jax.Array  # [] int32: the first word inside the open tag
    words: jax.Array  # [] int32: words written inside the open tag
    searches: jax.Array  # [] int32
    time: jax.Array  # [] int32
    # For the demonstrator only (`expert_action`): right searches so far, and whether this episode it guesses.
    progress: jax.Array  # [] int32
    guess: jax.Array  # [] bool
    guess_word: jax.Array  # [] int32


@dataclasses.dataclass(frozen=True)
class TextSearchTask(Environment):
    """The text search agent's task. `two_hop_fraction`: the share of two-hop questions; `guess_rate`: how
    often a demonstration answers without searching (a guess), so that a model warm-started on them is right
    only part of the time and reinforcement has something to improve."""

    has_success = True
    has_expert = True

    num_people: int = 6
    num_values: int = 6
    two_hop_fraction: float = 0.5
    step_limit: int = 64
    max_searches: int = 3
    guess_rate: float = 0.5

    def __post_init__(self):
        if not 2 <= self.num_people <= len(NAMES):
            raise ValueError(f"num_people must be in [2, {len(NAMES)}], got {self.num_people!r}.")
        if not 2 <= self.num_values <= len(CITIES):
            raise ValueError(f"num_values must be in [2, {len(CITIES)}], got {self.num_values!r}.")
        for name in ("two_hop_fraction", "guess_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}.")
        needed = 12 + 2 * (3 + _QUEUE) + 3  # the two-hop question, two searches with their answers, the answer
        if not needed <= self.step_limit <= 512:
            raise ValueError(f"step_limit must be in [{needed}, 512] (a two-hop episode takes {needed} steps), "
                             f"got {self.step_limit!r}.")
        if not 2 <= self.max_searches <= 16:
            raise ValueError(f"max_searches must be in [2, 16] (two hops need two), got {self.max_searches!r}.")

    @property
    def vocabulary_size(self) -> int:
        return len(WORDS)

    @property
    def num_actions(self) -> int:
        return len(WORDS)

    @property
    def max_steps(self) -> int:
        return self.step_limit

    def default_params(self):
        return ()

    def tokenizer(self):
        """A Hugging Face word-level tokenizer over `WORDS` (`ftw_jax.lm.Tokenizer`; ids = the environment's)."""
        import tokenizers

        backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(_ID, unk_token="<unk>"))
        backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
        backend.add_special_tokens(list(SPECIAL))

        from ftw_jax.lm.tokenizer import Tokenizer

        return Tokenizer(backend=backend, chat_template=None, special_tokens={"bos_token": "<bos>", "pad_token": "<pad>"},
                         eos_id=None, pad_id=PAD)

    def _question(self, asked, attribute, two_hop):
        """[_QUEUE] int32 tokens of the question (the tail padded), and their number."""
        one, two = (_padded(_ids(text)) for text in ("question : what is the city of", "question : what is the city of "
                                                                                    "the friend of"))
        tokens = jnp.where(two_hop, two, one)
        attribute_word = jnp.where(attribute == 0, _ID["city"], _ID["colour"])
        length = jnp.where(two_hop, 12, 9)
        tokens = tokens.at[5].set(attribute_word).at[length - 3 + 1].set(_FIRST_NAME + asked)
        return tokens.at[length - 1].set(_ID["?"]), length

    def _information(self, state: TextSearchState, query, words):
        """The <information> block for a query of `words` words whose first is `query`: [_QUEUE], length."""
        person = query - _FIRST_NAME
        found = (words == 1) & (person >= 0) & (person < self.num_people)
        person = jnp.clip(person, 0, self.num_people - 1)
        block = jnp.array(_ids("<information> alice : city paris , colour red , friend bob </information>"), jnp.int32)
        block = block.at[1].set(_FIRST_NAME + person).at[4].set(_FIRST_CITY + state.city[person])
        block = block.at[7].set(_FIRST_COLOUR + state.colour[person]).at[10].set(_FIRST_NAME + state.friend[person])
        nothing = _padded(_ids("<information> no result </information>"))
        return jnp.where(found, block, nothing), jnp.where(found, 12, 4)

    def reset(self, key, params):
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
        queue, length = self._question(asked, attribute, two_hop)
        zero = jnp.zeros((), jnp.int32)
        state = TextSearchState(
            friend=friend, city=city, colour=colour, asked=asked, two_hop=two_hop, answer=answer.astype(jnp.int32),
            queue=queue, queue_length=length.astype(jnp.int32), phase=zero, first_word=zero, words=zero,
            searches=zero, time=zero, progress=zero, guess=jax.random.uniform(keys[7]) < self.guess_rate,
            guess_word=guess_word.astype(jnp.int32))
        return jnp.int32(BOS), state

    def forced_action(self, state, params):
        return state.queue_length > 0, state.queue[0]

    def step(self, key, state, action, params):
        del key, params
        forced, forced_token = self.forced_action(state, ())
        token = jnp.where(forced, forced_token, action).astype(jnp.int32)
        free, in_search, in_answer = (~forced & (state.phase == phase) for phase in (_FREE, _IN_SEARCH, _IN_ANSWER))
        opens = free & ((token == SEARCH) | (token == ANSWER))
        closes_search = in_search & (token == END_SEARCH)
        closes_answer = in_answer & (token == END_ANSWER)
        inside = (in_search & ~closes_search) | (in_answer & ~closes_answer)  # a word inside an open tag
        first_word = jnp.where(inside & (state.words == 0), token, state.first_word)
        words = jnp.where(opens, 0, state.words + inside)
        information, information_length = self._information(state, state.first_word, state.words)
        popped = jnp.concatenate([state.queue[1:], jnp.zeros((1,), jnp.int32)])
        queue = jnp.where(forced, popped, jnp.where(closes_search, information, state.queue))
        queue_length = jnp.where(forced, state.queue_length - 1,
                                 jnp.where(closes_search, information_length, state.queue_length))
        phase = jnp.where(free & (token == SEARCH), _IN_SEARCH,
                          jnp.where(free & (token == ANSWER), _IN_ANSWER,
                                    jnp.where(closes_search, _FREE, state.phase)))
        target = jnp.where(state.progress == 0, state.asked, state.friend[state.asked])
        right_search = closes_search & (state.words == 1) & (state.first_word == _FIRST_NAME + target)
        searches = state.searches + (free & (token == SEARCH))
        solved = closes_answer & (state.words == 1) & (state.first_word == state.answer)
        time = state.time + 1
        done = closes_answer | (searches > self.max_searches) | (time >= self.step_limit)
        new_state = state.replace(queue=queue, queue_length=queue_length.astype(jnp.int32),
                                  phase=phase.astype(jnp.int32), first_word=first_word, words=words.astype(jnp.int32),
                                  searches=searches.astype(jnp.int32), time=time,
                                  progress=state.progress + right_search.astype(jnp.int32))
        return token, new_state, solved.astype(jnp.float32), done, {"solved": solved}

    def expert_action(self, state: TextSearchState) -> jax.Array:
        """The demonstrator's next word at a step the model writes: search the person the question names (and
        then their friend, for two hops), then answer; or, in the episodes it guesses, answer at once with a
        random value of the right kind."""
        needed = 1 + state.two_hop.astype(jnp.int32)
        target = jnp.where(state.progress == 0, state.asked, state.friend[state.asked])
        answer_now = state.guess | (state.progress >= needed)
        free = jnp.where(answer_now, ANSWER, SEARCH)
        in_search = jnp.where(state.words == 0, _FIRST_NAME + target, END_SEARCH)
        answer_word = jnp.where(state.guess, state.guess_word, state.answer)
        in_answer = jnp.where(state.words == 0, answer_word, END_ANSWER)
        return jnp.stack([free, in_search, in_answer])[state.phase].astype(jnp.int32)


def text(tokens) -> str:
    """The words of token ids (padding left out)."""
    return " ".join(WORDS[int(token)] for token in tokens if int(token) != PAD)

"""A Search-R1 analog in tokens: answer a question about a hidden knowledge base by calling a search tool.

Every episode draws a fresh knowledge base over E entities: each entity has a value (one of V value tokens)
and a link to another entity. The environment writes the question into the token stream, then the policy
emits one token per step:

    BOS  Q1 e  SEARCH e  RESULT link(e) value(e)  ANSWER v          (one hop: v should be value(e))
    BOS  Q2 e  SEARCH e  RESULT e' ...  SEARCH e'  RESULT ... v'  ANSWER v   (two hops: v = value(link(e)))

Tokens the environment writes (the question and every RESULT triple) are forced: the rollout records them
with mask False, so they never enter the loss or the KL. `ANSWER x` ends the episode with reward 1 if x is
the right value, else 0; so does running out of steps or of searches (`max_searches`). A search for a token
that is not an entity returns RESULT NONE NONE. Without searching, the policy is right by chance (1/V), so
early rewards are mostly tied zeros.

Observation at step t: the token written at step t − 1 (BOS at t = 0), with the tokens legal at step t
(`WithLegalActions`); a policy over histories (the transformer) sees them all. Actions: the vocabulary.
With `grammar=True` (default) the legal tokens are those of a well-formed call, as in constrained decoding
of a tool-call format for an LLM agent: SEARCH or ANSWER when free, an entity after SEARCH, a value after
ANSWER (a policy given `WithLegalActions`, like `TransformerPolicy`, writes nothing else; any other token is
still handled: a no-op when free, RESULT NONE NONE as a query, a wrong answer). The grammar does not find the
answer — a random well-formed policy is still right ~1/V of the time — but without it a random policy
rarely writes SEARCH and then the asked entity, and FTW never finds out that searching pays (measured in
docs/results.md). `grammar=False` makes every token legal at every step.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from ftw_jax.core.actions import WithLegalActions
from ftw_jax.envs.base import Environment

NONE, BOS, QUESTION_ONE_HOP, QUESTION_TWO_HOP, SEARCH, ANSWER, RESULT = range(7)
FIRST_ENTITY = 7
_QUEUE = 3  # longest forced stretch: RESULT link value

_FREE, _AFTER_SEARCH, _AFTER_ANSWER = range(3)
# Bounds that keep a task one a small transformer learns on a CPU; beyond them it would only hang or run out
# of memory (the vocabulary and the history grow with them).
MAX_ITEMS, MAX_STEPS = 256, 256


class SearchState(flax.struct.PyTreeNode):
    link: jax.Array  # [E] int32 entity index each entity links to
    value: jax.Array  # [E] int32 value index of each entity
    answer: jax.Array  # [] int32 the value token that is right
    queue: jax.Array  # [3] int32 tokens the environment will write next
    queue_length: jax.Array  # [] int32
    phase: jax.Array  # [] int32: free, after SEARCH, after ANSWER
    searches: jax.Array  # [] int32
    time: jax.Array  # [] int32


@dataclasses.dataclass(frozen=True)
class SearchTask(Environment):
    has_success = True

    num_entities: int = 4
    num_values: int = 8
    hops: int = 1
    step_limit: int = 16
    max_searches: int = 3
    grammar: bool = True

    def __post_init__(self):
        if self.hops not in (1, 2):
            raise ValueError(f"hops must be 1 or 2, got {self.hops!r}.")
        if not (2 <= self.num_entities <= MAX_ITEMS and 2 <= self.num_values <= MAX_ITEMS):
            raise ValueError(
                f"num_entities and num_values must be in [2, {MAX_ITEMS}], got {self.num_entities}, {self.num_values}."
            )
        if self.step_limit > MAX_STEPS:
            raise ValueError(
                f"step_limit must be <= {MAX_STEPS} (the policy reads the whole history), got {self.step_limit}."
            )
        needed = 2 + 5 * self.hops + 2  # question, (SEARCH e RESULT x y) per hop, ANSWER v
        if self.step_limit < needed:
            raise ValueError(f"step_limit must be >= {needed} for {self.hops} hop(s), got {self.step_limit}.")
        if self.max_searches < self.hops:
            raise ValueError(f"max_searches must be >= hops ({self.hops}), got {self.max_searches}.")

    @property
    def vocabulary_size(self) -> int:
        return FIRST_ENTITY + self.num_entities + self.num_values

    @property
    def num_actions(self) -> int:
        return self.vocabulary_size

    @property
    def max_steps(self) -> int:
        return self.step_limit

    def entity_token(self, index: int | jax.Array) -> int | jax.Array:
        return FIRST_ENTITY + index

    def value_token(self, index: int | jax.Array) -> int | jax.Array:
        return FIRST_ENTITY + self.num_entities + index

    def default_params(self) -> tuple[()]:
        return ()

    def legal_actions(self, state: SearchState) -> jax.Array:
        """[A] bool: the tokens the environment accepts at the next step (all of them without the grammar)."""
        if not self.grammar:
            return jnp.ones((self.num_actions,), bool)
        token = jnp.arange(self.num_actions)
        entity = (token >= FIRST_ENTITY) & (token < FIRST_ENTITY + self.num_entities)
        by_phase = jnp.stack([(token == SEARCH) | (token == ANSWER), entity, token >= FIRST_ENTITY + self.num_entities])
        # Forced steps (the environment writing) never enter the loss; leave them unconstrained.
        return by_phase[state.phase] | (state.queue_length > 0)

    def observe(self, token: int | jax.Array, state: SearchState) -> WithLegalActions:
        return WithLegalActions(observation=jnp.asarray(token, jnp.int32), legal=self.legal_actions(state))

    def reset(self, key: jax.Array, params: tuple[()]) -> tuple[WithLegalActions, SearchState]:
        link_key, value_key, question_key = jax.random.split(key, 3)
        entities, values = self.num_entities, self.num_values
        link = jax.random.randint(link_key, (entities,), 0, entities - 1)
        link = jnp.where(link >= jnp.arange(entities), link + 1, link)  # never itself
        value = jax.random.randint(value_key, (entities,), 0, values)
        asked = jax.random.randint(question_key, (), 0, entities)
        answer_entity = asked if self.hops == 1 else link[asked]
        marker = QUESTION_ONE_HOP if self.hops == 1 else QUESTION_TWO_HOP
        state = SearchState(
            link=link.astype(jnp.int32),
            value=value.astype(jnp.int32),
            answer=jnp.int32(self.value_token(value[answer_entity])),
            queue=jnp.array([marker, 0, 0], jnp.int32).at[1].set(self.entity_token(asked)),
            queue_length=jnp.int32(2),
            phase=jnp.int32(_FREE),
            searches=jnp.int32(0),
            time=jnp.int32(0),
        )
        return self.observe(BOS, state), state

    def forced_action(self, state: SearchState, params: tuple[()]) -> tuple[jax.Array, jax.Array]:
        return state.queue_length > 0, state.queue[0]

    def step(
        self, key: jax.Array, state: SearchState, action: jax.Array, params: tuple[()]
    ) -> tuple[WithLegalActions, SearchState, jax.Array, jax.Array, dict[str, jax.Array]]:
        del key, params
        forced, forced_token = self.forced_action(state, ())
        token = jnp.where(forced, forced_token, action).astype(jnp.int32)
        entity = token - FIRST_ENTITY
        is_entity = (entity >= 0) & (entity < self.num_entities)
        safe_entity = jnp.clip(entity, 0, self.num_entities - 1)
        result = jnp.where(
            is_entity,
            jnp.stack(
                [
                    jnp.int32(RESULT),
                    self.entity_token(state.link[safe_entity]),
                    self.value_token(state.value[safe_entity]),
                ]
            ),
            jnp.array([RESULT, NONE, NONE], jnp.int32),
        )
        free = ~forced & (state.phase == _FREE)
        searching = free & (token == SEARCH)
        answering = ~forced & (state.phase == _AFTER_ANSWER)
        looked_up = ~forced & (state.phase == _AFTER_SEARCH)
        popped_queue = jnp.concatenate([state.queue[1:], jnp.zeros((1,), jnp.int32)])
        queue = jnp.where(forced, popped_queue, jnp.where(looked_up, result, state.queue))
        queue_length = jnp.where(forced, state.queue_length - 1, jnp.where(looked_up, _QUEUE, state.queue_length))
        phase = jnp.where(
            searching,
            _AFTER_SEARCH,
            jnp.where(free & (token == ANSWER), _AFTER_ANSWER, jnp.where(looked_up, _FREE, state.phase)),
        )
        searches = state.searches + searching
        solved = answering & (token == state.answer)
        time = state.time + 1
        done = answering | (searches > self.max_searches) | (time >= self.step_limit)
        new_state = state.replace(
            queue=queue, queue_length=queue_length, phase=phase.astype(jnp.int32), searches=searches, time=time
        )
        return self.observe(token, new_state), new_state, solved.astype(jnp.float32), done, {"solved": solved}

"""A conversation the model and a tool take turns in, on one KV cache: blocks of the tool's tokens appended, turns
generated after them, batched over conversations, with static shapes (each program compiles once).

    turns = make_turn_sampler(model, SamplingConfig(max_new_tokens=500, stop_sequences=(end_search,)), slots=4096)
    talk = turns.start(params, prompts, prompt_mask)         # the prompts' block, left-padded [B, P]
    talk = turns.generate(params, key, talk, active)         # one turn, for rows active [B]; the key is consumed
    talk = turns.append(params, talk, block, block_mask)     # the tool's reply, left-padded [B, W]
    talk.sample                                              # a `Sample` [B, slots]: tokens, generated, log-probs

Every block and turn takes the same columns in every row, so one column index writes the cache. A row's block
is left-padded (its padding, and a turn's columns after the row stopped, are holes: attention_mask False, never
attended to), and positions count a row's real tokens only: the model reads each row as its real tokens in
order, what the learner reads once the holes are dropped (`ftw_jax.agent.episodes.sample_records`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax.lm.model import CausalLM, init_cache
from ftw_jax.lm.sampler import Sample, SamplingConfig, _check_prompts, _decode_step, recent_tokens


class Conversation(flax.struct.PyTreeNode):  # frozen
    """B conversations in `slots` columns, the first `column` used."""

    tokens: jax.Array  # [B, S] int32
    attention_mask: jax.Array  # [B, S] bool: real tokens (blocks' and turns'), False in holes and unused columns
    generated: jax.Array  # [B, S] bool: the tokens the model wrote
    logp: jax.Array  # [B, S] float32: log-prob under the distribution sampled from; 0 elsewhere
    model_logp: jax.Array  # [B, S] float32: log-prob under the plain model; 0 elsewhere
    cache: tuple[jax.Array, jax.Array]
    logits: jax.Array  # [B, V] float32: each row's next-token logits, after its last real token
    column: jax.Array  # int32: the first unused column
    next_position: jax.Array  # [B] int32: each row's real tokens so far (the position of its next one)

    def dropping(self, drop: Any) -> Conversation:
        """The conversations with the tokens at `drop` [B, S] made holes, as if never written: the last ones a row
        wrote (a tool cut its turn short). Its logits are then stale: the next block it gets recomputes them."""
        keep = ~jnp.asarray(drop, bool)
        mask = self.attention_mask & keep
        return self.replace(
            attention_mask=mask,
            generated=self.generated & keep,
            logp=jnp.where(keep, self.logp, 0.0),
            model_logp=jnp.where(keep, self.model_logp, 0.0),
            next_position=mask.sum(axis=1).astype(jnp.int32),
        )

    @property
    def sample(self) -> Sample:
        return Sample(
            tokens=self.tokens,
            generated=self.generated,
            logp=self.logp,
            model_logp=self.model_logp,
            attention_mask=self.attention_mask,
        )


@dataclasses.dataclass(frozen=True)
class TurnSampler:
    """The three steps of a conversation (see the module's docstring); `slots` columns in all."""

    config: SamplingConfig
    slots: int
    _start: Callable[..., Conversation]
    _append: Callable[..., Conversation]
    _generate: Callable[..., Conversation]

    def start(self, params: Any, prompts: Any, prompt_mask: Any) -> Conversation:
        """Conversations that begin with these prompts (int [B, P], left-padded: bool [B, P])."""
        _check_prompts(prompts, prompt_mask)
        self._check_room(0, np.shape(prompts)[1], "the prompts")
        return self._start(params, jnp.asarray(prompts, jnp.int32), jnp.asarray(prompt_mask, bool))

    def append(self, params: Any, conversation: Conversation, block: Any, block_mask: Any) -> Conversation:
        """The conversations with a block of tokens written for them (not by the model): int [B, W], each row's
        real tokens at its end (bool [B, W]; a row may have none)."""
        if np.ndim(block) != 2 or np.shape(block_mask) != np.shape(block):
            raise ValueError(
                f"block and block_mask must both be [batch, width], got {np.shape(block)}, {np.shape(block_mask)}."
            )
        self._check_room(int(conversation.column), np.shape(block)[1], "the block")
        return self._append(params, conversation, jnp.asarray(block, jnp.int32), jnp.asarray(block_mask, bool))

    def generate(self, params: Any, key: jax.Array, conversation: Conversation, active: Any) -> Conversation:
        """The conversations after one turn of the model: each active row writes until a stop token or sequence,
        or `max_new_tokens`; the others write nothing."""
        self._check_room(int(conversation.column), self.config.max_new_tokens, "a turn of `max_new_tokens`")
        return self._generate(params, key, conversation, jnp.asarray(active, bool))

    def _check_room(self, column: int, width: int, what: str) -> None:
        if column + width > self.slots:
            raise ValueError(
                f"{what} ({width} columns) would not fit: {column} of the conversation's {self.slots} slots are used."
            )


def make_turn_sampler(model: CausalLM, config: SamplingConfig, slots: int) -> TurnSampler:
    """A `TurnSampler` over `slots` columns (the longest conversation, holes included)."""
    config.check(model.config.vocab_size)
    if not (isinstance(slots, int) and slots > config.max_new_tokens):
        raise ValueError(f"slots must be an int above max_new_tokens ({config.max_new_tokens}), got {slots!r}.")
    start = jax.jit(functools.partial(_start, model, config, slots))
    append = jax.jit(functools.partial(_append, model))
    generate = jax.jit(functools.partial(_generate, model, config, slots))
    return TurnSampler(config, slots, start, append, generate)


def _append(model: CausalLM, params: Any, talk: Conversation, block: jax.Array, block_mask: jax.Array) -> Conversation:
    """`TurnSampler.append`: the block's tokens written at the next columns, through the model into the cache."""
    width = block.shape[1]
    write = lambda table, values: jax.lax.dynamic_update_slice(table, values, (0, talk.column))  # noqa: E731
    mask = write(talk.attention_mask, block_mask)
    positions = talk.next_position[:, None] + jnp.maximum(jnp.cumsum(block_mask, axis=1) - 1, 0)
    logits, cache = model.apply(params, block, positions, mask, cache=talk.cache, cache_index=talk.column)
    wrote = block_mask.any(axis=1)
    return talk.replace(
        tokens=write(talk.tokens, block),
        attention_mask=mask,
        cache=cache,
        logits=jnp.where(wrote[:, None], logits[:, -1], talk.logits),
        column=talk.column + width,
        next_position=talk.next_position + block_mask.sum(axis=1).astype(jnp.int32),
    )


def _start(
    model: CausalLM, config: SamplingConfig, slots: int, params: Any, prompts: jax.Array, prompt_mask: jax.Array
) -> Conversation:
    """`TurnSampler.start`: empty conversations of `slots` columns, the prompts appended."""
    batch = prompts.shape[0]
    empty = Conversation(
        tokens=jnp.full((batch, slots), config.pad_token, jnp.int32),
        attention_mask=jnp.zeros((batch, slots), bool),
        generated=jnp.zeros((batch, slots), bool),
        logp=jnp.zeros((batch, slots)),
        model_logp=jnp.zeros((batch, slots)),
        cache=init_cache(model.config, batch, slots),
        logits=jnp.zeros((batch, model.config.vocab_size)),
        column=jnp.int32(0),
        next_position=jnp.zeros(batch, jnp.int32),
    )
    return _append(model, params, empty, prompts, prompt_mask)


def _generate(
    model: CausalLM,
    config: SamplingConfig,
    slots: int,
    params: Any,
    key: jax.Array,
    talk: Conversation,
    active: jax.Array,
) -> Conversation:
    """`TurnSampler.generate`: the sampler's decoding loop (`lm.sampler`), from the conversation's next column."""
    batch = active.shape[0]
    # the keys this turn may read: the real tokens so far, and the turn's own (later columns by causality)
    key_mask = talk.attention_mask | (jnp.arange(slots) >= talk.column)[None]
    step = functools.partial(_decode_step, model, config, params, key_mask, talk.next_position, talk.column)

    def body(state):  # a row that is done keeps the logits after its last real token
        after = step(state)
        return dict(after, logits=jnp.where(state["done"][:, None], state["logits"], after["logits"]))

    state = dict(
        step=jnp.int32(0),
        key=key,
        cache=talk.cache,
        logits=talk.logits,
        tokens=talk.tokens,
        generated=jnp.zeros((batch, slots), bool),
        logp=talk.logp,
        model_logp=talk.model_logp,
        done=~active,
        **recent_tokens(config, batch),
    )
    state = jax.lax.while_loop(lambda s: (s["step"] < config.max_new_tokens) & ~jnp.all(s["done"]), body, state)
    return talk.replace(
        tokens=state["tokens"],
        attention_mask=talk.attention_mask | state["generated"],
        generated=talk.generated | state["generated"],
        logp=state["logp"],
        model_logp=state["model_logp"],
        cache=state["cache"],
        logits=state["logits"],
        column=talk.column + state["step"],
        next_position=talk.next_position + state["generated"].sum(axis=1).astype(jnp.int32),
    )

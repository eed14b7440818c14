"""Continuing a left-padded batch of prompts: one jitted `lax.while_loop` over a preallocated KV cache.

    sample = make_sampler(model, SamplingConfig(max_new_tokens=64, temperature=0.7, top_p=0.9,
                                                stop_tokens=(eos,), pad_token=pad))
    out = sample(params, key, prompts, prompt_mask)        # int [B, P], bool [B, P]; the key is consumed
    out.tokens, out.generated, out.logp, out.model_logp    # [B, P + M] each

Each generated token comes with two log-probabilities: `logp` under the distribution it was actually drawn
from (the logits divided by the temperature, cut to the top k and to the top-p nucleus, renormalised; 0 for
greedy decoding, a point mass) and `model_logp` under the plain model (temperature 1, nothing cut). An
importance ratio π_new/π_behaviour may use `model_logp` as the behaviour's only when sampling is plain.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.core
import jax.numpy as jnp
import numpy as np

from ftw_jax.lm.model import CausalLM, init_cache


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to continue prompts: M = max_new_tokens per row; temperature 0 is greedy; top_k 0 and top_p 1 cut
    nothing; a row ends after any of `stop_tokens`, or once its newest tokens are one of `stop_sequences` (token ids
    of a stop string, e.g. `</search>`; what ends a row is kept, as generated); `pad_token` fills the rest."""

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop_tokens: tuple[int, ...] = ()
    pad_token: int = 0
    stop_sequences: tuple[tuple[int, ...], ...] = ()

    def check(self, vocab_size: int) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}.")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature!r}.")
        if not (isinstance(self.top_k, int) and 0 <= self.top_k <= vocab_size):
            raise ValueError(f"top_k must be an integer in [0, {vocab_size}] (0: off), got {self.top_k!r}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1: off), got {self.top_p!r}.")
        for token in (*self.stop_tokens, self.pad_token, *(t for sequence in self.stop_sequences for t in sequence)):
            if not (isinstance(token, (int, np.integer)) and 0 <= token < vocab_size):
                raise ValueError(f"stop and pad tokens must be ids in [0, {vocab_size}), got {token!r}.")
        if not all(isinstance(sequence, tuple) and sequence for sequence in self.stop_sequences):
            raise ValueError(f"stop_sequences must be non-empty tuples of token ids, got {self.stop_sequences!r}.")


class Sample(flax.struct.PyTreeNode):  # frozen
    """Prompts and their continuations, aligned: column P + t holds the t-th generated token."""

    tokens: jax.Array  # [B, P + M] int32: the prompt (left-padded), then generated tokens, then pad_token
    generated: jax.Array  # [B, P + M] bool: the tokens the model wrote (a stop token included)
    logp: jax.Array  # [B, P + M] float32: log-prob under the distribution sampled from; 0 elsewhere
    model_logp: jax.Array  # [B, P + M] float32: log-prob under the plain model; 0 elsewhere
    attention_mask: jax.Array  # [B, P + M] bool: the prompt's real tokens and the generated ones


# How many of the most likely tokens top-p alone tries, in turn, before it sorts the whole vocabulary (each where it
# is at most a quarter of V). At V = 151,936 on 2 CPU cores sorting 8 rows costs 0.5 s a step, `lax.top_k` of 64,
# 1,024, 8,192 of them 4, 12, 47 ms (experiments/lm/nucleus_speed.py).
NUCLEUS_CANDIDATES = (64, 1024, 8192)


def sampling_log_probs(logits: jax.Array, config: SamplingConfig) -> jax.Array:
    """log-probabilities [..., V] of the distribution a token is drawn from: logits / temperature, outside
    the top k and the top-p nucleus −inf, renormalised. Greedy (temperature 0): 0 at the argmax, −inf
    elsewhere. The nucleus is the fewest most likely tokens whose probability reaches top_p (at least one;
    among equal logits the lower token id first).

    Nothing is sorted when nothing is cut; top-k takes `lax.top_k`'s k and top-p sorts only those. Top-p alone
    takes the 64, then 1,024, then 8,192 most likely tokens (`NUCLEUS_CANDIDATES`) and, only when their mass
    falls short of top_p in some row, finds the nucleus's least probability by a bisection over the whole
    vocabulary instead of sorting it (`_nucleus_by_threshold`; a sort cost twice the decoding at V = 4,096)."""
    if config.temperature == 0:
        best = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=bool)
        return jnp.where(best, 0.0, -jnp.inf)
    scaled = logits.astype(jnp.float32) / config.temperature
    if not config.top_k and config.top_p == 1:
        return jax.nn.log_softmax(scaled, axis=-1)
    if config.top_k:  # most likely first; ties: the lower token id first, as a stable sort puts them
        ranked, order = jax.lax.top_k(scaled, config.top_k)
        keep = jnp.ones(ranked.shape, bool)
        if config.top_p < 1:
            keep = _in_nucleus(jax.nn.softmax(ranked, axis=-1), config.top_p)[0]
        kept = _scatter(keep, order, scaled.shape)
    else:
        kept = _nucleus(scaled, config.top_p, [k for k in NUCLEUS_CANDIDATES if 4 * k <= scaled.shape[-1]])
    return jax.nn.log_softmax(jnp.where(kept, scaled, -jnp.inf), axis=-1)


def _in_nucleus(probabilities: jax.Array, top_p: float) -> tuple[jax.Array, jax.Array]:
    """(in the nucleus [..., k], cumulative mass [..., k]) of probabilities [..., k], most likely first: a token is in
    while the mass before it is below top_p."""
    mass = jnp.cumsum(probabilities, axis=-1)
    return mass - probabilities < top_p, mass


def _scatter(keep: jax.Array, order: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """bool [..., V]: keep [..., k] written at the token ids order [..., k]."""
    return jnp.put_along_axis(jnp.zeros(shape, bool), order, keep, axis=-1, inplace=False)


def _nucleus(scaled: jax.Array, top_p: float, candidates: list[int]) -> jax.Array:
    """bool [..., V], the top-p nucleus of scaled logits, from the first of `candidates` (counts of most likely
    tokens) whose mass reaches top_p in every row, or from a threshold search over the whole vocabulary
    (`_nucleus_by_threshold`). A row's nucleus lies within its k most likely tokens exactly when their mass
    reaches top_p: the next one has that much before it."""

    def from_candidates(counts: list[int]) -> jax.Array:
        if not counts:
            return _nucleus_by_threshold(jnp.exp(scaled - log_total), top_p)
        ranked, order = jax.lax.top_k(scaled, counts[0])
        keep, mass = _in_nucleus(jnp.exp(ranked - log_total), top_p)
        nucleus = _scatter(keep, order, scaled.shape)
        return jax.lax.cond(jnp.all(mass[..., -1] >= top_p), lambda: nucleus, lambda: from_candidates(counts[1:]))

    log_total = jax.nn.logsumexp(scaled, axis=-1, keepdims=True)
    return from_candidates(candidates)


def _nucleus_by_threshold(probabilities: jax.Array, top_p: float) -> jax.Array:
    """bool [..., V], the nucleus of probabilities [..., V] without sorting them: a token is in while the mass of
    the tokens before it (more likely, or as likely with a lower id) is below top_p. The least probability in
    the nucleus, t, is the largest whose tokens at or above it hold top_p; a bisection over float32's bit
    patterns (ordered as the non-negative values are) finds it in at most 31 passes over the vocabulary, each a
    comparison and a sum, where a sort of 151,936 tokens cost 0.4-0.5 s for 8 rows on 2 CPU cores."""
    bits = jax.lax.bitcast_convert_type(probabilities, jnp.int32)
    holds = lambda t: jnp.sum(jnp.where(bits >= t, probabilities, 0.0), axis=-1, keepdims=True) >= top_p  # noqa: E731

    def halve(_, bounds):  # holds(low) is true, holds(high + 1) false
        low, high = bounds
        middle = low + (high - low + 1) // 2
        up = holds(middle)
        return jnp.where(up, middle, low), jnp.where(up, high, middle - 1)

    top = jnp.max(bits, axis=-1, keepdims=True)
    threshold, _ = jax.lax.fori_loop(0, 31, halve, (jnp.zeros_like(top), top))
    above = jnp.sum(jnp.where(bits > threshold, probabilities, 0.0), axis=-1, keepdims=True)
    at = bits == threshold  # ties at the edge: the lower token ids first, while the mass before them is short
    before = above + (jnp.cumsum(at, axis=-1) - 1) * jax.lax.bitcast_convert_type(threshold, jnp.float32)
    return (bits > threshold) | (at & (before < top_p))


def _write_next(config: SamplingConfig, column: jax.Array | int, state: dict) -> tuple[dict, jax.Array]:
    """(state, token [B]): one token for each row still writing, drawn from the sampling distribution of the
    state's logits and written at `column` with its log-probabilities (the sampled and the model's own); a stop
    token, or a stop sequence ending at it, ends its row. Rows that are done get the pad token."""
    key, draw = jax.random.split(state["key"])
    log_probs = sampling_log_probs(state["logits"], config)  # [B, V]
    token = jax.random.categorical(draw, log_probs).astype(jnp.int32)
    active = ~state["done"]
    token = jnp.where(active, token, config.pad_token)
    pick = lambda table: jnp.take_along_axis(table, token[:, None], axis=1)[:, 0]  # noqa: E731
    write = lambda table, values: jax.lax.dynamic_update_slice(table, values[:, None], (0, column))  # noqa: E731
    stops = jnp.asarray(config.stop_tokens or (-1,), jnp.int32)
    written = dict(
        state,
        step=state["step"] + 1,
        key=key,
        tokens=write(state["tokens"], token),
        generated=write(state["generated"], active),
        logp=write(state["logp"], jnp.where(active, pick(log_probs), 0.0)),
        model_logp=write(state["model_logp"], jnp.where(active, pick(jax.nn.log_softmax(state["logits"])), 0.0)),
        done=state["done"] | (active & jnp.isin(token, stops)),
    )
    if config.stop_sequences:  # the row's newest tokens, this call's only (-1 before its first)
        recent = jnp.concatenate([state["recent"][:, 1:], token[:, None]], axis=1)
        ends = [jnp.all(recent[:, recent.shape[1] - len(s) :] == jnp.asarray(s), axis=1) for s in config.stop_sequences]
        written.update(recent=recent, done=written["done"] | (active & jnp.any(jnp.stack(ends), axis=0)))
    return written, token


def recent_tokens(config: SamplingConfig, batch: int) -> dict:
    """The state a stop sequence is matched in: each row's newest tokens, as many as the longest (none without)."""
    if not config.stop_sequences:
        return {}
    return {"recent": jnp.full((batch, max(map(len, config.stop_sequences))), -1, jnp.int32)}


def _decode_step(
    model: CausalLM,
    config: SamplingConfig,
    params: Any,
    key_mask: jax.Array,
    first_position: jax.Array,
    first_column: jax.Array | int,
    state: dict,
) -> dict:
    """`_write_next`, then the model's pass over the token written, for the next one's logits.
    `first_position` [B]: each row's position of its first new token; `first_column`: the column it is written at."""
    column = first_column + state["step"]
    state, token = _write_next(config, column, state)
    logits, cache = model.apply(
        params,
        token[:, None],
        (first_position + state["step"] - 1)[:, None],
        key_mask,
        cache=state["cache"],
        cache_index=column,
    )
    return dict(state, cache=cache, logits=logits[:, -1])


def _check_prompts(prompts: jax.Array, prompt_mask: jax.Array) -> None:
    if prompts.ndim != 2 or prompt_mask.shape != prompts.shape:
        raise ValueError(
            f"prompts and prompt_mask must both be [batch, length], got {prompts.shape} and {prompt_mask.shape}."
        )
    if not isinstance(prompt_mask, jax.core.Tracer):
        mask = np.asarray(prompt_mask, bool)
        if not mask[:, -1].all() or (np.diff(mask.astype(np.int8), axis=1) < 0).any():
            raise ValueError(
                "prompt_mask must be left-padded (False then True in each row) and end every row with a real token."
            )


def make_sampler(model: CausalLM, config: SamplingConfig) -> Callable[..., Sample]:
    """A jitted `sample(params, key, prompts int [B, P], prompt_mask bool [B, P]) -> Sample`.

    Prompts are left-padded (prompt_mask False before each row's first real token, True after); a row's
    positions count its real tokens. The loop stops when every row has met a stop token or written M tokens.
    """
    config.check(model.config.vocab_size)

    @jax.jit
    def run(params, key, prompts, prompt_mask):
        batch, prompt_length = prompts.shape
        steps, slots = config.max_new_tokens, prompts.shape[1] + config.max_new_tokens
        positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
        key_mask = jnp.concatenate([prompt_mask, jnp.ones((batch, steps), bool)], axis=1)
        logits, cache = model.apply(
            params, prompts, positions, key_mask, cache=init_cache(model.config, batch, slots), cache_index=0
        )
        pad = lambda fill, dtype: jnp.full((batch, steps), fill, dtype)  # noqa: E731
        state = dict(
            step=jnp.int32(0),
            key=key,
            cache=cache,
            logits=logits[:, -1],
            tokens=jnp.concatenate([prompts.astype(jnp.int32), pad(config.pad_token, jnp.int32)], axis=1),
            generated=jnp.zeros((batch, slots), bool),
            logp=jnp.zeros((batch, slots)),
            model_logp=jnp.zeros((batch, slots)),
            done=jnp.zeros(batch, bool),
            **recent_tokens(config, batch),
        )
        next_position = prompt_mask.sum(axis=1).astype(jnp.int32)

        body = functools.partial(_decode_step, model, config, params, key_mask, next_position, prompt_length)
        state = jax.lax.while_loop(lambda s: (s["step"] < steps - 1) & ~jnp.all(s["done"]), body, state)
        state, _ = _write_next(config, prompt_length + state["step"], state)  # the last token needs no pass after it
        mask = jnp.concatenate([prompt_mask, jnp.zeros((batch, steps), bool)], axis=1) | state["generated"]
        return Sample(
            tokens=state["tokens"],
            generated=state["generated"],
            logp=state["logp"],
            model_logp=state["model_logp"],
            attention_mask=mask,
        )

    def sample(params, key: jax.Array, prompts: jax.Array, prompt_mask: jax.Array) -> Sample:
        """Continues the prompts (see `make_sampler`); the key is consumed."""
        _check_prompts(prompts, prompt_mask)
        return run(params, key, jnp.asarray(prompts, jnp.int32), jnp.asarray(prompt_mask, bool))

    return sample

"""The KV-cached sampler: its log-probs against a full forward pass, top-k/top-p kept sets, greedy decoding,
stop tokens, keys, and refusals."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ftw_jax import lm
from ftw_jax.lm.sampler import SamplingConfig, make_sampler, sampling_log_probs

DATA = pathlib.Path(__file__).parent / "data" / "lm" / "qwen2-untied"
NEW = 10


@pytest.fixture(scope="module")
def checkpoint():
    """The tiny Qwen2 and 16 copies of a 2-row prompt batch (row 0 left-padded by 4): 32 rows, 8 columns."""
    model, params = lm.load(DATA)
    reference = np.load(DATA / "reference.npz")
    prompts = np.tile(reference["padded_tokens"][:, :8], (16, 1))
    mask = np.tile(reference["attention_mask"][:, :8].astype(bool), (16, 1))
    return model, params, prompts, mask


def full_log_probs(model, params, out) -> np.ndarray:
    """[B, L−1] log-prob of each token given those before it, from one forward pass over the whole rows."""
    positions = jnp.maximum(jnp.cumsum(out.attention_mask, axis=1) - 1, 0)
    log_probs = jax.nn.log_softmax(model.apply(params, out.tokens, positions, out.attention_mask))
    return np.asarray(log_probs[:, :-1]), np.asarray(out.tokens[:, 1:])


@pytest.mark.slow
def test_plain_sampling_log_probs_equal_a_full_forward(checkpoint):
    model, params, prompts, mask = checkpoint
    sample = make_sampler(model, SamplingConfig(max_new_tokens=NEW))
    out = sample(params, jax.random.key(0), prompts, mask)
    generated = np.asarray(out.generated)
    assert generated[:, 8:].all() and not generated[:, :8].any()  # no stop tokens: every row writes M tokens
    np.testing.assert_array_equal(out.tokens[:, :8], prompts)
    log_probs, targets = full_log_probs(model, params, out)
    expected = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    assert np.abs(expected - np.asarray(out.model_logp)[:, 1:])[generated[:, 1:]].max() <= 1e-5
    np.testing.assert_array_equal(out.logp, out.model_logp)  # plain sampling: the two distributions are one
    again = sample(params, jax.random.key(0), prompts, mask)
    other = sample(params, jax.random.key(1), prompts, mask)
    np.testing.assert_array_equal(again.tokens, out.tokens)
    assert (np.asarray(other.tokens) != np.asarray(out.tokens)).mean() > 0.3
    # The 16 copies of a prompt were continued differently: one key, split per row by the categorical draw.
    assert len({tuple(row) for row in np.asarray(out.tokens)[0::2]}) == 16


@pytest.mark.slow
@pytest.mark.parametrize("cut", [dict(top_k=5), dict(top_p=0.6), dict(top_k=3, top_p=0.9)])
def test_top_k_and_top_p_never_emit_a_token_outside_the_kept_set(checkpoint, cut):
    model, params, prompts, mask = checkpoint
    config = SamplingConfig(max_new_tokens=NEW, temperature=0.8, **cut)
    out = make_sampler(model, config)(params, jax.random.key(2), prompts, mask)
    log_probs, targets = full_log_probs(model, params, out)
    generated = np.asarray(out.generated)[:, 1:]
    scaled = np.asarray(jax.nn.log_softmax(jnp.asarray(log_probs) / 0.8))[generated]  # [tokens, V]
    token = targets[generated]
    rank = (scaled > np.take_along_axis(scaled, token[:, None], axis=1)).sum(axis=1)  # 0 = most likely
    if "top_k" in cut:
        assert rank.max() < cut["top_k"]
    if "top_p" in cut:
        probabilities = np.exp(scaled)
        mass_before = np.where(
            probabilities > probabilities[np.arange(len(token)), token][:, None], probabilities, 0
        ).sum(axis=1)
        assert mass_before.max() < cut["top_p"]
    # The behaviour log-prob is the cut distribution's, the model's the plain one's.
    behaviour = np.asarray(sampling_log_probs(jnp.asarray(log_probs[generated]), config))
    np.testing.assert_allclose(
        np.asarray(out.logp)[:, 1:][generated], behaviour[np.arange(len(token)), token], atol=1e-5
    )
    assert (np.asarray(out.logp)[:, 1:][generated] >= np.asarray(out.model_logp)[:, 1:][generated] - 1e-6).mean() > 0.9
    assert rank.max() > 0  # not greedy in disguise


def test_kept_sets_by_hand():
    logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
    kept = lambda **cut: np.isfinite(np.asarray(sampling_log_probs(logits, SamplingConfig(1, **cut))))  # noqa: E731
    assert kept().tolist() == [True] * 4
    assert kept(top_k=2).tolist() == [True, True, False, False]
    assert kept(top_p=0.75).tolist() == [True, True, False, False]  # 0.5 + 0.3 reaches 0.75
    assert kept(top_p=0.8).tolist() == [True, True, False, False]  # the third has 0.8 before it: not < 0.8
    assert kept(top_p=0.81).tolist() == [True, True, True, False]
    assert kept(top_p=0.1).tolist() == [True, False, False, False]  # at least the most likely
    np.testing.assert_allclose(
        np.exp(sampling_log_probs(logits, SamplingConfig(1, top_k=2)))[:2], [0.625, 0.375], rtol=1e-6
    )
    squared = np.array([0.25, 0.09, 0.0225, 0.0025])  # temperature ½: p² renormalised
    np.testing.assert_allclose(
        np.exp(sampling_log_probs(logits, SamplingConfig(1, temperature=0.5))), squared / squared.sum(), rtol=1e-5
    )
    assert np.asarray(sampling_log_probs(logits, SamplingConfig(1, temperature=0))).tolist() == [0] + [-np.inf] * 3


def sorted_log_probs(logits, config):
    """The cut distribution by sorting the whole vocabulary, as the sampler made it before issue 36."""
    scaled = logits / config.temperature
    order = jnp.argsort(-scaled, axis=-1)  # stable: ties keep the lower token id first
    ranked = jnp.take_along_axis(scaled, order, axis=-1)
    keep = jnp.broadcast_to(jnp.arange(ranked.shape[-1]) < (config.top_k or ranked.shape[-1]), ranked.shape)
    if config.top_p < 1:
        probabilities = jax.nn.softmax(jnp.where(keep, ranked, -jnp.inf), axis=-1)
        keep = keep & (jnp.cumsum(probabilities, axis=-1) - probabilities < config.top_p)
    kept = jnp.put_along_axis(jnp.zeros(keep.shape, bool), order, keep, axis=-1, inplace=False)
    return jax.nn.log_softmax(jnp.where(kept, scaled, -jnp.inf), axis=-1)


@pytest.mark.parametrize("top_k", [0, 1, 7, 50])
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.3])
def test_the_cut_distribution_is_the_one_a_whole_sort_gives(top_k, top_p):
    """Issue 36: no sort when nothing is cut, `lax.top_k` for top-k, a sort of the candidates only for top-p; the
    same kept sets (ties included: logits rounded to a tenth) and log-probs."""
    logits = jnp.round(jax.random.normal(jax.random.key(0), (16, 50)) * 20) / 10
    config = SamplingConfig(1, temperature=0.7, top_k=top_k, top_p=top_p)
    got, expected = np.asarray(sampling_log_probs(logits, config)), np.asarray(sorted_log_probs(logits, config))
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(expected))
    np.testing.assert_allclose(got[np.isfinite(got)], expected[np.isfinite(expected)], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "spread, nucleus_sizes",
    [(12.0, (1, 64)), (3.0, (64, 1024)), (0.3, (1024, 4096)), ("mixed", (1, 4096))],
)
def test_top_p_alone_from_the_most_likely_candidates_is_the_whole_sorts_nucleus(spread, nucleus_sizes):
    """Top-p alone tries the 64, then 1,024 most likely tokens before searching all 4,096: the same kept sets and
    log-probs as a whole sort whichever it takes (peaked rows: 64; middling: 1,024; flat, or any flat row in
    the batch: the threshold search over the vocabulary), ties included (logits rounded to a hundredth)."""
    normal = jax.random.normal(jax.random.key(3), (6, 4096))
    scales = jnp.array([12.0, 12.0, 3.0, 3.0, 0.3, 0.3])[:, None] if spread == "mixed" else spread
    logits = jnp.round(normal * scales * 100) / 100
    config = SamplingConfig(1, top_p=0.9)
    got, expected = np.asarray(sampling_log_probs(logits, config)), np.asarray(sorted_log_probs(logits, config))
    sizes = np.isfinite(expected).sum(axis=1)
    assert nucleus_sizes[0] <= sizes.min() and sizes.max() < nucleus_sizes[1], sizes  # the regime meant
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(expected))
    np.testing.assert_allclose(got[np.isfinite(got)], expected[np.isfinite(expected)], rtol=1e-6, atol=1e-6)


def test_one_new_token_needs_no_decode_pass(checkpoint):
    """The last token is drawn without a pass after it: with one new token, the prompt's pass is the only one."""
    model, params, prompts, mask = checkpoint
    out = make_sampler(model, SamplingConfig(max_new_tokens=1, temperature=0))(params, jax.random.key(0), prompts, mask)
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    last = model.apply(params, jnp.asarray(prompts), positions, jnp.asarray(mask))[:, -1]
    np.testing.assert_array_equal(out.tokens[:, -1], jnp.argmax(last, axis=-1))
    assert np.asarray(out.generated[:, -1]).all() and not np.asarray(out.generated[:, :-1]).any()


@pytest.mark.slow
def test_greedy_decoding_and_stop_tokens(checkpoint):
    model, params, prompts, mask = checkpoint
    prompts, mask = prompts[:2], mask[:2]
    greedy = make_sampler(model, SamplingConfig(max_new_tokens=NEW, temperature=0))
    out = greedy(params, jax.random.key(0), prompts, mask)
    log_probs, targets = full_log_probs(model, params, out)
    generated = np.asarray(out.generated)[:, 1:]
    np.testing.assert_array_equal(targets[generated], log_probs.argmax(-1)[generated])
    assert not np.asarray(out.logp).any()  # a point mass: log 1
    stop = int(out.tokens[0, 8 + 2])  # row 0's third token
    stopped = make_sampler(model, SamplingConfig(max_new_tokens=NEW, temperature=0, stop_tokens=(stop,), pad_token=7))
    cut = stopped(params, jax.random.key(0), prompts, mask)
    for row in range(2):
        written = np.asarray(out.tokens[row, 8:])
        end = int(np.argmax(written == stop)) + 1 if (written == stop).any() else NEW
        assert np.asarray(cut.generated[row, 8:]).tolist() == [True] * end + [False] * (NEW - end)
        np.testing.assert_array_equal(cut.tokens[row, 8 : 8 + end], written[:end])  # the stop token is kept
        assert (np.asarray(cut.tokens[row, 8 + end :]) == 7).all() and not np.asarray(
            cut.model_logp[row, 8 + end :]
        ).any()
    assert int(np.asarray(cut.generated[0]).sum()) <= 3


def test_sampler_refuses_bad_settings_and_prompts(checkpoint):
    model, params, prompts, mask = checkpoint
    vocab = model.config.vocab_size
    for settings, message in [
        (dict(max_new_tokens=0), "max_new_tokens must be a positive integer, got 0"),
        (dict(max_new_tokens=4, temperature=-1.0), "temperature must be >= 0"),
        (dict(max_new_tokens=4, top_k=vocab + 1), rf"top_k must be an integer in \[0, {vocab}\]"),
        (dict(max_new_tokens=4, top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(max_new_tokens=4, stop_tokens=(vocab,)), "stop and pad tokens must be ids"),
    ]:
        with pytest.raises(ValueError, match=message):
            make_sampler(model, SamplingConfig(**settings))
    sample = make_sampler(model, SamplingConfig(max_new_tokens=2))
    with pytest.raises(ValueError, match="must both be"):
        sample(params, jax.random.key(0), prompts, mask[:, :4])
    with pytest.raises(ValueError, match="left-padded"):
        sample(params, jax.random.key(0), prompts, mask[:, ::-1])

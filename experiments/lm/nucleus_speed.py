"""What top-p alone costs per sampling step: the sampler's cut (the most likely candidates first, then a
threshold search) against a sort of the whole vocabulary.

    python experiments/lm/nucleus_speed.py            # B = 8 rows, V up to Qwen2.5's 151,936; ~1 minute on 2 cores

Logits are N(0, 1) times a spread: a trained model's step is peaked (a nucleus of a few tokens: spread 12), or
middling, or flat as a randomly initialised model's (the nucleus is most of the vocabulary: the sampler then
searches the whole vocabulary for the nucleus's least probability, after trying the candidates). "Tokens kept
otherwise" counts tokens one keeps and the other does not (a float32 sum of thousands of probabilities lands
within rounding of top_p). Each is jitted, compiled first,
and timed as the median of `--repeats` calls, alternating.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax.lm import SamplingConfig
from ftw_jax.lm.sampler import sampling_log_probs

SPREADS = {"peaked": 12.0, "middling": 3.0, "flat": 0.3}


def whole_sort(scaled: jax.Array, top_p: float) -> jax.Array:
    """The nucleus by sorting all V logits of each row (the sampler before issue 36)."""
    order = jnp.argsort(-scaled, axis=-1)
    probabilities = jax.nn.softmax(jnp.take_along_axis(scaled, order, axis=-1), axis=-1)
    keep = jnp.cumsum(probabilities, axis=-1) - probabilities < top_p
    kept = jnp.put_along_axis(jnp.zeros(scaled.shape, bool), order, keep, axis=-1, inplace=False)
    return jax.nn.log_softmax(jnp.where(kept, scaled, -jnp.inf), axis=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-sizes", default="4096,16384,151936")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    config = SamplingConfig(1, top_p=args.top_p)
    cut = jax.jit(lambda logits: sampling_log_probs(logits, config))
    sort = jax.jit(lambda logits: whole_sort(logits, args.top_p))
    print(f"top-p {args.top_p}, batch {args.batch}, median of {args.repeats} alternating calls, ms per step\n")
    print(
        "| V | logits | nucleus (tokens, median row) | whole sort ms | sampler ms | speed-up | tokens kept otherwise |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    for vocab in (int(v) for v in args.vocab_sizes.split(",")):
        for name, spread in SPREADS.items():
            logits = jax.random.normal(jax.random.key(0), (args.batch, vocab)) * spread
            got, expected = cut(logits), sort(logits)
            differing = int((np.isfinite(np.asarray(got)) != np.isfinite(np.asarray(expected))).sum())
            seconds: dict[str, list[float]] = {"sort": [], "cut": []}
            for _ in range(args.repeats):
                for label, function in (("sort", sort), ("cut", cut)):
                    started = time.perf_counter()
                    jax.block_until_ready(function(logits))
                    seconds[label].append(time.perf_counter() - started)
            sort_ms, cut_ms = (1e3 * statistics.median(seconds[label]) for label in ("sort", "cut"))
            nucleus = int(np.median(np.isfinite(np.asarray(got)).sum(axis=1)))
            print(
                f"| {vocab:,} | {name} | {nucleus:,} | {sort_ms:.2f} | {cut_ms:.2f} | {sort_ms / cut_ms:.1f}× | "
                f"{differing} |"
            )


if __name__ == "__main__":
    main()

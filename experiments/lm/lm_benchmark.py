"""Tokens per second of the LM: forward, forward + backward (an Adam step), and sampling through the KV cache.

    python experiments/lm/lm_benchmark.py                            # three small sizes, on whatever JAX runs on
    python experiments/lm/lm_benchmark.py --sizes qwen2.5-0.5B --dtype bfloat16 --batch 8 --length 512   # a GPU

Each size is a randomly initialised model; each measurement is compiled first, then timed over `--repeats`
calls (median). Training tokens are batch × length; sampling counts the new tokens only (batch ×
new tokens, from a prompt of length − new tokens). On a shared machine, read the numbers side by side within
one run rather than against another run's.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import optax

from ftw_jax.lm import CausalLM, LMConfig, SamplingConfig, make_sampler
from ftw_jax.lm.memory import QWEN2_5, parameter_count

SIZES = {
    "tiny": LMConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=192,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        qkv_bias=True,
    ),
    "small": LMConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_layers=4,
        num_heads=8,
        num_kv_heads=2,
        head_dim=32,
        qkv_bias=True,
    ),
    "medium": LMConfig(
        vocab_size=16384,
        hidden_size=512,
        intermediate_size=1536,
        num_layers=8,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        qkv_bias=True,
    ),
    **{f"qwen2.5-{name}": config for name, config in QWEN2_5.items()},
}


def timed(function, *args, repeats: int) -> float:
    """Median seconds of one call (after a first, compiling call), waiting for the result each time."""
    from ftw_jax.running.timing import median_seconds  # here: lm_vs_torch.py's worker may import an older ftw_jax

    return median_seconds(lambda: function(*args), repeats)[0]


def make_train_step(model: CausalLM, optimizer: optax.GradientTransformation):
    """The jitted step `(params, opt_state, tokens [B, L]) -> (params, opt_state)`: the gradient of the
    next-token cross-entropy, then one optimizer step (also what experiments/lm/lm_vs_torch.py times)."""

    def loss(params, tokens):
        log_probs = jax.nn.log_softmax(model.apply(params, tokens[:, :-1]))
        return -jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1).mean()

    @jax.jit
    def step(params, opt_state, tokens):
        grads = jax.grad(loss)(params, tokens)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return step


def measure(config: LMConfig, batch: int, length: int, new_tokens: int, repeats: int) -> dict:
    model = CausalLM(config)
    key_params, key_tokens, key_sample = jax.random.split(jax.random.key(0), 3)
    tokens = jax.random.randint(key_tokens, (batch, length), 0, config.vocab_size)
    params = jax.jit(model.init)(key_params, tokens)
    optimizer = optax.adam(1e-4)
    step = make_train_step(model, optimizer)
    sample = make_sampler(model, SamplingConfig(max_new_tokens=new_tokens, top_p=0.95))
    prompts = tokens[:, : length - new_tokens]
    forward = timed(jax.jit(model.apply), params, tokens, repeats=repeats)
    train = timed(step, params, optimizer.init(params), tokens, repeats=repeats)
    sampling = timed(sample, params, key_sample, prompts, jnp.ones(prompts.shape, bool), repeats=repeats)
    return {
        "parameters": parameter_count(config),
        "forward": batch * length / forward,
        "train": batch * (length - 1) / train,
        "sample": batch * new_tokens / sampling,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,small,medium", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128, help="tokens per row (training and forward)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens the sampler writes per row")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    unknown = [name for name in args.sizes.split(",") if name not in SIZES]
    if unknown or not 0 < args.new_tokens < args.length:
        raise SystemExit(
            f"error: unknown sizes {unknown} (known: {', '.join(SIZES)})"
            if unknown
            else f"error: --new-tokens must be in [1, --length), got {args.new_tokens}."
        )
    device = jax.devices()[0]
    print(
        f"{jax.device_count()} x {device.device_kind} ({device.platform}), {args.dtype}, batch {args.batch}, "
        f"length {args.length}, {args.new_tokens} new tokens, median of {args.repeats}\n"
    )
    print("| size | parameters | forward tokens/s | train step tokens/s | sampling new tokens/s |")
    print("|---|---:|---:|---:|---:|")
    for name in args.sizes.split(","):
        row = measure(SIZES[name].replace(dtype=args.dtype), args.batch, args.length, args.new_tokens, args.repeats)
        print(
            f"| {name} | {row['parameters'] / 1e6:,.1f}M | {row['forward']:,.0f} | {row['train']:,.0f} | "
            f"{row['sample']:,.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

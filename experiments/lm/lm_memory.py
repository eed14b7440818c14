"""Memory of one training step and of sampling for Qwen2.5-0.5B, 1.5B and 3B (bfloat16, Adam), as a table.

    python experiments/lm/lm_memory.py --batch 8 --length 1024

Counted from the configs by `ftw_jax.lm.memory.memory_estimate` (no arrays made): parameters, gradients,
Adam's two moments (in the parameters' dtype, as optax keeps them), activations with and without
rematerialisation, with the attention probabilities stored (XLA's attention) or recomputed (a fused kernel),
float32 logits, and the KV cache of a sampler over `length` slots.
"""

from __future__ import annotations

import argparse

from ftw_jax.lm.memory import QWEN2_5, memory_estimate, parameter_count

GIB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="rows per step (default 8)")
    parser.add_argument("--length", type=int, default=1024, help="tokens per row (default 1024)")
    args = parser.parse_args()
    print(f"batch {args.batch} x length {args.length}, bfloat16 parameters and activations, Adam; GiB\n")
    print(
        "| model | parameters | params + grads + Adam | activations | with remat | with remat + fused attention "
        "| logits (float32) | step total, remat + fused | KV cache |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, config in QWEN2_5.items():
        config = config.replace(dtype="bfloat16")
        plain = memory_estimate(config, args.batch, args.length)
        remat = memory_estimate(config.replace(remat=True), args.batch, args.length)
        fused = memory_estimate(config.replace(remat=True), args.batch, args.length, fused_attention=True)
        state = plain["parameters"] + plain["gradients"] + plain["optimizer_state"]
        print(
            f"| Qwen2.5-{name} | {parameter_count(config) / 1e9:.2f}B | {state / GIB:.1f} | "
            f"{plain['activations'] / GIB:.1f} | {remat['activations'] / GIB:.1f} | {fused['activations'] / GIB:.1f} | "
            f"{plain['logits'] / GIB:.1f} | {fused['total'] / GIB:.1f} | {plain['kv_cache'] / GIB:.2f} |"
        )


if __name__ == "__main__":
    main()

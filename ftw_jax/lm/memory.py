"""How much memory an LM needs: parameters, gradients, optimizer state, a training step's activations and a
sampler's KV cache, counted from the config (no arrays made).

    estimate = memory_estimate(QWEN2_5["3B"].replace(dtype="bfloat16"), batch=8, length=1024)
    estimate["total"] / 2**30                              # GiB for one Adam step, bfloat16 parameters

The activation count is what the backward pass keeps per layer, in the compute dtype: the layer's input and
its two norms, q, k, v and the attention output, o_proj's output, the MLP's gate, up and their product, and
the attention scores and probabilities [B, N, L, L] in float32 unless a fused kernel (cuDNN's flash attention
on a GPU) recomputes them; the backward pass works on one layer at a time, whose working set is as large
again. With `remat` only each layer's input is kept. The float32 logits, log-probabilities and their
gradient come on top. It is an estimate (XLA fuses and reuses buffers); the tests hold it within a factor
of 1.5 of XLA's own count for small models.
"""

from __future__ import annotations

import numpy as np

from ftw_jax.lm.config import LMConfig

# Qwen2.5's published shapes (their config.json): 0.49B, 1.54B and 3.09B parameters, embeddings tied.
QWEN2_5 = {
    name: LMConfig(
        vocab_size=151_936,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=2,
        head_dim=hidden // heads,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        qkv_bias=True,
        tie_embeddings=True,
    )
    for name, (hidden, intermediate, layers, heads) in {
        "0.5B": (896, 4864, 24, 14),
        "1.5B": (1536, 8960, 28, 12),
        "3B": (2048, 11008, 36, 16),
    }.items()
}


def projection_shapes(config: LMConfig) -> dict[str, tuple[int, int]]:
    """(inputs, outputs) of each linear map of a layer, by its name (q_proj, ..., down_proj)."""
    d, f, h = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * h, config.num_kv_heads * h
    attention = {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d)}
    return attention | {"gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}


def parameter_count(config: LMConfig) -> int:
    """Every parameter of the model the config describes (the tied embedding counted once)."""
    d, f, h = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * h, config.num_kv_heads * h
    kernels = sum(inputs * outputs for inputs, outputs in projection_shapes(config).values())
    biases = config.qkv_bias * (q + 2 * kv) + config.output_bias * d + config.mlp_bias * (2 * f + d)
    per_layer = kernels + biases + 2 * d  # two norm scales
    embeddings = config.vocab_size * d * (1 if config.tie_embeddings else 2)
    return config.num_layers * per_layer + embeddings + d


def memory_estimate(
    config: LMConfig,
    batch: int,
    length: int,
    *,
    optimizer_moments: int = 2,
    fused_attention: bool = False,
    sample_slots: int | None = None,
    logits_chunk: int = 0,
) -> dict[str, int]:
    """Bytes of one training step (and of a sampler's KV cache) for a batch of `batch` rows of `length` tokens.

    Args:
      config: the model; its `weights_dtype` is the parameters', gradients' and Adam's moments' (optax keeps
        them in the parameters' dtype), its `dtype` the activations', its `remat` whether layers recompute
        their activations.
      optimizer_moments: arrays of the parameters' size the optimizer keeps (Adam 2, SGD with momentum 1).
      fused_attention: the attention probabilities are recomputed by a fused kernel, not stored.
      sample_slots: the sampler's cache length (prompt + new tokens); default `length`.
      logits_chunk: the loss makes the logits this many tokens of each row at a time (0: all at once), so
        only one chunk's are counted.
    Returns: "parameters", "gradients", "optimizer_state", "activations", "logits", "total" (the training
    step's sum) and "kv_cache" (sampling; not in the total).
    """
    width, weight_width = np.dtype(config.dtype).itemsize, np.dtype(config.weights_dtype).itemsize
    count = parameter_count(config)
    d, f = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    tokens = batch * length
    saved = tokens * (5 * d + 2 * q + 2 * kv + 3 * f) * width  # per layer, see the module docstring
    scores = 0 if fused_attention else 2 * batch * config.num_heads * length * length * 4  # float32 [B, N, L, L]
    per_layer = saved + scores
    kept = config.num_layers * (tokens * d * width if config.remat else per_layer)
    activations = kept + per_layer  # and the working set of the layer the backward pass is in
    logits_tokens = batch * min(logits_chunk or length, length)
    logits = 3 * logits_tokens * config.vocab_size * 4  # float32 logits, log-probabilities and their gradient
    estimate = {
        "parameters": count * weight_width,
        "gradients": count * weight_width,
        "optimizer_state": optimizer_moments * count * weight_width,
        "activations": activations,
        "logits": logits,
    }
    estimate["total"] = sum(estimate.values())
    slots = length if sample_slots is None else sample_slots
    estimate["kv_cache"] = 2 * config.num_layers * batch * slots * kv * width
    return estimate

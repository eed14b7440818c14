"""Low-rank adapters (LoRA, Hu et al. 2021) on the attention and MLP projections of `CausalLM`.

    config = dataclasses.replace(model.config, lora_rank=16, lora_alpha=32.0)
    params = with_adapters(key, config, params)     # a checkpoint's weights + adapters (B = 0: the same model)
    logits = CausalLM(config).apply(params, tokens)                # x W + (alpha / r) (x A) B at each projection
    lm.save(folder, config, merged(config, params))                # W + (alpha / r) A B: a plain checkpoint

Each targeted projection x W (+ b) becomes x W (+ b) + (alpha / r) (x A) B with A [D_in, r] and B [r, D_out];
A starts uniform in ±1/√D_in (PEFT's default, Kaiming's with a = √5) and B at zero, so the adapted model starts
as the base model, and a reference with B = 0 is the base with the adapters off. The adapters are float32
whatever the base's dtype (the base is frozen, so bfloat16 loses nothing there). Why our own module rather than
a library: the projections are one `nn.scan` of layers with a custom product (`model.tokens_flat_dot`), so an
adapter is two parameters beside each kernel and one more product in `model._dense` — less than wiring in
qwix's interception (a quantization library whose LoRA intercepts Flax's dot products by module path) and
keeping it in step with that product.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from ftw_jax.lm.config import LMConfig

# The projections that get adapters: every linear map of attention and the MLP (PEFT's "all-linear" on these models).
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTERS = ("lora_a", "lora_b")


def _key_name(entry: Any) -> str | None:
    return getattr(entry, "key", None)


def is_adapter(path: tuple) -> bool:
    """Whether a leaf at this tree path (`jax.tree_util` keys) is an adapter's A or B."""
    return any(_key_name(entry) in ADAPTERS for entry in path)


def with_adapters(key: jax.Array, config: LMConfig, params: dict) -> dict:
    """`params` ({"params": ...} of `CausalLM`) with an adapter beside every targeted kernel [layers, D_in, D_out]:
    `lora_a` [layers, D_in, r] uniform in ±1/√D_in and `lora_b` [layers, r, D_out] zero, both float32."""
    if not config.lora_rank:
        raise ValueError("with_adapters needs a config with lora_rank > 0.")
    rank, count = config.lora_rank, 0

    def adapted(tree: Any, name: str | None) -> Any:
        nonlocal count
        if not isinstance(tree, dict):
            return tree
        if name in TARGETS and "kernel" in tree:
            *layers, d_in, d_out = tree["kernel"].shape
            count += 1
            bound = 1.0 / d_in**0.5
            a = jax.random.uniform(jax.random.fold_in(key, count), (*layers, d_in, rank), jnp.float32, -bound, bound)
            return {**tree, "lora_a": a, "lora_b": jnp.zeros((*layers, rank, d_out), jnp.float32)}
        return {child: adapted(value, child) for child, value in tree.items()}

    return adapted(params, None)


def merged(config: LMConfig, params: dict) -> dict:
    """The params without adapters, each targeted kernel W + (alpha / r) A B in W's dtype (the product in
    float32): the adapted model as a plain checkpoint, for `lm.save` and any engine."""

    def merge(tree: Any) -> Any:
        if not isinstance(tree, dict):
            return tree
        if "lora_a" in tree:
            kernel = tree["kernel"]
            delta = jnp.einsum("...ir,...ro->...io", tree["lora_a"], tree["lora_b"], preferred_element_type=jnp.float32)
            combined = kernel.astype(jnp.float32) + config.lora_scale * delta
            return {name: value for name, value in tree.items() if name not in ADAPTERS} | {
                "kernel": combined.astype(kernel.dtype)
            }
        return {name: merge(value) for name, value in tree.items()}

    return merge(params)


def adapter_count(params: Any) -> int:
    """How many numbers the adapters hold (what LoRA trains)."""
    sizes = jax.tree_util.tree_map_with_path(lambda path, leaf: leaf.size if is_adapter(path) else 0, params)
    return int(sum(jax.tree.leaves(sizes)))

"""The decoder-only transformer of the Llama and Qwen2 families, in Flax Linen.

    model = CausalLM(config)
    params = model.init(key, tokens)                       # or ftw_jax.lm.load(path) for a checkpoint's
    logits = model.apply(params, tokens)                   # int32 [B, L] -> float32 [B, L, V]
    logits, cache = model.apply(params, tokens, positions, key_mask, cache=cache, cache_index=i)  # decoding

Each layer: x + attention(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)). Attention is grouped-query (G key/value
heads shared by N/G query heads each) with rotary position embeddings in Hugging Face's convention (the
head's two halves rotate together, `rotate_half`), through `jax.nn.dot_product_attention`, which can pick
cuDNN's fused kernel on a GPU (bfloat16).

Why Linen: its parameters are a plain nested dict, what Optax, Orbax, the pool's pytrees and partition
specs work on directly, and `model.apply(params, tokens)` is the contract other code calls. The layers are
one `nn.scan`, so their parameters are stacked ([layers, ...]) and the program holds one layer's code
whatever the depth: compile time does not grow with the number of layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ftw_jax.lm.config import LMConfig


def rotary_tables(config: LMConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos and sin [B, L, H] of each position's angles (int [B, L]); both halves of a head share them."""
    frequencies = jnp.asarray(config.inverse_frequencies(), jnp.float32)  # [H/2]
    angles = positions.astype(jnp.float32)[..., None] * frequencies  # [B, L, H/2]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotary embedding of x [B, L, heads, H]: each pair (x_i, x_{i+H/2}) turned by its angle (in float32)."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    rotated_half = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, :, None] + rotated_half * sin[:, :, None]).astype(x.dtype)


class RMSNorm(nn.Module):
    """x / rms(x) · w, the statistic in float32 (as Hugging Face's Llama/Qwen2); w kept in `param_dtype`, the
    product in `dtype`."""

    eps: float
    dtype: jnp.dtype
    param_dtype: jnp.dtype

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        weight = self.param("weight", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return weight.astype(self.dtype) * normed.astype(self.dtype)


def _norm(config: LMConfig, name: str) -> RMSNorm:
    return RMSNorm(config.rms_norm_eps, jnp.dtype(config.dtype), jnp.dtype(config.weights_dtype), name=name)


def _dense(config: LMConfig, features: int, use_bias: bool, name: str) -> nn.Module:
    if config.lora_rank:
        return LoRADense(config, features, use_bias, name=name)
    return nn.Dense(
        features,
        use_bias=use_bias,
        dtype=jnp.dtype(config.dtype),
        param_dtype=jnp.dtype(config.weights_dtype),
        name=name,
        kernel_init=nn.initializers.normal(config.initializer_range),
        dot_general=tokens_flat_dot,
    )


def tokens_flat_dot(
    inputs: jax.Array, kernel: jax.Array, dimension_numbers: Any, precision: Any = None, **kwargs: Any
) -> jax.Array:
    """`nn.Dense`'s product of inputs [..., D] and kernel [D, F] with the leading axes (the tokens) flattened into
    one. Why: over [B, L, ·] the kernel's gradient contracts two axes, and XLA's CPU backend then transposes every
    [B, L, F] cotangent (with the elementwise backward fused into the transposing copy): ~30% of a train step
    (experiments/lm/lm_step_profile.py, lm_vs_torch.py). Over [B·L, ·] it does not. Reshapes cost nothing."""
    assert dimension_numbers == (((inputs.ndim - 1,), (0,)), ((), ())), dimension_numbers  # Dense's, always
    flat = inputs.reshape(-1, inputs.shape[-1])
    out = jax.lax.dot_general(flat, kernel, (((1,), (0,)), ((), ())), precision=precision, **kwargs)
    return out.reshape(*inputs.shape[:-1], kernel.shape[-1])


class LoRADense(nn.Module):
    """`_dense`'s projection (kernel [D_in, F] and bias at the same paths, the same product) plus a low-rank
    adapter beside it: x W + b + (alpha / r) (x A) B, with A [D_in, r] and B [r, F] float32 parameters
    (`ftw_jax.lm.lora`; B starts at zero, so the adapted model starts as the base)."""

    config: LMConfig
    features: int
    use_bias: bool

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c, dtype, weights = self.config, jnp.dtype(self.config.dtype), jnp.dtype(self.config.weights_dtype)
        product = (((x.ndim - 1,), (0,)), ((), ()))
        kernel = self.param(
            "kernel", nn.initializers.normal(c.initializer_range), (x.shape[-1], self.features), weights
        )
        x = x.astype(dtype)
        y = tokens_flat_dot(x, kernel.astype(dtype), product)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,), weights).astype(dtype)
        bound = 1.0 / x.shape[-1] ** 0.5  # PEFT's A: Kaiming-uniform with a = sqrt(5)
        a_init = lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)  # noqa: E731
        a = self.param("lora_a", a_init, (x.shape[-1], c.lora_rank), jnp.float32)
        b = self.param("lora_b", nn.initializers.zeros, (c.lora_rank, self.features), jnp.float32)
        low = tokens_flat_dot(tokens_flat_dot(x, a.astype(dtype), product), b.astype(dtype), product)
        return y + (c.lora_scale * low).astype(dtype)


class Attention(nn.Module):
    config: LMConfig

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        mask: jax.Array | None,
        cache: tuple[jax.Array, jax.Array] | None,
        cache_index: jax.Array | None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """x [B, L, D] -> ([B, L, D], cache). mask [B, 1, L, S] (True = may attend), None for plain causal
        (S = L). With a cache (keys, values [B, S, G, H]) this step's keys and values are written into it at
        slots cache_index.. and the queries attend over all S slots; the updated cache is returned."""
        c = self.config
        batch, length, _ = x.shape
        q = _dense(c, c.num_heads * c.head_dim, c.qkv_bias, "q_proj")(x).reshape(batch, length, c.num_heads, -1)
        k = _dense(c, c.num_kv_heads * c.head_dim, c.qkv_bias, "k_proj")(x).reshape(batch, length, c.num_kv_heads, -1)
        v = _dense(c, c.num_kv_heads * c.head_dim, c.qkv_bias, "v_proj")(x).reshape(batch, length, c.num_kv_heads, -1)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is not None:
            assert cache_index is not None  # a cache comes with the index to write at
            start = (0, cache_index, 0, 0)
            cache = (
                jax.lax.dynamic_update_slice(cache[0], k.astype(cache[0].dtype), start),
                jax.lax.dynamic_update_slice(cache[1], v.astype(cache[1].dtype), start),
            )
            k, v = cache
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=mask is None)  # [B, L, N, H]
        return _dense(c, c.hidden_size, c.output_bias, "o_proj")(out.reshape(batch, length, -1)), cache


class MLP(nn.Module):
    config: LMConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        gate = _dense(c, c.intermediate_size, c.mlp_bias, "gate_proj")(x)
        up = _dense(c, c.intermediate_size, c.mlp_bias, "up_proj")(x)
        return _dense(c, c.hidden_size, c.mlp_bias, "down_proj")(nn.silu(gate) * up)


class Layer(nn.Module):
    config: LMConfig

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        mask: jax.Array | None,
        cache: tuple[jax.Array, jax.Array] | None,
        cache_index: jax.Array | None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        c = self.config
        attended, cache = Attention(c, name="self_attn")(
            _norm(c, "input_layernorm")(x), cos, sin, mask, cache, cache_index
        )
        x = x + attended
        x = x + MLP(c, name="mlp")(_norm(c, "post_attention_layernorm")(x))
        return x, cache  # (carry, this layer's cache) for nn.scan: the caches stack to [layers, ...]


class CausalLM(nn.Module):
    """Token ids [B, L] -> next-token logits [B, L, V] in float32; with `head=False` the final (normed) hidden
    states [B, L, D] instead, for a head of another size (a critic's value) to read."""

    config: LMConfig
    head: bool = True

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        attention_mask: jax.Array | None = None,
        cache: tuple[jax.Array, jax.Array] | None = None,
        cache_index: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """Logits float32 [B, L, V] of tokens int [B, L].

        Args:
          positions: int [B, L], default 0..L−1 (left-padded rows count from their first real token).
          attention_mask: bool [B, S] (S = L without a cache; the cache's slots with one): False where a key is
            padding, never attended to. Default: all True.
          cache: keys and values [layers, B, S, G, H] (`init_cache`) to decode with: the tokens take slots
            cache_index .. cache_index+L−1 and attend to the slots up to their own. Returns (logits, cache).
        """
        c, dtype = self.config, jnp.dtype(self.config.dtype)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, length], got shape {tokens.shape}.")
        batch, length = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
        mask = None  # None: causal, which lets the fused kernels skip the masked half
        if cache is not None:
            slots = cache[0].shape[2]
            cache_index = jnp.asarray(0 if cache_index is None else cache_index, jnp.int32)
            query_slots = cache_index + jnp.arange(length)
            mask = (jnp.arange(slots)[None, :] <= query_slots[:, None])[None, None]  # [1, 1, L, S]
            if attention_mask is not None:
                mask = mask & attention_mask[:, None, None, :].astype(bool)
        elif attention_mask is not None:
            causal = jnp.tril(jnp.ones((length, length), bool))
            mask = (causal[None] & attention_mask[:, None, :].astype(bool))[:, None]  # [B, 1, L, L]
        embed = nn.Embed(
            c.vocab_size,
            c.hidden_size,
            dtype=dtype,
            param_dtype=jnp.dtype(c.weights_dtype),
            name="embed_tokens",
            embedding_init=nn.initializers.normal(c.initializer_range),
        )
        x = embed(tokens)
        cos, sin = rotary_tables(c, positions)
        layer = nn.remat(Layer, prevent_cse=False) if c.remat else Layer  # inside a scan CSE cannot undo remat
        layers = nn.scan(
            layer,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, 0, nn.broadcast),  # pyright: ignore[reportArgumentType] (flax leaves it unannotated)
            length=c.num_layers,
        )
        x, cache = layers(c, name="layers")(x, cos, sin, mask, cache, cache_index)
        x = _norm(c, "norm")(x)
        if not self.head:
            return x if cache is None else (x, cache)
        if not c.tie_embeddings:
            self.param(
                "lm_head", nn.initializers.normal(c.initializer_range), (c.vocab_size, c.hidden_size), c.weights_dtype
            )
        logits = head_logits(c, self.variables["params"], x)
        return logits if cache is None else (logits, cache)


def head_logits(config: LMConfig, params: Mapping[str, Any], hidden: jax.Array) -> jax.Array:
    """float32 logits [..., V] of final hidden states [..., D], from the model's params (its "params" collection):
    the output embedding (the input one where tied) in the compute dtype, the products summed in float32. The
    leading axes are flattened for the product, as in `tokens_flat_dot` (the [B, L, V] cotangent is the largest
    array a train step transposes otherwise)."""
    table = params["embed_tokens"]["embedding"] if config.tie_embeddings else params["lm_head"]  # [V, D]
    flat = hidden.reshape(-1, hidden.shape[-1])
    logits = jnp.einsum("td,vd->tv", flat, table.astype(config.dtype), preferred_element_type=jnp.float32)
    return logits.reshape(*hidden.shape[:-1], table.shape[0])


def init_cache(config: LMConfig, batch: int, slots: int) -> tuple[jax.Array, jax.Array]:
    """Zero keys and values [layers, B, S, G, H] in the model's dtype, for decoding up to S tokens."""
    shape = (config.num_layers, batch, slots, config.num_kv_heads, config.head_dim)
    return jnp.zeros(shape, config.dtype), jnp.zeros(shape, config.dtype)

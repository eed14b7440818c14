"""A decoder-only LM's shape, read from a Hugging Face `config.json` (Llama and Qwen2 families).

    config = LMConfig.from_hf(json.load(open("config.json")))     # refuses what the model cannot run

transformers 4.x writes the rotary settings as `rope_theta` and `rope_scaling` at the top level; 5.x writes
them together as `rope_parameters`. Both are read; a value given in both places must agree.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any, Literal

# Hugging Face's class name -> its family; the families differ only in which projections have biases.
ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency-dependent rescaling of the rotary frequencies (rope type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Sizes and options of a Llama/Qwen2 decoder. Axes: B batch, L length, D hidden, V vocabulary, N query
    heads, G key/value heads (N a multiple of G: grouped-query attention), H head size, F MLP size."""

    vocab_size: int  # V
    hidden_size: int  # D
    intermediate_size: int  # F
    num_layers: int
    num_heads: int  # N
    num_kv_heads: int  # G
    head_dim: int  # H
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False  # Qwen2: always; Llama: `attention_bias`
    output_bias: bool = False  # Llama's `attention_bias` covers o_proj too; Qwen2's o_proj has none
    mlp_bias: bool = False  # Llama's `mlp_bias`
    tie_embeddings: bool = False  # logits from the input embedding (no lm_head)
    initializer_range: float = 0.02  # sd of fresh weights (a checkpoint's replace them), as Hugging Face's
    dtype: Literal["float32", "bfloat16"] = "float32"  # compute; norms' statistics, softmax and logits in float32
    param_dtype: Literal["float32", "bfloat16"] | None = None  # the parameters' (None: `dtype`); float32 master
    # weights with bfloat16 compute keep the small updates that bfloat16 weights would round away
    remat: bool = False  # recompute each layer's activations in the backward pass (memory for time)
    lora_rank: int = 0  # r > 0: a low-rank adapter beside every projection (`ftw_jax.lm.lora`); 0: none
    lora_alpha: float = 0.0  # the adapters' product is scaled by alpha / r

    def __post_init__(self):
        sizes = {
            name: getattr(self, name)
            for name in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_layers",
                "num_heads",
                "num_kv_heads",
                "head_dim",
            )
        }
        for name, value in sizes.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_kv_heads})."
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}.")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}.")
        if not (isinstance(self.lora_rank, int) and self.lora_rank >= 0):
            raise ValueError(f"lora_rank must be an int >= 0, got {self.lora_rank!r}.")
        if self.lora_rank and not self.lora_alpha > 0:
            raise ValueError(
                f"lora_alpha must be > 0 with adapters (lora_rank {self.lora_rank}), got {self.lora_alpha!r}."
            )
        if self.param_dtype is not None and self.param_dtype not in DTYPES:
            raise ValueError(f"param_dtype must be one of {', '.join(DTYPES)} or None, got {self.param_dtype!r}.")
        if not (self.rms_norm_eps > 0 and self.rope_theta > 0 and self.initializer_range > 0):
            raise ValueError(
                f"rms_norm_eps, rope_theta and initializer_range must be > 0, got {self.rms_norm_eps}, "
                f"{self.rope_theta}, {self.initializer_range}."
            )

    @property
    def lora_scale(self) -> float:
        """alpha / r, the scale of the adapters' product (0 without adapters)."""
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    @property
    def weights_dtype(self) -> str:
        """The parameters' dtype: `param_dtype`, or `dtype` where it is None."""
        return self.param_dtype or self.dtype

    def replace(self, **changes: Any) -> LMConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_hf(cls, hf: dict, **options: Any) -> LMConfig:
        """The config of a Hugging Face `config.json` (as a dict); `options`: `dtype`, `param_dtype`, `remat`.

        Raises ValueError naming what is not supported: another architecture, sliding-window attention,
        a rope type other than the default and "llama3", a missing size.
        """
        architectures = hf.get("architectures") or []
        if len(architectures) != 1 or architectures[0] not in ARCHITECTURES:
            raise ValueError(
                f"architectures {architectures} in config.json: supported are {', '.join(ARCHITECTURES)} (one of them)."
            )
        family = ARCHITECTURES[architectures[0]]
        if hf.get("use_sliding_window"):
            raise ValueError("use_sliding_window is true in config.json: sliding-window attention is not supported.")
        missing = [
            name
            for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
            if name not in hf
        ]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}.")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf['hidden_act']!r} in config.json: only 'silu' (SwiGLU) is supported.")
        num_heads = hf["num_attention_heads"]
        theta, scaling = _rope(hf)
        attention_bias = bool(hf.get("attention_bias", False))
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            qkv_bias=family == "qwen2" or attention_bias,
            output_bias=family == "llama" and attention_bias,
            mlp_bias=family == "llama" and bool(hf.get("mlp_bias", False)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            initializer_range=float(hf.get("initializer_range", 0.02)),
            **options,
        )

    def inverse_frequencies(self) -> list[float]:
        """The H/2 rotary angular frequencies (radians per position), Llama 3's rescaling applied."""
        frequencies = [self.rope_theta ** (-2 * i / self.head_dim) for i in range(self.head_dim // 2)]
        if self.rope_scaling is None:
            return frequencies
        s = self.rope_scaling
        context = s.original_max_position_embeddings
        low_wavelength, high_wavelength = context / s.low_freq_factor, context / s.high_freq_factor
        scaled = []
        for frequency in frequencies:
            wavelength = 2 * math.pi / frequency
            if wavelength < high_wavelength:  # fast rotations: kept
                scaled.append(frequency)
            elif wavelength > low_wavelength:  # slow rotations: stretched to the longer context
                scaled.append(frequency / s.factor)
            else:  # in between: interpolated between the two
                smooth = (context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
                scaled.append((1 - smooth) * frequency / s.factor + smooth * frequency)
        return scaled


def _rope(hf: dict) -> tuple[float, RopeScaling | None]:
    """rope_theta and the llama3 scaling from either layout (4.x: top level + `rope_scaling`; 5.x:
    `rope_parameters`)."""
    parameters = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    for name in set(parameters) & set(scaling):
        if parameters[name] != scaling[name]:
            raise ValueError(
                f"config.json gives {name} as {parameters[name]!r} in rope_parameters and "
                f"{scaling[name]!r} in rope_scaling."
            )
    merged = {**scaling, **parameters}
    if "rope_theta" in hf and "rope_theta" in merged and float(hf["rope_theta"]) != float(merged["rope_theta"]):
        raise ValueError(f"config.json gives rope_theta as {hf['rope_theta']} and {merged['rope_theta']}.")
    theta = float(merged.get("rope_theta", hf.get("rope_theta", 10_000.0)))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"rope type {rope_type!r} in config.json: supported are 'default' and 'llama3'.")
    needed = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [name for name in needed if name not in merged]
    if missing:
        raise ValueError(f"the llama3 rope scaling in config.json lacks {', '.join(missing)}.")
    scaling = RopeScaling(
        factor=float(merged["factor"]),
        low_freq_factor=float(merged["low_freq_factor"]),
        high_freq_factor=float(merged["high_freq_factor"]),
        original_max_position_embeddings=int(merged["original_max_position_embeddings"]),
    )
    if not scaling.high_freq_factor > scaling.low_freq_factor:
        raise ValueError(
            f"llama3 rope scaling needs high_freq_factor > low_freq_factor, got "
            f"{scaling.high_freq_factor} and {scaling.low_freq_factor}."
        )
    return theta, scaling


def tiny_config(vocabulary_size: int) -> LMConfig:
    """A Qwen2-shaped decoder a CPU trains in minutes: 2 layers, width 64, 4 query heads sharing 2 key/value
    heads, q/k/v biases, tied embeddings (as Qwen2.5-0.5B/1.5B/3B).

    Fresh weights have sd 1/√64: Hugging Face's 0.02 suits widths near 2,500, and at width 64 it leaves the
    attention scores near 0 and learning slow (one-hop search, seeds 1 and 2: 20.7% and 13.3% success after
    400 iterations with 0.02, 99.2% and 100% with 1/√64; docs/lm.md).
    """
    return LMConfig(
        vocab_size=vocabulary_size,
        hidden_size=64,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        qkv_bias=True,
        tie_embeddings=True,
        initializer_range=64**-0.5,
    )


def read_json(path: pathlib.Path) -> Any:
    """A JSON file's value; ValueError naming the file, line and column where it is not JSON."""
    try:
        return json.loads(path.read_bytes())
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path}:{error.lineno}: not JSON ({error.msg.removesuffix(' at')} at column {error.colno})."
        ) from None
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}: not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start})."
        ) from None


def pretrained_config(path: str) -> LMConfig:
    """The shape of the checkpoint in a Hugging Face folder (its config.json)."""
    folder = pathlib.Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} is not a Hugging Face model folder: no config.json in it.")
    return LMConfig.from_hf(read_json(folder / "config.json"))

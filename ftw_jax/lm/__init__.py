"""A decoder-only LM of the Llama and Qwen2 families: Hugging Face checkpoints, exact logits.

    model, params = ftw_jax.lm.load(path, dtype="float32")   # a Hugging Face folder
    logits = model.apply(params, tokens)                     # int32 [B, L] -> float32 [B, L, V]
"""

from ftw_jax.lm.config import LMConfig, RopeScaling
from ftw_jax.lm.load import load
from ftw_jax.lm.model import CausalLM

__all__ = ["CausalLM", "LMConfig", "RopeScaling", "load"]

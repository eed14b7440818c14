"""A decoder-only LM of the Llama and Qwen2 families: Hugging Face checkpoints, exact logits, a KV-cached sampler.

    model, params = ftw_jax.lm.load(path, dtype="float32")   # a Hugging Face folder
    ftw_jax.lm.save(folder, model.config, params)             # one that transformers and engines read
    logits = model.apply(params, tokens)                     # int32 [B, L] -> float32 [B, L, V]
    tokenizer = ftw_jax.lm.load_tokenizer(path)              # tokenizer.json and the chat template
    sample = ftw_jax.lm.make_sampler(model, ftw_jax.lm.SamplingConfig(max_new_tokens=64, top_p=0.9))
    out = sample(params, key, *tokenizer.left_padded(texts))  # tokens, generated mask, both log-probs

Modules: `config` (LMConfig from config.json; `tiny_config`, a fresh model a CPU trains), `model` (CausalLM),
`load`, `sampler`, `sharding` (a data × model mesh), `memory` (what a step needs), `tokenizer`, `lora` (low-rank
adapters). A model library only: the LM as a policy is `ftw_jax.policies.lm`, the learner `ftw_jax.agent.learner`,
`lm learn` over an engine's episodes `ftw_jax.agent.lm_learn`, their schema `ftw_jax.agent.episodes`.
"""

from ftw_jax.lm.config import LMConfig, RopeScaling, pretrained_config, tiny_config
from ftw_jax.lm.load import load, save
from ftw_jax.lm.model import CausalLM, init_cache
from ftw_jax.lm.sampler import Sample, SamplingConfig, make_sampler
from ftw_jax.lm.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "CausalLM",
    "LMConfig",
    "RopeScaling",
    "Sample",
    "SamplingConfig",
    "Tokenizer",
    "init_cache",
    "load",
    "load_tokenizer",
    "make_sampler",
    "pretrained_config",
    "save",
    "tiny_config",
]

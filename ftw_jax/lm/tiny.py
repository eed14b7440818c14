"""A tiny chat checkpoint for trials on a CPU: a byte-level BPE tokenizer trained on the texts given, a Qwen-style
chat template, and fresh weights of `tiny_config`'s shape, written as a Hugging Face folder.

    folder = write_tiny_checkpoint("tiny-chat", texts=corpus_lines, vocab_size=1024)
    model, params = ftw_jax.lm.load(folder); tokenizer = ftw_jax.lm.load_tokenizer(folder)
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterable

import jax
import jax.numpy as jnp

from ftw_jax.lm.config import LMConfig

# Qwen2.5's turn markers, without its tool and system-prompt logic.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def write_tiny_checkpoint(
    folder: str | os.PathLike[str],
    texts: Iterable[str],
    vocab_size: int = 320,
    seed: int = 0,
    shape: LMConfig | None = None,
) -> pathlib.Path:
    """Writes the checkpoint (tokenizer.json, tokenizer_config.json with the chat template, config.json,
    model.safetensors) into `folder`; returns it. The vocabulary is at most `vocab_size`, fewer when the texts have
    fewer merges to learn. `shape`: a model shape to take instead of `tiny_config`'s (a real one's, to time it;
    its vocabulary is kept where it is the larger)."""
    import tokenizers

    from ftw_jax.lm.config import tiny_config
    from ftw_jax.lm.load import save
    from ftw_jax.lm.model import CausalLM

    folder = pathlib.Path(folder)
    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    config = tiny_config(backend.get_vocab_size())
    if shape is not None:
        config = shape.replace(vocab_size=max(shape.vocab_size, config.vocab_size))
    params = CausalLM(config).init(jax.random.key(seed), jnp.zeros((1, 4), jnp.int32))
    save(folder, config, dict(params))
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    )
    return folder

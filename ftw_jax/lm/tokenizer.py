"""A checkpoint's own tokenizer (`tokenizer.json`, Hugging Face `tokenizers`) and chat template (jinja2).

    tokenizer = load_tokenizer("path/to/Qwen2.5-0.5B-Instruct")
    text = tokenizer.chat([{"role": "user", "content": "Who wrote Emma?"}])   # ends with the assistant's turn
    prompts, mask = tokenizer.left_padded([text, "a shorter one"])           # int32 [B, P], bool [B, P]

The template comes from `chat_template.jinja` (transformers ≥ 4.43 writes it beside the config) or from
`tokenizer_config.json`'s `chat_template`; it renders in jinja2's sandbox with the options and helpers
transformers gives it (`trim_blocks`, `lstrip_blocks`, `raise_exception`, `tojson`), so a template written for
transformers renders the same text here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from ftw_jax.lm.config import read_json

if TYPE_CHECKING:  # imported where a tokenizer is read, so that importing this module costs nothing
    import jax
    import tokenizers


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """Text <-> token ids, and chat messages -> text. `pad_id` is the pad token's, else the end-of-sequence
    token's (as Qwen's files have it); None where the files name neither."""

    backend: tokenizers.Tokenizer
    chat_template: str | None
    special_tokens: dict  # bos_token, eos_token, pad_token as the config names them (strings), where given
    eos_id: int | None
    pad_id: int | None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """The ids of `text` as written (no special tokens added: a chat template writes its own)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int] | jax.Array, skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def chat(self, messages: list[dict], add_generation_prompt: bool = True, **variables: Any) -> str:
        """The conversation as the model was trained to read it; with `add_generation_prompt`, the opening of the
        assistant's next turn."""
        if self.chat_template is None:
            raise ValueError(
                "this tokenizer has no chat template (no chat_template.jinja, no chat_template in "
                "tokenizer_config.json)."
            )
        return _template(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens, **variables
        )

    def left_padded(self, texts: list[str], pad_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Token ids [B, P] of the texts, each row left-padded to the longest, and the mask of real tokens."""
        pad = self.pad_id if pad_id is None else pad_id
        if pad is None:
            raise ValueError("no pad token: the tokenizer's files name none; pass pad_id.")
        rows = [self.encode(text) for text in texts]
        if not rows or not all(rows):
            raise ValueError("every text must have at least one token.")
        return left_pad(rows, max(map(len, rows)), pad)


def left_pad(rows: list[list[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids [B, width], each row's ids at its end after `pad_id`s, and the mask of real tokens (a row may have
    none). Rows longer than `width` are the caller's to refuse."""
    ids = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), bool)
    for row, tokens in enumerate(rows):
        if tokens:
            ids[row, width - len(tokens) :], mask[row, width - len(tokens) :] = tokens, True
    return ids, mask


def _template(source: str):
    import jinja2
    import jinja2.sandbox

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    environment.globals["raise_exception"] = raise_exception
    return environment.from_string(source)


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict with "content"."""
    return value.get("content") if isinstance(value, dict) else value


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer of a Hugging Face folder: `tokenizer.json` (required), `tokenizer_config.json` and
    `chat_template.jinja` (optional). Raises ValueError naming a missing file or a special token the
    vocabulary lacks."""
    import tokenizers

    folder = pathlib.Path(path)
    if not (folder / "tokenizer.json").is_file():
        raise ValueError(f"no tokenizer.json in {folder} (only the `tokenizers` format is read).")
    backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    config_file = folder / "tokenizer_config.json"
    config = read_json(config_file) if config_file.is_file() else {}
    template = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    if isinstance(template, list):  # several named templates: the default one
        template = next((item["template"] for item in template if item.get("name") == "default"), None)
    texts = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token", "pad_token")}
    special = {name: text for name, text in texts.items() if text}
    ids = {}
    for name, text in special.items():
        ids[name] = backend.token_to_id(text)
        if ids[name] is None:
            raise ValueError(
                f"{name} {text!r} in {config_file} is not in the vocabulary of {folder / 'tokenizer.json'}."
            )
    return Tokenizer(
        backend=backend,
        chat_template=template,
        special_tokens=special,
        eos_id=ids.get("eos_token"),
        pad_id=ids.get("pad_token", ids.get("eos_token")),
    )

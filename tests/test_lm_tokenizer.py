"""The checkpoint tokenizer: a small word-level `tokenizers` file, its chat template, left-padded batches."""

import json

import numpy as np
import pytest
import tokenizers

from ftw_jax.lm.tokenizer import load_tokenizer

WORDS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "user",
    "assistant",
    "system",
    "\n",
    "who",
    "wrote",
    "emma",
    "?",
    "austen",
    "jane",
    " ",
]
# Qwen's ChatML layout in miniature: a default system turn when none is given.
TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nbe brief<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(folder, config=None, template_file=None):
    vocabulary = {word: index for index, word in enumerate(WORDS + ["be", "brief", "[UNK]"])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocabulary, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Split(
        tokenizers.Regex(r"<\|[a-z_]+\|>|\n| |[a-z]+|\?"), behavior="isolated"
    )
    backend.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    backend.decoder = tokenizers.decoders.Fuse()
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    config = (
        {
            "eos_token": "<|im_end|>",
            "pad_token": {"content": "<|endoftext|>", "special": True},
            "chat_template": TEMPLATE,
        }
        if config is None
        else config
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if template_file:
        (folder / "chat_template.jinja").write_text(template_file)
    return folder


def test_encode_decode_and_special_tokens(tmp_path):
    tokenizer = load_tokenizer(write_tokenizer(tmp_path))
    ids = tokenizer.encode("who wrote emma?")
    assert [WORDS[i] for i in ids] == ["who", " ", "wrote", " ", "emma", "?"]
    assert tokenizer.decode(ids) == "who wrote emma?"
    assert tokenizer.encode("<|im_start|>who") == [WORDS.index("<|im_start|>"), WORDS.index("who")]  # special: one id
    assert tokenizer.eos_id == WORDS.index("<|im_end|>") and tokenizer.pad_id == WORDS.index("<|endoftext|>")


def test_chat_template_renders_as_written(tmp_path):
    tokenizer = load_tokenizer(write_tokenizer(tmp_path))
    text = tokenizer.chat([{"role": "user", "content": "who wrote emma?"}])
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nwho wrote emma?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.encode(text)
    assert ids.count(WORDS.index("<|im_start|>")) == 3 and ids[-1] == WORDS.index("\n")
    closed = tokenizer.chat([{"role": "system", "content": "x"}], add_generation_prompt=False)
    assert closed == "<|im_start|>system\nx<|im_end|>\n"
    # chat_template.jinja, where present, is the template (transformers >= 4.43 writes it there).
    other = load_tokenizer(write_tokenizer(tmp_path / "file", template_file="{{ messages | length }} turns"))
    assert other.chat([{"role": "user", "content": "a"}] * 2) == "2 turns"


def test_left_padded_batches(tmp_path):
    tokenizer = load_tokenizer(write_tokenizer(tmp_path))
    ids, mask = tokenizer.left_padded(["who wrote emma?", "jane austen"])
    assert ids.shape == mask.shape == (2, 6) and ids.dtype == np.int32
    assert mask[0].all() and mask[1].tolist() == [False, False, False, True, True, True]
    assert (ids[1, :3] == tokenizer.pad_id).all() and tokenizer.decode(ids[1, 3:]) == "jane austen"


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer.json in"):
        load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="eos_token '<eos>' in .* is not in the vocabulary"):
        load_tokenizer(write_tokenizer(tmp_path / "bad", config={"eos_token": "<eos>"}))
    plain = load_tokenizer(write_tokenizer(tmp_path / "plain", config={}))
    with pytest.raises(ValueError, match="has no chat template"):
        plain.chat([{"role": "user", "content": "who"}])
    with pytest.raises(ValueError, match="no pad token"):
        plain.left_padded(["who"])
    assert plain.left_padded(["who"], pad_id=0)[0].tolist() == [[WORDS.index("who")]]

"""A Hugging Face Llama/Qwen2 folder as (CausalLM, params): `config.json` and safetensors weights.

    model, params = load("path/to/Qwen2.5-0.5B-Instruct", dtype="bfloat16")
    logits = model.apply(params, tokens)                   # int32 [B, L] -> float32 [B, L, V]
    pretrained = load_pretrained("path/to/Qwen2.5-0.5B-Instruct")  # its shape and tokenizer; .read_weights()

The weights are `model.safetensors`, or the shards that `model.safetensors.index.json` lists. Every tensor's
name and shape is checked against the model's before any is read: a missing, extra or misshaped tensor is
refused with its name (a tied checkpoint may still carry `lm_head.weight` equal to the embedding). `save`
writes such a folder (atomically), for an inference engine to load the weights a learner trained.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax.lm.config import LMConfig, pretrained_config, read_json
from ftw_jax.lm.model import CausalLM
from ftw_jax.lm.tokenizer import Tokenizer, load_tokenizer

_LAYER = "model.layers.{}."


# Files of a Hugging Face folder an engine needs beside the weights (the tokenizer and generation defaults).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
)


def hf_names(config: LMConfig) -> dict[str, tuple[tuple[str, ...], bool]]:
    """Hugging Face tensor name (per layer, with `{}` for the layer) -> (our parameter's path under
    params["params"], whether the tensor is transposed into it). Per-layer tensors stack on a leading axis."""
    names: dict[str, tuple[tuple[str, ...], bool]] = {
        "model.embed_tokens.weight": (("embed_tokens", "embedding"), False),
        "model.norm.weight": (("norm", "weight"), False),
    }
    if not config.tie_embeddings:
        names["lm_head.weight"] = (("lm_head",), False)
    biases = {
        "self_attn.q_proj": config.qkv_bias,
        "self_attn.k_proj": config.qkv_bias,
        "self_attn.v_proj": config.qkv_bias,
        "self_attn.o_proj": config.output_bias,
        "mlp.gate_proj": config.mlp_bias,
        "mlp.up_proj": config.mlp_bias,
        "mlp.down_proj": config.mlp_bias,
    }
    for module, has_bias in biases.items():
        path = ("layers", *module.split("."))
        names[_LAYER + module + ".weight"] = ((*path, "kernel"), True)
        if has_bias:
            names[_LAYER + module + ".bias"] = ((*path, "bias"), False)
    for norm in ("input_layernorm", "post_attention_layernorm"):
        names[_LAYER + norm + ".weight"] = (("layers", norm, "weight"), False)
    return names


@contextlib.contextmanager
def _opened(path: pathlib.Path) -> Iterator[Any]:
    """`safe_open(path)` (the flax reader keeps bfloat16, numpy has none); a truncated or damaged file is a
    ValueError naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="flax") as file:
            yield file
    except SafetensorError as error:
        raise ValueError(f"{path} is not a readable safetensors file ({error}); is it truncated?") from None


def _weight_files(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """Tensor name -> the safetensors file that holds it."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index)["weight_map"]
        files = {name: folder / file for name, file in weight_map.items()}
        absent = sorted({str(path.name) for path in files.values() if not path.exists()})
        if absent:
            raise ValueError(f"{index} lists shards that are not in {folder}: {', '.join(absent)}.")
        return files
    single = folder / "model.safetensors"
    if not single.exists():
        raise ValueError(f"{folder} has neither model.safetensors nor model.safetensors.index.json.")
    with _opened(single) as file:
        return {name: single for name in file.keys()}


# The tensor dtypes a checkpoint's weights may have (safetensors' names): integer or quantized tensors would be
# cast to floats as if they were weights, and the model would compute garbage.
WEIGHT_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def _shapes(files: dict[str, pathlib.Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, read from the headers; a ValueError naming the file and tensor for a dtype that is
    not a float weight's."""
    shapes = {}
    for path in sorted(set(files.values())):
        with _opened(path) as file:
            for name in file.keys():
                tensor = file.get_slice(name)
                if tensor.get_dtype() not in WEIGHT_DTYPES:
                    raise ValueError(
                        f"{path}: tensor {name} is {tensor.get_dtype()}; expected float weights "
                        f"({', '.join(WEIGHT_DTYPES.values())}): integer and quantized checkpoints are not supported."
                    )
                shapes[name] = tuple(tensor.get_shape())
    return shapes


def expected_shapes(config: LMConfig) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor's name (layers numbered) -> its shape, as the config says."""
    spec = jax.eval_shape(CausalLM(config).init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]
    shapes = {}
    for pattern, (path, transposed) in hf_names(config).items():
        shape = _at(spec, path).shape
        per_layer = shape[1:] if path[0] == "layers" else shape
        per_layer = per_layer[::-1] if transposed else per_layer
        names = [pattern.format(i) for i in range(config.num_layers)] if "{}" in pattern else [pattern]
        shapes.update({name: tuple(per_layer) for name in names})
    return shapes


def load(
    path: str | os.PathLike[str], dtype: str = "float32", remat: bool = False, param_dtype: str | None = None
) -> tuple[CausalLM, dict]:
    """The model computing in `dtype` and its parameters ({"params": ...}, cast to `param_dtype`, by default
    `dtype`) from a Hugging Face folder.

    Raises ValueError, before reading any tensor, for an unknown architecture or option (`LMConfig.from_hf`),
    and for missing, extra or misshaped tensors (each named).
    """
    folder = pathlib.Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} is not a Hugging Face model folder: no config.json in it.")
    config = LMConfig.from_hf(read_json(folder / "config.json"), dtype=dtype, param_dtype=param_dtype, remat=remat)
    files = _weight_files(folder)
    found, expected = _shapes(files), expected_shapes(config)
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected) - ({"lm_head.weight"} if config.tie_embeddings else set()))
    misshaped = [
        f"{name} {found[name]} (expected {expected[name]})"
        for name in sorted(set(found) & set(expected))
        if found[name] != expected[name]
    ]
    problems = [
        f"{label}: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
        for label, names in (("missing", missing), ("unexpected", extra), ("misshaped", misshaped))
        if names
    ]
    if problems:
        raise ValueError(f"the weights in {folder} do not fit its config.json; " + "; ".join(problems) + ".")
    tensors = _read(files, config.weights_dtype)
    if config.tie_embeddings and "lm_head.weight" in tensors:
        if not np.array_equal(np.asarray(tensors["lm_head.weight"]), np.asarray(tensors["model.embed_tokens.weight"])):
            raise ValueError(f"tie_word_embeddings is true but lm_head.weight in {folder} differs from the embedding.")
    params: dict = {}
    for pattern, (target, transposed) in hf_names(config).items():
        take = lambda name: tensors[name].T if transposed else tensors[name]  # noqa: E731, B023 (used in this iteration)
        if "{}" in pattern:
            value = jnp.stack([take(pattern.format(i)) for i in range(config.num_layers)])
        else:
            value = take(pattern)
        _set(params, target, value)
    return CausalLM(config), {"params": params}


@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity
class Pretrained:
    """A checkpoint a run starts from: the model's shape and its tokenizer, read first (what they decide is
    checked before any weight is read), and its weights when asked (`read_weights`, once)."""

    path: str
    config: LMConfig
    tokenizer: Tokenizer = dataclasses.field(repr=False)

    def read_weights(self) -> dict:
        """The weights ({"params": ...}) in the config's dtype; every tensor checked (`load`)."""
        return load(self.path, dtype=self.config.dtype)[1]


def load_pretrained(path: str | os.PathLike[str]) -> Pretrained:
    """The shape (config.json) and tokenizer of a Hugging Face folder; the weights stay on disk until read."""
    tokenizer = load_tokenizer(path)
    return Pretrained(path=str(path), config=pretrained_config(str(path)), tokenizer=tokenizer)


def _read(files: dict[str, pathlib.Path], dtype: str) -> dict[str, jax.Array]:
    tensors = {}
    for path in sorted(set(files.values())):
        with _opened(path) as file:
            tensors.update({name: file.get_tensor(name).astype(dtype) for name in file.keys()})
    return tensors


def _at(tree: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        tree = tree[name]
    return tree


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for name in path[:-1]:
        tree = tree.setdefault(name, {})
    tree[path[-1]] = value


def hf_config(config: LMConfig) -> dict:
    """The `config.json` of a model of this shape: Qwen2 where only q/k/v have biases, else Llama."""
    qwen2 = config.qkv_bias and not config.output_bias and not config.mlp_bias
    hf = {
        "architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen2 else "llama",
        "hidden_act": "silu",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": config.initializer_range,
    }
    if not qwen2:
        hf.update(attention_bias=config.qkv_bias, mlp_bias=config.mlp_bias)
    if config.rope_scaling is not None:
        hf["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(config.rope_scaling)}
    return hf


def process_umask() -> int:
    """The process's file-mode creation mask, read without changing it where Linux shows it (`os.umask` sets it
    for every thread while it reads it)."""
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def readable_as_umask_allows(folder: pathlib.Path) -> None:
    """`folder` and its files with the modes a plain mkdir and open would give them (0755 and 0644 under umask
    022): the temporary folder and safetensors' file are private (0700, 0600), and an engine running as another
    user (a container, a shared cluster account) must read the weights."""
    mask = process_umask()
    os.chmod(folder, 0o777 & ~mask)
    for file in folder.iterdir():
        os.chmod(file, 0o666 & ~mask)


def save(
    path: str | os.PathLike[str],
    config: LMConfig,
    params: dict,
    *,
    config_json: dict | None = None,
    copy_files: Iterable[str | os.PathLike[str]] = (),
    dtype: str | None = None,
) -> pathlib.Path:
    """Writes a Hugging Face folder that `load` (and transformers, vLLM, SGLang) reads: `model.safetensors` in
    `dtype` (default: the params') and `config.json` (`config_json` if given, e.g. the checkpoint's own, else
    `hf_config`) whose dtype fields name the tensors' dtype, and copies `copy_files` (tokenizer files) beside them.

    The folder appears complete or not at all: everything is written into a temporary folder beside it, which
    is then renamed. An existing folder is refused (a version is written once).
    """
    from safetensors.flax import save_file

    folder = pathlib.Path(path)
    if folder.exists():
        raise ValueError(f"{folder} exists already; weights are written once per version.")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        tensors = {}
        for pattern, (source, transposed) in hf_names(config).items():
            value = _at(params["params"], source)
            names = [pattern.format(i) for i in range(config.num_layers)] if "{}" in pattern else [pattern]
            for index, name in enumerate(names):
                tensor = value[index] if "{}" in pattern else value
                tensors[name] = jnp.asarray(tensor.T if transposed else tensor, dtype)
        saved_dtypes = {str(tensor.dtype) for tensor in tensors.values()}
        if len(saved_dtypes) != 1:
            raise ValueError(f"the params mix dtypes {sorted(saved_dtypes)}; give save a dtype to write them in.")
        # transformers 4.x reads torch_dtype, 5.x dtype: both say what the file holds, so "auto" loads it as is.
        config_json = {**(config_json or hf_config(config)), "torch_dtype": saved_dtypes.pop()}
        config_json["dtype"] = config_json["torch_dtype"]
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
        for file in copy_files:
            shutil.copyfile(file, staging / pathlib.Path(file).name)
        readable_as_umask_allows(staging)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder

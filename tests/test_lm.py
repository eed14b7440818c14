"""The causal LM: transformers' logits on tiny random checkpoints (written by experiments/lm/lm_parity.py), the
loader's refusals, the config's two rope layouts, decoding through the KV cache."""

import json
import pathlib
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ftw_jax import lm
from ftw_jax.lm import LMConfig
from ftw_jax.lm.model import init_cache, tokens_flat_dot

DATA = pathlib.Path(__file__).parent / "data" / "lm"
CHECKPOINTS = ["qwen2-untied", "qwen2-tied", "llama3-scaled"]


def _reference(name: str) -> dict:
    return dict(np.load(DATA / name / "reference.npz"))


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_logits_equal_transformers(name):
    model, params = lm.load(DATA / name)
    reference = _reference(name)
    logits = model.apply(params, jnp.asarray(reference["tokens"]))
    assert logits.dtype == jnp.float32 and logits.shape == reference["logits"].shape
    assert np.abs(np.asarray(logits) - reference["logits"]).max() <= 1e-5
    assert np.abs(reference["logits"]).max() > 0.5  # the weights are random enough for the logits to differ


def test_left_padded_logits_equal_transformers_at_real_positions():
    model, params = lm.load(DATA / "qwen2-untied")
    reference = _reference("qwen2-untied")
    mask = reference["attention_mask"].astype(bool)
    logits = model.apply(
        params, jnp.asarray(reference["padded_tokens"]), jnp.asarray(reference["position_ids"]), jnp.asarray(mask)
    )
    assert np.abs(np.asarray(logits)[mask] - reference["padded_logits"][mask]).max() <= 1e-5


def test_what_each_checkpoint_exercises():
    configs = {name: lm.load(DATA / name)[0].config for name in CHECKPOINTS}
    assert configs["qwen2-untied"].qkv_bias and not configs["qwen2-untied"].tie_embeddings
    assert configs["qwen2-untied"].num_kv_heads < configs["qwen2-untied"].num_heads  # grouped-query attention
    assert configs["qwen2-tied"].tie_embeddings and (DATA / "qwen2-tied" / "model.safetensors.index.json").exists()
    llama = configs["llama3-scaled"]
    assert not llama.qkv_bias and llama.rope_scaling is not None
    assert llama.head_dim != llama.hidden_size // llama.num_heads
    # Its frequencies fall in all three of Llama 3's regimes: kept, interpolated, divided by the factor.
    plain = np.array(llama.replace(rope_scaling=None).inverse_frequencies())
    ratios = plain / np.array(llama.inverse_frequencies())
    factor = llama.rope_scaling.factor
    assert ratios[0] == 1 and 1 < ratios[1] < factor and np.allclose(ratios[2:], factor)
    params = lm.load(DATA / "qwen2-untied")[1]["params"]["layers"]["self_attn"]
    assert min(np.abs(np.asarray(params[name]["bias"])).min() for name in ("q_proj", "k_proj", "v_proj")) > 0


def test_rope_settings_read_from_either_layout():
    written = json.loads((DATA / "llama3-scaled" / "config.json").read_text())  # transformers 5.x: rope_parameters
    parameters = dict(written.pop("rope_parameters"))
    older = {**written, "rope_theta": parameters.pop("rope_theta"), "rope_scaling": parameters}  # 4.x
    assert LMConfig.from_hf(older) == LMConfig.from_hf(json.loads((DATA / "llama3-scaled" / "config.json").read_text()))
    older["rope_scaling"] = {**parameters, "type": "llama3"}  # older still: "type" for "rope_type"
    del older["rope_scaling"]["rope_type"]
    assert LMConfig.from_hf(older).rope_scaling.factor == parameters["factor"]
    plain = {**written, "rope_parameters": {"rope_theta": 7.0, "rope_type": "default"}}
    assert LMConfig.from_hf(plain).rope_theta == 7.0 and LMConfig.from_hf(plain).rope_scaling is None


@pytest.mark.slow
def test_fresh_weights_have_the_configs_initializer_range():
    written = json.loads((DATA / "qwen2-untied" / "config.json").read_text())
    assert LMConfig.from_hf(written).initializer_range == written["initializer_range"] == 0.02
    config = LMConfig.from_hf({**written, "initializer_range": 0.5})
    params = lm.CausalLM(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
    assert abs(float(np.std(np.asarray(params["layers"]["mlp"]["up_proj"]["kernel"]))) - 0.5) < 0.02
    with pytest.raises(ValueError, match="initializer_range must be > 0"):
        LMConfig.from_hf({**written, "initializer_range": 0})


def _copy(name: str, tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / name
    shutil.copytree(DATA / name, folder)
    return folder


def _edit_config(folder: pathlib.Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _edit_tensors(folder: pathlib.Path, edit) -> None:
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors")


def test_loader_refuses_what_it_cannot_run(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        lm.load(tmp_path)
    folder = _copy("qwen2-untied", tmp_path)
    _edit_config(folder, architectures=["MistralForCausalLM"])
    with pytest.raises(ValueError, match=r"architectures \['MistralForCausalLM'\].*LlamaForCausalLM, Qwen2ForCausalLM"):
        lm.load(folder)
    _edit_config(folder, architectures=["Qwen2ForCausalLM"], use_sliding_window=True)
    with pytest.raises(ValueError, match="sliding-window attention is not supported"):
        lm.load(folder)
    _edit_config(folder, use_sliding_window=False, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4})
    with pytest.raises(ValueError, match="rope type 'yarn'"):
        lm.load(folder)
    _edit_config(folder, rope_parameters={"rope_type": "default", "rope_theta": 1e4}, num_key_value_heads=3)
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"):
        lm.load(folder)
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, got 'float16'"):
        lm.load(DATA / "qwen2-untied", dtype="float16")


def test_loader_names_missing_extra_and_misshaped_tensors(tmp_path):
    folder = _copy("qwen2-untied", tmp_path)
    _edit_tensors(folder, lambda tensors: tensors.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing: model\.layers\.1\.mlp\.up_proj\.weight\.$"):
        lm.load(folder)
    folder = _copy("qwen2-untied", tmp_path / "extra")
    _edit_tensors(folder, lambda tensors: tensors.update({"model.layers.0.self_attn.o_proj.bias": np.zeros(32, "f4")}))
    with pytest.raises(ValueError, match=r"unexpected: model\.layers\.0\.self_attn\.o_proj\.bias"):
        lm.load(folder)
    folder = _copy("qwen2-untied", tmp_path / "misshaped")
    _edit_tensors(folder, lambda tensors: tensors.update({"model.norm.weight": np.ones(31, "f4")}))
    with pytest.raises(ValueError, match=r"misshaped: model\.norm\.weight \(31,\) \(expected \(32,\)\)"):
        lm.load(folder)
    folder = _copy("qwen2-tied", tmp_path)
    (folder / "model-00003-of-00005.safetensors").unlink()
    with pytest.raises(ValueError, match="lists shards that are not in .*: model-00003-of-00005.safetensors"):
        lm.load(folder)


def test_a_tied_checkpoint_may_carry_its_lm_head_only_if_it_equals_the_embedding(tmp_path):
    folder = _copy("qwen2-untied", tmp_path)
    _edit_config(folder, tie_word_embeddings=True)
    with pytest.raises(ValueError, match="lm_head.weight .* differs from the embedding"):
        lm.load(folder)
    _edit_tensors(folder, lambda tensors: tensors.update({"lm_head.weight": tensors["model.embed_tokens.weight"]}))
    model, params = lm.load(folder)
    assert model.config.tie_embeddings and "lm_head" not in params["params"]


@pytest.mark.slow
def test_bfloat16_computes_close_to_float32():
    model32, params32 = lm.load(DATA / "llama3-scaled")
    model16, params16 = lm.load(DATA / "llama3-scaled", dtype="bfloat16")
    assert all(leaf.dtype == jnp.bfloat16 for leaf in jax.tree.leaves(params16))
    tokens = jnp.asarray(_reference("llama3-scaled")["tokens"])
    logits16 = model16.apply(params16, tokens)
    assert logits16.dtype == jnp.float32  # logits in float32 whatever the compute dtype
    reference = np.asarray(model32.apply(params32, tokens))
    assert 0 < np.abs(np.asarray(logits16) - reference).max() < 0.05 * np.abs(reference).max()


@pytest.mark.slow
def test_float32_master_weights_compute_exactly_as_bfloat16_weights():
    """Mixed precision: float32 parameters cast to bfloat16 where they are used give the logits of bfloat16
    parameters bit for bit, and the gradient reaches the float32 parameters in float32."""
    model16, params16 = lm.load(DATA / "qwen2-untied", dtype="bfloat16")
    mixed, master = lm.load(DATA / "qwen2-untied", dtype="bfloat16", param_dtype="float32")
    tokens = jnp.asarray(_reference("qwen2-untied")["tokens"])
    fresh = jax.eval_shape(mixed.init, jax.random.key(0), tokens)
    for params in (master, fresh):
        assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    np.testing.assert_array_equal(mixed.apply(master, tokens), model16.apply(params16, tokens))
    grads = jax.grad(lambda p: jnp.mean(jax.nn.log_softmax(mixed.apply(p, tokens))[..., 0]))(master)
    assert {leaf.dtype for leaf in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    assert all(np.any(np.asarray(leaf) != 0) for leaf in jax.tree.leaves(grads))


def test_a_saved_folder_says_the_dtype_it_holds(tmp_path):
    """config.json's torch_dtype and dtype name the tensors' dtype (transformers loads "auto" by them), whatever
    the config.json given says; save casts to the dtype asked for."""
    model, params = lm.load(DATA / "qwen2-untied")
    for dtype in ("float32", "bfloat16"):
        folder = lm.save(
            tmp_path / dtype, model.config, params, config_json={"dtype": "float16", "torch_dtype": "x"}, dtype=dtype
        )
        data = (folder / "model.safetensors").read_bytes()
        header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
        assert {entry["dtype"] for name, entry in header.items() if name != "__metadata__"} == {
            {"float32": "F32", "bfloat16": "BF16"}[dtype]
        }
        written = json.loads((folder / "config.json").read_text())
        assert (written["torch_dtype"], written["dtype"]) == (dtype, dtype)


@pytest.mark.slow
def test_remat_changes_neither_logits_nor_gradients():
    model, params = lm.load(DATA / "qwen2-untied")
    remat = lm.CausalLM(model.config.replace(remat=True))
    tokens = jnp.asarray(_reference("qwen2-untied")["tokens"])
    loss = lambda m: lambda p: jnp.mean(jax.nn.log_softmax(m.apply(p, tokens))[..., 0])  # noqa: E731
    chex_close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # noqa: E731
    jax.tree.map(chex_close, jax.grad(loss(remat))(params), jax.grad(loss(model))(params))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_products_over_flattened_tokens_equal_flax_dense(dtype):
    """`tokens_flat_dot` (the LM's products, flattened for XLA's CPU backward) gives Dense's values and gradients."""
    x = jax.random.normal(jax.random.key(0), (3, 5, 8))
    flat, plain = (nn.Dense(6, dtype=dtype, dot_general=dot) for dot in (tokens_flat_dot, jax.lax.dot_general))
    params = plain.init(jax.random.key(1), x)
    for inputs in (x, x[0], x[0, 0]):  # [B, L, D], [L, D], [D]
        loss = lambda m, p, v: jnp.sum(jnp.sin(m.apply(p, v).astype(jnp.float32)))  # noqa: E731
        assert flat.apply(params, inputs).shape == plain.apply(params, inputs).shape
        np.testing.assert_array_equal(flat.apply(params, inputs), plain.apply(params, inputs))
        for a, b in zip(jax.grad(loss, (1, 2))(flat, params, inputs), jax.grad(loss, (1, 2))(plain, params, inputs)):
            jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-6), a, b)


@pytest.mark.slow
def test_decoding_through_the_cache_equals_the_full_forward():
    model, params = lm.load(DATA / "qwen2-untied")
    reference = _reference("qwen2-untied")
    tokens, positions = jnp.asarray(reference["padded_tokens"]), jnp.asarray(reference["position_ids"])
    mask = jnp.asarray(reference["attention_mask"].astype(bool))
    full = np.asarray(model.apply(params, tokens, positions, mask))
    prompt, slots = 7, tokens.shape[1] + 3  # a prompt, then one token at a time; spare slots stay masked out
    key_mask = jnp.concatenate([mask, jnp.zeros((2, 3), bool)], axis=1)
    key_mask = key_mask.at[:, prompt:].set(True)
    logits, cache = model.apply(
        params,
        tokens[:, :prompt],
        positions[:, :prompt],
        key_mask,
        cache=init_cache(model.config, 2, slots),
        cache_index=0,
    )
    steps = [np.asarray(logits)]
    for index in range(prompt, tokens.shape[1]):
        logits, cache = model.apply(
            params,
            tokens[:, index : index + 1],
            positions[:, index : index + 1],
            key_mask,
            cache=cache,
            cache_index=index,
        )
        steps.append(np.asarray(logits))
    decoded = np.concatenate(steps, axis=1)
    real = np.asarray(mask)
    assert np.abs(decoded[real] - full[real]).max() <= 1e-5


def test_saved_weights_are_readable_as_the_umask_allows(tmp_path):
    """A version folder and its files get the modes mkdir and open would give (0755 / 0644 under umask 022), not
    the private ones of a temporary folder and of safetensors' file (0700 / 0600): an engine running as another
    user reads them."""
    import os
    import stat

    from ftw_jax.lm import CausalLM, save
    from ftw_jax.lm.config import tiny_config

    config = tiny_config(16)
    params = CausalLM(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    old_mask = os.umask(0o022)
    try:
        save(tmp_path / "weights", config, params)
    finally:
        os.umask(old_mask)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in (tmp_path / "weights").iterdir()}
    assert stat.S_IMODE((tmp_path / "weights").stat().st_mode) == 0o755
    assert modes == {"model.safetensors": 0o644, "config.json": 0o644}

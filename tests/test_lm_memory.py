"""The LM's memory estimate: exact parameter counts, and activations within a factor of 1.5 of XLA's count."""

import functools
import json
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from conftest import with_cpu_devices

from ftw_jax.agent.compiled_memory import compiled_memory, learn_config, model_config
from ftw_jax.lm import CausalLM, LMConfig
from ftw_jax.lm.memory import QWEN2_5, memory_estimate, parameter_count


def _counted(config: LMConfig) -> int:
    spec = jax.eval_shape(CausalLM(config).init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))
    return sum(leaf.size for leaf in jax.tree.leaves(spec))


@pytest.mark.parametrize(
    "config",
    [
        LMConfig(
            vocab_size=50,
            hidden_size=16,
            intermediate_size=24,
            num_layers=3,
            num_heads=4,
            num_kv_heads=2,
            head_dim=6,
            qkv_bias=True,
        ),
        LMConfig(
            vocab_size=50,
            hidden_size=16,
            intermediate_size=24,
            num_layers=2,
            num_heads=2,
            num_kv_heads=1,
            head_dim=8,
            qkv_bias=True,
            output_bias=True,
            mlp_bias=True,
            tie_embeddings=True,
        ),
    ],
    ids=["qwen2-like", "every-bias-tied"],
)
def test_parameter_count_is_the_models(config):
    assert parameter_count(config) == _counted(config)


def test_qwen2_5_sizes_are_the_published_ones():
    published = {"0.5B": 0.49e9, "1.5B": 1.54e9, "3B": 3.09e9}  # Qwen2.5's model cards
    for name, config in QWEN2_5.items():
        assert parameter_count(config) == _counted(config)
        assert abs(parameter_count(config) / published[name] - 1) < 0.01


@pytest.mark.slow
@pytest.mark.parametrize("remat", [False, True])
def test_activation_estimate_is_within_a_factor_of_xlas_count(remat):
    config = LMConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        qkv_bias=True,
        remat=remat,
    )
    model, batch, length = CausalLM(config), 4, 256
    tokens = jnp.zeros((batch, length), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), tokens)

    def loss(params, tokens):
        log_probs = jax.nn.log_softmax(model.apply(params, tokens))
        return -jnp.take_along_axis(log_probs, tokens[..., None], axis=-1).mean()

    measured = jax.jit(jax.grad(loss)).lower(params, tokens).compile().memory_analysis().temp_size_in_bytes
    estimate = memory_estimate(config, batch, length)
    assert 1 / 1.5 < (estimate["activations"] + estimate["logits"]) / measured < 1.5
    assert estimate["optimizer_state"] == 2 * estimate["parameters"] == 2 * 4 * parameter_count(config)


def test_remat_bfloat16_and_fused_attention_shrink_the_estimate():
    config = QWEN2_5["0.5B"]
    plain = memory_estimate(config, batch=8, length=1024)
    assert memory_estimate(config.replace(remat=True), 8, 1024)["activations"] < plain["activations"] / 4
    assert memory_estimate(config, 8, 1024, fused_attention=True)["activations"] < plain["activations"]
    half = memory_estimate(config.replace(dtype="bfloat16"), 8, 1024)
    assert half["parameters"] * 2 == plain["parameters"] and half["kv_cache"] * 2 == plain["kv_cache"]
    # The KV cache: 2 (keys, values) x 24 layers x 8 rows x 1024 slots x 2 heads x 64 x 4 bytes.
    assert plain["kv_cache"] == 2 * 24 * 8 * 1024 * 2 * 64 * 4


def test_master_weights_and_logits_in_chunks_change_what_they_should():
    config = QWEN2_5["0.5B"]
    half = memory_estimate(config.replace(dtype="bfloat16"), 8, 1024)
    mixed = memory_estimate(config.replace(dtype="bfloat16", param_dtype="float32"), 8, 1024)
    for name in ("parameters", "gradients", "optimizer_state"):
        assert mixed[name] == 2 * half[name]
    assert mixed["activations"] == half["activations"] and mixed["kv_cache"] == half["kv_cache"]
    chunked = memory_estimate(config, 8, 1024, logits_chunk=128)
    assert chunked["logits"] * 8 == memory_estimate(config, 8, 1024)["logits"]
    assert chunked["logits"] == 3 * 8 * 128 * config.vocab_size * 4


# Logits [8, 32, 2048] outweigh everything else, as a real vocabulary's do.
_WIDE_VOCABULARY = LMConfig(
    vocab_size=2048,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    qkv_bias=True,
    tie_embeddings=True,
)


@functools.cache
def _compiled(loss, *, chunk=None, **options):
    """`compiled_memory` of lm learn's update for _WIDE_VOCABULARY (bfloat16 compute, float32 weights, remat),
    8 trajectories of 32 steps in the loss."""
    model = model_config(_WIDE_VOCABULARY, remat=True)
    config = learn_config(loss=loss, chunk=chunk, max_length=33, episodes=8, pool=16)
    return compiled_memory(model, config, **options)


def test_compiled_memory_of_the_lm_update_counts_its_buffers():
    dense, chunked = _compiled("dense"), _compiled("chunked", chunk=8)
    for row in (dense, chunked):
        assert row["arguments"] > 0 and row["outputs"] > 0 and row["temps"] > 0 and row["compile_seconds"] > 0
        assert row["peak"] == row["arguments"] + row["outputs"] + row["temps"] - row["aliased"]
    assert dense["logits_chunk"] == 0 and chunked["logits_chunk"] == 8
    assert dense["temps"] > 8 * 32 * 2048 * 4  # the dense loss holds float32 [J·K, T, V] logits at least once
    assert chunked["temps"] < dense["temps"] and chunked["peak"] < dense["peak"]
    assert chunked["arguments"] == dense["arguments"] and dense["aliased"] == 0  # compiled without donation


@pytest.mark.slow
def test_a_donated_state_and_a_bfloat16_reference_shrink_the_compiled_update():
    dense, donated = _compiled("dense"), _compiled("dense", donate=True)
    assert donated["aliased"] > 0 and donated["peak"] < dense["peak"]  # the state's buffers are reused
    # The reference in the compute dtype (bfloat16) under float32 master weights, as lm learn keeps it: 2 bytes
    # a parameter less than a float32 copy.
    float32_reference = _compiled("dense", reference_dtype="float32")
    assert float32_reference["arguments"] - dense["arguments"] == 2 * parameter_count(_WIDE_VOCABULARY)


# Runs in a fresh process: the device count is fixed when JAX starts.
_MESH_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[2])
from test_lm_memory import _WIDE_VOCABULARY
from ftw_jax.agent.compiled_memory import compiled_memory, learn_config, model_config
model = model_config(_WIDE_VOCABULARY, remat=True)
config = learn_config(max_length=33, episodes=8, pool=16)
print(json.dumps({
    "one": compiled_memory(model, config),
    **{placement: compiled_memory(model, config, mesh=(2, 2), placement=placement)
       for placement in ("learn", "sharded")},
}))
"""


@pytest.mark.slow
def test_compiled_memory_on_a_mesh_is_per_device():
    result = subprocess.run(
        [sys.executable, "-c", _MESH_SCRIPT, "", str(pathlib.Path(__file__).parent)],
        env=with_cpu_devices(4),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    one, learn, sharded = rows["one"], rows["learn"], rows["sharded"]
    # Every state leaf split like its parameter over 2 x 2 devices: well under half of one device's arguments.
    assert 0 < sharded["arguments"] < one["arguments"] / 2
    assert sharded["arguments"] <= learn["arguments"] <= one["arguments"]

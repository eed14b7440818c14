"""The LM sharded over a 2 × 2 (data, model) mesh of 4 forced CPU devices computes what it does on one."""

import json
import pathlib
import subprocess
import sys

import jax
import pytest
from conftest import with_cpu_devices

from ftw_jax.lm.sharding import PartitionSpec, make_mesh, param_specs

DATA = pathlib.Path(__file__).parent / "data" / "lm"

# Runs in a fresh process: the device count is fixed when JAX starts.
SCRIPT = """
import json, sys
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import NamedSharding
from ftw_jax import lm
from ftw_jax.lm.sharding import BATCH, make_mesh, shard_params

model, params = lm.load(sys.argv[1])
tokens = jnp.asarray(np.load(sys.argv[1] + "/reference.npz")["tokens"])
optimizer = optax.sgd(0.5)  # not Adam: its m/√v turns rounding in near-zero gradients into lr-sized steps

def loss(params, tokens):  # next-token cross-entropy
    log_probs = jax.nn.log_softmax(model.apply(params, tokens[:, :-1]))
    return -jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1).mean()

@jax.jit
def step(params, opt_state, tokens):
    value, grads = jax.value_and_grad(loss)(params, tokens)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

mesh = make_mesh(data=2, model=2)
sharded = shard_params(params, mesh)
sharded_tokens = jax.device_put(tokens, NamedSharding(mesh, BATCH))
forward = jax.jit(model.apply)
plain_params, _, plain_loss = step(params, optimizer.init(params), tokens)
new_params, _, sharded_loss = step(sharded, optimizer.init(sharded), sharded_tokens)
q = sharded["params"]["layers"]["self_attn"]["q_proj"]["kernel"]
print(json.dumps({
    "devices": jax.device_count(),
    "forward": float(jnp.abs(forward(sharded, sharded_tokens) - forward(params, tokens)).max()),
    "loss": abs(float(sharded_loss) - float(plain_loss)),
    "step": max(
        float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(plain_params))
    ),
    "moved": max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(params))),
    "q_shard": list(q.addressable_shards[0].data.shape), "q_shape": list(q.shape),
    "stepped_sharding": str(new_params["params"]["layers"]["self_attn"]["q_proj"]["kernel"].sharding.spec),
}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2-untied", "llama3-scaled"])
def test_sharded_forward_and_gradient_step_equal_the_unsharded_ones(name):
    env = with_cpu_devices(4)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(DATA / name)], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["devices"] == 4
    assert measured["forward"] <= 1e-5 and measured["loss"] <= 1e-6 and measured["step"] <= 1e-6
    assert measured["moved"] > 1e-3  # the step did change the parameters
    layers, width, heads = measured["q_shape"]
    assert measured["q_shard"] == [layers, width // 2, heads // 2]  # split over both mesh axes
    assert "data" in measured["stepped_sharding"] and "model" in measured["stepped_sharding"]  # stays sharded


def test_partition_specs_split_what_the_mesh_divides():
    from ftw_jax import lm

    _, params = lm.load(DATA / "qwen2-untied")
    mesh = make_mesh(data=1, model=1)
    specs = param_specs(params, mesh)["params"]
    assert specs["layers"]["self_attn"]["q_proj"]["kernel"] == PartitionSpec(None, "data", "model")
    assert specs["layers"]["self_attn"]["o_proj"]["kernel"] == PartitionSpec(None, "model", "data")
    assert specs["layers"]["mlp"]["down_proj"]["kernel"] == PartitionSpec(None, "model", "data")
    assert specs["layers"]["self_attn"]["q_proj"]["bias"] == PartitionSpec(None, "model")
    assert specs["embed_tokens"]["embedding"] == PartitionSpec("model", "data")
    assert (
        specs["norm"]["weight"] == PartitionSpec() and specs["layers"]["input_layernorm"]["weight"] == PartitionSpec()
    )
    # An axis that the mesh axis does not divide stays whole: 3 divides the vocabulary (96) and nothing else.
    odd = param_specs(params, jax.sharding.AbstractMesh((1, 3), ("data", "model")))["params"]
    assert odd["layers"]["self_attn"]["q_proj"]["kernel"] == PartitionSpec(None, "data", None)
    assert odd["embed_tokens"]["embedding"] == PartitionSpec("model", "data")
    with pytest.raises(ValueError, match="a 2 x 3 mesh needs 6 devices; 1 are available"):
        make_mesh(2, 3, devices=jax.devices()[:1])

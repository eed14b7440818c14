"""Partition specs for the LM's parameters on a (data, model) device mesh: fully sharded data parallel over
"data", tensor parallel (Megatron's split) over "model".

    mesh = make_mesh(data=2, model=2)                     # 4 devices
    params = shard_params(params, mesh)                   # each array laid out by `param_specs`
    tokens = jax.device_put(tokens, NamedSharding(mesh, BATCH))   # the batch split over "data"
    logits = jax.jit(model.apply)(params, tokens)         # XLA inserts the collectives

Tensor parallel: the q/k/v, gate and up projections are split by output column (heads, MLP units) over
"model", o_proj and down_proj by input row, so each device computes its heads and units and one reduction
joins them; the embedding and the output head are split by vocabulary. FSDP: the other (hidden-size) axis of
every matrix is split over "data" and gathered when used. An axis that the mesh axis does not divide stays
whole (a tiny test model on a large mesh is still correct, only less split). Norm scales are replicated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

DATA, MODEL = "data", "model"
BATCH = PartitionSpec(DATA)  # tokens [B, L]: rows over "data"

# Per parameter (its last path names): the mesh axis of each of its axes, layers' stacking axis excluded.
_LAYOUT = {
    ("embed_tokens", "embedding"): (MODEL, DATA),  # [V, D]
    ("lm_head",): (MODEL, DATA),  # [V, D]
    **{(name, "kernel"): (DATA, MODEL) for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},  # [D, out]
    **{(name, "bias"): (MODEL,) for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
    **{(name, "kernel"): (MODEL, DATA) for name in ("o_proj", "down_proj")},  # [in, D]
    **{(name, "bias"): (None,) for name in ("o_proj", "down_proj")},
}


def make_mesh(
    data: int,
    model: int,
    devices: Iterable[jax.Device] | None = None,  # pyright: ignore[reportInvalidTypeForm] (jaxlib's Device has no stub)
) -> Mesh:
    """A data × model mesh over the first data·model devices (default: all of jax.devices())."""
    devices = list(jax.devices() if devices is None else devices)
    if data < 1 or model < 1 or data * model > len(devices):
        raise ValueError(f"a {data} x {model} mesh needs {data * model} devices; {len(devices)} are available.")
    return Mesh(np.array(devices[: data * model]).reshape(data, model), (DATA, MODEL))


def param_specs(params: Any, mesh: Mesh | AbstractMesh) -> Any:
    """A PartitionSpec per parameter (same tree as `params`, arrays or ShapeDtypeStructs); only the mesh's
    axis sizes are read (an `AbstractMesh` will do)."""

    def spec(path, leaf) -> PartitionSpec:
        names = tuple(getattr(entry, "key", str(entry)) for entry in path)
        stacked = "layers" in names  # [layers, ...]: the stacking axis stays whole
        layout = next((axes for suffix, axes in _LAYOUT.items() if names[-len(suffix) :] == suffix), None)
        if layout is None:  # norm scales
            return PartitionSpec()
        shape = leaf.shape[1:] if stacked else leaf.shape
        axes = [axis if axis and size % mesh.shape[axis] == 0 else None for axis, size in zip(layout, shape)]
        return PartitionSpec(*([None] if stacked else []), *axes)

    return jax.tree_util.tree_map_with_path(spec, params)


def shard_params(params: Any, mesh: Mesh) -> Any:
    """`params` placed on the mesh as `param_specs` lays them out. The mesh may span several processes (hosts),
    each holding the whole `params` (read from the same checkpoint): each device gets its block."""
    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), param_specs(params, mesh))
    return jax.tree.map(
        lambda leaf, sharding: jax.make_array_from_callback(
            leaf.shape, sharding, lambda index: np.asarray(leaf)[index]
        ),
        params,
        shardings,
    )


def replicated(tree: Any, mesh: Mesh) -> Any:
    """Host arrays, the same on every process, as global arrays that every device of `mesh` holds whole."""
    sharding = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(
        lambda leaf: jax.make_array_from_callback(np.shape(leaf), sharding, lambda index: np.asarray(leaf)[index]), tree
    )

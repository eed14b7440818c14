"""XLA's memory count, per device, of the LM learner's compiled update and init at a model's real sizes.

The learner `lm learn` builds (`EpisodeLearner.build`) is lowered and compiled with abstract inputs
(`jax.ShapeDtypeStruct`: no weight is allocated), on one device or laid out on a mesh as `lm learn` lays it out.
`compiled.memory_analysis()` then gives XLA's buffer sizes per device: arguments, outputs, temporaries, and the
bytes where an output reuses an input's buffer (aliased). Peak = arguments + outputs + temporaries − aliased.

    model = model_config("3B", remat=True)                     # Qwen2.5-3B, bfloat16 compute, float32 weights
    row = compiled_memory(model, learn_config(loss="chunked"), donate=True)
    row["peak"], init_memory(model, learn_config())["peak"]     # bytes per device

A mesh of D×M needs D·M devices: on a CPU host, XLA's forced host device count, set before JAX starts.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from ftw_jax.agent.learner import EpisodeLearner, LearnConfig, token_trajectory_spec
from ftw_jax.algos.ftw import FTWConfig
from ftw_jax.lm.config import LMConfig
from ftw_jax.lm.memory import QWEN2_5
from ftw_jax.lm.model import CausalLM
from ftw_jax.lm.sharding import make_mesh, param_specs

# Qwen2.5-7B's published config.json: 7.62B parameters, untied embeddings, q/k/v biases, 28 query heads sharing
# 4 key/value heads.
QWEN2_5_7B = LMConfig(
    vocab_size=152_064,
    hidden_size=3584,
    intermediate_size=18_944,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    qkv_bias=True,
    tie_embeddings=False,
)
MODELS = {**QWEN2_5, "7B": QWEN2_5_7B}

# The update's default sizes: B = 8 episodes per iteration into a pool of N = 64, J = 4 minibatches of C = 4 with
# the top K = 2 kept: J·K = 8 trajectories of T = 1024 steps in the loss (J·K < N: the gathered path).
EPISODES, POOL, NUM_BATCHES, BATCH_SIZE, NUM_ELITES, MAX_LENGTH = 8, 64, 4, 4, 2, 1025

Dtype = Literal["float32", "bfloat16"]
LOSSES = ("dense", "chunked")
PLACEMENTS = ("learn", "sharded")


def model_config(name_or_config: str | LMConfig, *, remat: bool, param_dtype: Dtype = "float32") -> LMConfig:
    """A model shape (a key of MODELS, or a config) computing in bfloat16 with `param_dtype` parameters (float32:
    master weights), remat as given."""
    config = MODELS[name_or_config] if isinstance(name_or_config, str) else name_or_config
    return config.replace(dtype="bfloat16", param_dtype=param_dtype, remat=remat)


def learn_config(
    *,
    loss: str = "dense",
    chunk: int | None = None,
    param_dtype: Dtype = "float32",
    monitor_entries: int = 0,
    max_length: int = MAX_LENGTH,
    episodes: int = EPISODES,
    pool: int = POOL,
    num_batches: int = NUM_BATCHES,
    batch_size: int = BATCH_SIZE,
    num_elites: int = NUM_ELITES,
    algorithm: str = "ftw",
    lora_rank: int | None = None,
) -> LearnConfig:
    """`lm learn`'s settings for one update: U = 1 update, Adam, β = 0.05, bfloat16 compute, the trust-region
    monitor off unless `monitor_entries`. loss "dense": logits of the whole batch; "chunked": `chunk` steps at a
    time (None: LearnConfig's automatic choice). A baseline (`algorithm`) learns from the B episodes with lm
    learn's settings of it (Search-R1's), in groups of 4 (B = 8 is no multiple of Search-R1's 5)."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}.")
    if algorithm != "ftw":
        from ftw_jax import algos
        from ftw_jax.algos.defaults import SEARCH_R1

        groups = {"grpo": {"group_size": 4}, "reinforce": {"leave_one_out": 4}}.get(algorithm, {})
        baseline = algos.get(algorithm).config(**{**SEARCH_R1.get(algorithm, {}), **groups})
        return dataclasses.replace(
            learn_config(
                loss=loss,
                chunk=chunk,
                param_dtype=param_dtype,
                max_length=max_length,
                episodes=episodes,
                lora_rank=lora_rank,
            ),
            algorithm=algorithm,
            algorithm_config=baseline,
        )
    return LearnConfig(
        max_length=max_length,
        episodes_per_iteration=episodes,
        kl_coef=0.05,
        optimizer="adam",
        dtype="bfloat16",
        param_dtype=param_dtype,
        algorithm_config=FTWConfig(
            pool_capacity=pool,
            num_batches=num_batches,
            batch_size=batch_size,
            num_elites=num_elites,
            updates_per_iteration=1,
            monitor_entries=monitor_entries,
        ),
        logits_chunk=0 if loss == "dense" else chunk,
        lora_rank=lora_rank,
    )


def _abstract(tree: Any, shardings: Any = None) -> Any:
    """ShapeDtypeStructs of `tree`'s leaves, laid out by `shardings` (a tree of Shardings) where given."""
    if shardings is None:
        return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), tree)
    return jax.tree.map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding), tree, shardings
    )


def _abstract_params(model: LMConfig, mesh: jax.sharding.Mesh | None) -> Any:
    """The CausalLM's params as ShapeDtypeStructs, laid out as `lm learn --mesh` lays them out (`param_specs`)."""
    params = jax.eval_shape(CausalLM(model).init, jax.random.key(0), jnp.zeros((1, 1), jnp.int32))
    if mesh is None:
        return params
    return _abstract(params, jax.tree.map(lambda spec: NamedSharding(mesh, spec), param_specs(params, mesh)))


def learner_inputs(
    learner: EpisodeLearner, mesh: jax.sharding.Mesh | None, placement: str = "learn"
) -> tuple[Any, Any, Any]:
    """(state, batch [B, T], iteration) of `learner.learn` as ShapeDtypeStructs.

    On `mesh` the parameters are laid out by `param_specs`, as `lm learn --mesh` lays them out; the rest of the
    state as lm learn's compiled `init` places it (placement "learn") or by `param_specs` (placement "sharded":
    the same layout, measured apart); the batch and the iteration are replicated. None: one device, as lm learn
    without a mesh.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}.")
    params = _abstract_params(learner.model_config, mesh)
    state = jax.eval_shape(learner.init_program(params), params)  # not `init`: it checks this host's memory
    examples = learner.config.episodes_per_iteration
    batch = jax.eval_shape(
        lambda: jax.tree.map(
            lambda leaf: jnp.zeros((examples, *leaf.shape), leaf.dtype),
            token_trajectory_spec(learner.config.num_steps),
        )
    )
    iteration = jax.ShapeDtypeStruct((), jnp.int32)
    if mesh is None:
        return _abstract(state), _abstract(batch), iteration
    replicated = NamedSharding(mesh, PartitionSpec())
    if placement == "learn":  # what lm learn does on a mesh: sharded params into its compiled init, which shards all
        shardings = learner.init_program(params).lower(params).compile().output_shardings
    else:
        shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), param_specs(state, mesh))
    return (
        _abstract(state, shardings),
        _abstract(batch, jax.tree.map(lambda _: replicated, batch)),
        jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated),
    )


def _sizes(compiled: jax.stages.Compiled) -> dict[str, int]:
    """XLA's buffer sizes of a compiled program, per device, and their peak-ish sum."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        raise RuntimeError(f"the {jax.default_backend()} backend gives no memory analysis.")
    sizes = {
        "arguments": analysis.argument_size_in_bytes,
        "outputs": analysis.output_size_in_bytes,
        "temps": analysis.temp_size_in_bytes,
        "aliased": analysis.alias_size_in_bytes,
        "generated_code": analysis.generated_code_size_in_bytes,
    }
    sizes["peak"] = sizes["arguments"] + sizes["outputs"] + sizes["temps"] - sizes["aliased"]
    return sizes


def compiled_memory(
    model: LMConfig,
    config: LearnConfig,
    *,
    mesh: tuple[int, int] = (1, 1),
    placement: str = "learn",
    donate: bool = False,
    reference_dtype: str | None = None,
) -> dict[str, Any]:
    """XLA's memory analysis of `lm learn`'s compiled update, `learn(state, batch, iteration)` (the batch into
    the pool, selection, the updates), for `model` and `config`, per device, in bytes.

    Args:
      mesh: (data, model) devices; (1, 1) is one device without a mesh.
      placement: on a mesh, "learn" (the state as lm learn's init lays it out) or "sharded" (every leaf by
        `param_specs`).
      donate: compile `learn` as lm learn runs it, the learner state donated (its buffers reused by the outputs);
        False: the same update without donation.
      reference_dtype: keep the KL's reference params in this dtype instead of the parameters' (a state that
        `init` does not make: "bfloat16" with float32 master weights costs half, and as the model casts every
        weight to the compute dtype where it is used, gives the same reference logits).
    Returns: "arguments", "outputs", "temps", "aliased", "generated_code", "peak" (arguments + outputs + temps −
    aliased), "logits_chunk" (steps per chunk of the loss's logits; 0: dense), "lower_seconds",
    "compile_seconds".
    """
    learner = EpisodeLearner.build(config, model)
    device_mesh = None if mesh == (1, 1) else make_mesh(*mesh)
    started = time.perf_counter()
    inputs = learner_inputs(learner, device_mesh, placement)
    if reference_dtype is not None:
        state = inputs[0]
        reference = jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, jnp.dtype(reference_dtype), sharding=leaf.sharding),
            state.policy.reference_params,
        )
        inputs = (state.replace(policy=state.policy.replace(reference_params=reference)), *inputs[1:])
    lowered = learner.jitted(inputs[0], donate).lower(*inputs)  # lm learn's own donates
    lowered_at = time.perf_counter()
    row: dict[str, Any] = _sizes(lowered.compile())
    row["compile_seconds"] = time.perf_counter() - lowered_at
    row["lower_seconds"] = lowered_at - started
    row["logits_chunk"] = getattr(learner.policy, "logits_chunk", 0)  # as resolved from config.logits_chunk
    return row


def init_memory(
    model: LMConfig, config: LearnConfig, *, mesh: tuple[int, int] = (1, 1), placement: str = "learn"
) -> dict[str, int]:
    """XLA's memory analysis of `lm learn`'s compiled `learner.init`, per device, in bytes (as `compiled_memory`):
    the parameters in, laid out as lm learn lays them out; the learner state out, as lm learn's init places it
    (placement "learn") or every leaf by `param_specs` through this jit's out_shardings (placement "sharded")."""
    learner = EpisodeLearner.build(config, model)
    device_mesh = None if mesh == (1, 1) else make_mesh(*mesh)
    params = _abstract_params(model, device_mesh)
    if device_mesh is None or placement == "learn":
        return _sizes(learner.init_program(params).lower(params).compile())
    state = jax.eval_shape(learner.init_program(params), params)  # not `init`: it checks this host's memory
    shardings = jax.tree.map(lambda spec: NamedSharding(device_mesh, spec), param_specs(state, device_mesh))
    return _sizes(jax.jit(learner.init, out_shardings=shardings).lower(params).compile())

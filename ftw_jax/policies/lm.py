"""The causal LM as a policy over token histories, acting one token at a time through its KV cache.

    policy = LMPolicy(num_actions=env.num_actions, config=tiny_config(env.vocabulary_size), max_length=T)
    logits = policy.apply(params, tokens)                                  # [T] -> [T, A]: the update's pass
    logits, cache = policy.apply(params, token, cache=cache, position=t)   # [1] -> [1, A]: one step of a rollout

A rollout (`ftw_jax.lab.rollout`) starts each episode with `policy.init_cache()` and feeds it the token written
at each step, so an episode of T steps costs T one-token passes instead of T passes over the whole history.
Where the actions are the vocabulary (A = V, the search task) the logits are the LM's own next-token logits,
as an LLM agent's are; with another number of outputs (a critic's 1) a linear head reads the last hidden
state instead, as the value heads of LLM PPO implementations do.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from ftw_jax.core.actions import WithLegalActions, mask_illegal, split_legal_actions
from ftw_jax.core.losses import ChunkedLogits
from ftw_jax.lm import lora
from ftw_jax.lm.config import LMConfig
from ftw_jax.lm.load import Pretrained
from ftw_jax.lm.memory import memory_estimate
from ftw_jax.lm.model import CausalLM, head_logits, init_cache
from ftw_jax.policies.base import PolicyNetwork

# From this vocabulary size up, the update makes the logits a chunk of steps at a time (`LMPolicy.logits_chunk`):
# real tokenizers (GPT-2's 50k, Llama 3's 128k, Qwen's 152k) give logits that outweigh a small model's
# activations, while over a task's own words (58 to a few thousand) a whole sequence's logits are small and
# the dense loss compiles and runs faster.
CHUNKED_VOCABULARY = 32_768
DEFAULT_LOGITS_CHUNK = 128  # steps per chunk at most
# Bytes of one [M, chunk, V] float32 array that the chunk is sized to (the loss holds a few such arrays at once:
# logits, log-probabilities, their gradient): 128 steps of M = 8 rows up to V = 65,536; Qwen's V = 151,936 gets
# 32 (156 MiB a copy, where 128 made 594 MiB).
LOGITS_BUDGET = 256 * 2**20
# Bytes of activations a training step may keep for the backward pass before the learner's model recomputes each
# layer's instead (`remat_for`). On 2 CPU cores recomputing cost 0-10% of a loss-and-gradient step and kept 2-6x
# less (4 x 512 over 8 x 256 tokens, 2 x 64 over 32 x 512, 8 x 1,024 over 4 x 256): worth it from a few hundred MiB.
ACTIVATIONS_BUDGET = 256 * 2**20


def logits_chunk_for(vocab_size: int, logits_chunk: int | None, rows: int = 8, steps: int | None = None) -> int:
    """The steps per chunk of the update's logits: `logits_chunk` if given (0: all at once); else 0 below a
    vocabulary of CHUNKED_VOCABULARY, and from it up 0 where the float32 logits of `rows` whole sequences of
    `steps`, [rows, steps, V], fit LOGITS_BUDGET (a chunk's logits are recomputed in the backward pass: at 8 x 255
    steps over V = 32,768 the chunked step took 1.25x as long), else the largest power of two up to
    DEFAULT_LOGITS_CHUNK whose [rows, chunk, V] fit it (at least 1)."""
    if logits_chunk is not None:
        return logits_chunk
    fits = LOGITS_BUDGET // (4 * rows * vocab_size)
    if vocab_size < CHUNKED_VOCABULARY or (steps is not None and steps <= fits):
        return 0
    chunk = DEFAULT_LOGITS_CHUNK
    while chunk > 1 and chunk > fits:
        chunk //= 2
    return chunk


def remat_for(config: LMConfig, remat: bool | None, rows: int, steps: int) -> bool:
    """Whether the learner's model recomputes each layer's activations in the backward pass: `remat` if given;
    else the config's own where it asks for it, or where the activations that `rows` sequences of `steps` tokens
    would keep without it (`lm.memory.memory_estimate`) outweigh ACTIVATIONS_BUDGET."""
    if remat is not None:
        return remat
    kept = memory_estimate(dataclasses.replace(config, remat=False), rows, steps)["activations"]
    return config.remat or kept > ACTIVATIONS_BUDGET


def as_policy_params(model_params: dict) -> dict:
    """The CausalLM's params ({"params": ...}) as an `LMPolicy`'s: the model is its submodule "lm"."""
    return {"params": {"lm": model_params["params"]}}


def as_model_params(policy_params: dict) -> dict:
    """The CausalLM's params ({"params": ...}) inside an `LMPolicy`'s (`as_policy_params` undone)."""
    return {"params": policy_params["params"]["lm"]}


def checkpoint_params(policy: LMPolicy, pretrained: Pretrained) -> dict:
    """The policy's params holding a checkpoint's weights (the model is its submodule "lm")."""
    if policy.num_actions != pretrained.config.vocab_size:
        raise ValueError(
            f"a pretrained LM acts over its vocabulary ({pretrained.config.vocab_size}), not {policy.num_actions} "
            "actions."
        )
    return as_policy_params(pretrained.read_weights())


def frozen_in_lora(path: tuple) -> bool:
    """Whether a leaf at this tree path stays as it is in a LoRA policy: the pretrained model's weights (under
    "lm"), not its adapters nor a head of the policy's own (a critic's value head)."""
    return any(getattr(entry, "key", None) == "lm" for entry in path) and not lora.is_adapter(path)


def frozen_base(params: Any) -> Any:
    """`params` with the `frozen_in_lora` leaves behind `stop_gradient`: their gradients are zeros no product
    computes, so a step moves and measures the adapters (and a head of its own) alone."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: jax.lax.stop_gradient(leaf) if frozen_in_lora(path) else leaf, params
    )


class LMPolicy(PolicyNetwork):
    """`CausalLM` over one trajectory's tokens [T] (or `WithLegalActions`, whose illegal actions get
    `ILLEGAL_LOGIT`) -> logits [T, A]; with `cache` and `position`, one step: (logits [1, A], cache)."""

    num_actions: int
    config: LMConfig
    max_length: int  # the cache's slots: the longest episode
    logits_chunk: int = 0  # > 0: the update makes the logits this many steps at a time (`chunked_logits`)
    cached: ClassVar[bool] = True

    def chunked_logits(self) -> ChunkedLogits | None:
        """The policy's logits as the model's output head over its final hidden states, the model run once over
        a batch of sequences and the head `logits_chunk` steps at a time (0: all at once); None where the head
        is the policy's own (another size than the vocabulary), and the update runs `apply` per sequence."""
        if self.num_actions != self.config.vocab_size:
            return None
        model = CausalLM(self.config, head=False, parent=None)  # a model of its own, not a submodule
        frozen = frozen_base if self.config.lora_rank else (lambda params: params)

        def features(params, tokens):  # [M, T] -> ([M, T, D], [M, T, A] | None)
            params = frozen(params)
            ids, legal = split_legal_actions(tokens)
            return model.apply(as_model_params(params), ids), legal

        def head(params, inputs):
            params, (hidden, legal) = frozen(params), inputs
            logits = head_logits(self.config, as_model_params(params)["params"], hidden)
            return mask_illegal(logits, legal)

        return ChunkedLogits(features=features, head=head, chunk=self.logits_chunk)

    def apply(self, variables: Any, *args: Any, **kwargs: Any) -> Any:
        """`nn.Module.apply`; with adapters (`config.lora_rank`) the pretrained weights are frozen (`frozen_base`)."""
        return super().apply(frozen_base(variables) if self.config.lora_rank else variables, *args, **kwargs)

    def init_cache(self) -> tuple[jax.Array, jax.Array]:
        """An empty cache for one episode (keys and values [layers, 1, max_length, G, H])."""
        return init_cache(self.config, 1, self.max_length)

    @nn.compact
    def __call__(
        self,
        tokens: jax.Array | WithLegalActions,
        cache: tuple[jax.Array, jax.Array] | None = None,
        position: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        ids, legal = split_legal_actions(tokens)  # ids [T]
        own_head = self.num_actions != self.config.vocab_size
        lm = CausalLM(self.config, head=not own_head, name="lm")
        if cache is None:
            out = lm(ids[None])[0]
        else:
            assert position is not None  # a cache comes with the position to write at
            positions = jnp.reshape(position, (1, 1)).astype(jnp.int32)
            out, cache = lm(ids[None], positions=positions, cache=cache, cache_index=position)
            out = out[0]
        logits = out
        if own_head:
            logits = nn.Dense(self.num_actions, kernel_init=nn.initializers.normal(0.01), name="head")(out)
        logits = mask_illegal(logits, legal)
        return logits if cache is None else (logits, cache)

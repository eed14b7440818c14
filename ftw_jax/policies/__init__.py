"""Flax policies. Each maps one trajectory's observations [T, ...] to logits [T, A].

Parameters stay a plain pytree, so `module.apply` is all the update needs. Each is a `PolicyNetwork`
(`ftw_jax.policies.base`) and declares what it is: `markov = True` says the logits at step t depend on
observation t alone, so a rollout can act from the current observation; a policy over histories (the default)
is applied to the whole [T, ...] buffer and read at position t, unless it is `cached` (the LM,
`ftw_jax.policies.lm`): then it acts one token at a time through its KV cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from ftw_jax.core.actions import WithLegalActions, mask_illegal, split_legal_actions
from ftw_jax.policies.base import PolicyNetwork


class TabularPolicy(PolicyNetwork):
    """The same logits [A] at every step, whatever the observation (bandits). Starts uniform."""

    num_actions: int
    markov: ClassVar[bool] = True

    @nn.compact
    def __call__(self, observation: jax.Array) -> jax.Array:
        logits = self.param("logits", nn.initializers.zeros, (self.num_actions,))
        return jnp.broadcast_to(logits, (observation.shape[0], self.num_actions))


class MLPPolicy(PolicyNetwork):
    """A tanh MLP on flat vector observations [T, D] -> logits [T, A]."""

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)
    markov: ClassVar[bool] = True

    @nn.compact
    def __call__(self, observation: jax.Array) -> jax.Array:
        x = observation.reshape(observation.shape[0], -1).astype(jnp.float32)
        for width in self.hidden_sizes:
            x = nn.tanh(nn.Dense(width)(x))
        # Small final layer: the initial policy is close to uniform.
        return nn.Dense(self.num_actions, kernel_init=nn.initializers.normal(0.01))(x)


class ConvPolicy(PolicyNetwork):
    """A small ReLU convnet on grid observations [T, H, W, C] -> logits [T, A].

    3x3 'SAME' convolutions, then dense layers on the flattened feature map. Each convolution is written as
    3x3 patches through a Dense layer: the same function as `nn.Conv`, but only matrix products, which
    stay fast on CPU when seeds are vmapped (a vmapped convolution with per-seed kernels becomes a grouped
    convolution, which XLA:CPU runs very slowly).
    """

    num_actions: int
    channels: Sequence[int] = (16, 16)
    hidden_sizes: Sequence[int] = (128,)
    markov: ClassVar[bool] = True

    @nn.compact
    def __call__(self, observation: jax.Array) -> jax.Array:
        x = observation.astype(jnp.float32)  # [T, H, W, C]
        height, width = x.shape[1], x.shape[2]
        for features in self.channels:
            padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
            patches = jnp.concatenate(
                [padded[:, i : i + height, j : j + width, :] for i in range(3) for j in range(3)], axis=-1
            )  # [T, H, W, 9 C]
            x = nn.relu(nn.Dense(features)(patches))
        x = x.reshape(x.shape[0], -1)
        for features in self.hidden_sizes:
            x = nn.relu(nn.Dense(features)(x))
        return nn.Dense(self.num_actions, kernel_init=nn.initializers.normal(0.01))(x)


class TransformerPolicy(PolicyNetwork):
    """A tiny causal transformer over token histories [T] int -> logits [T, A] (pre-LayerNorm blocks).

    Position t sees tokens 0..t only, so one pass over a whole trajectory gives every step's logits.
    Given `WithLegalActions` (tokens [T], legal [T, A]) it gives illegal actions the logit `ILLEGAL_LOGIT`.
    """

    num_actions: int
    vocabulary_size: int
    max_length: int
    width: int = 64
    num_layers: int = 2
    num_heads: int = 4

    @nn.compact
    def __call__(self, tokens: jax.Array | WithLegalActions) -> jax.Array:
        ids, legal = split_legal_actions(tokens)  # ids [T]
        length = ids.shape[0]
        positions = self.param("positions", nn.initializers.normal(0.02), (self.max_length, self.width))
        x = nn.Embed(self.vocabulary_size, self.width)(ids) + positions[:length]  # [T, W]
        causal = nn.make_causal_mask(jnp.ones((1, length)))  # [1, 1, T, T]
        for _ in range(self.num_layers):
            y = nn.LayerNorm()(x)[None]
            x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads)(y, y, mask=causal)[0]
            y = nn.LayerNorm()(x)
            x = x + nn.Dense(self.width)(nn.gelu(nn.Dense(4 * self.width)(y)))
        x = nn.LayerNorm()(x)
        logits = nn.Dense(self.num_actions, kernel_init=nn.initializers.normal(0.01))(x)
        return mask_illegal(logits, legal)


# Architecture name -> `build(num_outputs, env, config)`; the config gives `hidden_sizes` and `conv_channels`.
# Which fit an environment is said by its registry entry (`ftw_jax.envs.ENVIRONMENTS`).
ARCHITECTURES = {
    "tabular": lambda num_outputs, env, config: TabularPolicy(num_actions=num_outputs),
    "mlp": lambda num_outputs, env, config: MLPPolicy(num_actions=num_outputs, hidden_sizes=config.hidden_sizes),
    "conv": lambda num_outputs, env, config: ConvPolicy(
        num_actions=num_outputs, channels=config.conv_channels, hidden_sizes=config.hidden_sizes
    ),
    "transformer": lambda num_outputs, env, config: TransformerPolicy(
        num_actions=num_outputs, vocabulary_size=_vocabulary(env, "transformer"), max_length=env.max_steps
    ),
    "lm": lambda num_outputs, env, config: _lm_policy(num_outputs, env),
}


# Architecture name -> `build(num_outputs, env, pretrained)` for those that can start from a pretrained
# checkpoint (`ftw_jax.lm.load.Pretrained`, the run's `model` setting): its shape, and later its weights.
FROM_CHECKPOINT = {
    "lm": lambda num_outputs, env, pretrained: _lm_policy(num_outputs, env, pretrained.config),
}


def _lm_policy(num_outputs: int, env, config=None) -> PolicyNetwork:
    """An LM over the environment's token histories: `config`'s shape (a checkpoint's), else a tiny fresh one over
    the environment's vocabulary."""
    from ftw_jax.lm.config import tiny_config  # only this loads the LM package
    from ftw_jax.policies.lm import LMPolicy

    config = config or tiny_config(_vocabulary(env, "lm"))
    return LMPolicy(num_actions=num_outputs, config=config, max_length=env.max_steps)


def _vocabulary(env, architecture: str) -> int:
    """The environment's token vocabulary, which a policy over token ids embeds."""
    if env.vocabulary_size is None:
        raise ValueError(f"the {architecture} policy reads token ids; {type(env).__name__} gives other observations.")
    return env.vocabulary_size

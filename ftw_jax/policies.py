"""Flax policies. Each maps one trajectory's observations [T, ...] to logits [T, A].

Parameters stay a plain pytree, so `apply_fn = lambda params, obs: module.apply(params, obs)` is all the
update needs.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLPPolicy(nn.Module):
    """A tanh MLP on flat vector observations [T, D] -> logits [T, A]."""

    num_actions: int
    hidden_sizes: Sequence[int] = (64, 64)

    @nn.compact
    def __call__(self, observation: jax.Array) -> jax.Array:
        x = observation.reshape(observation.shape[0], -1).astype(jnp.float32)
        for width in self.hidden_sizes:
            x = nn.tanh(nn.Dense(width)(x))
        # Small final layer: the initial policy is close to uniform.
        return nn.Dense(self.num_actions, kernel_init=nn.initializers.normal(0.01))(x)

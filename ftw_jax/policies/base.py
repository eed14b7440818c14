"""What every policy network declares on its class: how a rollout feeds it, and how an update makes its logits.

    class MyPolicy(PolicyNetwork):
        markov: ClassVar[bool] = True     # the logits at step t read observation t alone

A rollout acts from the current observation (`markov`), through a KV cache one token at a time (`cached`,
with `init_cache()`), or else re-reads the whole [T, ...] history buffer each step; an update may make the
logits a chunk of steps at a time (`chunked_logits()`, an LM's over a real vocabulary).
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn

from ftw_jax.core.losses import ChunkedLogits


class PolicyNetwork(nn.Module):
    """A Flax module mapping one trajectory's observations [T, ...] to logits [T, A], and what it is."""

    markov: ClassVar[bool] = False  # True: the logits at step t depend on observation t alone
    cached: ClassVar[bool] = False  # True: it acts one token at a time through its KV cache (`init_cache()`)

    def chunked_logits(self) -> ChunkedLogits | None:
        """Its logits as a head over per-step features, for the update to make in chunks; None: made whole."""
        return None

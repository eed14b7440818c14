"""Legal actions: an observation that says which actions are legal at its step, and how a policy masks the rest.

Environments (`ftw_jax.envs.search`) give `WithLegalActions`; policies split it (`split_legal_actions`) and give
illegal actions `ILLEGAL_LOGIT` (`mask_illegal`), so acting and the loss see the same distribution.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

# Logit of an illegal action: exp() of it is exactly 0, yet p·log p and KL terms stay 0, not NaN as with −inf.
ILLEGAL_LOGIT = -1e9


class WithLegalActions(flax.struct.PyTreeNode):
    """An observation together with the actions that are legal at this step (as in constrained decoding).

    A policy given one puts (practically) zero probability on illegal actions, in acting and in the loss
    alike, so behaviour log-probs, cross-entropy and KL all refer to the same distribution over legal actions.
    """

    observation: Any
    legal: jax.Array  # [A] bool (a trajectory holds [T, A])


def split_legal_actions(observation: Any) -> tuple[Any, jax.Array | None]:
    """(the observation itself, its legal actions [..., A] bool or None where it carries none)."""
    if isinstance(observation, WithLegalActions):
        return observation.observation, observation.legal
    return observation, None


def mask_illegal(logits: jax.Array, legal: jax.Array | None) -> jax.Array:
    """`logits` [..., A] with the illegal actions' set to `ILLEGAL_LOGIT` (unchanged where `legal` is None)."""
    return logits if legal is None else jnp.where(legal, logits, ILLEGAL_LOGIT)

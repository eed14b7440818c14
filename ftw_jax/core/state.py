"""A policy's trainable state, and the one optimizer step every algorithm takes: applied only if finite."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


class PolicyState(flax.struct.PyTreeNode):
    """The policy's params and optimizer state, its KL reference, β and version (the optimizer is static)."""

    params: Any
    opt_state: optax.OptState
    reference_params: Any
    kl_coef: jax.Array  # [] float32: β, an array so that sweeps can vmap over it
    version: jax.Array  # [] int32: updates applied so far, the policy version
    optimizer: optax.GradientTransformation = flax.struct.field(pytree_node=False)

    @classmethod
    def create(
        cls, params: Any, optimizer: optax.GradientTransformation, *, kl_coef: float | jax.Array = 0.0
    ) -> PolicyState:
        return cls(
            params=params,
            opt_state=optimizer.init(params),
            reference_params=params,
            kl_coef=jnp.asarray(kl_coef, jnp.float32),
            version=jnp.zeros((), jnp.int32),
            optimizer=optimizer,
        )

    def apply_if_finite(
        self, grads: Any, loss: jax.Array, ready: jax.Array | bool = True
    ) -> tuple[PolicyState, jax.Array, jax.Array]:
        """(state after one step, applied [] bool, finite [] bool); see `apply_if_finite`. Applied steps count
        as versions."""
        params, opt_state, applied, finite = apply_if_finite(
            self.optimizer, self.params, self.opt_state, grads, loss, ready
        )
        state = self.replace(params=params, opt_state=opt_state, version=self.version + applied.astype(jnp.int32))
        return state, applied, finite


def all_finite(tree: Any) -> jax.Array:
    """Whether every leaf of `tree` is finite ([] bool)."""
    return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


def select_tree(condition: jax.Array, on_true: Any, on_false: Any) -> Any:
    """`on_true` where `condition`, else `on_false`, leaf by leaf (a skipped step keeps the old tree)."""
    return jax.tree.map(lambda a, b: jnp.where(condition, a, b), on_true, on_false)


def apply_if_finite(
    optimizer: optax.GradientTransformation,
    params: Any,
    opt_state: optax.OptState,
    grads: Any,
    loss: jax.Array,
    ready: jax.Array | bool = True,
) -> tuple[Any, optax.OptState, jax.Array, jax.Array]:
    """One Optax step, taken only where `ready` and the loss, gradients and updates are all finite.

    Otherwise params and optimizer state stay as they were (a NaN must not reach Adam's moments either).

    Returns:
      (params, opt_state, applied [] bool, finite [] bool).
    """
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    finite = jnp.isfinite(loss) & all_finite(grads) & all_finite(updates)
    applied = finite & ready
    return (
        select_tree(applied, optax.apply_updates(params, updates), params),
        select_tree(applied, new_opt_state, opt_state),
        applied,
        finite,
    )

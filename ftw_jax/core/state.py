"""A policy's trainable state, and the one optimizer step every algorithm takes: applied only if finite."""

from __future__ import annotations

from collections.abc import Callable
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
        cls,
        params: Any,
        optimizer: optax.GradientTransformation,
        *,
        kl_coef: float | jax.Array = 0.0,
        reference_dtype: Any = None,
        frozen: Callable[[tuple], bool] | None = None,
    ) -> PolicyState:
        """The state at `params`, which are also the KL's reference: in `reference_dtype` where given (an LM that
        computes in bfloat16 over float32 master weights casts every weight to bfloat16 where it is used, so a
        bfloat16 reference gives the same logits at half the memory). Where `frozen(path)` (a leaf that never
        changes: a LoRA policy's pretrained weights) the reference holds None and reads the params' own
        (`losses.filled_reference`)."""

        def reference_leaf(path: tuple, leaf: Any) -> Any:
            if frozen is not None and frozen(path):
                return None
            floating = reference_dtype is not None and jnp.issubdtype(leaf.dtype, jnp.floating)
            return leaf.astype(reference_dtype) if floating else leaf

        reference = jax.tree_util.tree_map_with_path(reference_leaf, params)
        return cls(
            params=params,
            opt_state=optimizer.init(params),
            reference_params=reference,
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

    Otherwise params and optimizer state stay as they were (a NaN must not reach Adam's moments either). The check
    comes before the new state is made: the updates are computed once to be checked (reduced as they are made,
    never stored), and the step itself only where it is taken (`lax.cond`), so the old and the new weights and
    moments are never alive together; with the state donated the step writes in place.

    Returns:
      (params, opt_state, applied [] bool, finite [] bool).
    """
    updates, _ = optimizer.update(grads, opt_state, params)
    finite = jnp.isfinite(loss) & all_finite(grads) & all_finite(updates)
    applied = finite & ready

    def step(state):
        params, opt_state = state
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_opt_state

    params, opt_state = jax.lax.cond(applied, step, lambda state: state, (params, opt_state))
    return params, opt_state, applied, finite

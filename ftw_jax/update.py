"""The FTW update (Algorithm 2): select elites → cross-entropy + β·KL → gradient → Optax step, one jit.

Axis legend: N pool entries, J minibatches, C candidates, K elites, M trajectories in the loss, T steps,
A actions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal

import chex
import flax.struct
import jax
import jax.numpy as jnp
import optax

from ftw_jax import losses
from ftw_jax import pool as pool_lib
from ftw_jax.checks import check_positive_int
from ftw_jax.occupancy import check_sizes
from ftw_jax.selection import ELITE_RULES, select_elites_masked

# apply_fn(params, observation) -> [T, A] logits for one trajectory's observation pytree (leaves [T, ...]).
ApplyFn = Callable[[Any, Any], jax.Array]

_CHOICES = {
    "reference": ("initial", "previous"),
    "kl_direction": ("policy_to_reference", "reference_to_policy"),
    "normalisation": ("token", "trajectory"),
    "elite_path": ("auto", "gather", "counts"),
    "elite_rule": ELITE_RULES,
}


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    """Static shape and option choices of the update; validated on construction.

    Attributes:
      pool_capacity: N.
      num_batches: J, minibatches per update.
      batch_size: C, pool entries drawn (without replacement) per minibatch.
      num_elites: K, entries kept per minibatch.
      reference: the KL's reference policy. "initial" (default): the params the state was created with,
        frozen. "previous": the params before the last applied update (a one-step trust region; the KL to
        the params being updated would have zero gradient).
      kl_direction: "policy_to_reference" (default) is KL(π ‖ π_ref); "reference_to_policy" is KL(π_ref ‖ π).
      normalisation: "token" (default): cross-entropy and KL are averaged over all kept steps, so each
        kept action counts once (longer trajectories weigh more). "trajectory": averaged within each
        trajectory first, then over trajectories.
      elite_path: how repeated elites are paid for. "gather" runs the policy on the J·K selected
        trajectories (repeats included); "counts" runs it once on every pool entry, weighted by how often
        each was selected (no repeated forward passes, but N of them); "auto" (default) takes "counts"
        when J·K >= N. Both give the same loss and gradient.
      elite_rule: "top_k" (default) keeps the K best of each minibatch; "beat_minimum" keeps only those
        above the minibatch's lowest return (tied rewards: no minibatch of equal returns, no failure among
        binary rewards is imitated). An update that keeps nothing is not applied.
    """

    pool_capacity: int
    num_batches: int
    batch_size: int
    num_elites: int
    reference: Literal["initial", "previous"] = "initial"
    kl_direction: Literal["policy_to_reference", "reference_to_policy"] = "policy_to_reference"
    normalisation: Literal["token", "trajectory"] = "token"
    elite_path: Literal["auto", "gather", "counts"] = "auto"
    elite_rule: Literal["top_k", "beat_minimum"] = "top_k"

    def __post_init__(self):
        check_sizes(self.pool_capacity, self.batch_size, self.num_elites)
        check_positive_int("num_batches (J)", self.num_batches)
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}.")

    @property
    def uses_counts(self) -> bool:
        if self.elite_path == "auto":
            return self.num_batches * self.num_elites >= self.pool_capacity
        return self.elite_path == "counts"


@flax.struct.dataclass
class FTWState:
    """Everything the update changes, plus the optimizer that changes it (static)."""

    params: Any
    opt_state: optax.OptState
    reference_params: Any
    kl_coef: jax.Array  # [] float32: β, an array so that sweeps can vmap over it
    version: jax.Array  # [] int32: updates applied so far, the policy version
    optimizer: optax.GradientTransformation = flax.struct.field(pytree_node=False)

    @classmethod
    def create(cls, params: Any, optimizer: optax.GradientTransformation, *, kl_coef: float = 0.0) -> "FTWState":
        return cls(
            params=params,
            opt_state=optimizer.init(params),
            reference_params=params,
            kl_coef=jnp.asarray(kl_coef, jnp.float32),
            version=jnp.zeros((), jnp.int32),
            optimizer=optimizer,
        )


def all_finite(tree) -> jax.Array:
    """Whether every leaf of `tree` is finite ([] bool)."""
    return jnp.all(jnp.asarray([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


def select_tree(condition: jax.Array, on_true, on_false):
    """`on_true` where `condition`, else `on_false`, leaf by leaf (a skipped step keeps the old tree)."""
    return jax.tree.map(lambda a, b: jnp.where(condition, a, b), on_true, on_false)


def make_update(apply_fn: ApplyFn, config: UpdateConfig) -> Callable[[FTWState, pool_lib.Pool, jax.Array], tuple]:
    """Builds the jitted FTW update `(state, pool, key[, sizes]) -> (state, metrics)`.

    One call selects J·K elites (`select_elites`), computes

        L(θ) = mean over kept steps of [−log π_θ(a_t | h_t)] + β · mean of KL(π_θ ‖ π_ref)(h_t)

    (repeats counted; see `UpdateConfig` for the normalisation and KL options), and applies one step of
    `state.optimizer`. It is a no-op (params, optimizer state and version unchanged; `metrics["applied"]`
    False) while the pool holds fewer than C valid entries, when the loss or any gradient or update is not
    finite (`metrics["nonfinite"]` True), and when no elite is kept (possible under "beat_minimum"). The key
    is consumed.

    `sizes`, an int32 [3] array (J, C, K), runs the update for those sizes inside the config's, which are then
    maxima (`select_elites_masked`): one compiled update serves a grid of sizes, e.g. vmapped in a sweep.
    Without it the config's sizes are used.

    Args:
      apply_fn: `apply_fn(params, observation) -> [T, A] logits` for one trajectory.
      config: the static sizes and options.

    Returns:
      The update, compiled as one jit (it traces once per pool/state structure).
    """
    if not isinstance(config, UpdateConfig):
        raise ValueError(f"config must be an UpdateConfig, got {type(config).__name__}.")
    num_kept = config.num_batches * config.num_elites

    def step_losses(params, reference_params, trajectory):
        logits = apply_fn(params, trajectory.observation)
        reference_logits = jax.lax.stop_gradient(apply_fn(reference_params, trajectory.observation))
        chex.assert_rank(logits, 2)
        chex.assert_equal_shape((logits, reference_logits))
        mask = trajectory.mask
        if config.kl_direction == "policy_to_reference":
            kl = losses.categorical_kl(logits, reference_logits, mask)
        else:
            kl = losses.categorical_kl(reference_logits, logits, mask)
        return {
            "cross_entropy": -losses.log_likelihood(logits, trajectory.action, mask),
            "kl": kl,
            "entropy": losses.entropy(logits, mask),
        }  # each [T]

    def average(per_step, step_weights):
        """Weighted mean of [M, T] per-step values under the configured normalisation."""
        if config.normalisation == "token":
            return jnp.sum(per_step * step_weights) / jnp.maximum(jnp.sum(step_weights), 1e-12)
        steps = jnp.sum(step_weights, axis=1)
        per_trajectory = jnp.sum(per_step * step_weights, axis=1) / jnp.maximum(steps, 1e-12)
        trajectory_weights = jnp.where(steps > 0, jnp.max(step_weights, axis=1), 0.0)
        return jnp.sum(per_trajectory * trajectory_weights) / jnp.maximum(jnp.sum(trajectory_weights), 1e-12)

    def loss_fn(params, reference_params, kl_coef, trajectories, weights):
        per_step = jax.vmap(step_losses, in_axes=(None, None, 0))(params, reference_params, trajectories)
        step_weights = weights[:, None] * trajectories.mask
        terms = {name: average(value, step_weights) for name, value in per_step.items()}
        loss = terms["cross_entropy"] + kl_coef * terms["kl"]
        return loss, terms

    def update(state: FTWState, pool: pool_lib.Pool, key: jax.Array, sizes: jax.Array | None = None):
        # Runs while tracing, so a mismatch fails before any work.
        if not isinstance(pool, pool_lib.Pool) or pool.capacity != config.pool_capacity:
            capacity = pool.capacity if isinstance(pool, pool_lib.Pool) else type(pool).__name__
            raise ValueError(f"the update was built for a pool of capacity {config.pool_capacity}, got {capacity}.")
        returns = pool.trajectories.episode_return
        if sizes is None:
            num_batches, batch_size, num_elites = config.num_batches, config.batch_size, config.num_elites
        else:
            chex.assert_shape(sizes, (3,))
            num_batches, batch_size, num_elites = sizes[0], sizes[1], sizes[2]
        valid = pool_lib.valid_mask(pool)
        elites = select_elites_masked(
            key,
            returns,
            valid,
            (num_batches, batch_size, num_elites),
            max_batches=config.num_batches,
            max_batch_size=config.batch_size,
            max_elites=config.num_elites,
            rule=config.elite_rule,
        ).reshape(num_kept)
        filled = elites >= 0
        safe_elites = jnp.maximum(elites, 0)
        counts = jnp.zeros(config.pool_capacity, jnp.float32).at[safe_elites].add(filled)  # [N]
        if config.uses_counts:
            trajectories, weights = pool.trajectories, counts
        else:
            trajectories = jax.tree.map(lambda leaf: leaf[safe_elites], pool.trajectories)
            weights = filled.astype(jnp.float32)
        chex.assert_rank(weights, 1)

        (loss, terms), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state.reference_params, state.kl_coef, trajectories, weights
        )
        updates, opt_state = state.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)

        ready = pool.size >= batch_size
        finite = jnp.isfinite(loss) & all_finite(grads) & all_finite(updates)
        applied = ready & finite & jnp.any(filled)  # nothing kept: no step (Adam's momentum would still move)
        reference_params = state.reference_params
        if config.reference == "previous":
            reference_params = select_tree(applied, state.params, reference_params)
        new_state = state.replace(
            params=select_tree(applied, params, state.params),
            opt_state=select_tree(applied, opt_state, state.opt_state),
            reference_params=reference_params,
            version=state.version + applied.astype(jnp.int32),
        )
        elite_returns = returns[safe_elites]
        metrics = {
            "loss": loss,
            **terms,
            "elite_return_mean": jnp.sum(jnp.where(filled, elite_returns, 0.0)) / jnp.maximum(jnp.sum(filled), 1),
            "elite_return_min": jnp.min(jnp.where(filled, elite_returns, jnp.inf)),
            "unique_elite_fraction": jnp.sum(counts > 0) / (num_batches * num_elites),
            "kept_fraction": jnp.sum(filled) / (num_batches * num_elites),  # < 1 only under beat_minimum
            "pool_size": pool.size,
            "pool_return_mean": jnp.sum(jnp.where(valid, returns, 0.0)) / jnp.maximum(pool.size, 1),
            "grad_norm": optax.tree_utils.tree_norm(grads),
            "ready": ready,
            "nonfinite": ~finite,
            "applied": applied,
            "version": new_state.version,
        }
        return new_state, metrics

    return jax.jit(update)

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

from ftw_jax import diagnostics, losses
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
      max_staleness: if set (V), entries played by a policy more than V versions older than the current one
        are left out of selection (evicted, besides FIFO). Default None: FIFO only.
      importance_weight_cap: if set (c), each kept trajectory's loss weight is multiplied by min(w, c), with
        w = π_θ(τ) / q(τ) its importance ratio (no gradient through w); the averages divide by the total weight
        (self-normalised). An experiment flag; default None: no weighting.
      monitor_entries: the trust-region monitor's sample: that many pool entries, evenly spaced over the
        filled slots, on whose policy steps KL(π_old ‖ π_new) and the total variation are measured after the
        step (2 × that many extra forward passes). 0 turns the monitor off.
      monitor_discount: γ of the logged TRPO penalty term (must be < 1).
      staleness_histogram_bins: if > 0, metrics carry `pool_staleness_histogram` [bins]: valid entries by
        staleness 0, 1, ..., the last bin counting everything from bins − 1 up.
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
    max_staleness: int | None = None
    importance_weight_cap: float | None = None
    monitor_entries: int = 16
    monitor_discount: float = 0.99
    staleness_histogram_bins: int = 0

    def __post_init__(self):
        check_sizes(self.pool_capacity, self.batch_size, self.num_elites)
        check_positive_int("num_batches (J)", self.num_batches)
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}.")
        if self.max_staleness is not None and not (isinstance(self.max_staleness, int) and self.max_staleness >= 0):
            raise ValueError(f"max_staleness must be None or an int >= 0, got {self.max_staleness!r}.")
        if self.importance_weight_cap is not None and not self.importance_weight_cap > 0:
            raise ValueError(f"importance_weight_cap must be None or > 0, got {self.importance_weight_cap!r}.")
        for name in ("monitor_entries", "staleness_histogram_bins"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be an int >= 0, got {getattr(self, name)!r}.")
        if not 0 <= self.monitor_discount < 1:
            raise ValueError(f"monitor_discount must be in [0, 1), got {self.monitor_discount!r}.")

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
        log_weights = diagnostics.log_importance_ratio(  # [M] log π_θ(τ) / q(τ), no gradient through it
            jax.lax.stop_gradient(-per_step["cross_entropy"]), trajectories.behaviour_logp, trajectories.mask)
        if config.importance_weight_cap is not None:
            weights = weights * jnp.minimum(jnp.exp(log_weights), config.importance_weight_cap)
        step_weights = weights[:, None] * trajectories.mask
        terms = {name: average(value, step_weights) for name, value in per_step.items()}
        loss = terms["cross_entropy"] + kl_coef * terms["kl"]
        return loss, (terms, log_weights)

    def trust_region(old_params, new_params, pool: pool_lib.Pool) -> dict:
        """KL(π_old ‖ π_new) and total variation on the policy steps of `monitor_entries` evenly spaced entries."""
        picks = (jnp.arange(config.monitor_entries) * pool.size) // config.monitor_entries
        monitored = jax.tree.map(lambda leaf: leaf[picks], pool.trajectories)
        logits = lambda params: jax.vmap(apply_fn, in_axes=(None, 0))(params, monitored.observation)  # noqa: E731
        old, new = logits(old_params), logits(new_params)
        mask = monitored.mask & (pool.size > 0)
        kl = jax.vmap(losses.categorical_kl)(old, new, mask)
        tv = jnp.where(mask, diagnostics.total_variation(old, new), 0.0)
        steps = jnp.maximum(jnp.sum(mask), 1)
        largest_return = jnp.max(jnp.where(pool_lib.valid_mask(pool), jnp.abs(pool.trajectories.episode_return), 0.0))
        return {"policy_kl_mean": jnp.sum(kl) / steps, "policy_kl_max": jnp.max(kl),
                "policy_tv_mean": jnp.sum(tv) / steps, "policy_tv_max": jnp.max(tv),
                "trpo_penalty": diagnostics.trpo_penalty(jnp.max(tv), largest_return, config.monitor_discount)}

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
        filled_slots = pool_lib.valid_mask(pool)
        entry_staleness = diagnostics.staleness(state.version, pool.trajectories.behaviour_version,
                                                pool.trajectories.mask)  # [N]
        valid = filled_slots
        if config.max_staleness is not None:
            valid = valid & (entry_staleness <= config.max_staleness)
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

        (loss, (terms, log_weights)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state.reference_params, state.kl_coef, trajectories, weights
        )
        updates, opt_state = state.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)

        ready = jnp.sum(valid) >= batch_size
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
        kept = jnp.maximum(jnp.sum(filled), 1)
        elite_staleness = entry_staleness[safe_elites]
        pool_entries = jnp.maximum(pool.size, 1)
        metrics = {
            "loss": loss,
            **terms,
            "elite_return_mean": jnp.sum(jnp.where(filled, elite_returns, 0.0)) / jnp.maximum(jnp.sum(filled), 1),
            "elite_return_min": jnp.min(jnp.where(filled, elite_returns, jnp.inf)),
            "unique_elite_fraction": jnp.sum(counts > 0) / (num_batches * num_elites),
            "kept_fraction": jnp.sum(filled) / (num_batches * num_elites),  # < 1 only under beat_minimum
            "pool_size": pool.size,
            "pool_return_mean": jnp.sum(jnp.where(filled_slots, returns, 0.0)) / pool_entries,
            # Staleness: the current version (before this step) minus the version that played the entry.
            "pool_staleness_mean": jnp.sum(jnp.where(filled_slots, entry_staleness, 0)) / pool_entries,
            "pool_staleness_max": jnp.max(jnp.where(filled_slots, entry_staleness, 0)),
            "elite_staleness_mean": jnp.sum(jnp.where(filled, elite_staleness, 0)) / kept,
            "elite_staleness_max": jnp.max(jnp.where(filled, elite_staleness, 0)),
            "usable_fraction": jnp.sum(valid) / pool_entries,  # < 1 only with max_staleness
            # Importance ratios π_θ(τ) / q(τ) of the kept trajectories (θ before this step), repeats counted.
            "elite_log_weight_mean": jnp.sum(weights * log_weights) / jnp.maximum(jnp.sum(weights), 1),
            "elite_ess_fraction": diagnostics.effective_sample_size(log_weights, weights) / jnp.maximum(jnp.sum(weights), 1),
            "grad_norm": optax.tree_utils.tree_norm(grads),
            "ready": ready,
            "nonfinite": ~finite,
            "applied": applied,
            "version": new_state.version,
        }
        if config.monitor_entries:
            metrics.update(trust_region(state.params, new_state.params, pool))
        if config.staleness_histogram_bins:
            bins = config.staleness_histogram_bins
            metrics["pool_staleness_histogram"] = jnp.zeros(bins, jnp.int32).at[
                jnp.minimum(entry_staleness, bins - 1)].add(filled_slots.astype(jnp.int32))
        return new_state, metrics

    return jax.jit(update)

"""The FTW update's settings: its static sizes and options (`UpdateConfig`), and the sizes a sweep varies inside
them (`Sizes`). The update (`ftw_jax.core.update`) and its loss (`ftw_jax.core.elite_loss`) both read them.

Axis legend: N pool entries, J minibatches, C candidates, K elites.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import flax.struct
import jax
import jax.core
import jax.numpy as jnp

from ftw_jax.core.checks import check_positive_int, check_sizes
from ftw_jax.core.settings import check_settings, setting


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
      monitor_entries: the trust-region monitor's sample: that many pool entries (more than N is taken as N:
        more would only repeat entries, and 10⁹ of them would never compile), evenly spaced over the filled
        slots, on whose policy steps KL(π_old ‖ π_new) and the total variation are measured after the step
        (2 × that many extra forward passes). 0 turns the monitor off.
      monitor_discount: γ of the logged TRPO penalty term (must be < 1).
      staleness_histogram_bins: if > 0, metrics carry `pool_staleness_histogram` [bins]: filled entries by
        staleness 0, 1, ..., the last bin counting everything from bins − 1 up.
    """

    pool_capacity: int = setting(64, "N, the pool's capacity", axis="N", short="-N")
    num_batches: int = setting(16, "J, minibatches per update", axis="J", short="-J")
    batch_size: int = setting(8, "C, pool entries drawn (without replacement) per minibatch", axis="C", short="-C")
    num_elites: int = setting(2, "K, entries kept per minibatch", axis="K", short="-K")
    reference: Literal["initial", "previous"] = setting("initial", "the KL's reference policy")
    kl_direction: Literal["policy_to_reference", "reference_to_policy"] = setting(
        "policy_to_reference", "KL(pi || pi_ref) or KL(pi_ref || pi)"
    )
    normalisation: Literal["token", "trajectory"] = setting("token", "average over kept steps, or per trajectory first")
    elite_path: Literal["auto", "gather", "counts"] = setting("auto", "how repeated elites are paid for")
    elite_rule: Literal["top_k", "beat_minimum"] = setting(
        "top_k", "top_k, or beat_minimum: only elites above their minibatch's lowest return"
    )
    max_staleness: int | None = setting(
        None, "evict pool entries played more than V policy versions ago (default: FIFO only)"
    )
    importance_weight_cap: float | None = setting(None, "weight elites by min(w, c), w = pi(traj)/q(traj) (experiment)")
    monitor_entries: int = setting(16, "pool entries for the per-update KL / TV monitor (0: off)")
    monitor_discount: float = setting(0.99, "gamma of the logged TRPO penalty term")
    staleness_histogram_bins: int = setting(0, "log the pool's staleness histogram with this many bins (0: off)")

    def __post_init__(self):
        check_positive_int("pool_capacity (N)", self.pool_capacity)
        check_sizes(self.pool_capacity, self.batch_size, self.num_elites)
        check_positive_int("num_batches (J)", self.num_batches)
        for name in ("pool_capacity", "num_batches", "batch_size", "num_elites"):  # pool indices are int32
            if getattr(self, name) > 2**31 - 1:
                raise ValueError(f"{name} must be < 2**31, got {getattr(self, name)}.")
        check_settings(self)
        if self.max_staleness is not None and not (isinstance(self.max_staleness, int) and self.max_staleness >= 0):
            raise ValueError(f"max_staleness must be None or an int >= 0, got {self.max_staleness!r}.")
        if self.importance_weight_cap is not None and not self.importance_weight_cap > 0:
            raise ValueError(f"importance_weight_cap must be None or > 0, got {self.importance_weight_cap!r}.")
        for name in ("monitor_entries", "staleness_histogram_bins"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be an int >= 0, got {getattr(self, name)!r}.")
        if not 0 <= self.monitor_discount < 1:
            raise ValueError(f"monitor_discount must be in [0, 1), got {self.monitor_discount!r}.")
        # The monitor measures at most the N entries there are: the config (and a run's config.json) says so.
        object.__setattr__(self, "monitor_entries", min(self.monitor_entries, self.pool_capacity))

    @property
    def uses_counts(self) -> bool:
        if self.elite_path == "auto":
            return self.num_batches * self.num_elites >= self.pool_capacity
        return self.elite_path == "counts"


class Sizes(flax.struct.PyTreeNode):
    """J, C, K of an update: Python ints, or int32 arrays inside the config's sizes, which are then maxima (a
    sweep vmaps over them; `select_elites_masked`)."""

    num_batches: Any  # J
    batch_size: Any  # C
    num_elites: Any  # K

    @classmethod
    def of(cls, config: UpdateConfig) -> Sizes:
        return cls(config.num_batches, config.batch_size, config.num_elites)

    def check(self, config: UpdateConfig) -> None:
        """Raises ValueError if these sizes, where they are concrete numbers, lie outside the config's maxima or
        have K > C."""
        values = (self.num_batches, self.batch_size, self.num_elites)
        if any(isinstance(value, jax.core.Tracer) for value in values):
            return
        num_batches, batch_size, num_elites = (int(value) for value in values)
        maxima = (config.num_batches, config.batch_size, config.num_elites)
        if not (
            1 <= num_batches <= maxima[0] and 1 <= num_elites <= batch_size <= maxima[1] and num_elites <= maxima[2]
        ):
            raise ValueError(
                f"sizes (J, C, K) = {(num_batches, batch_size, num_elites)} must lie within the "
                f"config's {maxima}, with 1 <= K <= C."
            )

    def within(self, config: UpdateConfig) -> tuple[Sizes, jax.Array]:
        """(these sizes inside the config's maxima with 1 <= K <= C, whether any had to be clamped): traced
        sizes cannot be refused, so they are clamped and the flag (a metric) says so."""
        values = (self.num_batches, self.batch_size, self.num_elites)
        num_batches = jnp.clip(self.num_batches, 1, config.num_batches)
        batch_size = jnp.clip(self.batch_size, 1, config.batch_size)
        num_elites = jnp.clip(self.num_elites, 1, jnp.minimum(batch_size, config.num_elites))
        clamped = Sizes(num_batches, batch_size, num_elites)
        changed = jnp.any(
            jnp.stack([jnp.asarray(a) != b for a, b in zip(values, (num_batches, batch_size, num_elites))])
        )
        return clamped, changed

"""Skipped optimizer steps: counted in the program, followed across updates on the host, and the stop of a
run that no longer applies any.

    counts = update_counts(metrics)          # in the program: an iteration's U updates' metrics -> its counts
    totals = totals_after(totals, counts)    # on the host, after some iterations: skipped so far, and in a row
    stop = stop_for_skips(labels, totals, limit)   # the error that stops the run, or None

An update is tried and not applied (`PolicyState.apply_if_finite`) before FTW's pool holds C entries
(`ready` False: expected at a run's start, never a problem), and once ready when the loss, a gradient or an
optimizer update is not finite (`nonfinite`), or when nothing was kept (FTW's beat_minimum on tied returns).
Only the ready ones count here as *skipped*. Algorithms without a `ready` metric are always ready, and
without a `nonfinite` metric every skip of theirs is a non-finite one (their only reason to skip).
"""

from __future__ import annotations

from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

# Per iteration, of its U updates: applied; skipped (ready, not applied); skipped for a non-finite value; and
# those of them after the iteration's last applied update, which a run of skipped updates goes on from.
COUNTS = ("applied_count", "skipped_count", "nonfinite_count", "skipped_trailing", "nonfinite_trailing")

NONFINITE_ADVICE = (
    "try a lower `learning_rate`, `max_grad_norm` 1 or `optimizer` sgd (unless metrics.jsonl's "
    "observation_nonfinite is true: then the episodes hold NaN or infinite observations)"
)
NOTHING_KEPT_ADVICE = (
    "try `elite_rule` top_k (beat_minimum keeps nothing from a minibatch of tied returns) or episodes whose "
    "returns differ"
)


class StoppedRun(Exception):
    """A run stopped on purpose, checkpointed where it stopped (exit 3); `str()` is the one line to print and
    `go_on` the setting that resumes past it (as `name` value: the command line says its flag)."""

    go_on = ""

    def __init__(self, message: str, go_on: str | None = None):
        super().__init__(message)
        if go_on is not None:
            self.go_on = go_on


class SkippedUpdates(StoppedRun):
    """A run stopped because a member applied none of its last ready updates; `str()` is the one line to print."""

    go_on = "`stop_after_skipped` 0"


def update_counts(metrics: dict) -> dict[str, jax.Array]:
    """The `COUNTS` of one iteration's updates, from their metrics (leaves [U]: `applied`, and `ready` and
    `nonfinite` where the algorithm logs them), as int32 scalars. Pure: runs inside the program or on the
    host's copies."""
    applied = jnp.asarray(metrics["applied"], bool)
    chex.assert_rank(applied, 1)
    ready = jnp.asarray(metrics.get("ready", jnp.ones_like(applied)), bool)
    nonfinite = jnp.asarray(metrics.get("nonfinite", ~applied), bool)
    skipped = ready & ~applied
    order = jnp.arange(applied.shape[0])
    trailing = skipped & (order > jnp.max(jnp.where(applied, order, -1)))
    count = lambda flags: jnp.sum(flags, dtype=jnp.int32)  # noqa: E731
    return {
        "applied_count": count(applied),
        "skipped_count": count(skipped),
        "nonfinite_count": count(skipped & nonfinite),
        "skipped_trailing": count(trailing),
        "nonfinite_trailing": count(trailing & nonfinite),
    }


def skipped_in_a_row(in_a_row: np.ndarray, applied: np.ndarray, trailing: np.ndarray) -> np.ndarray:
    """Ready updates skipped in a row at the end of some iterations, from the count before them `in_a_row` [M]
    and each iteration's `applied_count` and `skipped_trailing` (or `nonfinite_trailing`) [M, I], in order.

    An iteration that applies an update starts the run again from its trailing skips; one that applies none
    adds its skips to it (updates not ready neither add nor break it)."""
    in_a_row = np.asarray(in_a_row, np.int64)
    for index in range(np.shape(applied)[-1]):
        in_a_row = np.asarray(trailing)[..., index] + np.where(np.asarray(applied)[..., index] == 0, in_a_row, 0)
    return in_a_row


# A run's totals so far, per member: ready updates skipped, those for a non-finite value, and the skipped (non-finite)
# ones in a row since the last applied update.
TOTALS = ("updates_skipped", "updates_nonfinite", "skipped_in_a_row", "nonfinite_in_a_row")


def no_skips(num_members: int | None = None) -> dict[str, np.ndarray]:
    """`TOTALS` at a run's start: zeros [M] (scalars without `num_members`)."""
    return {name: np.zeros(() if num_members is None else (num_members,), np.int64) for name in TOTALS}


def totals_after(before: dict, counts: dict) -> dict[str, np.ndarray]:
    """`TOTALS` after some iterations, from those before them (leaves [M] or scalars) and the iterations'
    `COUNTS` (leaves [M, I] or [I], in order)."""
    counts = {name: np.asarray(value) for name, value in counts.items()}
    applied = counts["applied_count"]
    return {
        "updates_skipped": before["updates_skipped"] + counts["skipped_count"].sum(axis=-1),
        "updates_nonfinite": before["updates_nonfinite"] + counts["nonfinite_count"].sum(axis=-1),
        "skipped_in_a_row": skipped_in_a_row(before["skipped_in_a_row"], applied, counts["skipped_trailing"]),
        "nonfinite_in_a_row": skipped_in_a_row(before["nonfinite_in_a_row"], applied, counts["nonfinite_trailing"]),
    }


def limit_of(stop_after_skipped: int | None, updates_per_period: int) -> int | None:
    """The run of skipped ready updates that stops a run: the setting's N, a whole period's updates for None,
    never (None) for 0."""
    if stop_after_skipped is None:
        return updates_per_period
    return stop_after_skipped or None


def stuck(in_a_row: np.ndarray, limit: int | None) -> np.ndarray:
    """[M] bool: the members whose last `limit` ready updates were all skipped (none with no limit)."""
    in_a_row = np.asarray(in_a_row)
    return np.zeros(in_a_row.shape, bool) if limit is None else in_a_row >= limit


def stop_for_skips(
    labels: Sequence[str],
    totals: dict,
    limit: int | None,
    *,
    whole: str = "",
    nonfinite_advice: str = NONFINITE_ADVICE,
) -> SkippedUpdates | None:
    """The error that stops a run whose members (`labels`; `totals` as `totals_after` gives them, leaves [M])
    applied none of their last `limit` ready updates, naming those members (`stop_message`); None while none has
    (and always without a limit)."""
    in_a_row = np.atleast_1d(np.asarray(totals["skipped_in_a_row"]))
    members = stuck(in_a_row, limit)
    if limit is None or not members.any():
        return None
    nonfinite = np.atleast_1d(np.asarray(totals["nonfinite_in_a_row"]))
    return SkippedUpdates(
        stop_message(
            [label for label, member_stuck in zip(labels, members) if member_stuck],
            in_a_row[members],
            nonfinite[members],
            limit,
            whole=whole,
            nonfinite_advice=nonfinite_advice,
        )
    )


def _reason(skipped: int, nonfinite: int) -> str:
    if nonfinite == skipped:
        return "all non-finite"
    if nonfinite == 0:
        return "all with nothing kept"
    return f"{nonfinite:,} non-finite, {skipped - nonfinite:,} with nothing kept"


def stop_message(
    labels: Sequence[str],
    in_a_row: np.ndarray,
    nonfinite_in_a_row: np.ndarray,
    limit: int,
    *,
    whole: str = "",
    nonfinite_advice: str = NONFINITE_ADVICE,
    shown: int = 6,
) -> str:
    """One line: which members applied no update for at least `limit` ready updates in a row, how many and
    why, and what to try. `labels`, `in_a_row` and `nonfinite_in_a_row` are those of the stuck members;
    `whole` names `limit` when it is the default ("a whole period")."""
    groups: dict[tuple[int, int], list[str]] = {}
    for label, skipped, nonfinite in zip(labels, np.asarray(in_a_row), np.asarray(nonfinite_in_a_row)):
        groups.setdefault((int(skipped), int(nonfinite)), []).append(label)
    parts = [
        f"{', '.join(members)} skipped the last {skipped:,} ({_reason(skipped, nonfinite)})"
        for (skipped, nonfinite), members in list(groups.items())[:shown]
    ]
    if len(groups) > shown:
        parts.append(f"{sum(len(members) for members in list(groups.values())[shown:])} more members too")
    why = []
    if any(nonfinite for _, nonfinite in groups):
        why.append(f"Non-finite (the loss, a gradient or an optimizer update was NaN or infinite): {nonfinite_advice}.")
    if any(nonfinite < skipped for skipped, nonfinite in groups):
        why.append(f"Nothing kept: {NOTHING_KEPT_ADVICE}.")
    named = f"{whole}; " if whole else ""
    return (
        f"no update applied for {limit:,} ready update{'s' if limit != 1 else ''} in a row ({named}"
        f"`stop_after_skipped`): {'; '.join(parts)}. " + " ".join(why)
    )

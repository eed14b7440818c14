"""Wall-clock timing of device work, as the benchmarks measure it: each call waited for (JAX dispatches
asynchronously, so a call returns before its work is done), the first call apart (it compiles), the median of
the rest (robust to a shared machine's stalls).

    seconds, result = wall_seconds(step, state)                  # one call, waited for
    median, first = median_seconds(lambda: step(state), repeats=5)  # after a first call that compiles
    medians = interleaved_medians([ours, theirs], repeats=20)    # several calls alternated: the same noise for each
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax


def wall_seconds(function: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """(seconds, result) of one call of `function(*args)`, its result waited for (a compiled program, which has
    nothing to wait for, is returned as it is)."""
    started = time.perf_counter()
    result = function(*args)
    if not hasattr(result, "memory_analysis"):
        result = jax.block_until_ready(result)
    return time.perf_counter() - started, result


def median_seconds(call: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(the median seconds of `repeats` calls of `call()`, the first call's seconds), each waited for; the first
    call, which compiles, is not among the `repeats`."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}.")
    first, _ = wall_seconds(call)
    return statistics.median(wall_seconds(call)[0] for _ in range(repeats)), first


def interleaved_medians(calls: Sequence[Callable[[int], Any]], repeats: int, warmup: int = 1) -> list[float]:
    """The median seconds of each call `f(i) -> outputs` (i the call's index, for keys split beforehand), the calls
    alternated so that a stall of the machine falls on them alike; `warmup` rounds first, not timed."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats!r}.")
    for i in range(warmup):
        for call in calls:
            jax.block_until_ready(call(i))
    samples: list[list[float]] = [[] for _ in calls]
    for i in range(warmup, warmup + repeats):
        for call, sample in zip(calls, samples):
            sample.append(wall_seconds(call, i)[0])
    return [statistics.median(sample) for sample in samples]

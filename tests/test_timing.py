"""ftw_jax.running.timing: device work is waited for, the compiling call is set apart, and calls alternate."""

import jax.numpy as jnp
import pytest

from ftw_jax.running import timing


def test_wall_seconds_waits_for_the_result_and_returns_it():
    seconds, result = timing.wall_seconds(lambda x: x * 2, jnp.arange(3))
    assert seconds > 0 and result.tolist() == [0, 2, 4] and result.is_fully_replicated


def test_median_seconds_sets_the_first_call_apart():
    calls = []

    def call():
        calls.append(len(calls))
        return jnp.ones(())

    median, first = timing.median_seconds(call, repeats=3)
    assert calls == [0, 1, 2, 3] and median > 0 and first > 0
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        timing.median_seconds(call, repeats=0)


def test_interleaved_medians_alternate_the_calls_with_their_index():
    seen = []
    calls = [lambda i: seen.append(("a", i)) or jnp.zeros(()), lambda i: seen.append(("b", i)) or jnp.zeros(())]
    medians = timing.interleaved_medians(calls, repeats=2, warmup=1)
    assert seen == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    assert len(medians) == 2 and all(value >= 0 for value in medians)

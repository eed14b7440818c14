"""A pytest plugin that records how long each test spent in XLA compiling, for experiments/suite/test_durations.py.

    PYTHONPATH=experiments/suite python -m pytest -p pytest_compile_times -p no:logging --durations=0 > pytest.log
    python experiments/suite/test_durations.py pytest.log --compiles compile-times.txt

It turns on `jax_log_compiles` and appends one line per test to `compile-times.txt` (or to the file named by
FTW_JAX_COMPILE_TIMES): its wall seconds, its seconds in XLA compilation, how many programs it compiled and the
four names compiled most often (`jit(scan)`, `jit(add)` and the like mean code that ran eagerly, op by op).
Compiles in processes a test starts are not seen.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import time

import jax
import pytest

FINISHED = re.compile(r"Finished XLA compilation of (\S+) .*in ([0-9.]+) sec")
OUTPUT = os.environ.get("FTW_JAX_COMPILE_TIMES", "compile-times.txt")
_current: dict = {}


class _Listener(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        match = FINISHED.search(record.getMessage())
        if match and _current:
            _current["seconds"] += float(match.group(2))
            _current["names"][match.group(1)] += 1


def pytest_configure(config: pytest.Config) -> None:
    jax.config.update("jax_log_compiles", True)
    listener = _Listener(logging.DEBUG)
    for name in ("jax._src.dispatch", "jax._src.interpreters.pxla", "jax"):
        logger = logging.getLogger(name)
        logger.addHandler(listener)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False  # the messages go to the listener only, not to the terminal


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _current.update(seconds=0.0, names=collections.Counter())
    started = time.perf_counter()
    yield
    wall, names = time.perf_counter() - started, _current["names"]
    common = ", ".join(f"{name}x{count}" for name, count in names.most_common(4))
    with open(OUTPUT, "a") as file:
        seconds, count = _current["seconds"], sum(names.values())
        file.write(f"{wall:7.1f} wall {seconds:6.1f} compile {count:4d} n  {item.nodeid}  [{common}]\n")
    _current.clear()

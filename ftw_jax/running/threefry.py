"""Threefry on XLA's CPU backend lowered as JAX lowers it for GPU and TPU: unrolled. The same bits, sooner. Opt in.

Every `jax.random` draw of JAX's default PRNG hashes with threefry2x32. On CPU, JAX lowers the hash to a rolled
loop (five trips of four rounds); on GPU and TPU, to the twenty rounds written out. On this project's programs
the rolled loop is the slower of the two on CPU, to compile and to run, and more so when another process
shares the cores (2-core CPU, docs/results.md): the bandit reproduction over 1000 seeds compiles in 1.2 s
instead of 2.2 s and runs in 0.55 s instead of 0.77 s, and `ftw-jax train --env cartpole` steps 1.6× faster.
The hash is the same function either way, so every draw is bit-identical: the golden runs pin it, and the tests
check Random123's known answer.

`use_unrolled()` registers JAX's own unrolled lowering for the CPU platform, for every program the process
lowers afterwards (its caller's too), so importing ftw_jax never calls it: the command line does, before it
compiles anything, and a script may (`from ftw_jax.running import threefry; threefry.use_unrolled()`). It reaches
a private JAX name: where a JAX release lacks it, nothing changes (the rolled loop stays, the bits are the
same). `FTW_JAX_THREEFRY=rolled` keeps JAX's choice. Programs lowered before the call keep theirs.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping

ENVIRONMENT_VARIABLE = "FTW_JAX_THREEFRY"
CHOICES = ("unrolled", "rolled")
_registered: list[bool] = []  # [True] once this process lowers threefry unrolled
# Where JAX keeps the threefry primitive and its unrolled lowering: newer releases, then older ones.
JAX_MODULES = ("jax._src.random.threefry2x32", "jax._src.prng")


def use_unrolled(environ: Mapping[str, str] = os.environ) -> bool:
    """Lowers threefry unrolled on CPU from now on in this process; returns whether it does (False where
    FTW_JAX_THREEFRY=rolled, or is not a choice (a one-line warning), or this JAX has no unrolled lowering)."""
    choice = environ.get(ENVIRONMENT_VARIABLE, "unrolled")
    if choice not in CHOICES:  # a warning, not an error: either lowering gives the same bits
        message = f"{ENVIRONMENT_VARIABLE} must be one of {CHOICES}, got {choice!r}; keeping JAX's rolled loop"
        print(f"warning: {message}", file=sys.stderr)
        return False
    if choice == "rolled":
        return False
    from jax.interpreters import mlir

    for name in JAX_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        primitive = getattr(module, "threefry2x32_p", None)
        rule = getattr(module, "_threefry2x32_lowering_rule", None)  # the GPU and TPU lowering: unrolled
        if primitive is not None and rule is not None:
            mlir.register_lowering(primitive, rule, platform="cpu", inline=False)
            _registered[:] = [True]
            return True
    return False


def in_use() -> bool:
    """Whether this process lowers threefry unrolled on CPU (`use_unrolled` registered it)."""
    return bool(_registered)

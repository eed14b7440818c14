"""Shared test set-up: programs compiled for speed of compiling, key-reuse checking on, and small shared helpers."""

import functools
import os
import shutil
import subprocess
import sys
import tempfile

# The suite's programs are tiny and most of a test's time is XLA compiling them, so the tests compile for speed
# of compiling (docs/testing.md), in this process and the commands it starts: LLVM's optimisations off (a third
# less time) and XLA's older CPU code generator for fusions, which compiles in two thirds of the time of its
# MLIR fusion emitters. The numbers are the same maths rounded another way, which the tests' tolerances and the
# golden runs' margins are made for. FTW_JAX_TEST_OPTIMIZED=1 runs the suite as users run the package.
COMPILE_FOR_SPEED = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def _xla_accepts(flags: str) -> bool:
    """Whether this jaxlib knows every flag in `flags`: XLA ends a process given one it does not, so a child asks."""
    probe = [sys.executable, "-c", "import jax; jax.devices()"]
    environment = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(probe, env=environment, capture_output=True).returncode == 0


# Set once, by the first conftest: the processes the tests start inherit it, and flags set by hand are kept.
if os.environ.get("FTW_JAX_TEST_OPTIMIZED") != "1" and "xla_backend_optimization_level" not in os.environ.get(
    "XLA_FLAGS", ""
):
    # Newest flag last: a jaxlib that has dropped one still gets the others.
    for count in range(len(COMPILE_FOR_SPEED), 0, -1):
        flags = f"{os.environ.get('XLA_FLAGS', '')} {' '.join(COMPILE_FOR_SPEED[:count])}".strip()
        if _xla_accepts(flags):
            os.environ["XLA_FLAGS"] = flags
            break

# The suite runs on two processes (pytest -n 2): on a GPU each would otherwise reserve most of its memory at start.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import jax.numpy as jnp
import pytest

from ftw_jax import Trajectory
from ftw_jax.running import compile_cache, threefry

jax.config.update("jax_debug_key_reuse", True)
threefry.use_unrolled()  # the suite opts in as the command line does: the same bits, its programs compile faster

# The tests (in process, and the commands they start as processes) share one compilation cache, not the user's:
# a program compiled twice in the suite (a run and its resumed run, a member and its standalone run) is read
# back the second time. FTW_JAX_COMPILE_CACHE=off (or a folder) set before pytest starts is kept.
_SESSION_CACHE = None
if compile_cache.ENVIRONMENT_VARIABLE not in os.environ:
    _SESSION_CACHE = tempfile.mkdtemp(prefix="ftw-jax-test-compile-cache-")
    os.environ[compile_cache.ENVIRONMENT_VARIABLE] = _SESSION_CACHE
compile_cache.configure()


def pytest_unconfigure(config):
    if _SESSION_CACHE:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


def make_trajectories(batch, num_steps, *, returns=None, observation_size=3, seed=0):
    """B random trajectories [B, T] with every step masked in; returns default to 0..B-1."""
    key_observation, key_action = jax.random.split(jax.random.key(seed))
    if returns is None:
        returns = jnp.arange(batch, dtype=jnp.float32)
    return Trajectory(
        observation=jax.random.normal(key_observation, (batch, num_steps, observation_size)),
        action=jax.random.randint(key_action, (batch, num_steps), 0, 2),
        mask=jnp.ones((batch, num_steps), bool),
        behaviour_logp=jnp.full((batch, num_steps), -0.5, jnp.float32),
        behaviour_version=jnp.zeros((batch, num_steps), jnp.int32),
        episode_return=jnp.asarray(returns, jnp.float32),
        reward=jnp.zeros((batch, num_steps), jnp.float32).at[:, -1].set(jnp.asarray(returns, jnp.float32)),
        alive=jnp.ones((batch, num_steps), bool),
    )


@pytest.fixture
def unchecked_key_reuse():
    """Turns the key-reuse checker off for one test.

    jax's experimental checker rejects any scan over split keys inside vmap, a false positive:
    `vmap(lambda k: scan(f, 0, split(k, 5)))` alone trips it. Tests of vmapped programs use this;
    `tests/test_bandit.py::test_one_seed_reuses_no_key` checks the same kind of program without vmap. It also
    keeps a bool per key element of every split: a program drawing a billion keys needs gigabytes to be traced.
    """
    with jax.debug_key_reuse(False):
        yield


def write_tiny_bpe_checkpoint(folder, vocab_size: int = 320):
    """A Hugging Face folder as a real chat model's, tiny (`ftw_jax.lm.tiny`): a byte-level BPE tokenizer trained on
    the text search task's words (small enough that some words take several tokens). Returns the folder."""
    from ftw_jax.envs.text_search import INSTRUCTIONS, WORDS
    from ftw_jax.lm.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(folder, [INSTRUCTIONS, " ".join(WORDS[3:])] * 3, vocab_size)


def with_cpu_devices(count: int) -> dict[str, str]:
    """The environment of a child process that sees `count` CPU devices, with this suite's XLA flags kept."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}".strip()
    return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}


@functools.cache
def jitted_steps(env):
    """A task's `reset`, `forced_action` and `step`, jitted once per task for the session: scripted episodes
    call them step by step, and called eagerly each of their operations would compile on its own."""
    return jax.jit(env.reset), jax.jit(env.forced_action), jax.jit(env.step)

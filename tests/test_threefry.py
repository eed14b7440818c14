"""Threefry lowered unrolled on CPU (ftw_jax.running.threefry): off for a process that only imports ftw_jax, on where
asked (the command line, this suite's conftest), the same bits as JAX's rolled loop, Random123's known answer, and
FTW_JAX_THREEFRY read as documented."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry_2x32

from ftw_jax.running import threefry

# Draws of the kinds the project makes (split, fold_in, bits, normal, randint, categorical), vmapped.
DRAWS = """
import json, sys
import jax, jax.numpy as jnp
from ftw_jax.running import threefry
threefry.use_unrolled()

def draws(key):
    a, b = jax.random.split(key)
    return {
        "bits": jax.random.bits(jax.random.fold_in(a, 7), (5,)),
        "normal": jax.random.normal(b, (3,)),
        "randint": jax.random.randint(a, (4,), 0, 37),
        "categorical": jax.random.categorical(b, jnp.array([0.1, 0.5, -1.0])),
    }

out = jax.jit(jax.vmap(draws))(jax.vmap(jax.random.key)(jnp.arange(3, dtype=jnp.uint32)))
print(json.dumps(jax.tree.map(lambda leaf: leaf.tolist(), out)))
"""


def _draws(environ: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", DRAWS], env={**os.environ, **environ}, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


# Lowers a draw before and after importing ftw_jax and every module of it, and reads JAX's settings each time.
UNTOUCHED = """
import importlib, json, pkgutil
import jax

def lowered():
    return jax.jit(lambda key: jax.random.bits(key, (4,))).lower(jax.random.key(0)).as_text()

before, settings_before = lowered(), dict(jax.config.values)
import ftw_jax
for module in pkgutil.walk_packages(ftw_jax.__path__, "ftw_jax."):
    if not module.name.endswith("__main__"):  # running the command is not importing it
        importlib.import_module(module.name)
after, settings_after = lowered(), dict(jax.config.values)
changed = sorted(name for name in settings_after if settings_after[name] != settings_before.get(name))
print(json.dumps({"same_lowering": before == after, "rolled": "stablehlo.while" in after, "changed_settings": changed}))
"""


def test_importing_ftw_jax_leaves_jax_untouched():
    environ = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", UNTOUCHED], env=environ, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    assert found == {"same_lowering": True, "rolled": True, "changed_settings": []}


def test_once_asked_threefry_is_lowered_without_loops_on_cpu():
    # The rolled lowering is a while loop; JAX's unrolled one (registered by the suite's conftest, as the command
    # line does) has none.
    assert threefry.in_use()
    lowered = jax.jit(lambda key: jax.random.bits(key, (4,))).lower(jax.random.key(0)).as_text()
    assert jax.default_backend() != "cpu" or "stablehlo.while" not in lowered


def test_unrolled_threefry_gives_random123s_known_answer():
    # Random123's known-answer vector for threefry2x32 with 20 rounds (kat_vectors: pi digits in, this out).
    key = jnp.array([0x13198A2E, 0x03707344], jnp.uint32)
    count = jnp.array([0x243F6A88, 0x85A308D3], jnp.uint32)
    hashed = jax.jit(threefry_2x32)(key, count)
    assert [int(word) for word in hashed] == [0xC4923A9C, 0x483DF7A0]


def test_draws_are_bit_identical_to_jaxs_rolled_loop():
    unrolled, rolled = _draws({}), _draws({threefry.ENVIRONMENT_VARIABLE: "rolled"})
    for name in unrolled:
        np.testing.assert_array_equal(np.asarray(unrolled[name]), np.asarray(rolled[name]), err_msg=name)


def test_the_environment_variable_chooses_and_a_bad_value_is_named(capsys):
    assert threefry.use_unrolled({}) is True  # this JAX has the lowering to register
    assert threefry.use_unrolled({threefry.ENVIRONMENT_VARIABLE: "rolled"}) is False
    assert threefry.use_unrolled({threefry.ENVIRONMENT_VARIABLE: "fast"}) is False
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and "FTW_JAX_THREEFRY must be one of ('unrolled', 'rolled'), got 'fast'" in warning
    threefry.use_unrolled({})  # as the suite's conftest left it, for the tests after this one


def test_a_bad_value_warns_in_one_line_and_the_command_runs():
    environ = {**os.environ, threefry.ENVIRONMENT_VARIABLE: "fast"}
    done = subprocess.run(
        [sys.executable, "-m", "ftw_jax.cli", "--version"], env=environ, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout.startswith("ftw-jax ")
    assert done.stderr.strip().splitlines() == [
        "warning: FTW_JAX_THREEFRY must be one of ('unrolled', 'rolled'), got 'fast'; keeping JAX's rolled loop"
    ]

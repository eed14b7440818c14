"""The command line's persistent compilation cache: where it lives, how it is turned off, and that a cached
program gives the run a fresh compile gives."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from ftw_jax import compile_cache

BANDIT = [
    sys.executable,
    "-m",
    "ftw_jax.cli",
    "bandit",
    "--num-seeds",
    "2",
    "--iterations",
    "30",
    "--no-plot",
    "--json",
]


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"HOME": "/home/u"}, "/home/u/.cache/ftw_jax/jax"),
        ({"HOME": "/home/u", "XDG_CACHE_HOME": "/cache"}, "/cache/ftw_jax/jax"),
        ({"HOME": "/home/u", "FTW_JAX_COMPILE_CACHE": "~/elsewhere"}, "/home/u/elsewhere"),
        ({"HOME": "/home/u", "FTW_JAX_COMPILE_CACHE": "off"}, None),
        ({"HOME": "/home/u", "FTW_JAX_COMPILE_CACHE": "0"}, None),
        ({"HOME": "/home/u", "FTW_JAX_COMPILE_CACHE": ""}, None),
        ({"HOME": "/home/u", "JAX_COMPILATION_CACHE_DIR": "/jax"}, None),  # JAX's own setting rules
    ],
)
def test_the_cache_folder_follows_the_environment(environ, expected, monkeypatch):
    monkeypatch.setenv("HOME", environ["HOME"])  # `~` expands from the process's HOME
    found = compile_cache.folder(environ)
    assert (None if found is None else str(found)) == expected


def run(cache, *flags):
    """The bandit command as a process with `cache` as its cache folder: (its summary, the files in the cache)."""
    # Every program written, however fast it compiled: the files then do not depend on the machine's load.
    environ = {
        **os.environ,
        compile_cache.ENVIRONMENT_VARIABLE: str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    done = subprocess.run([*BANDIT, *flags], env=environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), sorted(path.name for path in pathlib.Path(cache).glob("*"))


@pytest.mark.slow
def test_a_second_run_reads_the_program_the_first_wrote_and_gives_the_same_numbers(tmp_path):
    first, written = run(tmp_path / "cache")
    assert any(name.startswith("jit_run") for name in written)  # the protocol's vmapped program
    second, after = run(tmp_path / "cache")
    assert after == written  # read, not written again
    assert second["best_arm_probability_final"] == first["best_arm_probability_final"]


@pytest.mark.slow
def test_no_compile_cache_reads_and_writes_nothing(tmp_path):
    _, written = run(tmp_path / "cache", "--no-compile-cache")
    assert written == []


@pytest.mark.slow
def test_a_cache_folder_that_cannot_be_made_warns_and_the_run_goes_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    environ = {**os.environ, compile_cache.ENVIRONMENT_VARIABLE: str(blocker / "cache")}
    done = subprocess.run(BANDIT, env=environ, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "warning: no compilation cache" in done.stderr
    assert len(json.loads(done.stdout)["best_arm_probability_final"]) == 2

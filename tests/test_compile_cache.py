"""The command line's persistent compilation cache: where it lives, how it is turned off, and that a cached
program gives the run a fresh compile gives."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from ftw_jax.running import compile_cache

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
    # The protocol's vmapped program, traced (exported/) and compiled (JAX's file).
    assert "exported" in written and any(name.startswith("jit_call") for name in written)
    traced = sorted(path.name for path in (tmp_path / "cache" / "exported").iterdir())
    second, after = run(tmp_path / "cache")
    assert after == written and sorted(path.name for path in (tmp_path / "cache" / "exported").iterdir()) == traced
    assert second["best_arm_probability_final"] == first["best_arm_probability_final"]
    uncached, _ = run(tmp_path / "other", "--no-compile-cache")  # traced here: the exported program is the same
    assert uncached["best_arm_probability_final"] == first["best_arm_probability_final"]


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


def doubled_plus_one():
    return jax.jit(lambda x: 2 * x + 1)


def never_built():
    raise AssertionError("the cached program should have been read, not built")


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    """A persistent cache folder as cached_export sees it (JAX's own cache is left alone)."""
    monkeypatch.setattr(compile_cache, "_cache_folder", lambda: str(tmp_path))
    return tmp_path


def test_an_exported_program_is_read_back_without_building_or_tracing_it(cache_folder):
    x = np.arange(4, dtype=np.float32)
    first = compile_cache.cached_export(doubled_plus_one, (x,), identity="a")(x)
    (written,) = (cache_folder / compile_cache.EXPORTED_FOLDER).iterdir()
    again = compile_cache.cached_export(never_built, (x,), identity="a")(x)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(first))
    np.testing.assert_array_equal(np.asarray(first), 2 * x + 1)
    assert list((cache_folder / compile_cache.EXPORTED_FOLDER).iterdir()) == [written]


def test_another_identity_or_shape_is_another_program(cache_folder):
    x = np.arange(4, dtype=np.float32)
    compile_cache.cached_export(doubled_plus_one, (x,), identity="a")(x)
    compile_cache.cached_export(doubled_plus_one, (x,), identity="b")(x)
    longer = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(
        np.asarray(compile_cache.cached_export(doubled_plus_one, (longer,), identity="a")(longer)), 2 * longer + 1
    )
    assert len(list((cache_folder / compile_cache.EXPORTED_FOLDER).iterdir())) == 3


def test_a_damaged_exported_program_is_exported_again(cache_folder):
    x = np.arange(4, dtype=np.float32)
    compile_cache.cached_export(doubled_plus_one, (x,), identity="a")(x)
    (written,) = (cache_folder / compile_cache.EXPORTED_FOLDER).iterdir()
    written.write_bytes(b"not a program")
    np.testing.assert_array_equal(
        np.asarray(compile_cache.cached_export(doubled_plus_one, (x,), identity="a")(x)), 2 * x + 1
    )
    np.testing.assert_array_equal(  # rewritten: readable again
        np.asarray(compile_cache.cached_export(never_built, (x,), identity="a")(x)), 2 * x + 1
    )


def test_without_a_persistent_cache_the_function_itself_runs(monkeypatch):
    monkeypatch.setattr(compile_cache, "_cache_folder", lambda: None)
    function = doubled_plus_one()
    assert compile_cache.cached_export(lambda: function, (np.zeros(2),), identity="a") is function


def test_only_the_most_recently_used_exported_programs_are_kept(tmp_path):
    for age in range(5):
        path = tmp_path / f"{age}.jaxexport"
        path.write_bytes(b"")
        os.utime(path, (1000 - age, 1000 - age))  # 0 is the most recent
    compile_cache._keep_recent(tmp_path, 2)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["0.jaxexport", "1.jaxexport"]


def test_an_unwritable_cache_warns_and_the_program_still_runs(cache_folder, capsys):
    (cache_folder / compile_cache.EXPORTED_FOLDER).write_text("a file where the folder would go")
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(
        np.asarray(compile_cache.cached_export(doubled_plus_one, (x,), identity="a")(x)), 2 * x + 1
    )
    assert "warning: the traced program was not cached" in capsys.readouterr().err

"""JAX's persistent compilation cache for the command line: the second run of a program skips most of its compile.

`ftw-jax` turns it on before its first compile, in a folder under the user's cache directory
(`$XDG_CACHE_HOME/ftw_jax/jax`, else `~/.cache/ftw_jax/jax`). `FTW_JAX_COMPILE_CACHE=DIR` moves it,
`FTW_JAX_COMPILE_CACHE=off` (or `--no-compile-cache`) turns it off, and a `JAX_COMPILATION_CACHE_DIR` the user
set is left to JAX. The cache is keyed by the program, the JAX version and the device, so a stale entry is
never used; it is trusted code, so keep it where only you can write. It keeps to 4 GiB, dropping the least
recently used programs; deleting the folder is always safe.
"""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Mapping

ENVIRONMENT_VARIABLE = "FTW_JAX_COMPILE_CACHE"
OFF = ("off", "0", "false", "no", "none")
# Programs that compile faster than this are not written (reading a file costs about as much), unless
# JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise.
MIN_COMPILE_SECONDS = 0.5
# The folder's size limit: past it, the least recently used programs are removed.
MAX_BYTES = 4 * 2**30


def folder(environ: Mapping[str, str] = os.environ) -> pathlib.Path | None:
    """Where the cache lives for this environment, or None when it is turned off or JAX's own setting rules."""
    chosen = environ.get(ENVIRONMENT_VARIABLE)
    if chosen is not None:
        return None if chosen.strip().lower() in OFF or not chosen.strip() else pathlib.Path(chosen).expanduser()
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    base = pathlib.Path(environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return base / "ftw_jax" / "jax"


def enable(path: pathlib.Path) -> None:
    """Compiled programs are read from and written to `path` from now on in this process."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    path = pathlib.Path(path)
    if _cache_folder() == str(path):
        return
    path.mkdir(mode=0o700, parents=True, exist_ok=True)  # compiled code runs from it: the user's alone
    compilation_cache.reset_cache()  # a cache already opened in this process keeps its folder otherwise
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)


def _cache_folder() -> str | None:
    """The folder JAX's persistent cache uses now, or None."""
    import jax

    return jax.config.jax_compilation_cache_dir  # pyright: ignore[reportAttributeAccessIssue] (a flag made at run time)


def disable() -> None:
    """No program is read from or written to a persistent cache from now on in this process."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if _cache_folder() is not None:
        compilation_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", None)


def configure(turned_off: bool = False, environ: Mapping[str, str] = os.environ) -> pathlib.Path | None:
    """The command line's setting: the cache's folder, or None when it is off (`--no-compile-cache`, the
    environment variable) or left to JAX (`JAX_COMPILATION_CACHE_DIR`)."""
    try:
        path = None if turned_off else folder(environ)
    except RuntimeError as error:  # no home directory to put it in (a container's user without one)
        print(f"warning: no compilation cache ({error}); set {ENVIRONMENT_VARIABLE} to a folder", file=sys.stderr)
        return None
    if path is not None:
        try:
            enable(path)
        except OSError as error:  # a cache is a saving, never a reason to stop
            print(
                f"warning: no compilation cache ({error}); set {ENVIRONMENT_VARIABLE} to a folder you can "
                "write, or to off",
                file=sys.stderr,
            )
            return None
    elif turned_off or environ.get(ENVIRONMENT_VARIABLE) is not None:
        disable()
    return path

"""JAX's persistent compilation cache for the command line: the second run of a program skips most of its compile.

`ftw-jax` turns it on before its first compile, in a folder under the user's cache directory
(`$XDG_CACHE_HOME/ftw_jax/jax`, else `~/.cache/ftw_jax/jax`). `FTW_JAX_COMPILE_CACHE=DIR` moves it,
`FTW_JAX_COMPILE_CACHE=off` (or `--no-compile-cache`) turns it off, and a `JAX_COMPILATION_CACHE_DIR` the user
set is left to JAX. The cache is keyed by the program, the JAX version and the device, so a stale entry is
never used; it is trusted code, so keep it where only you can write. It keeps to 4 GiB, dropping the least
recently used programs; deleting the folder is always safe.

`cached_export` goes one step further for a program that is traced anew in every process (the bandit command):
the program as `jax.export` serialized it is kept in the folder's `exported/`, so a second run skips tracing
as well as most of the compile.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import os
import pathlib
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ftw_jax.running import threefry

if TYPE_CHECKING:
    from jax.stages import Wrapped

ENVIRONMENT_VARIABLE = "FTW_JAX_COMPILE_CACHE"
OFF = ("off", "0", "false", "no", "none")
# Programs that compile faster than this are not written (reading a file costs about as much), unless
# JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS says otherwise.
MIN_COMPILE_SECONDS = 0.5
# The folder's size limit: past it, the least recently used programs are removed.
MAX_BYTES = 4 * 2**30
# Exported programs (`cached_export`): their subfolder, and how many are kept (the least recently used go).
EXPORTED_FOLDER = "exported"
MAX_EXPORTED = 64
# The libraries whose versions shape a traced program, besides the package's own source.
TRACING_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "chex", "numpy")


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


def cached_export(make_function: Callable[[], Wrapped], arguments: tuple, identity: str) -> Callable:
    """The jitted function `make_function()` builds, as the program `jax.export` makes of it for `arguments`'
    shapes: read from the persistent cache's `exported/` folder when an earlier process exported the same one
    (neither built nor traced; XLA's compile then comes from the compilation cache), else exported now and
    written there.

    The file's name hashes `identity` (what the caller's program depends on besides the package: its settings),
    the package's source, the versions of the libraries that trace it, the backend and the arguments' shapes
    and dtypes, so a program that would trace differently is never read. With no persistent cache on, or
    without `flatbuffers` (jax.export's serializer), it returns `make_function()` itself.
    """
    import jax

    folder = _cache_folder()
    if folder is None:
        return make_function()
    try:
        import flatbuffers  # noqa: F401 (jax.export serializes with it)
        from jax import export
    except ImportError:
        return make_function()
    path = pathlib.Path(folder) / EXPORTED_FOLDER / f"{_program_key(identity, arguments)}.jaxexport"
    try:
        exported = export.deserialize(bytearray(path.read_bytes()))
    except Exception:  # absent or unreadable: export it again (a cache is a saving, never a reason to stop)
        pass
    else:
        with contextlib.suppress(OSError):  # a read-only cache still serves its programs
            os.utime(path)  # recently used
        return exported.call
    exported = export.export(make_function())(*(jax.ShapeDtypeStruct(jax.numpy.shape(a), a.dtype) for a in arguments))
    try:
        from ftw_jax.running.run_files import write_atomically

        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomically(path, bytes(exported.serialize()))
    except OSError as error:
        print(f"warning: the traced program was not cached ({error})", file=sys.stderr)
        return exported.call
    with contextlib.suppress(OSError):  # another process pruning the same folder at the same moment
        _keep_recent(path.parent, MAX_EXPORTED)
    return exported.call


def _program_key(identity: str, arguments: tuple) -> str:
    import jax

    parts = [
        identity,
        _package_source_digest(),
        *(f"{name}=={_version(name)}" for name in TRACING_LIBRARIES),
        jax.default_backend(),
        jax.devices()[0].device_kind,
        f"threefry unrolled: {threefry.in_use()}",
        *(f"{a.dtype}{jax.numpy.shape(a)}" for a in arguments),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def _package_source_digest() -> str:
    """A hash of every Python file of the package: an edited install never reads a program traced before."""
    package = pathlib.Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _keep_recent(folder: pathlib.Path, count: int) -> None:
    """Removes all but the `count` most recently used exported programs in `folder`."""
    programs = sorted(folder.glob("*.jaxexport"), key=lambda path: path.stat().st_mtime, reverse=True)
    for path in programs[count:]:
        path.unlink(missing_ok=True)

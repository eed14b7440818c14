"""What wrote a record: the git commit of the code that ran (and whether its tree had changes), the versions of
the packages that computed, and the command line.

    record["provenance"] = provenance(["ftw-jax", *argv])

Kept beside a run's fingerprint, never inside it (`ftw_jax.running.checkpoints.config_differences` leaves it out):
a run resumed after a commit is the same run, and each record says which code wrote it. Reading it never fails a
run: without git, or where the package's folder is not the root of a git checkout (an installed wheel), the
commit is None and `source` says why.
"""

from __future__ import annotations

import functools
import importlib.metadata
import pathlib
import platform
import subprocess
import sys
from collections.abc import Sequence

# The packages whose versions decide what a run computes, beside the project's own.
PACKAGES = ("jax", "jaxlib", "optax", "flax", "numpy")
_GIT_SECONDS = 10.0  # a git that hangs (a network file system, a lock) must not hold a run up


def provenance(argv: Sequence[str]) -> dict:
    """{"commit": the HEAD of the package's git checkout or None, "dirty": whether tracked files differ from it
    (None without a commit), "source": where the code came from, "versions": {package: version or None},
    "command": `argv`}."""
    commit, dirty, source = _code()
    return {"commit": commit, "dirty": dirty, "source": source, "versions": _versions(), "command": list(argv)}


@functools.cache  # the code that ran is the code imported: read once, at the first record
def _code() -> tuple[str | None, bool | None, str]:
    """(commit, dirty, source) of the folder this package was imported from."""
    folder = pathlib.Path(__file__).resolve().parents[2]  # above ftw_jax/: the checkout's root, if it is one
    # .git: a clone's folder, or a worktree's file. Above the root is some other repository (a wheel installed
    # in a project's virtual environment), whose commit says nothing of this code.
    if not (folder / ".git").exists():
        return None, None, f"not a git checkout: {folder} (an installed package)"
    commit = _git(folder, "rev-parse", "HEAD")
    if commit is None:
        return None, None, f"git checkout {folder}, unread (git absent or failing)"
    changes = _git(folder, "status", "-s", "-uno")  # untracked files: run outputs, not code
    return commit, None if changes is None else bool(changes), f"git checkout {folder}"


def _git(folder: pathlib.Path, *arguments: str) -> str | None:
    """git's output in `folder`, stripped; None where git is absent, fails or hangs."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *arguments],
            capture_output=True,
            text=True,
            timeout=_GIT_SECONDS,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.cache
def _versions() -> dict[str, str | None]:
    # The package's own version from its __init__, loaded before any of its modules: the installed metadata may
    # be another checkout's (an editable install elsewhere).
    versions = {"ftw_jax": getattr(sys.modules.get("ftw_jax"), "__version__", None)}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {**versions, "python": platform.python_version()}

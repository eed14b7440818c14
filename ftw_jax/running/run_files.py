"""Run folders: the config, per-iteration metrics (JSON lines), CSV tables, a summary, checkpoints."""

from __future__ import annotations

import contextlib
import csv
import datetime
import functools
import json
import os
import pathlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ftw_jax.running.checkpoints import CheckpointSettings


def make_folder(path: pathlib.Path) -> pathlib.Path:
    """Creates `path` (and its parents) if needed; a ValueError says why it cannot be (a file, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"cannot use {path} as a folder: {error.strerror or error}.") from None
    if not os.access(path, os.W_OK):
        raise ValueError(f"cannot write into the folder {path}: permission denied.")
    return path


def new_run_folder(root: pathlib.Path, name: str) -> pathlib.Path:
    """A fresh folder `root/name-YYYYmmdd-HHMMSS[-n]`."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    make_folder(root)
    folder = root / f"{name}-{stamp}"
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = root / f"{name}-{stamp}-{suffix}"
    folder.mkdir()
    return folder


def _plain(value):
    """numpy scalars and arrays as JSON-ready Python values (non-finite floats become None)."""
    value = np.asarray(value)
    if value.ndim:
        return [_plain(item) for item in value]
    item = value.item()
    if isinstance(item, float) and not np.isfinite(item):
        return None
    return item


def append_rows(path: pathlib.Path, columns: dict, seeds: list[int]) -> None:
    """Appends one JSON line per (row, seed) from `columns` whose leaves are [S, rows] (`append_lines`)."""
    arrays = {name: np.asarray(value) for name, value in columns.items()}
    num_rows = next(iter(arrays.values())).shape[1]
    append_lines(
        path,
        [
            {"seed": seed, **{name: _plain(value[index, row]) for name, value in arrays.items()}}
            for row in range(num_rows)
            for index, seed in enumerate(seeds)
        ],
    )


def append_lines(path: pathlib.Path, records: list[dict]) -> None:
    """Appends one JSON line per record, on disk before the caller goes on (to the checkpoint that counts them)."""
    with path.open("a") as file:
        file.writelines(json.dumps(record) + "\n" for record in records)
        file.flush()
        os.fsync(file.fileno())


def write_atomically(path: pathlib.Path, text: str | bytes) -> None:
    """Writes `text` (or bytes) to a temporary file beside `path`, syncs it and renames it into place: a reader
    (or a kill) sees the old file or the new one, never half of one."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with temporary.open("wb" if isinstance(text, bytes) else "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def write_json(path: pathlib.Path, payload: dict) -> None:
    write_atomically(path, json.dumps(payload, indent=2, default=_plain) + "\n")


def read_json(path: pathlib.Path) -> Any:
    """A run file's JSON value (config.json, start.json); a ValueError naming the file, line and column where it is
    not JSON (damaged or edited since it was written)."""
    try:
        return json.loads(path.read_bytes())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: not JSON ({error.msg} at column {error.colno}).") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (at byte offset {error.start}).") from None


def _row(line: str) -> dict | None:
    """One whole JSON line with an iteration, or None for a line torn by a kill mid-write."""
    try:
        record = json.loads(line) if line.endswith("\n") else None
        return record if isinstance(record, dict) and isinstance(record["iteration"], int) else None
    except (ValueError, KeyError):
        return None


def keep_rows_up_to(
    path: pathlib.Path, last_iteration: int, iterations: Sequence[int], seeds: Sequence[int | None]
) -> None:
    """Keeps the JSON lines of iterations up to `last_iteration` (those after the checkpoint a run resumes from
    are written again, and a line torn by a kill is dropped), rewritten atomically; a ValueError naming the file
    and the first missing row if a row of `iterations` × `seeds` (those up to the checkpoint; None: rows without
    a seed) is not there: the rows are written before the checkpoint that counts them, so only a file damaged
    since lacks one, and resuming would lose it for good."""
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    rows = [(line, _row(line)) for line in lines]
    kept = [(line, row) for line, row in rows if row is not None and row["iteration"] <= last_iteration]
    present = {(row.get("seed"), row["iteration"]) for _, row in kept}
    missing = next(((s, i) for i in iterations if i <= last_iteration for s in seeds if (s, i) not in present), None)
    if missing:
        seed = "" if missing[0] is None else f"seed {missing[0]}, "
        raise ValueError(
            f"{path} lacks the row of {seed}iteration {missing[1]}, which the checkpoint after "
            f"iteration {last_iteration} counts (the file was cut or edited after it was written); resuming would "
            "lose it: restore the file, or start the run again."
        )
    if path.exists():
        write_atomically(path, "".join(line for line, _ in kept))


def write_arrays(path: pathlib.Path, arrays: dict[str, Any]) -> None:
    """Named arrays as one compressed .npz file (`np.load(path)[name]` reads one back)."""
    np.savez_compressed(path, **arrays)


def write_csv(path: pathlib.Path, rows: list[dict]) -> None:
    """Rows (dicts) as a CSV file with a header: every key of any row, in first-seen order; a row without one
    leaves its cell empty (each algorithm's tuning rows name its own settings)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def check_run_name(name: str) -> str:
    """`name` if it names a folder directly inside the output folder (no separators, not . or ..), else ValueError."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or name != name.strip():
        raise ValueError(f"`name` must be a plain folder name inside `out` (no '/', not '..'), got {name!r}.")
    return name


@contextlib.contextmanager
def locked(folder: pathlib.Path) -> Iterator[pathlib.Path]:
    """Holds `folder/.lock` (this process's pid) while the block runs, so two runs never write one folder.

    A lock whose process is gone (killed) is taken over; one held by a live process is refused (ValueError).
    """
    path = folder / ".lock"
    while True:
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            try:
                owner = int(path.read_text().strip() or 0)
            except (OSError, ValueError):
                owner = 0
            if owner and owner != os.getpid() and _alive(owner):
                raise ValueError(
                    f"the run folder {folder} is in use by process {owner} (its lock: {path}); "
                    "wait for it to end, or stop it."
                ) from None
            path.unlink(missing_ok=True)  # its process is gone: take it over
    with os.fdopen(descriptor, "w") as file:
        file.write(f"{os.getpid()}\n")
    try:
        yield folder
    finally:
        path.unlink(missing_ok=True)


def release_lock(folder: pathlib.Path) -> None:
    """Removes `folder/.lock` if this process holds it: what a process that ends at once does (`locked` does it
    otherwise)."""
    path = folder / ".lock"
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text().strip() or 0) == os.getpid():
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


# What a new run folder holds before its first checkpoint: nothing a retry under the same name would keep.
_UNSTARTED = {"config.json", ".lock", "checkpoints"}


def _discard_if_refused(folder: pathlib.Path, created: bool, error_type, error, traceback) -> bool:
    """After a new run is refused (ValueError, OSError: bad input; ImportError: a missing optional dependency) before
    its first checkpoint, removes what it wrote (the folder too, if the run made it), so a retry under the same name
    is not refused as taken."""
    if error_type is None or not issubclass(error_type, (ValueError, OSError, ImportError)) or not folder.is_dir():
        return False
    entries = {path.name: path for path in folder.iterdir()}
    checkpoints = entries.get("checkpoints")
    # compare makes a folder per algorithm and phase below checkpoints/: empty ones hold nothing learnt.
    below = sorted(checkpoints.rglob("*"), reverse=True) if checkpoints is not None else []  # deepest first
    if set(entries) - _UNSTARTED or any(not path.is_dir() for path in below):
        return False  # something was learnt or written: keep it to resume
    with contextlib.suppress(OSError):  # a file appearing meanwhile keeps the folder; the error still gets reported
        for empty in [*below, checkpoints] if checkpoints is not None else []:
            empty.rmdir()
        (folder / "config.json").unlink(missing_ok=True)
        if created:
            folder.rmdir()
    return False  # the error goes on to be reported


def open_run(
    out: pathlib.Path,
    name: str | None,
    resume: pathlib.Path | None,
    default_name: str,
    fingerprint: dict,
    *,
    checkpoints: CheckpointSettings | None = None,
    writer: bool = True,
    cleanup: contextlib.ExitStack | None = None,
    provenance: dict | None = None,
) -> pathlib.Path:
    """The run folder: a new one (`out/name`, or `out/default_name-DATE-TIME`) holding config.json, or the `resume`
    folder after checking that it was started with the same configuration. A resume is refused where
    `checkpoints` (default `CheckpointSettings()`) are off: it would start again and overwrite the logs. Only the
    `writer` process writes files, and it holds the folder's lock until `cleanup` closes. The run's checkpointer
    is `checkpoints.checkpointer(folder / "checkpoints", fingerprint)`.

    config.json is the fingerprint with, beside it, "provenance": one entry (`ftw_jax.running.provenance`) per
    process that opened the run, its start first, then each resume; never compared on a resume."""
    from ftw_jax.running.checkpoints import CheckpointSettings, check_same_config

    checkpoints, stored = checkpoints or CheckpointSettings(), None
    if resume:
        if checkpoints.off:
            raise ValueError(
                "`resume` needs the checkpoints that `off` turns off (nothing written would be kept); leave it out."
            )
        folder, created = resume, False  # never discarded: it holds a run
        if not (folder / "config.json").exists():
            raise ValueError(f"`resume` {folder}: no run there (config.json is missing).")
        stored = read_json(folder / "config.json")
        check_same_config(stored, fingerprint, f"the run in {folder}")
    elif name:
        folder = out / check_run_name(name)
        if writer and (folder / "config.json").exists():
            raise ValueError(f"the run folder {folder} already holds a run; pass `resume` {folder} to continue it.")
        if writer and folder.exists() and any(folder.iterdir()):
            raise ValueError(f"{folder} exists and is not a run folder; choose another `name` or `out`.")
        created = not folder.exists()  # an empty folder of the user's stays
    else:
        folder, created = new_run_folder(out, default_name), True
    if writer:
        make_folder(folder)
        if cleanup is not None:
            if not resume:  # pushed before the lock: runs after the lock is released
                cleanup.push(functools.partial(_discard_if_refused, folder, created))
            cleanup.enter_context(locked(folder))
        write_json(folder / "config.json", _beside(stored, fingerprint, provenance))
    return folder


def _beside(stored: dict | None, fingerprint: dict, provenance: dict | None) -> dict:
    """config.json's contents: `fingerprint` and, beside it, the provenance of every process that opened the run:
    those `stored` (the config.json a resume found) names, then `provenance`."""
    opened = stored.get("provenance", []) if isinstance(stored, dict) else []
    opened = [*(opened if isinstance(opened, list) else [opened]), *([provenance] if provenance else [])]
    return {**fingerprint, "provenance": opened} if opened else fingerprint

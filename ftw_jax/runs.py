"""Run folders: the config, per-iteration metrics (JSON lines), a summary and a learning-curve PNG."""

from __future__ import annotations

import datetime
import json
import pathlib

import numpy as np


def new_run_folder(root: pathlib.Path, name: str) -> pathlib.Path:
    """A fresh folder `root/name-YYYYmmdd-HHMMSS[-n]`."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = root / f"{name}-{stamp}"
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = root / f"{name}-{stamp}-{suffix}"
    folder.mkdir(parents=True)
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
    """Appends one JSON line per (row, seed) from `columns` whose leaves are [S, rows]."""
    arrays = {name: np.asarray(value) for name, value in columns.items()}
    num_rows = next(iter(arrays.values())).shape[1]
    with path.open("a") as file:
        for row in range(num_rows):
            for index, seed in enumerate(seeds):
                record = {"seed": seed, **{name: _plain(value[index, row]) for name, value in arrays.items()}}
                file.write(json.dumps(record) + "\n")


def write_json(path: pathlib.Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=2, default=_plain) + "\n")


def keep_rows_up_to(path: pathlib.Path, last_iteration: int) -> None:
    """Drops the JSON lines of iterations after `last_iteration` (written after the checkpoint a run resumes from)."""
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if json.loads(line)["iteration"] <= last_iteration))

"""Run folders: the config, per-iteration metrics (JSON lines), CSV tables, a summary, checkpoints."""

from __future__ import annotations

import csv
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


def write_csv(path: pathlib.Path, rows: list[dict]) -> None:
    """Rows (dicts with the same keys) as a CSV file with a header."""
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def open_run(out: pathlib.Path, name: str | None, resume: pathlib.Path | None, default_name: str, fingerprint: dict,
             *, checkpoint_every: int | None = 1, writer: bool = True):
    """(run folder, Checkpointer or None): a new folder (`out/name`, or `out/default_name-DATE-TIME`) holding
    config.json, or the `resume` folder after checking that it was started with the same configuration.
    `checkpoint_every=None` writes no checkpoints; only the `writer` process writes files."""
    from ftw_jax.checkpoints import Checkpointer, check_same_config

    if resume:
        folder = resume
        if not (folder / "config.json").exists():
            raise ValueError(f"--resume {folder}: no run there (config.json is missing).")
        check_same_config(json.loads((folder / "config.json").read_text()), fingerprint, f"the run in {folder}")
    elif name:
        folder = out / name
        if writer and (folder / "config.json").exists():
            raise ValueError(f"the run folder {folder} already holds a run; pass --resume {folder} to continue it.")
    else:
        folder = new_run_folder(out, default_name)
    if writer:
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "config.json", fingerprint)
    checkpointer = (None if checkpoint_every is None
                    else Checkpointer(folder / "checkpoints", fingerprint, every=checkpoint_every))
    return folder, checkpointer

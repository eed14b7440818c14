"""Checkpoints of a running program with Orbax: the carry and a JSON record, every few evaluation periods.

    settings = CheckpointSettings(every=5)          # when: a setting every command takes the same way
    checkpointer = settings.checkpointer(folder / "checkpoints", fingerprint)   # fingerprint: the config, as JSON
    restored = checkpointer.restore(carry)          # None, or (periods done, carry, record)
    checkpointer.save(periods_done, carry, {"history": ...})
    checkpointer.close()                            # waits for the last write
    finish_writes()                                 # every open checkpointer's writes in flight (a process ending)
    save_then_stop(checkpointer, step, carry, record, last=..., stop=...)   # what both host loops do per step

The carry holds everything a run needs to go on exactly as if never stopped: parameters, optimizer state, the
pool, the PRNG keys, the iteration and the hyperparameters. The record holds the fingerprint (the config that
wrote the checkpoint; a different one is refused) and whatever the caller needs to rebuild its results.

Orbax writes each checkpoint into a temporary folder and renames it into place only when complete, so a kill
mid-write leaves nothing that loads (`latest_step` never sees the partial folder). A checkpoint damaged
afterwards (a truncated file, empty metadata) is set aside and the one before it restored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ftw_jax.core.checks import check_positive_int
from ftw_jax.core.settings import setting
from ftw_jax.running.signals import Interrupted


def _as_json(value):
    """A JSON round trip: tuples become lists, so fingerprints compare as they are stored."""
    return json.loads(json.dumps(value))


# Settings that decide when a run stops, not what it computes: a resume may change them (a run stopped for its
# skipped updates goes on past them with stop_after_skipped 0, one stopped for its engine's log-probs with
# sampler_gap_limit 0; lm learn may follow its file, or stop doing so, and may go on past the torn line it stopped
# at with skip_bad_lines, each bad line named; retrieval QA's retrieval server may answer at another address after
# a restart; the checkpoints it then writes record the new value).
CHANGEABLE_ON_RESUME = frozenset(
    {
        "retriever_url",
        "stop_after_skipped",
        "sampler_gap_limit",
        "stale_share_limit",
        "follow",
        "idle_timeout",
        "poll_seconds",
        "skip_bad_lines",
    }
)

# Settings that name a file or folder (lm learn's episodes and checkpoint, a run's pretrained model): compared by
# the path they resolve to, so `episodes.jsonl` and `/work/episodes.jsonl` are one file. A relative path stored by
# an older run resolves against the current directory: the same file if resumed from where it started.
PATH_SETTINGS = frozenset({"episodes", "model"})


def _resolved(path: str) -> str:
    return str(pathlib.Path(path).resolve()) if path else path  # None or "": no path (a run without a checkpoint)


def _compared(value: Any) -> Any:
    """A fingerprint without the `CHANGEABLE_ON_RESUME` settings and with `PATH_SETTINGS` resolved, at any depth
    (sweeps nest the config)."""
    if isinstance(value, dict):
        return {
            name: _resolved(item) if name in PATH_SETTINGS and isinstance(item, str) else _compared(item)
            for name, item in value.items()
            if name not in CHANGEABLE_ON_RESUME
        }
    if isinstance(value, list):
        return [_compared(item) for item in value]
    return value


def _without_added_off(stored: Any, current: Any) -> Any:
    """`current` without the settings (at any depth) that `stored` lacks and that are off (False or None): a
    setting added to the project after a run was written starts off, so that run had the behaviour it names."""
    if isinstance(stored, dict) and isinstance(current, dict):
        return {
            name: _without_added_off(stored.get(name), item)
            for name, item in current.items()
            if name in stored or not (item is None or item is False)
        }
    return current


# What a run folder's config.json keeps beside its fingerprint, never compared: which code opened the run
# (`ftw_jax.running.provenance`); a resume after a commit is the same run.
NOT_FINGERPRINT = frozenset({"provenance"})


def config_differences(stored: dict, current: dict) -> list[str]:
    """'field: stored -> current' for every top-level field where two fingerprints differ (the
    `CHANGEABLE_ON_RESUME` settings, settings added since, left off, and `NOT_FINGERPRINT`, left out)."""
    stored, current = ({k: v for k, v in d.items() if k not in NOT_FINGERPRINT} for d in (stored, current))
    stored = _compared(_as_json(stored))
    current = _without_added_off(stored, _compared(_as_json(current)))
    return [
        f"{name}: {stored.get(name)!r} -> {current.get(name)!r}"
        for name in sorted(set(stored) | set(current))
        if stored.get(name) != current.get(name)
    ]


def check_same_config(stored: dict, current: dict, where: str) -> None:
    differences = config_differences(stored, current)
    if differences:
        raise ValueError(
            f"{where} was written by a different configuration; refusing to mix them. Differences (stored -> "
            f"now): {'; '.join(differences)}. Resume with the original options, or start a new run."
        )


def _is_key(leaf) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def with_raw_keys(tree: Any) -> Any:
    """`tree` with PRNG key arrays replaced by their raw uint32 data (what Orbax stores; numpy can read it)."""
    return jax.tree.map(lambda leaf: jax.random.key_data(leaf) if _is_key(leaf) else leaf, tree)


def with_keys_like(template: Any, tree: Any) -> Any:
    """The inverse of `with_raw_keys`: `tree`'s raw key data wrapped as keys wherever `template` holds keys."""

    def rewrap(like, leaf):
        return jax.random.wrap_key_data(leaf, impl=jax.random.key_impl(like)) if _is_key(like) else leaf

    return jax.tree.map(rewrap, template, tree)


def rows_record(rows: list[dict]) -> dict:
    """Per-period rows ({name: array}) as JSON for a checkpoint's record: the values, and each one's dtype."""
    return {
        "rows": [{name: np.asarray(value).tolist() for name, value in row.items()} for row in rows],
        "dtypes": {name: np.asarray(value).dtype.str for row in rows[:1] for name, value in row.items()},
    }


def rows_from_record(record: dict | list) -> list[dict]:
    """The rows `rows_record` stored, as the very arrays: float32 through JSON's float64 and back is exact, so
    a resumed run computes with the numbers an uninterrupted one has (a bare list, the older format, works too)."""
    rows, dtypes = (record, {}) if isinstance(record, list) else (record["rows"], record["dtypes"])
    return [{name: np.asarray(value, dtypes.get(name)) for name, value in row.items()} for row in rows]


def _key_name(key: Any) -> str:
    """One step of a tree path as a name: a dict key, an attribute or an index (Orbax stores attributes as keys)."""
    for field in ("key", "name", "idx"):
        if hasattr(key, field):
            return str(getattr(key, field))
    return str(key)


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """{'policy/params/embedding': shape} of every array (or Orbax array metadata) in `tree`."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(_key_name(key) for key in path): tuple(leaf.shape) for path, leaf in leaves}


def shape_differences(stored: dict[str, tuple], current: dict[str, tuple], shown: int = 3) -> list[str]:
    """'name: stored shape -> current shape' (or 'absent') for up to `shown` arrays that differ, then how many more."""
    names = sorted(set(stored) | set(current))
    differences = [
        f"{name}: {stored.get(name, 'absent')} -> {current.get(name, 'absent')}"
        for name in names
        if stored.get(name) != current.get(name)
    ]
    more = len(differences) - shown
    return differences[:shown] + ([f"{more} more"] if more > 0 else [])


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """When a run checkpoints, taken the same way by every command (`train`, `sweep`, `compare`'s every phase,
    `lm learn`): a step is an evaluation period (`lm learn`: an iteration)."""

    every: int = setting(
        1, "checkpoint every this many evaluation periods (lm learn: iterations), and always after the last one "
        "and where a run stops", flag="checkpoint_every"
    )  # fmt: skip
    keep: int = setting(2, "how many of the newest checkpoints a run folder keeps", flag="checkpoints_kept")
    off: bool = setting(False, "write no checkpoints (the run cannot be resumed)", flag="no_checkpoint")

    def __post_init__(self):
        check_positive_int("every", self.every)
        check_positive_int("keep", self.keep)
        if not isinstance(self.off, bool):
            raise ValueError(f"off must be a bool, got {self.off!r}.")

    def checkpointer(self, directory: pathlib.Path, fingerprint: dict) -> Checkpointer | None:
        """A `Checkpointer` of `directory` at this cadence; None when checkpoints are off."""
        return None if self.off else Checkpointer(directory, fingerprint, every=self.every, keep=self.keep)


class Checkpointer:
    """Saves (carry, record) at step = evaluation periods done; keeps the last `keep`."""

    def __init__(self, directory: pathlib.Path, fingerprint: dict, *, every: int = 1, keep: int = 2):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self.directory = pathlib.Path(directory).absolute()
        self.fingerprint, self.every = _as_json(fingerprint), every
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=every, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._saved: list[int] = []  # the steps this process asked to save, the last maybe still being written
        self._restored: int | None = None
        self._busy = threading.Lock()  # held while a save starts and while closing: `finish_writes` waits after
        _open.add(self)

    def save(self, periods_done: int, carry: Any, record: dict, *, final: bool = False) -> None:
        """Saves every `every` periods, and always when `final` (writes continue in the background)."""
        ocp = self._ocp
        with self._busy, self._writing():
            saved = self._manager.save(
                periods_done,
                args=ocp.args.Composite(
                    carry=ocp.args.StandardSave(with_raw_keys(carry)),
                    record=ocp.args.JsonSave({"fingerprint": self.fingerprint, "periods_done": periods_done, **record}),
                ),
                force=final,
            )
        if saved:
            self._saved = [*self._saved[-1:], periods_done]  # only the newest can still be in flight

    def durable_step(self) -> int | None:
        """The newest step whose checkpoint is whole on disk (written by this process, or restored), or None: what
        a restart after a kill now would resume from at least. Orbax writes one checkpoint at a time, so every
        step asked for but the last is done; the last is once no write is in flight and its folder is in place."""
        steps = self._saved[:-1] if self._manager.is_saving_in_progress() else self._saved
        return max(filter(self._in_place, steps), default=self._restored)

    def _in_place(self, step: int) -> bool:
        """Whether checkpoint `step`'s folder is in place: Orbax renames it there once written whole (a kept one
        may since have been deleted as one of the oldest)."""
        return (self.directory / str(step)).is_dir()

    def wait(self) -> None:
        """Waits until every checkpoint asked for is on disk (`durable_step` is then the last)."""
        with self._writing():
            self._manager.wait_until_finished()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Orbax's error from a checkpoint write in the background (a full disk), raised where the next save or a
        wait finds it, as one OSError naming the checkpoint, the reason and the checkpoints still intact."""
        try:
            yield
        except Interrupted:
            raise
        except Exception as error:  # noqa: BLE001 (Orbax and TensorStore raise many kinds)
            step = self._saved[-1] if self._saved else "?"
            system = re.search(r": ([^:\[]+) \[os_error_code='(\d+)'\]", str(error))  # TensorStore's OS error
            lines = str(error).strip().splitlines() or [type(error).__name__]
            reason = f"{system[1].strip()}, errno {system[2]}" if system else lines[0][:200]
            intact = list(filter(self._in_place, self._manager.all_steps()))
            kept = f"the checkpoints {intact} are intact" if intact else "no checkpoint was written before it"
            raise OSError(
                f"the checkpoint {self.directory / str(step)} could not be written ({reason}); {kept}: make room, "
                f"then resume the run in {self.directory.parent}"
            ) from None

    def restore(self, template: Any, log: Callable[[str], object] | None = None) -> tuple[int, Any, dict] | None:
        """The newest intact checkpoint as (periods done, carry shaped and sharded like `template`, record), or None.

        A checkpoint that cannot be read (a truncated array file, empty metadata) is named through `log`
        (default: stderr), moved aside to `checkpoints-unreadable/` beside this folder, and the one before it
        is tried. Raises ValueError, touching nothing, if it was written by a different configuration or holds arrays
        of other shapes than `template` (another model); or if checkpoints exist and none can be read.
        """
        log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        unreadable = []
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                record = self._read(step, record=self._ocp.args.JsonRestore())["record"]
            except Exception as error:  # noqa: BLE001 (Orbax and TensorStore raise many kinds)
                unreadable.append(self._set_aside(step, error, log))
                continue
            check_same_config(record["fingerprint"], self.fingerprint, f"the checkpoint {self.directory / str(step)}")
            self._check_same_shapes(step, template)
            try:
                stored = self._read(step, carry=self._ocp.args.StandardRestore(with_raw_keys(template)))["carry"]
            except Exception as error:  # noqa: BLE001
                unreadable.append(self._set_aside(step, error, log))
                continue
            self._restored = step
            return step, with_keys_like(template, stored), record
        if unreadable:
            raise ValueError(
                f"no checkpoint in {self.directory} can be read ({'; '.join(unreadable)}); start a new run."
            )
        return None

    def _check_same_shapes(self, step: int, template: Any) -> None:
        """ValueError naming the arrays whose shapes differ between checkpoint `step` and `template` (the run as
        the settings now build it: another model's folder, another size), before anything is read or moved: such a
        checkpoint is intact, only not this run's. Unreadable metadata is left to the restore to find."""
        try:
            # The item's handler, not a Checkpointer: that looks for a step's metadata in the item's folder and
            # logs a warning at every resume when it is not there.
            from etils import epath  # Orbax's own path type (one of its dependencies)

            handler = self._ocp.StandardCheckpointHandler()
            try:
                stored = _shapes(handler.metadata(epath.Path(self.directory / str(step) / "carry")).tree)
            finally:
                handler.close()
        except Exception:  # noqa: BLE001 (damaged metadata: the restore sets the checkpoint aside)
            return
        differences = shape_differences(stored, _shapes(with_raw_keys(template)))
        if differences:
            raise ValueError(
                f"the checkpoint {self.directory / str(step)} holds arrays of other shapes than this run builds "
                f"(stored -> now: {'; '.join(differences)}): the model or its settings differ from the run's. "
                "Resume with the original model, or start a new run; the checkpoints are left as they are."
            )

    def _read(self, step: int, **items):
        return self._manager.restore(step, args=self._ocp.args.Composite(**items))

    def _set_aside(self, step: int, error: Exception, log) -> str:
        """Moves an unreadable checkpoint out of the way (kept for a look, never loaded again); says so."""
        aside = self.directory.parent / "checkpoints-unreadable" / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(self.directory / str(step)), aside)
        self._manager.reload()
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        log(
            f"warning: the checkpoint {self.directory / str(step)} cannot be read ({type(error).__name__}: {reason}); "
            f"moved to {aside}, trying the one before it."
        )
        return f"{step}: {type(error).__name__}"

    def close(self) -> None:
        """Waits for writes in flight, then releases Orbax's threads."""
        with self._busy, self._writing():
            _open.discard(self)
            try:
                self._manager.wait_until_finished()
            finally:  # Orbax's threads go even where the last write failed
                self._manager.close()

    def wait_for_writes(self) -> None:
        """Waits for the writes in flight (a save started by another thread included); never raises."""
        with self._busy, contextlib.suppress(Exception):
            self._manager.wait_until_finished()


_open: set[Checkpointer] = set()  # the checkpointers not closed yet, for `finish_writes`


def finish_writes() -> None:
    """Waits for every open checkpointer's writes in flight, so that its newest checkpoint lands whole: what a
    process that ends at once does first (a stop signal's watcher; any thread may call it). Never raises."""
    for checkpointer in list(_open):
        checkpointer.wait_for_writes()


def save_then_stop(
    checkpointer: Checkpointer | None, step: int, carry: Any, record: dict, *, last: bool, stop: Exception | None
) -> None:
    """What a run does after each period (`MemberRun`) or iteration (the LM learner), once its rows are written:
    checkpoints `step` at the checkpointer's cadence, and always at the `last` step and where the run stops, so
    that a stopped run resumes from where it stopped; then raises `stop` (a run that applies no update), if any."""
    if checkpointer:
        checkpointer.save(step, carry, record, final=last or stop is not None)
    if stop is not None:
        raise stop

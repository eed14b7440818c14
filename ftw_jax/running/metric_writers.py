"""Metrics where researchers read them: TensorBoard event files beside the run's JSON lines.

    writer = TensorBoardWriter(folder / "tensorboard", log)       # RUN/tensorboard/<run>/: one run per seed or member
    writer.resume(["seed_0", "seed_1"], purge_after=[40_960, 41_002])  # a resumed run: drop what the kill left after it
    writer.period(["seed_0", "seed_1"], metrics, evaluation)     # {name: [M, eval_every]}, {name: [M]}
    writer.close()

Every number of a `metrics.jsonl` row is the scalar `train/NAME` and every number of an `evaluation.jsonl` row
`eval/NAME` (docs/metrics.md says what each means), at the step of its environment steps, so that runs of
different methods line up on the same axis; `lm learn` writes `learn/NAME` per iteration (`rows`). Each seed, sweep
member or comparison seed is a folder of its own, which TensorBoard draws as one curve of its own, overlaid.

Events go through tensorboardX: the format's writer without TensorFlow (numpy and protobuf, which Orbax already
installs), where CLU's writer needs TensorFlow and TensorBoard's own comes with its server. A resumed run writes
TensorBoard's purge marker (a session start at the first step after its checkpoint), so the reader drops the
points a killed process wrote past the checkpoint and shows one curve. A writer that fails (a full disk) warns
once and stops; the run goes on, its JSON lines the record.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class TensorBoardWriter:
    """Event files under `root`, one folder per run name; `log` takes the one warning a failure gives."""

    def __init__(self, root: pathlib.Path, log: Callable[[str], None]):
        self.root, self.log = root, log
        self._writers: dict[str, Any] = {}
        self._purge: dict[str, int] = {}
        self.failed = False

    def resume(self, runs: Sequence[str], purge_after: Sequence[int] | np.ndarray) -> None:
        """The runs continue from a checkpoint at these steps: what a killed process wrote after it is dropped."""
        self._purge.update({run: int(step) + 1 for run, step in zip(runs, purge_after)})

    def period(self, runs: Sequence[str], metrics: dict, evaluation: dict) -> None:
        """A period's rows: metrics {name: [M, T]} per iteration, evaluation {name: [M]}, for the M `runs`; each
        at its own environment steps (`env_steps`, which both carry)."""
        metrics = {name: np.asarray(value) for name, value in metrics.items()}
        evaluation = {name: np.asarray(value) for name, value in evaluation.items()}
        for member, run in enumerate(runs):
            for row in range(metrics["env_steps"].shape[1]):
                step = int(metrics["env_steps"][member, row])
                self.scalars(run, step, {name: value[member, row] for name, value in metrics.items()}, "train")
            step = int(evaluation["env_steps"][member])
            self.scalars(run, step, {name: value[member] for name, value in evaluation.items()}, "eval")
        self.flush()

    def rows(self, run: str, rows: Sequence[dict], step_name: str, prefix: str) -> None:
        """Rows of plain numbers, each at its `step_name` (`lm learn`'s iteration)."""
        for row in rows:
            self.scalars(run, int(row[step_name]), row, prefix)
        self.flush()

    def scalars(self, run: str, step: int, values: dict, prefix: str) -> None:
        """Every finite number of `values` as `prefix/NAME` at `step` (flags as 0 or 1; text and lists left out)."""
        if self.failed:
            return
        try:
            writer = self._writer(run)
            for name, value in values.items():
                number = _number(value)
                if number is not None:
                    writer.add_scalar(f"{prefix}/{name}", number, global_step=step)
        except Exception as error:  # noqa: BLE001 - any failure of the writer: warn once, the run goes on
            self._fail(error)

    def flush(self) -> None:
        """Puts what was written on disk: a process killed after this leaves readable event files."""
        if self.failed:
            return
        try:
            for writer in self._writers.values():
                writer.flush()
        except Exception as error:  # noqa: BLE001
            self._fail(error)

    def close(self) -> None:
        for writer in self._writers.values():
            try:
                writer.close()
            except Exception as error:  # noqa: BLE001
                self._fail(error)
        self._writers.clear()

    def _writer(self, run: str):
        if run not in self._writers:
            from tensorboardX import SummaryWriter

            self._writers[run] = SummaryWriter(
                logdir=str(self.root / run), purge_step=self._purge.get(run), flush_secs=3600
            )
        return self._writers[run]

    def _fail(self, error: Exception) -> None:
        if not self.failed:
            self.failed = True
            self.log(
                f"warning: TensorBoard events under {self.root} could not be written ({type(error).__name__}: "
                f"{error}); the run goes on without them, its JSON lines hold every row."
            )


def _number(value: Any) -> float | None:
    """A plain finite number, or None where the value is not one (text, a list, NaN, infinity, None)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool | np.bool_):
        return float(value)
    if isinstance(value, int | float | np.integer | np.floating) and math.isfinite(float(value)):
        return float(value)
    return None

"""Metrics where researchers read them: TensorBoard event files (and Weights & Biases when asked) beside the run's
JSON lines.

    writer = TensorBoardWriter(folder / "tensorboard", log)       # RUN/tensorboard/<run>/: one run per seed or member
    writer.resume(["seed_0", "seed_1"], purge_after=[40_960, 41_002])  # a resumed run: drop what the kill left after it
    writer.period(["seed_0", "seed_1"], metrics, evaluation)     # {name: [M, eval_every]}, {name: [M]}
    writer.close()

Every number of a `metrics.jsonl` row is the scalar `train/NAME` and every number of an `evaluation.jsonl` row
`eval/NAME` (docs/metrics.md says what each means), at the step of its environment steps, so that runs of
different methods line up on the same axis; `lm learn` writes `learn/NAME` per iteration (`rows`). Each seed, sweep
member or comparison seed is a run of its own, which TensorBoard and W&B draw as a curve of its own, overlaid.

Events go through tensorboardX: the format's writer without TensorFlow (numpy and protobuf, which Orbax already
installs), where CLU's writer needs TensorFlow and TensorBoard's own comes with its server. A resumed run writes
TensorBoard's purge marker (a session start at the first step after its checkpoint), so the reader drops the
points a killed process wrote past the checkpoint and shows one curve. W&B (`WandbWriter`, the optional `wandb`
package) resumes a run by its id and ignores steps it has seen. A writer that fails (a full disk, W&B not
installed) warns once and stops; the run goes on, its JSON lines the record.
"""

from __future__ import annotations

import hashlib
import math
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class RowWriter:
    """Rows of a run as scalars: `period` and `rows` call `_write` per row; the first failure warns (with `log`)
    and stops the writer."""

    def __init__(self, where: str, log: Callable[[str], None]):
        self.where, self.log = where, log
        self.failed = False

    def resume(self, runs: Sequence[str], purge_after: Sequence[int] | np.ndarray) -> None:
        """The runs continue from a checkpoint at these steps: what a killed process wrote after them must not
        show twice (TensorBoard purges it; W&B ignores the steps it has seen, which a resumed run repeats)."""

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
        numbers = {
            f"{prefix}/{name}": number for name, value in values.items() if (number := _number(value)) is not None
        }
        self._guarded(self._write, run, step, numbers)

    def flush(self) -> None:
        """Puts what was written on disk: a process killed after this leaves readable files."""
        self._guarded(self._flush)

    def close(self) -> None:
        self._guarded(self._close)

    def _write(self, run: str, step: int, numbers: dict[str, float]) -> None:
        raise NotImplementedError

    def _flush(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _guarded(self, action: Callable[..., None], *args: Any) -> None:
        if self.failed:
            return
        try:
            action(*args)
        except Exception as error:  # noqa: BLE001 - any failure of the writer: warn once, the run goes on
            self.failed = True
            self.log(
                f"warning: {self.where} could not be written ({type(error).__name__}: {error}); the run goes on "
                "without them, its JSON lines hold every row."
            )


class TensorBoardWriter(RowWriter):
    """Event files under `root`, one folder per run name."""

    def __init__(self, root: pathlib.Path, log: Callable[[str], None]):
        super().__init__(f"TensorBoard events under {root}", log)
        self.root = root
        self._writers: dict[str, Any] = {}
        self._purge: dict[str, int] = {}

    def resume(self, runs: Sequence[str], purge_after: Sequence[int] | np.ndarray) -> None:
        self._purge.update({run: int(step) + 1 for run, step in zip(runs, purge_after)})

    def _write(self, run: str, step: int, numbers: dict[str, float]) -> None:
        if run not in self._writers:
            from tensorboardX import SummaryWriter

            self._writers[run] = SummaryWriter(
                logdir=str(self.root / run), purge_step=self._purge.get(run), flush_secs=3600
            )
        for tag, number in numbers.items():
            self._writers[run].add_scalar(tag, number, global_step=step)

    def _flush(self) -> None:
        for writer in self._writers.values():
            writer.flush()

    def _close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


class WandbWriter(RowWriter):
    """The same rows in Weights & Biases, project `project`: one W&B run per run name, named FOLDER/RUN and grouped
    by the run folder's name, the run's settings (`config`) as its config, its files under `folder`/wandb. The
    id is the folder's and the run's, so a resumed run continues its W&B run (W&B ignores steps it has seen). W&B's
    own settings hold: `WANDB_MODE=offline` writes the runs without a network, for `wandb sync` later."""

    def __init__(self, project: str, folder: pathlib.Path, config: dict, log: Callable[[str], None]):
        super().__init__(f"W&B runs of project {project!r}", log)
        self.project, self.folder, self.config = project, folder, config
        self._runs: dict[str, Any] = {}

    def _write(self, run: str, step: int, numbers: dict[str, float]) -> None:
        if run not in self._runs:
            import wandb

            identity = hashlib.sha256(f"{self.folder.resolve()}/{run}".encode()).hexdigest()[:16]
            self._runs[run] = wandb.init(
                project=self.project,
                name=f"{self.folder.name}/{run}",
                group=self.folder.name,
                config=self.config,
                dir=str(self.folder),
                id=identity,
                resume="allow",
                reinit="create_new",
            )
        self._runs[run].log(numbers, step=step)

    def _flush(self) -> None:
        """W&B writes in its own process as rows come."""

    def _close(self) -> None:
        for run in self._runs.values():
            run.finish()
        self._runs.clear()


class Writers:
    """Several writers as one: each call goes to every writer."""

    def __init__(self, writers: Sequence[RowWriter]):
        self.writers = list(writers)

    def resume(self, runs: Sequence[str], purge_after: Sequence[int] | np.ndarray) -> None:
        for writer in self.writers:
            writer.resume(runs, purge_after)

    def period(self, runs: Sequence[str], metrics: dict, evaluation: dict) -> None:
        for writer in self.writers:
            writer.period(runs, metrics, evaluation)

    def rows(self, run: str, rows: Sequence[dict], step_name: str, prefix: str) -> None:
        for writer in self.writers:
            writer.rows(run, rows, step_name, prefix)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def _number(value: Any) -> float | None:
    """A plain finite number, or None where the value is not one (text, a list, NaN, infinity, None)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool | np.bool_):
        return float(value)
    if isinstance(value, int | float | np.integer | np.floating) and math.isfinite(float(value)):
        return float(value)
    return None

"""Algorithms side by side at a matched budget.

    comparison = compare("sokoban", ["ftw", "ppo", "grpo", "reinforce"], seeds=range(10),
                         search=8, tuning_seeds=[1000, 1001, 1002])

reported as rows and tables by `ftw_jax.lab.comparison_tables`, with the statistics of `ftw_jax.lab.stats`.

Matched budget: every algorithm runs the environment's `TrainConfig` with the same overrides, so the same
iterations × B episodes (env steps differ only as episode lengths do), the same policy network, the same
optimizer family and the same evaluation. Tuning effort is the same too, on tuning seeds kept apart from the
reported ones, keeping the highest mean AUC: either every learning rate of a grid, or (`search`) the same
number of configurations drawn at random from each algorithm's space (`ftw_jax.lab.tuning`: learning rate, β and
its decay horizon, and the algorithm's own knobs) beside its reference recipe at the task's learning rate,
narrowed by the same successive halving (`rungs`), or run on shorter runs (`tuning_iterations`). Each
compiled program is one sweep (`ftw_jax.lab.sweep`), vmapped, sharded and checkpointed as sweeps are.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import pathlib
import sys
from collections.abc import Callable, Sequence

import numpy as np

from ftw_jax import envs
from ftw_jax.lab import tuning
from ftw_jax.lab.sweep import Sweep, make_sweep
from ftw_jax.lab.train import RUN_FIELDS, TrainConfig, make_train, split_overrides
from ftw_jax.running import run_files
from ftw_jax.running.checkpoints import CheckpointSettings, check_same_config, rows_from_record, rows_record
from ftw_jax.running.loop import MemberRun, history_arrays
from ftw_jax.running.provenance import provenance as running_provenance


@dataclasses.dataclass(frozen=True)
class AlgorithmResult:
    """One algorithm's reported runs: curves [S, periods] of the metric, and how its settings were chosen."""

    algorithm: str
    learning_rate: float
    curves: np.ndarray  # [S, periods] the evaluation metric
    env_steps: np.ndarray  # [S, periods] training env steps at each evaluation
    seconds: float  # starting, compiling and running its phases (tuning included), summed over resumed processes
    tuning: list[dict]  # per configuration tried: its settings, "auc_mean", "final_mean"; empty when not tuned
    applied_share: np.ndarray  # [S] the share of its optimizer steps each reported seed applied
    updates: np.ndarray | None = None  # [S, periods] optimizer steps applied by each evaluation
    settings: dict = dataclasses.field(default_factory=dict)  # the chosen configuration (searched settings)
    skipped: np.ndarray | None = None  # [S] ready optimizer steps each reported seed skipped (`ftw_jax.running.skips`)
    nonfinite: np.ndarray | None = None  # [S] those of them skipped for a non-finite loss, gradient or update
    tuning_skipped: tuple[int, int] = (0, 0)  # (skipped, of them non-finite) over every tuning run
    # [S, iterations] per name of `DIAGNOSTICS` the reported runs kept (groups_tied: grouped methods only)
    diagnostics: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    greedy: np.ndarray | None = None  # [S, periods] the metric of the most likely actions, with `eval_greedy`

    @property
    def final(self) -> np.ndarray:
        return self.curves[:, -1]

    @property
    def auc(self) -> np.ndarray:
        """Area under the evaluation curve, normalised by its length: the mean over evaluations, per seed."""
        return self.curves.mean(axis=1)


@dataclasses.dataclass(frozen=True)
class Comparison:
    env: str
    metric: str
    seeds: list[int]
    episodes: np.ndarray  # [periods] training episodes at each evaluation (the same for every algorithm)
    results: list[AlgorithmResult]


def compare(
    env: str,
    algorithms: list[str],
    seeds: list[int],
    *,
    learning_rates: list[float] | None = None,
    search: int = 0,
    search_seed: int = 0,
    tuning_iterations: int | None = None,
    rungs: int = 1,
    tuning_seeds: Sequence[int] = (),
    env_options: dict | None = None,
    overrides: dict | None = None,
    metric: str | None = None,
    checkpoint_folder: pathlib.Path | None = None,
    checkpoints: CheckpointSettings | None = None,
    on_period: Callable[[PhasePeriod], None] | None = None,
    log: Callable[[str], None] | None = None,
    provenance: dict | None = None,
) -> Comparison:
    """Runs every algorithm on `env` at the same budget (see the module docstring) and returns their curves.

    Args:
      env, env_options, overrides: as for `TrainConfig.for_env`; each algorithm takes those of `overrides`
        that are its settings (`log` names the others).
      algorithms: names from `ftw_jax.algos.ALGORITHMS`.
      seeds: the reported seeds.
      learning_rates: the tuning grid (default: the environment's learning rate alone, no tuning); with
        `search`, the rates the search draws from (default `tuning.LEARNING_RATES`).
      search: instead of trying every rate, this many configurations drawn from each algorithm's space
        (`ftw_jax.lab.tuning`, drawn from `search_seed` with the task and the algorithm: `tuning.task_seed`) and its
        reference recipe at the environment's learning rate (`tuning.candidates`); the overrides may not set a
        searched setting.
      tuning_iterations: the tuning runs' iterations (default: the reported runs'); β's decay horizon scales.
      rungs: successive halving of the search's configurations (`tuning.rung_periods`): every one runs the
        first rung, the better half by mean AUC so far goes on, ..., the last rung reaches the tuning horizon
        (1: every configuration runs it whole).
      tuning_seeds: seeds for choosing the settings; must not overlap `seeds` and are needed when the grid
        has more than one value or `search` is on.
      metric: "success" or "return" (default: success where the environment has it).
      checkpoint_folder: each (algorithm, phase) checkpoints under it and resumes from it, at the cadence of
        `checkpoints` (default: every period; none where they are off).
      provenance: what each phase record says about the code that ran it, beside its fingerprint (default:
        this process's, `ftw_jax.running.provenance`).
      on_period: progress and rows, called after every evaluation period of every phase (`PhasePeriod`).

    A reported run that stops applying updates stops the comparison (`ftw_jax.running.skips.SkippedUpdates`, as
    `ftw-jax train`); a tuning run never does: a configuration that diverges is a finding of the tuning (it
    scores low and is not chosen), and its skipped updates are counted (`AlgorithmResult.tuning_skipped`).
    """
    overrides = dict(overrides or {})
    own_settings = {}  # each algorithm's settings among the overrides (the run's and its own)
    for algorithm in algorithms:
        own_settings[algorithm], ignored = split_overrides(algorithm, overrides)
        if ignored and log:
            names = ", ".join(f"`{name}`" for name in sorted(ignored))
            log(f"note: {names} do(es) not apply to {algorithm}; ignored for it.")
    base = TrainConfig.for_env(env, **{name: value for name, value in overrides.items() if name in RUN_FIELDS})
    grid = list(learning_rates) if learning_rates else None  # given: the search draws its rates from it
    learning_rates = grid or [base.learning_rate]
    seeds, tuning_seeds = list(seeds), list(tuning_seeds)
    _check_lists(algorithms, learning_rates, seeds, tuning_seeds)
    for name, value, default in (("rungs", rungs, 1), ("tuning_iterations", tuning_iterations, None)):
        if value != default and not search:  # a setting of the random search alone: it would be ignored
            raise ValueError(f"{name}={value} applies to a random search (`search` N); there is none here.")
    searched = tuning.Search(search, search_seed, grid, tuning_iterations, rungs, base.learning_rate)
    if search:
        tuning.rung_periods((tuning_iterations or base.num_iterations) // base.eval_every, rungs)  # refuses
        tuning.check_search(env, env_options, own_settings, searched, tuning_seeds)
    for algorithm in algorithms:  # every algorithm's options are checked before the first one runs
        try:
            make_sweep(env, {"lr": learning_rates}, seeds, env_options, algorithm=algorithm, **own_settings[algorithm])
        except ValueError as error:
            raise ValueError(f"{algorithm}: {error} (change its settings, or leave it out of the algorithms)") from None
    metric = _metric_of(env, env_options, metric)
    checkpoints = checkpoints or CheckpointSettings()
    folder = None if checkpoints.off else checkpoint_folder
    provenance = provenance or running_provenance(sys.argv)
    phases = _Phases(env, dict(env_options or {}), metric, folder, checkpoints, on_period, log, provenance)
    results = [
        phases.search(algorithm, own_settings[algorithm], searched, seeds, tuning_seeds)
        if search
        else phases.compare(algorithm, own_settings[algorithm], learning_rates, seeds, tuning_seeds)
        for algorithm in algorithms
    ]
    episodes = np.arange(1, base.num_periods + 1) * base.eval_every * base.episodes_per_iteration
    return Comparison(env=env, metric=metric, seeds=seeds, episodes=episodes, results=results)


def _check_lists(algorithms: list[str], learning_rates: list[float], seeds: list[int], tuning_seeds: list[int]) -> None:
    """Raises ValueError unless the algorithms and learning rates are distinct, a grid has its tuning seeds, and
    no tuning seed is reported."""
    if len(set(algorithms)) != len(algorithms) or not algorithms:
        raise ValueError(f"algorithms must be distinct and at least one, got {algorithms}.")
    if len(set(learning_rates)) != len(learning_rates):
        raise ValueError(f"learning rates must be distinct, got {learning_rates}.")
    if len(learning_rates) > 1 and not tuning_seeds:
        raise ValueError(f"a tuning grid of {len(learning_rates)} learning rates needs tuning seeds.")
    if set(seeds) & set(tuning_seeds):
        raise ValueError(
            f"tuning seeds {sorted(set(seeds) & set(tuning_seeds))} are also reported seeds; tune on other seeds."
        )


def _metric_of(env: str, env_options: dict | None, metric: str | None) -> str:
    """The metric to compare by: `metric`, checked, or by default success where the environment has it."""
    if metric not in (None, "success", "return"):
        raise ValueError(f"metric must be 'success' or 'return', got {metric!r}.")
    has_success = envs.make(env, **dict(env_options or {})).has_success
    if metric == "success" and not has_success:
        raise ValueError(f"metric 'success' is not defined for {env} (it has no notion of success); use 'return'.")
    return metric or ("success" if has_success else "return")


@dataclasses.dataclass(frozen=True)
class PhasePeriod:
    """What `compare` tells `on_period` after each evaluation period of a phase ("tune", "tuneN", "tuneN-rungR"
    or "report")."""

    algorithm: str
    phase: str
    period: int  # the period just run, from 0
    members: list[dict]  # the phase's members: their sweep axes and seed
    metrics: dict  # {name: [M, eval_every]} per iteration (metrics.jsonl's rows)
    evaluation: dict  # {name: [M]} (evaluation.jsonl's)
    metric: str  # the comparison's metric, one of `evaluation`'s names
    skipped: tuple[int, int]  # ready updates skipped, updates tried, in the period by all members
    # On the first period this process runs of the phase: each member's env steps before it [M] (−1 where the
    # phase starts at its beginning; a killed process may have gone further); None on the later periods.
    starts_after: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class _Phases:
    """How `compare` runs an algorithm: a tuning sweep over learning rates, then the reported seeds."""

    env: str
    env_options: dict
    metric: str
    checkpoint_folder: pathlib.Path | None
    checkpoints: CheckpointSettings
    on_period: Callable[[PhasePeriod], None] | None
    log: Callable[[str], None] | None = None
    provenance: dict | None = None  # beside each phase record's fingerprint, never compared

    def finished_record(self, path: pathlib.Path) -> dict | None:
        """A finished phase's record, or None where there is none or it cannot be read (a torn or edited file:
        named, set aside as PATH.unreadable, and the phase restored from its checkpoints instead)."""
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_text())
            if not isinstance(record, dict) or not {"fingerprint", "history", "seconds"} <= set(record):
                raise ValueError("not a phase record")
            return record
        except (ValueError, UnicodeDecodeError) as error:
            path.replace(path.with_name(path.name + ".unreadable"))
            if self.log:
                self.log(f"note: {path} cannot be read ({error}); set aside, the phase resumes from its checkpoints.")
            return None

    def run(
        self, algorithm: str, phase: str, sweep: Sweep, until: int | None = None, start: Start | None = None
    ) -> tuple[dict, float]:
        """One phase's sweep, checkpointed in its own folder ("ALGORITHM-PHASE") and resumed from it, to period
        `until` (default: the last): its results (as `run_sweep`'s) and the seconds it took (those of the
        processes it resumes included). `start`: where it starts when it has no checkpoint of its own (a rung
        of successive halving goes on from the runs it promotes).

        A finished phase leaves "ALGORITHM-PHASE.json" beside its checkpoints (its evaluations, applied
        shares, seconds and the provenance of the code that finished it: kilobytes, where the checkpoints are
        megabytes); a resume takes the phase from it
        without restoring or compiling anything, so those files alone carry a comparison's finished phases
        to another machine.
        """
        finished = self.checkpoint_folder / f"{algorithm}-{phase}.json" if self.checkpoint_folder else None
        with contextlib.ExitStack() as stack:
            record = self.finished_record(finished) if finished else None
            if record is not None:  # checked against the phase's fingerprint: no checkpoint is opened
                check_same_config(record["fingerprint"], self.fingerprint(algorithm, phase, sweep), str(finished))
                results = history_arrays(rows_from_record(record["history"]))
                results["updates_applied_share"] = np.asarray(record["updates_applied_share"])
                for name in ("updates_skipped", "updates_nonfinite"):  # absent from phases finished before counting
                    results.setdefault(name, np.zeros_like(results["updates_applied"]))
                return results, record["seconds"]
            run = self.started(algorithm, phase, sweep, until, start, stack)
            results, seconds = run.results(), run.seconds
            if finished:
                run_files.write_json(
                    finished,
                    {
                        "fingerprint": run.checkpointer.fingerprint,  # type: ignore[union-attr]
                        "seconds": seconds,
                        "updates_applied_share": results["updates_applied_share"].tolist(),
                        "history": rows_record(run.history),
                        "provenance": self.provenance,
                    },
                )
        return results, seconds

    @staticmethod
    def fingerprint(algorithm: str, phase: str, sweep: Sweep) -> dict:
        """What a phase's checkpoints and its finished record must match to be taken up."""
        return {
            "algorithm": algorithm,
            "phase": phase,
            "members": sweep.members,
            "config": dataclasses.asdict(sweep.config),
        }

    def checkpointer(self, algorithm: str, phase: str, sweep: Sweep, stack: contextlib.ExitStack):
        """The phase's checkpointer (None without a checkpoint folder), closed with `stack`."""
        if not self.checkpoint_folder:
            return None
        checkpointer = self.checkpoints.checkpointer(
            self.checkpoint_folder / f"{algorithm}-{phase}", self.fingerprint(algorithm, phase, sweep)
        )
        if checkpointer:
            stack.callback(checkpointer.close)
        return checkpointer

    def started(
        self,
        algorithm: str,
        phase: str,
        sweep: Sweep,
        until: int | None,
        start: Start | None,
        stack: contextlib.ExitStack,
    ) -> MemberRun:
        """The phase's members run (or resumed) to period `until`. A reported run stops when a seed stops applying
        updates (`MemberRun`); a tuning run goes on. Every phase keeps the batch diagnostics per iteration
        (`train.batch_diagnostics`)."""
        trainer = make_train(sweep.config, **sweep.env_options)
        run = MemberRun(
            trainer,
            sweep.keys(),
            sweep.hyperparameters(),
            self.checkpointer(algorithm, phase, sweep, stack),
            metric_names=DIAGNOSTICS[: 2 if trainer.learner.group_size > 1 else 1],
            labels=[f"{algorithm} seed {member['seed']}" for member in sweep.members],
            stops=phase == "report",
        )
        if start and not run.history:
            previous, members = start(stack)
            run.take_members(previous, members)
        first = len(run.history)  # the periods this process runs start here
        for metrics, evaluation in run.periods(until):
            if self.on_period:
                before = None
                if len(run.history) == first + 1:  # the first period this process runs of the phase
                    before = run.history[first - 1]["env_steps"] if first else np.full(len(sweep.members), -1)
                period = PhasePeriod(
                    algorithm, phase, len(run.history) - 1, sweep.members, metrics, evaluation, self.metric,
                    run.last_period_skipped(), before,
                )  # fmt: skip
                self.on_period(period)
        return run

    def compare(
        self, algorithm: str, settings: dict, learning_rates: list[float], seeds: list[int], tuning_seeds: list[int]
    ) -> AlgorithmResult:
        """The learning rate with the best mean AUC on the tuning seeds (if several), then the reported seeds."""
        chosen, tuning, seconds, tuning_skipped = learning_rates[0], [], 0.0, (0, 0)
        sweep = functools.partial(make_sweep, self.env, env_options=self.env_options, algorithm=algorithm, **settings)
        if len(learning_rates) > 1:
            tuning_sweep = sweep({"lr": learning_rates}, tuning_seeds)
            tuned, seconds = self.run(algorithm, "tune", tuning_sweep)
            tuning_skipped = _skipped_total(tuned)
            curves = tuned[self.metric]
            for rate in learning_rates:
                members = [i for i, m in enumerate(tuning_sweep.members) if m["lr"] == rate]
                tuning.append({"learning_rate": rate, "auc_mean": float(curves[members].mean())})
            chosen = max(tuning, key=lambda row: row["auc_mean"])["learning_rate"]
        reported, report_seconds = self.run(algorithm, "report", sweep({"lr": [chosen]}, seeds))
        return self.result(
            algorithm, reported, seconds + report_seconds, tuning, {"learning_rate": chosen}, tuning_skipped
        )

    def result(
        self,
        algorithm: str,
        reported: dict,
        seconds: float,
        tuning: list[dict],
        settings: dict,
        tuning_skipped: tuple[int, int],
    ):
        return AlgorithmResult(
            algorithm=algorithm,
            learning_rate=settings["learning_rate"],
            curves=reported[self.metric],
            env_steps=reported["env_steps"],
            seconds=seconds,
            tuning=tuning,
            applied_share=reported["updates_applied_share"],
            updates=reported["updates_applied"],
            settings=settings,
            skipped=reported["updates_skipped"][:, -1],
            nonfinite=reported["updates_nonfinite"][:, -1],
            tuning_skipped=tuning_skipped,
            diagnostics={  # [S, periods, eval_every] from a record -> [S, iterations]
                name: reported[f"metrics/{name}"].reshape(len(reported[self.metric]), -1)
                for name in DIAGNOSTICS
                if f"metrics/{name}" in reported
            },
            greedy=reported.get(f"greedy_{self.metric}"),
        )

    def search(
        self,
        algorithm: str,
        settings: dict,
        search: tuning.Search,
        seeds: list[int],
        tuning_seeds: list[int],
    ) -> AlgorithmResult:
        """The search's configurations drawn from the algorithm's space and its reference recipe
        (`tuning.Search.candidates`) on the tuning seeds (one sweep per compiled program), narrowed by successive
        halving over its rungs (`tuning.rung_periods`; each rung's runs go on from the last one's), the best mean
        AUC at the full tuning horizon, then the reported seeds with it. Each configuration's row holds its
        scores at the last rung it ran, and says whether it was drawn or is the reference recipe (`candidate`)."""
        seconds, tuning_skipped = 0.0, (0, 0)
        configurations = search.candidates(self.env, self.env_options, algorithm)
        iterations = search.tuning_iterations
        tuning_settings = {**settings, **({"num_iterations": iterations} if iterations else {})}
        groups = tuning.group_sweeps(
            self.env, configurations, tuning_seeds, self.env_options, algorithm=algorithm, **tuning_settings
        )
        config = groups[0][0].config
        untils = tuning.rung_periods(config.num_periods, search.rungs)
        per_seed = len(tuning_seeds)
        rows = [{**point, "candidate": "drawn"} for point in configurations]
        rows[-1]["candidate"] = "reference"
        alive = list(range(len(configurations)))
        starts: dict[int, Start] = {}  # per group: where its runs of the next rung start
        for rung, until in enumerate(untils):
            scores, ran = {}, {}
            for group, (sweep, indices) in enumerate(groups):
                running = [index for index in indices if index in alive]
                if not running:
                    continue
                if running != indices:  # the promoted configurations' members, in the group's program
                    positions = [indices.index(index) for index in running]
                    sweep = sweep.subset([p * per_seed + seed for p in positions for seed in range(per_seed)])
                phase = f"tune{group}" if search.rungs == 1 else f"tune{group}-rung{rung}"
                tuned, phase_seconds = self.run(algorithm, phase, sweep, until, starts.get(group))
                curves, seconds = tuned[self.metric], seconds + phase_seconds  # [configs × seeds, periods]
                skipped, nonfinite = _skipped_total(tuned)
                tuning_skipped = (tuning_skipped[0] + skipped, tuning_skipped[1] + nonfinite)
                for position, index in enumerate(running):
                    members = curves[position * per_seed : (position + 1) * per_seed]
                    rows[index].update(
                        iterations=until * config.eval_every,
                        auc_mean=float(members.mean()),
                        final_mean=float(members[:, -1].mean()),
                        auc_per_seed=[float(value) for value in members.mean(axis=1)],
                    )
                    scores[index] = rows[index]["auc_mean"]
                ran[group] = (phase, sweep, starts.get(group), running)
            if rung + 1 < len(untils):
                alive = tuning.promoted(scores)
                starts = {
                    group: self.continuation(algorithm, phase, sweep, start, running, until, alive, per_seed)
                    for group, (phase, sweep, start, running) in ran.items()
                }
        chosen = configurations[max(alive, key=lambda index: rows[index]["auc_mean"])]
        sweep = tuning.group_sweeps(self.env, [chosen], seeds, self.env_options, algorithm=algorithm, **settings)[0][0]
        reported, report_seconds = self.run(algorithm, "report", sweep)
        return self.result(algorithm, reported, seconds + report_seconds, rows, dict(chosen), tuning_skipped)

    def continuation(
        self,
        algorithm: str,
        phase: str,
        sweep: Sweep,
        start: Start | None,
        running: list[int],
        until: int,
        alive: list[int],
        per_seed: int,
    ) -> Start:
        """Where a group's next rung starts: this rung's phase at `until` (restored from its checkpoints, or run
        again where they are gone), and the members of its configurations (`running`, in order) that are
        `alive`, in the same order."""

        def begin(stack: contextlib.ExitStack) -> tuple[MemberRun, list[int]]:
            run = self.started(algorithm, phase, sweep, until, start, stack)
            positions = [position for position, index in enumerate(running) if index in alive]
            return run, [position * per_seed + seed for position in positions for seed in range(per_seed)]

        return begin


# Where a rung's runs start when they have no checkpoint of their own: given an exit stack (that closes the
# checkpointers opened), the previous rung's run at its end and the members of it to go on from.
Start = Callable[[contextlib.ExitStack], tuple[MemberRun, list[int]]]
DIAGNOSTICS = ("policy_entropy", "groups_tied")  # `train.batch_diagnostics`, kept per iteration (the 2nd: G > 1)


def _skipped_total(results: dict) -> tuple[int, int]:
    """(ready updates skipped, of them non-finite) by every member of a phase."""
    return int(results["updates_skipped"][:, -1].sum()), int(results["updates_nonfinite"][:, -1].sum())

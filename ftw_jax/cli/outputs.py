"""What the commands write and print: summaries, tables, per-iteration logs, CSVs, arrays and plots.

Files go through `ftw_jax.running.run_files` (atomic JSON, CSV, JSON lines); plots through
`ftw_jax.running.plots`, imported when drawn so that a command that draws nothing never loads matplotlib.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import typing

import numpy as np

from ftw_jax.running import run_files

if typing.TYPE_CHECKING:
    from ftw_jax.envs import GaussianBandit
    from ftw_jax.lab.compare import Comparison, PhasePeriod
    from ftw_jax.lab.sweep import Sweep
    from ftw_jax.lab.train import TrainConfig
    from ftw_jax.running.loop import MemberRun
    from ftw_jax.running.metric_writers import Writers


def applied_warning(applied_share: np.ndarray, labels: list) -> str | None:
    """A warning when some member applied less than half of the optimizer steps it tried (None otherwise)."""
    low = [f"{label} ({share:.0%})" for label, share in zip(labels, applied_share) if share < 0.5]
    if not low:
        return None
    return (
        f"warning: few or no updates were applied (non-finite losses or gradients, nothing kept, a pool that "
        f"never held C entries), so the results are close to the untrained policy's: {', '.join(low)}."
    )


def skipped_text(run: MemberRun) -> str:
    """The progress line's "skipped S/T": ready updates skipped in the last period of the T all members tried."""
    skipped, tried = run.last_period_skipped()
    return f"skipped {skipped:,}/{tried:,}"


# ----------------------------------------------------------------------------------------------------- bandit


def bandit_result(config: TrainConfig, env: GaussianBandit, seeds: list[int], curves: dict, seconds: float) -> dict:
    """The bandit command's JSON: each seed's P(best arm) at the start and the end, the updates it applied."""
    best = np.asarray(curves["best_arm_probability"], dtype=np.float64)  # [S, I + 1]
    applied = np.asarray(curves["metrics"]["applied"])
    return {
        "seeds": seeds,
        "best_arm": env.best_arm,
        "best_arm_probability_initial": best[:, 0].tolist(),
        "best_arm_probability_final": best[:, -1].tolist(),
        "expected_reward_final": np.asarray(curves["expected_reward"], dtype=np.float64)[:, -1].tolist(),
        "best_arm_probability_final_mean": float(best[:, -1].mean()),
        "updates_applied": applied.sum(axis=1).tolist(),
        "warning": applied_warning(applied.mean(axis=1), [f"seed {s}" for s in seeds]),
        "seconds": seconds,
        "config": dataclasses.asdict(config),
        "env": dataclasses.asdict(env),
    }


def print_bandit_table(seeds: list[int], best: np.ndarray, reward: np.ndarray, max_rows: int = 20) -> None:
    print(f"{'seed':>8}  {'P(best) initial':>15}  {'P(best) final':>13}  {'E[reward] final':>15}")
    for seed, curve, rewards in list(zip(seeds, best, reward))[:max_rows]:
        print(f"{seed:>8}  {curve[0]:>15.6f}  {curve[-1]:>13.6f}  {rewards[-1]:>15.6f}")
    if len(seeds) > max_rows:
        print(f"{'...':>8}  ({len(seeds) - max_rows} more seeds)")
    final = best[:, -1]
    print(f"{'mean':>8}  {best[:, 0].mean():>15.6f}  {final.mean():>13.6f}  {reward[:, -1].mean():>15.6f}")
    if len(seeds) > 1:
        quantiles = np.quantile(final, [0.0, 0.05, 0.25, 0.5, 0.75, 1.0])
        at_max = np.mean(final >= final.max() - 1e-6)
        print(
            "\nfinal P(best) over seeds: sd {:.6f}; min {:.6f}, 5% {:.6f}, 25% {:.6f}, median {:.6f}, "
            "75% {:.6f}, max {:.6f}".format(final.std(), *quantiles)
        )
        print(f"share of seeds within 1e-6 of the max: {at_max:.1%}")


def save_bandit_curve(folder: pathlib.Path, config: TrainConfig, seeds: list[int], best: np.ndarray) -> pathlib.Path:
    from ftw_jax.running.plots import save_learning_curves

    ftw = config.algorithm_config
    return save_learning_curves(
        folder / "learning_curve.png",
        best,
        [f"seed {seed}" for seed in seeds],
        title=f"FTW bandit: best arm probability (C={ftw.batch_size}, K={ftw.num_elites}, J={ftw.num_batches}, "
        f"beta={config.kl_coef})",
        ylabel="P(best arm)",
    )


# ------------------------------------------------------------------------------------------------------ train


def event_writer(
    args: typing.Any, folder: pathlib.Path, log: typing.Callable[[str], None], runs: list[str], run: MemberRun | None
) -> Writers | None:
    """Where the run's rows go beside its JSON lines: TensorBoard event files (RUN/tensorboard/RUN_NAME/ for each
    of `runs`, M seeds or members; not with `no_tensorboard`) and W&B runs (with `wandb` PROJECT); None where
    neither. A resumed run drops what a killed process wrote after its last checkpoint (all of it where there was
    none), so each run shows one curve."""
    from ftw_jax.running.metric_writers import RowWriter, TensorBoardWriter, WandbWriter, Writers

    writers: list[RowWriter] = [] if args.no_tensorboard else [TensorBoardWriter(folder / "tensorboard", log)]
    if args.wandb:
        config = run_files.read_json(folder / "config.json") if (folder / "config.json").exists() else {}
        writers.append(WandbWriter(args.wandb, folder, config, log))
    if not writers:
        return None
    board = Writers(writers)
    if args.resume:
        history = run.history if run else []
        board.resume(runs, history[-1]["env_steps"] if history else [-1] * len(runs))
    return board


def member_run(member: dict, names: list[str]) -> str:
    """A sweep member's TensorBoard run: its values of `names`, e.g. "C=4,lr=0.003,seed=0"."""
    return ",".join(f"{name}={member[name]:g}" if isinstance(member[name], float) else f"{name}={member[name]}"
                    for name in names)  # fmt: skip


def phase_events(board: Writers, period: PhasePeriod) -> None:
    """A comparison's period in TensorBoard: each reported seed its own run (ALGORITHM/seed_S), each tuning member
    one under its phase (ALGORITHM/PHASE/AXES,seed=S); the first period a process runs of a phase drops what a
    killed process wrote past its start first."""
    if period.phase == "report":
        runs = [f"{period.algorithm}/seed_{member['seed']}" for member in period.members]
    else:
        runs = [f"{period.algorithm}/{period.phase}/{member_run(member, list(member))}" for member in period.members]
    if period.starts_after is not None:
        board.resume(runs, period.starts_after)
    board.period(runs, period.metrics, period.evaluation)


def write_period_logs(folder: pathlib.Path, metrics: dict, evaluation: dict, seeds: list[int], eval_every: int) -> dict:
    """Appends a period's rows to metrics.jsonl (per iteration and seed) and evaluation.jsonl (per seed); returns
    the metrics as written, with their iteration."""
    last = evaluation["iteration"][:, None]  # [S, 1]
    metrics = {**metrics, "iteration": last - eval_every + 1 + np.arange(eval_every)[None]}
    run_files.append_rows(folder / "metrics.jsonl", metrics, seeds)
    run_files.append_rows(
        folder / "evaluation.jsonl", {name: value[:, None] for name, value in evaluation.items()}, seeds
    )
    return metrics


def train_summary(
    env: str,
    env_options: dict,
    config: TrainConfig,
    seeds: list[int],
    run: MemberRun,
    folder: pathlib.Path,
    seconds: float,
    has_success: bool,
) -> dict:
    """The train command's summary.json (and JSON): each seed's final evaluation, steps and updates."""
    final = run.history[-1]
    return {
        "updates_applied": run.updates_applied().tolist(),
        **{name: counts.tolist() for name, counts in run.updates_skipped().items()},
        "updates_applied_share": run.applied_share().tolist(),
        "warning": applied_warning(run.applied_share(), [f"seed {seed}" for seed in seeds]),
        "env": env,
        "seeds": seeds,
        "return": final["return"].tolist(),
        **({"success": final["success"].tolist()} if has_success else {}),
        "env_steps": run.env_steps().tolist(),
        "iterations": config.num_iterations,
        "seconds": seconds,  # all of it: init, compile, training, evaluations
        "compile_seconds": run.compile_seconds,
        "env_steps_per_second": run.throughput(),  # compile excluded; after --resume, this process's part
        "run_folder": str(folder),
        "env_options": env_options,
        "config": dataclasses.asdict(config),
    }


def print_train_table(summary: dict, seeds: list[int]) -> None:
    successes = summary.get("success", [None] * len(seeds))
    print(
        f"\n{'seed':>6}  {'final eval return':>17}  {'success':>8}  {'env steps':>10}  {'updates applied':>15}  "
        f"{'skipped':>8}"
    )
    updates = zip(summary["updates_applied"], summary["updates_skipped"])
    for seed, value, success, steps, (applied, skipped) in zip(
        seeds, summary["return"], successes, summary["env_steps"], updates
    ):
        print(
            f"{seed:>6}  {value:>17.3f}  {'-' if success is None else f'{success:.1%}':>8}  {steps:>10,}  "
            f"{applied:>15,}  {skipped:>8,}"
        )
    mean_success = f"{np.mean(summary['success']):.1%}" if "success" in summary else "-"
    print(f"{'mean':>6}  {np.mean(summary['return']):>17.3f}  {mean_success:>8}")


def save_train_curve(folder: pathlib.Path, title: str, seeds: list[int], run: MemberRun, start: dict | None) -> None:
    """learning_curve.png: each seed's evaluation return against env steps, from the warm-started policy's when
    there is one."""
    from ftw_jax.running.plots import save_learning_curves

    results = run.results()
    curves, steps = results["return"], results["env_steps"]
    if start:  # the warm-started policy, before any update, at 0 env steps
        curves = np.concatenate([np.asarray(start["return"])[:, None], curves], axis=1)
        steps = np.concatenate([np.zeros((len(seeds), 1), steps.dtype), steps], axis=1)
    save_learning_curves(
        folder / "learning_curve.png",
        curves,
        [f"seed {s}" for s in seeds],
        title=title,
        ylabel="mean episode return",
        xlabel="env steps",
        x=steps,
    )


# ------------------------------------------------------------------------------------------------------ sweep


def save_sweep(
    env: str, sweep: Sweep, seeds: list[int], results: dict, folder: pathlib.Path, metric: str, heatmap_axes: list[str]
) -> dict:
    """results.csv, curves.npz and heatmap.png in the run folder; returns the summary of the grid points."""
    from ftw_jax.lab.sweep import heatmap_cells, summarise_points, tidy_rows
    from ftw_jax.running.plots import save_heatmap

    run_files.write_csv(folder / "results.csv", tidy_rows(sweep, results))
    members = {f"member_{axis}": np.array([m[axis] for m in sweep.members]) for axis in sweep.members[0]}
    run_files.write_arrays(folder / "curves.npz", {**results, **members})
    final = results[metric][:, -1]
    x_axis, y_axis = heatmap_axes[0], (heatmap_axes[1] if len(heatmap_axes) == 2 else None)
    means, spreads = heatmap_cells(sweep, final, x_axis, y_axis)
    save_heatmap(
        folder / "heatmap.png",
        means,
        spreads,
        x_values=sweep.grid[x_axis],
        y_values=sweep.grid[y_axis] if y_axis else [""],
        x_label=x_axis,
        y_label=y_axis or "",
        title=f"{env}: final {metric}, mean ± sd over {len(seeds)} seeds",
    )
    return {
        "env": env,
        "metric": metric,
        "grid": sweep.grid,
        "seeds": seeds,
        "run_folder": str(folder),
        "points": [
            {**dict(zip(sweep.grid, point)), "mean": mean, "sd": sd}
            for point, mean, sd in summarise_points(sweep, final)
        ],
    }


def print_sweep_table(summary: dict) -> None:
    grid, metric = summary["grid"], summary["metric"]
    print("\n" + "  ".join(f"{axis:>8}" for axis in grid) + f"  {'final ' + metric:>14}  {'sd':>8}")
    for point in summary["points"]:
        print("  ".join(f"{point[axis]:>8}" for axis in grid) + f"  {point['mean']:>14.3f}  {point['sd']:>8.3f}")
    print(
        f"updates applied {sum(summary['updates_applied']):,}, skipped {sum(summary['updates_skipped']):,} "
        f"({sum(summary['updates_nonfinite']):,} non-finite), all members"
    )
    if summary["env_steps_per_second"] is not None:
        print(
            f"\n{summary['seconds']:.1f} s, of which {summary['compile_seconds']:.1f} s compiling; then "
            f"{summary['env_steps_per_second']:,.0f} env steps/s (all members, training steps)"
        )
    print(f"results.csv, curves.npz, heatmap.png in {summary['run_folder']}")


# ---------------------------------------------------------------------------------------------------- compare


def save_comparison(folder: pathlib.Path, comparison: Comparison, title: str) -> str:
    """results.csv, seeds.csv, differences.csv, tuning.csv, table.md, tuning.md, curves.npz and the plots in the
    run folder; returns table.md's text."""
    from ftw_jax.lab.comparison_tables import (
        diagnostics_table,
        difference_rows,
        markdown_table,
        seed_rows,
        summary_rows,
        tuning_table,
    )

    run_files.write_csv(folder / "results.csv", summary_rows(comparison))
    run_files.write_csv(folder / "seeds.csv", seed_rows(comparison))
    differences = difference_rows(comparison)
    if differences:
        run_files.write_csv(folder / "differences.csv", differences)
    tried = [
        {"algorithm": r.algorithm, **{k: v for k, v in row.items() if k != "auc_per_seed"}}
        for r in comparison.results
        for row in r.tuning
    ]
    if tried:
        run_files.write_csv(folder / "tuning.csv", tried)
    table, diagnostics = markdown_table(comparison), diagnostics_table(comparison)
    if diagnostics:
        table += "\n" + diagnostics
    run_files.write_atomically(folder / "table.md", table)
    tuning = tuning_table(comparison)
    if tuning:
        run_files.write_atomically(folder / "tuning.md", tuning)
    run_files.write_arrays(folder / "curves.npz", _comparison_arrays(comparison))
    _save_comparison_plots(folder, comparison, title)
    return table


def _comparison_arrays(comparison: Comparison) -> dict:
    metric, results = comparison.metric, comparison.results
    return {
        "episodes": comparison.episodes,
        **{f"{r.algorithm}_{metric}": r.curves for r in results},
        **{f"{r.algorithm}_env_steps": r.env_steps for r in results},
        **{f"{r.algorithm}_updates": r.updates for r in results},
        **{f"{r.algorithm}_greedy_{metric}": r.greedy for r in results if r.greedy is not None},
        **{f"{r.algorithm}_{name}": values for r in results for name, values in r.diagnostics.items()},
    }


def _save_comparison_plots(folder: pathlib.Path, comparison: Comparison, title: str) -> None:
    """The curves with 95% bootstrap bands against training episodes (curves.png), and against the mean over
    seeds of env steps and of gradient steps applied (curves_env_steps.png, curves_updates.png); the policy's
    entropy and the share of tied groups per iteration where recorded."""
    from ftw_jax.lab.stats import bootstrap_interval
    from ftw_jax.running.plots import save_banded_curves

    bands = {r.algorithm: (r.curves.mean(axis=0), *bootstrap_interval(r.curves)) for r in comparison.results}
    ylabel = f"evaluation {comparison.metric}"
    save_banded_curves(
        folder / "curves.png", comparison.episodes, bands, title=title, xlabel="training episodes", ylabel=ylabel
    )
    for name, label, of in (
        ("env_steps", "training env steps (mean over seeds)", lambda r: r.env_steps),
        ("updates", "gradient steps applied (mean over seeds)", lambda r: r.updates),
    ):
        x = {r.algorithm: of(r).mean(axis=0) for r in comparison.results}
        save_banded_curves(folder / f"curves_{name}.png", x, bands, title=title, xlabel=label, ylabel=ylabel)
    for name, ylabel in (("policy_entropy", "policy entropy (nats per step)"), ("groups_tied", "share of groups tied")):
        shown = {r.algorithm: r.diagnostics[name] for r in comparison.results if name in r.diagnostics}
        if shown:  # per training iteration, over the reported seeds
            bands = {algorithm: (v.mean(axis=0), *bootstrap_interval(v)) for algorithm, v in shown.items()}
            iterations = np.arange(1, next(iter(shown.values())).shape[1] + 1)
            save_banded_curves(
                folder / f"{name}.png", iterations, bands, title=title, xlabel="training iteration", ylabel=ylabel
            )


def print_comparison(table: str, summary: dict) -> None:
    print("\n" + table)
    skipped = ", ".join(
        f"{name} {sum(row['skipped']):,} ({sum(row['nonfinite']):,} non-finite; tuning {row['tuning_skipped']:,})"
        for name, row in summary["updates"].items()
    )
    print(f"updates skipped, all reported seeds: {skipped}")
    files = "table.md, results.csv, seeds.csv, curves.npz, curves*.png"
    print(f"{summary['seconds']:.1f} s; {files} in {summary['run_folder']}")


# ------------------------------------------------------------------------------------------------------ lm learn


# The metrics an `lm learn` log line shows, where the algorithm's row has them: (name, label, format).
LEARN_LOG = (
    ("elite_return_mean", "elite reward", ".3f"),  # FTW's
    ("cross_entropy", "cross-entropy", ".4f"),
    ("surrogate", "surrogate", ".4f"),  # the baselines'
    ("value_loss", "value loss", ".4f"),  # PPO's critic
    ("kl", "kl", ".4f"),
    ("groups_tied", "groups tied", ".2f"),  # GRPO's and RLOO's groups of equal rewards
    ("pool_staleness_mean", "staleness", ".1f"),
    ("episodes_stale", "stale", "d"),  # with --max-staleness: episodes the pool will never select
    ("sampler_gap", "sampler gap", ".2g"),  # nats per token; absent where no episode was the current version's
)


@dataclasses.dataclass(frozen=True)
class LearnOutputs:
    """What `lm learn` writes and prints (`ftw_jax.agent.lm_learn.LearnReport`): a metrics.jsonl row and a log line per
    iteration, and summary.json; only the process that writes (the main one) touches the files."""

    folder: pathlib.Path
    log: typing.Callable[[str], None]
    updates: int  # the optimizer steps per batch (U; PPO: U x M), of which the log line counts those skipped
    writer: bool = True
    provenance: dict | None = None  # the code that ran (`ftw_jax.running.provenance`), for summary.json
    board: Writers | None = None  # each row as TensorBoard's (and W&B's) `learn/NAME` at its iteration

    def resumed(self, iterations: int) -> None:
        if self.writer:
            run_files.keep_rows_up_to(self.folder / "metrics.jsonl", iterations, range(1, iterations + 1), [None])
        if self.board:  # what a killed process wrote after the checkpoint goes
            self.board.resume(["learner"], [iterations])

    def iteration(self, row: dict, total: int | None) -> None:
        if self.writer:
            run_files.append_lines(self.folder / "metrics.jsonl", [row])
        if self.board:
            self.board.rows("learner", [row], "iteration", "learn")
        shown = "".join(f"  {label} {row[name]:{spec}}" for name, label, spec in LEARN_LOG if row.get(name) is not None)
        self.log(
            f"iteration {row['iteration']:>4}{'' if total is None else f'/{total}'}  reward {row['reward_mean']:.3f}"
            f"{shown}  version {row['version']}  skipped {row['skipped_count']}/{self.updates}"
        )

    def evaluation(self, row: dict, name: str) -> None:
        if self.board:  # the log line is the program's: it knows what was evaluated
            self.board.rows("learner", [row], "iteration", name)

    def finished(self, summary: dict) -> None:
        if self.board:
            self.board.close()
        if self.provenance is not None:
            summary["provenance"] = self.provenance
        if self.writer:
            run_files.write_json(self.folder / "summary.json", summary)


def print_learn_summary(summary: dict) -> None:
    print(
        f"{summary['episodes']} episodes, {summary['iterations']} iterations, policy version "
        f"{summary['version']} ({summary['updates_skipped']:,} updates skipped, {summary['updates_nonfinite']:,} "
        f"non-finite): weights in {summary['weights']} ({summary['seconds']:.1f} s)"
    )


# ------------------------------------------------------------------------------------------------ retrieval QA


def save_exact_match_curve(folder: pathlib.Path, evaluations: list[dict]) -> None:
    """exact_match.png: greedy test exact match against iterations (the first point: before any update)."""
    from ftw_jax.running.plots import save_learning_curves

    save_learning_curves(
        folder / "exact_match.png",
        np.asarray([[row["test_em"] for row in evaluations]]),
        ["test"],
        title="FTW on retrieval QA: greedy exact match",
        ylabel="exact match",
        xlabel="iteration",
        x=np.asarray([[row["iteration"] for row in evaluations]]),
    )


def save_test_table(folder: pathlib.Path, row: dict) -> None:
    """test_table.md: the final evaluation as the paper's table (each source's exact match and their mean)."""
    from ftw_jax.agent.retrieval_qa.evaluation import paper_table

    (folder / "test_table.md").write_text(paper_table([(folder.name, row)]))


def print_retrieval_summary(summary: dict) -> None:
    start, final, best = (summary[f"test_em_{name}"] for name in ("start", "final", "best"))
    print(
        f"test exact match {start:.1%} -> {final:.1%} (best {best:.1%}) over {summary['test_questions']} questions, "
        f"{summary['iterations']} iterations, policy version {summary['version']}: weights in {summary['weights']} "
        f"({summary['seconds']:.1f} s)"
    )
    from ftw_jax.agent.retrieval_qa.evaluation import paper_table

    print(paper_table([("final", summary["final_test"])]), end="")
    if final <= start:
        print(
            f"warning: test exact match did not rise ({start:.1%} -> {final:.1%}): nothing was learnt", file=sys.stderr
        )

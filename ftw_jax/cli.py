"""The `ftw-jax` command: parses, calls the package, prints. Its training flags are generated from the configs.

Every setting is declared once, as a `ftw_jax.settings.setting` field of `TrainConfig`, of an algorithm's
config (`ftw_jax.algos`) or of the bandit (`GaussianBandit`); its flag, type, choices, help and default come
from there.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import os
import pathlib
import signal
import sys
import threading
import time
import typing
from collections.abc import Iterable

import numpy as np

from ftw_jax import __version__, compile_cache
from ftw_jax.checks import MAX_SEED, check_seed

if typing.TYPE_CHECKING:  # imported where they are used, so that `ftw-jax --help` stays fast
    from ftw_jax.envs import GaussianBandit
    from ftw_jax.settings import Setting
    from ftw_jax.train import TrainConfig

# Every subcommand's default seeds (the bandit protocol's); `--num-seeds N` runs 42, 43, ..., 42 + N - 1.
FIRST_SEED = 42

# The exit status of a run stopped because a member applied no update for too long (`--stop-after-skipped`); 2 is
# bad input, 1 a non-finite evaluation, 128 + N a signal.
STOPPED_SKIPPING = 3


# ----------------------------------------------------------------------------------------------- value types


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    return values


MAX_NUM_SEEDS = 1_000_000


def _seed_list(text: str) -> list[int]:
    seeds = _int_list(text)
    bad = [seed for seed in seeds if not 0 <= seed <= MAX_SEED]
    if bad:
        raise argparse.ArgumentTypeError(f"seeds must be integers in [0, {MAX_SEED}], got {bad[0]}")
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(
            f"seeds must be distinct (a repeated seed repeats its run), got {repeated[0]} more than once"
        )
    return seeds


def _seed(text: str) -> int:
    try:
        value = int(text)
        check_seed("the seed", value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {MAX_SEED}], got {text!r}") from None
    return value


def _name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder name, got an empty one")
    return text


def _num_seeds(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_NUM_SEEDS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_NUM_SEEDS:,} seeds, got {text}")
    return value


def _float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _yes_no(text: str) -> bool:
    if text.lower() in ("yes", "true", "1"):
        return True
    if text.lower() in ("no", "false", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected yes or no, got {text!r}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


# Annotation -> how its flag's text becomes a value.
_VALUE_TYPES = {
    int: int,
    float: float,
    bool: _yes_no,
    str: str,
    tuple[int, ...]: lambda text: tuple(_int_list(text)),
    tuple[float, ...]: _float_list,
}


# ------------------------------------------------------------------------------------------- settings -> flags


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def add_settings(
    parser: argparse.ArgumentParser, settings: Iterable[Setting], *, env_defaults: bool | str = False
) -> None:
    """One flag per setting name (the first declaration's help; its default shown, with each environment's own
    when `env_defaults` is True, or that environment's when it names one). Every flag defaults to None: not
    given."""
    from ftw_jax import envs

    seen = set()
    for item in settings:
        if item.name in seen:
            continue
        seen.add(item.name)
        kind = typing.get_origin(item.base_type) is typing.Literal and str or item.base_type
        default = f"default {_shown(item.default)}"
        if isinstance(env_defaults, str):
            default = f"default {_shown(envs.entry(env_defaults).defaults.get(item.name, item.default))}"
        elif env_defaults:
            default += "".join(
                f"; {env} {_shown(entry.defaults[item.name])}"
                for env, entry in envs.ENVIRONMENTS.items()
                if item.name in entry.defaults
            )
        metavar = None if item.choices else item.flag[2:].upper().replace("-", "_")
        parser.add_argument(
            *filter(None, (item.flag, item.short)),
            dest=item.name,
            type=_VALUE_TYPES[kind],
            choices=item.choices,
            default=None,
            metavar=metavar,
            help=f"{item.help} ({default})",
        )


def given_settings(args: argparse.Namespace, settings: Iterable[Setting]) -> dict:
    """{name: value} of the settings whose flags were given."""
    return {item.name: getattr(args, item.name) for item in settings if getattr(args, item.name, None) is not None}


def _training_settings():
    """The settings of a training run: the run's own, then every algorithm's."""
    from ftw_jax import algos
    from ftw_jax.settings import describe
    from ftw_jax.train import TrainConfig

    return [*describe(TrainConfig), *(item for entry in algos.ALGORITHMS.values() for item in describe(entry.config))]


def _train_overrides(args, log, algorithm: str | None = None) -> dict:
    """The training settings whose flags were given; those that belong to other algorithms only are named and
    left out."""
    from ftw_jax.train import split_overrides

    overrides = given_settings(args, _training_settings())
    algorithm = algorithm or overrides.get("algorithm", "ftw")
    applicable, ignored = split_overrides(algorithm, overrides)
    if ignored:
        flags = ", ".join("--" + name.replace("_", "-") for name in ignored)
        log(f"note: {flags} do(es) not apply to {algorithm}; ignored.")
    return applicable


def _add_seeds(parser: argparse.ArgumentParser, count: int = 3) -> None:
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seeds", type=_seed_list, help=f"comma-separated seeds (default {FIRST_SEED}..{FIRST_SEED + count - 1})"
    )
    seeds.add_argument(
        "--num-seeds",
        type=_num_seeds,
        default=count,
        help=f"run seeds {FIRST_SEED}, {FIRST_SEED + 1}, ..., {FIRST_SEED} + N - 1 (default {count})",
    )


def seeds_of(args: argparse.Namespace) -> list[int]:
    """The seeds of `--seeds`, or `--num-seeds` of them from 42."""
    return args.seeds or [FIRST_SEED + i for i in range(args.num_seeds)]


def _add_env(parser: argparse.ArgumentParser) -> None:
    from ftw_jax import envs

    parser.add_argument("--env", required=True, choices=sorted(envs.ENVIRONMENTS))
    parser.add_argument(
        "--env-options",
        type=_env_options,
        default={},
        help="environment options, e.g. 'reward=binary,num_train_levels=1000' (sokoban)",
    )


def _add_run_folder_arguments(parser: argparse.ArgumentParser) -> None:
    """Where results go, checkpoints and resuming (train, sweep and compare alike)."""
    parser.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path("runs"), help="where the run folder is created (default runs/)"
    )
    parser.add_argument("--name", type=_name, default=None, help="run folder name (default: COMMAND-ENV-DATE-TIME)")
    parser.add_argument(
        "--resume",
        type=pathlib.Path,
        default=None,
        metavar="RUN_FOLDER",
        help="continue the run in RUN_FOLDER from its last checkpoint (same options as it started with)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=_positive_int,
        default=1,
        metavar="PERIODS",
        help="checkpoint every PERIODS evaluation periods, and at the end (default 1)",
    )
    parser.add_argument("--no-checkpoint", action="store_true", help="write no checkpoints")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress goes to stderr)")


def _open_run(args, default_name: str, fingerprint: dict, *, writer: bool = True):
    from ftw_jax import runs

    folder, checkpointer = runs.open_run(
        args.out,
        args.name,
        args.resume,
        default_name,
        fingerprint,
        writer=writer,
        checkpoint_every=None if args.no_checkpoint else args.checkpoint_every,
        cleanup=args.cleanup,
    )
    args.run_folder = folder  # for the resume command an interrupt prints
    return folder, checkpointer


def _logger(args):
    return lambda message: print(message, file=sys.stderr if args.json else sys.stdout, flush=True)


def _default_metric(args, env) -> str:
    if args.metric == "success" and not env.has_success:
        raise ValueError(f"--metric success is not defined for {args.env} (it has no notion of success); use return.")
    return args.metric or ("success" if env.has_success else "return")


# ----------------------------------------------------------------------------------------------------- bandit


def _protocol_settings():
    from ftw_jax.reproduction import PROTOCOL_SETTINGS

    return [item for item in _training_settings() if item.name in PROTOCOL_SETTINGS]


def add_bandit_arguments(parser: argparse.ArgumentParser) -> None:
    """The bandit protocol's options: its seeds, the bandit's and the training settings it reads (experiments/bandit.py
    takes them too)."""
    from ftw_jax.envs import GaussianBandit
    from ftw_jax.settings import describe

    _add_seeds(parser)
    add_settings(parser, describe(GaussianBandit))
    add_settings(parser, _protocol_settings(), env_defaults="bandit")


def bandit_protocol(args: argparse.Namespace) -> tuple[TrainConfig, GaussianBandit]:
    """(TrainConfig, GaussianBandit) of the bandit command's flags."""
    from ftw_jax.envs import GaussianBandit
    from ftw_jax.reproduction import protocol_config
    from ftw_jax.settings import describe

    env = GaussianBandit(**given_settings(args, describe(GaussianBandit)))
    return protocol_config(**given_settings(args, _protocol_settings())), env


def _add_bandit_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bandit",
        help="reproduce the two-armed bandit result (the main job)",
        description="FTW on a Gaussian bandit, all seeds in one vmapped jit. Defaults are the paper's protocol.",
    )
    add_bandit_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path("runs/bandit"),
        help="folder for the learning-curve PNG (default runs/bandit)",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.set_defaults(handler=_run_bandit)


def _run_bandit(args) -> int:
    from ftw_jax.reproduction import run_seeds

    seeds = seeds_of(args)
    config, env = bandit_protocol(args)
    if not args.no_plot:  # before the work, not after it
        from ftw_jax.runs import make_folder

        make_folder(args.out)
    print(f"running {len(seeds)} seed(s) x {config.num_iterations} iterations in one jit...", file=sys.stderr)
    started = time.perf_counter()
    curves = run_seeds(config, seeds, env, metric_names=("applied",))  # the one metric it reports
    best = np.asarray(curves["best_arm_probability"], dtype=np.float64)  # [S, I + 1]
    reward = np.asarray(curves["expected_reward"], dtype=np.float64)
    seconds = time.perf_counter() - started
    if not np.all(np.isfinite(best)):
        print("error: non-finite policy probabilities; the run is not trustworthy.", file=sys.stderr)
        return 1
    final = best[:, -1]
    result = {
        "seeds": seeds,
        "best_arm": env.best_arm,
        "best_arm_probability_initial": best[:, 0].tolist(),
        "best_arm_probability_final": final.tolist(),
        "expected_reward_final": reward[:, -1].tolist(),
        "best_arm_probability_final_mean": float(final.mean()),
        "updates_applied": np.asarray(curves["metrics"]["applied"]).sum(axis=1).tolist(),
        "warning": applied_warning(np.asarray(curves["metrics"]["applied"]).mean(axis=1), [f"seed {s}" for s in seeds]),
        "seconds": seconds,
        "config": dataclasses.asdict(config),
        "env": dataclasses.asdict(env),
    }
    if result["warning"]:
        print(result["warning"], file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 0
    print_bandit_table(seeds, best, reward)
    print(f"\n{len(seeds)} seed(s) in {seconds:.1f} s (compile included)")
    if not args.no_plot:
        from ftw_jax.plots import save_learning_curves

        path = save_learning_curves(
            args.out / "learning_curve.png",
            best,
            [f"seed {seed}" for seed in seeds],
            title=f"FTW bandit: best arm probability (C={config.algorithm_config.batch_size}, "
            f"K={config.algorithm_config.num_elites}, J={config.algorithm_config.num_batches}, beta={config.kl_coef})",
            ylabel="P(best arm)",
        )
        print(f"learning curve: {path}")
    return 0


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


@contextlib.contextmanager
def _native_output_to_stderr():
    """Sends file descriptor 1 to stderr for a while: native libraries (gloo's connection messages) print there,
    and with --json stdout must hold nothing but the JSON object."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        ctypes.CDLL(None).fflush(None)  # C stdio buffers a pipe: flush it while it still goes to stderr
        os.dup2(saved, 1)
        os.close(saved)


def _start_processes(args) -> None:
    """Joins the other processes of a multi-process run (before anything else touches jax)."""
    import jax

    explicit = (args.coordinator, args.num_processes, args.process_id)
    if any(value is not None for value in explicit):
        if any(value is None for value in explicit):
            raise ValueError(
                "--coordinator, --num-processes and --process-id go together; got "
                f"{args.coordinator!r}, {args.num_processes!r}, {args.process_id!r}."
            )
        if not 0 <= args.process_id < args.num_processes:
            raise ValueError(f"--process-id must be in [0, {args.num_processes}), got {args.process_id}.")
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    elif args.distributed:
        jax.distributed.initialize()
    if jax.process_count() > 1 and not (args.name or args.resume):
        raise ValueError("a run over several processes needs --name (or --resume), so they share one run folder.")


def _env_options(text: str) -> dict:
    """'a=1,b=x' -> {'a': 1, 'b': 'x'} (ints, then floats, else strings)."""
    options = {}
    for item in filter(None, text.split(",")):
        name, separator, value = item.partition("=")
        if not separator or not name:
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE pairs separated by commas, got {item!r}")
        for kind in (int, float, str):
            try:
                options[name.strip()] = kind(value)
                break
            except ValueError:
                continue
    return options


# ------------------------------------------------------------------------------------------------------ train


def _add_train_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train FTW (or a baseline) on an environment (all seeds in one jitted program)",
        description="Every option defaults to a setting that trains on a 2-core CPU (ftw_jax.envs.ENVIRONMENTS).",
    )
    _add_env(parser)
    _add_seeds(parser)
    add_settings(parser, _training_settings(), env_defaults=True)
    _add_run_folder_arguments(parser)
    parser.add_argument("--no-plot", action="store_true", help="do not write the learning-curve PNG")
    parser.set_defaults(handler=_run_train)


def _write_period_logs(
    folder: pathlib.Path, metrics: dict, evaluation: dict, seeds: list[int], eval_every: int
) -> None:
    """Appends a period's rows to metrics.jsonl (per iteration and seed) and evaluation.jsonl (per seed)."""
    from ftw_jax import runs

    last = evaluation["iteration"][:, None]  # [S, 1]
    metrics = {**metrics, "iteration": last - eval_every + 1 + np.arange(eval_every)[None]}
    runs.append_rows(folder / "metrics.jsonl", metrics, seeds)
    runs.append_rows(folder / "evaluation.jsonl", {name: value[:, None] for name, value in evaluation.items()}, seeds)


def _run_train(args) -> int:
    from ftw_jax import runs
    from ftw_jax.runner import MemberRun, seed_keys
    from ftw_jax.train import TrainConfig, make_train

    log = _logger(args)
    seeds = seeds_of(args)
    config = TrainConfig.for_env(args.env, **_train_overrides(args, log))
    trainer = make_train(config, **args.env_options)
    folder, checkpointer = _open_run(
        args, args.env, {"seeds": seeds, "env_options": args.env_options, **dataclasses.asdict(config)}
    )
    log(f"training {args.env} for {config.num_iterations} iterations x {len(seeds)} seed(s); run folder {folder}")
    started = time.perf_counter()
    try:
        run = MemberRun(trainer, seed_keys(seeds), checkpointer=checkpointer, labels=[f"seed {s}" for s in seeds])
        if run.periods_done_before:
            log(f"resumed from the checkpoint after iteration {run.periods_done_before * config.eval_every}")
        done = run.periods_done_before * config.eval_every
        for log_file, every in (("metrics.jsonl", 1), ("evaluation.jsonl", config.eval_every)):
            # rows written after that checkpoint come again; those it counts must all be there
            runs.keep_rows_up_to(folder / log_file, done, list(range(every, done + 1, every)), seeds)
        steps_before = int(run.env_steps().sum())
        start = _starting_evaluation(trainer, run, seeds, folder, log) if config.warm_start_demonstrations else None
        for metrics, evaluation in run.periods():
            if len(run.clock) == 1:
                log(f"compiled in {run.compile_seconds:.1f} s")
            _write_period_logs(folder, metrics, evaluation, seeds, config.eval_every)
            success = f"  eval success {evaluation['success'].mean():6.1%}" if trainer.env.has_success else ""
            log(
                f"iteration {evaluation['iteration'][0]:>5}/{config.num_iterations}  env steps {run.clock[-1][1]:>10,}"
                f"  train return {metrics['return_mean'][:, -1].mean():9.3f}"
                f"  eval return {evaluation['return'].mean():9.3f}"
                f"{success}  {_skipped_text(run)}  {run.throughput(steps_before):9,.0f} env steps/s"
            )
            if not np.all(np.isfinite(evaluation["return"])):
                log("error: non-finite evaluation return; stopping (the run folder keeps what was done).")
                return 1
    finally:  # waits for the checkpoint writes in flight
        if checkpointer:
            checkpointer.close()
    summary = _train_summary(
        args, config, seeds, run, folder, time.perf_counter() - started, steps_before, trainer.env.has_success
    )
    if start is not None:
        summary["start"] = start
    runs.write_json(folder / "summary.json", summary)
    if summary["warning"]:
        print(summary["warning"], file=sys.stderr)
    if not args.no_plot:
        from ftw_jax.plots import save_learning_curves

        results = run.results()
        curves, steps = results["return"], results["env_steps"]
        if start:  # the warm-started policy, before any update, at 0 env steps
            curves = np.concatenate([np.asarray(start["return"])[:, None], curves], axis=1)
            steps = np.concatenate([np.zeros((len(seeds), 1), steps.dtype), steps], axis=1)
        save_learning_curves(
            folder / "learning_curve.png",
            curves,
            [f"seed {s}" for s in seeds],
            title=f"{config.algorithm.upper()} on {args.env}: evaluation return",
            ylabel="mean episode return",
            xlabel="env steps",
            x=steps,
        )
    if args.json:
        print(json.dumps(summary))
        return 0
    _print_train_table(summary, seeds)
    print(
        f"\n{summary['seconds']:.1f} s ({run.compile_seconds:.1f} s compiling), "
        f"{summary['env_steps_per_second'] or 0:,.0f} env steps/s (all seeds, training steps, compile excluded); "
        f"run folder {folder}"
    )
    return 0


def _starting_evaluation(trainer, run, seeds: list[int], folder: pathlib.Path, log) -> dict:
    """The evaluation of each seed's starting policy (after its warm start), before any update: computed on a fresh
    run and kept in start.json for a resumed one. {"return": [S], "success": [S]}."""
    import jax

    from ftw_jax import runs
    from ftw_jax.runner import host_array, seed_keys

    path = folder / "start.json"
    if run.periods_done_before and path.exists():
        return json.loads(path.read_text())
    if run.periods_done_before:  # a run started before start.json was written: its start is gone
        return {}
    keys = jax.vmap(lambda key: jax.random.fold_in(key, 1))(seed_keys(seeds))  # not a key the run itself draws
    evaluation = jax.jit(jax.vmap(trainer.evaluate))(keys, jax.tree.map(lambda leaf: leaf[: len(seeds)], run.carry))
    start = {name: host_array(evaluation[name]).tolist() for name in ("return", "success")}
    runs.write_json(path, start)
    log(
        f"starting policy (after the warm start): eval return {np.mean(start['return']):.3f}"
        + (f", success {np.mean(start['success']):.1%}" if trainer.env.has_success else "")
    )
    return start


def _skipped_text(run) -> str:
    """The progress line's "skipped S/T": ready updates skipped in the last period of the T all members tried."""
    skipped, tried = run.last_period_skipped()
    return f"skipped {skipped:,}/{tried:,}"


def applied_warning(applied_share: np.ndarray, labels: list) -> str | None:
    """A warning when some member applied less than half of the optimizer steps it tried (None otherwise)."""
    low = [f"{label} ({share:.0%})" for label, share in zip(labels, applied_share) if share < 0.5]
    if not low:
        return None
    return (
        f"warning: few or no updates were applied (non-finite losses or gradients, nothing kept, a pool that "
        f"never held C entries), so the results are close to the untrained policy's: {', '.join(low)}."
    )


def _train_summary(args, config, seeds, run, folder, seconds: float, steps_before: int, has_success: bool) -> dict:
    final = run.history[-1]
    return {
        "updates_applied": run.updates_applied().tolist(),
        **{name: counts.tolist() for name, counts in run.updates_skipped().items()},
        "updates_applied_share": run.applied_share().tolist(),
        "warning": applied_warning(run.applied_share(), [f"seed {seed}" for seed in seeds]),
        "env": args.env,
        "seeds": seeds,
        "return": final["return"].tolist(),
        **({"success": final["success"].tolist()} if has_success else {}),
        "env_steps": run.env_steps().tolist(),
        "iterations": config.num_iterations,
        "seconds": seconds,  # all of it: init, compile, training, evaluations
        "compile_seconds": run.compile_seconds,
        "env_steps_per_second": run.throughput(steps_before),  # compile excluded; after --resume, this process's part
        "run_folder": str(folder),
        "env_options": args.env_options,
        "config": dataclasses.asdict(config),
    }


def _print_train_table(summary: dict, seeds: list[int]) -> None:
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


# ------------------------------------------------------------------------------------------------------ sweep


def _add_sweep_parser(subparsers) -> None:
    from ftw_jax.sweep import ALL_AXES

    parser = subparsers.add_parser(
        "sweep",
        help="run a grid of N, J, C, K, beta, learning rate x seeds as one compiled program",
        description="Every grid point and seed is one member of one jitted program (vmapped; looped on a single CPU "
        "device), sharded over the visible devices. Settings not in the grid keep the environment's defaults or "
        "the flags' values.",
    )
    _add_env(parser)
    parser.add_argument(
        "--grid", required=True, help=f"e.g. 'C=4,5,8 K=1,2,3 kl=0.01,0.05' (axes: {' '.join(ALL_AXES)})"
    )
    _add_seeds(parser)
    add_settings(parser, _training_settings(), env_defaults=True)
    parser.add_argument(
        "--metric",
        choices=["return", "success"],
        default=None,
        help="final metric of the table and heatmap (default: success where defined, else return)",
    )
    parser.add_argument("--heatmap", default=None, help="two grid axes, e.g. 'C,K' (default: the grid's first two)")
    _add_run_folder_arguments(parser)
    _add_cluster_arguments(parser)
    parser.set_defaults(handler=_run_sweep)


def _add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group(
        "several processes (one per host)",
        "all three, the same --name and a shared --out on every process; "
        "or --distributed alone where jax.distributed.initialize() detects the cluster (SLURM, Open MPI)",
    )
    cluster.add_argument("--coordinator", default=None, metavar="HOST:PORT", help="address of process 0")
    cluster.add_argument("--num-processes", type=_positive_int, default=None)
    cluster.add_argument("--process-id", type=int, default=None)
    cluster.add_argument("--distributed", action="store_true", help="jax.distributed.initialize() with no arguments")


def _run_sweep(args) -> int:
    import jax

    from ftw_jax.runner import MemberRun
    from ftw_jax.sweep import make_sweep, parse_grid

    grid = parse_grid(args.grid)
    seeds = seeds_of(args)
    heatmap_axes = args.heatmap.split(",") if args.heatmap else list(grid)[:2]
    if len(heatmap_axes) not in (1, 2) or any(axis not in grid for axis in heatmap_axes):
        raise ValueError(f"--heatmap must name one or two grid axes among {list(grid)}, got {args.heatmap!r}.")
    sweep = make_sweep(args.env, grid, seeds, args.env_options, **_train_overrides(args, _logger(args)))
    with _native_output_to_stderr() if args.json else contextlib.nullcontext():
        _start_processes(args)
        from ftw_jax.train import make_train

        trainer = make_train(sweep.config, **sweep.env_options)
        metric = _default_metric(args, trainer.env)
        main_process = jax.process_index() == 0  # the one that writes files and prints
        folder, checkpointer = _open_run(
            args,
            f"sweep-{args.env}",
            {
                "grid": grid,
                "seeds": seeds,
                "env_options": sweep.env_options,
                "maxima": dataclasses.asdict(sweep.config),
            },
            writer=main_process,
        )
        log = _logger(args) if main_process else (lambda message: None)
        log(
            f"sweep {args.env}: {len(sweep.members)} members ({len(sweep.members) // len(seeds)} grid points x "
            f"{len(seeds)} seeds) in one program on {jax.device_count()} device(s) in {jax.process_count()} "
            f"process(es); run folder {folder}"
        )
        labels = [", ".join([*(f"{axis}={m[axis]}" for axis in grid), f"seed {m['seed']}"]) for m in sweep.members]
        started = time.perf_counter()
        try:
            run = MemberRun(trainer, sweep.keys(), sweep.hyperparameters(), checkpointer, labels=labels)
            steps_before = int(run.env_steps().sum())
            for _, evaluation in run.periods():
                values = evaluation[metric]
                log(
                    f"iteration {evaluation['iteration'][0]:>5}/{sweep.config.num_iterations}  eval {metric} mean "
                    f"{values.mean():9.3f} (min {values.min():.3f}, max {values.max():.3f})  {_skipped_text(run)}"
                    f"  {time.perf_counter() - started:7.1f} s"
                )
        finally:  # waits for the checkpoint writes in flight
            if checkpointer:
                checkpointer.close()
        results = run.results()  # gathers from every process: all of them must take part
    if not main_process:
        return 0
    summary = _save_sweep(args, sweep, results, folder, metric, heatmap_axes)
    applied_share = results["updates_applied_share"]
    summary.update(
        updates_applied=results["updates_applied"][:, -1].tolist(),  # per member, in the order of results.csv
        **{name: counts.tolist() for name, counts in run.updates_skipped().items()},
        updates_applied_share=applied_share.tolist(),
        warning=applied_warning(applied_share, labels),
    )
    if summary["warning"]:
        print(summary["warning"], file=sys.stderr)
    summary.update(
        seconds=time.perf_counter() - started,
        compile_seconds=run.compile_seconds,
        env_steps_per_second=run.throughput(steps_before),
        devices=jax.device_count(),
        processes=jax.process_count(),
    )
    from ftw_jax import runs

    runs.write_json(folder / "summary.json", summary)
    if args.json:
        print(json.dumps(summary))
        return 0
    print("\n" + "  ".join(f"{axis:>8}" for axis in grid) + f"  {'final ' + metric:>14}  {'sd':>8}")
    for point in summary["points"]:
        print("  ".join(f"{point[axis]:>8}" for axis in grid) + f"  {point['mean']:>14.3f}  {point['sd']:>8.3f}")
    print(
        f"updates applied {sum(summary['updates_applied']):,}, skipped {sum(summary['updates_skipped']):,} "
        f"({sum(summary['updates_nonfinite']):,} non-finite), all members"
    )
    if summary["env_steps_per_second"] is not None:
        print(
            f"\n{summary['seconds']:.1f} s, of which {run.compile_seconds:.1f} s compiling; then "
            f"{summary['env_steps_per_second']:,.0f} env steps/s (all members, training steps)"
        )
    print(f"results.csv, curves.npz, heatmap.png in {folder}")
    return 0


def _save_sweep(args, sweep, results: dict, folder: pathlib.Path, metric: str, heatmap_axes: list[str]) -> dict:
    """results.csv, curves.npz and heatmap.png in the run folder; returns the summary of the grid points."""
    from ftw_jax import runs
    from ftw_jax.plots import save_heatmap
    from ftw_jax.sweep import heatmap_cells, summarise_points, tidy_rows

    if not np.all(np.isfinite(results["return"])):
        _logger(args)("warning: some members' evaluation returns are not finite (see results.csv).")
    runs.write_csv(folder / "results.csv", tidy_rows(sweep, results))
    members = {f"member_{axis}": np.array([m[axis] for m in sweep.members]) for axis in sweep.members[0]}
    runs.write_arrays(folder / "curves.npz", {**results, **members})
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
        title=f"{args.env}: final {metric}, mean ± sd over {len(set(m['seed'] for m in sweep.members))} seeds",
    )
    return {
        "env": args.env,
        "metric": metric,
        "grid": sweep.grid,
        "seeds": seeds_of(args),
        "run_folder": str(folder),
        "points": [
            {**dict(zip(sweep.grid, point)), "mean": mean, "sd": sd}
            for point, mean, sd in summarise_points(sweep, final)
        ],
    }


# ---------------------------------------------------------------------------------------------------- compare


def _add_compare_parser(subparsers) -> None:
    from ftw_jax.algos import ALGORITHMS

    parser = subparsers.add_parser(
        "compare",
        help="FTW and the baselines (PPO, GRPO, REINFORCE) at a matched budget: curves with CIs, a table",
        description="Every algorithm runs the environment's defaults with the same overrides (same iterations x "
        "episodes, policy network, optimizer, evaluation) and the same tuning on the --tuning-seeds, keeping the "
        "best mean AUC: every learning rate of --learning-rates, or --search N configurations drawn from each "
        "algorithm's space (ftw_jax.tuning). Each algorithm takes the flags that are its settings. Writes table.md, "
        "results.csv, differences.csv, seeds.csv, tuning.csv and tuning.md, curves.npz and curves against episodes, "
        "env steps and gradient steps.",
    )
    _add_env(parser)
    parser.add_argument(
        "--algos", default=",".join(ALGORITHMS), help=f"comma-separated, from {','.join(ALGORITHMS)} (default: all)"
    )
    _add_seeds(parser, count=5)
    parser.add_argument(
        "--learning-rates",
        type=_float_list,
        default=None,
        help="the tuning grid (default: the environment's learning rate alone, no tuning)",
    )
    parser.add_argument(
        "--search",
        type=_positive_int,
        default=0,
        help="tune by random search: this many configurations per algorithm from its space "
        "(learning rate, beta and its horizon, its own knobs; default: off)",
    )
    parser.add_argument("--search-seed", type=_seed, default=0, help="the seed that draws the configurations")
    parser.add_argument(
        "--tuning-iterations",
        type=_positive_int,
        default=None,
        help="iterations of each tuning run (default: those of the reported runs)",
    )
    parser.add_argument(
        "--rungs",
        type=_positive_int,
        default=1,
        help="successive halving of --search: every configuration runs the first rung, the better half by mean AUC "
        "so far goes on to the next, the last reaching the tuning horizon; rung r of R ends at 1/2^(R-r) of it, "
        "schedules on the whole (default 1: every configuration runs it whole)",
    )
    parser.add_argument(
        "--tuning-seeds",
        type=_seed_list,
        default=None,
        help="seeds that choose the settings (default 1000,1001,1002 with --search; 1000,1001 "
        "when the grid has several learning rates)",
    )
    add_settings(
        parser,
        [item for item in _training_settings() if item.name not in ("algorithm", "learning_rate")],
        env_defaults=True,
    )
    parser.add_argument(
        "--metric",
        choices=["return", "success"],
        default=None,
        help="what the curves and table report (default: success where defined, else return)",
    )
    _add_run_folder_arguments(parser)
    parser.set_defaults(handler=_run_compare)


def _save_compare_plots(args, folder: pathlib.Path, comparison, num_seeds: int) -> None:
    """The curves with 95% bootstrap bands against training episodes (curves.png), and against the mean over
    seeds of env steps and of gradient steps applied (curves_env_steps.png, curves_updates.png)."""
    from ftw_jax.compare import bootstrap_interval
    from ftw_jax.plots import save_banded_curves

    title = f"{args.env}{_options_label(args.env_options)}: mean of {num_seeds} seeds, 95% bootstrap CI"
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


def _options_label(env_options: dict) -> str:
    return f" ({', '.join(f'{name}={value}' for name, value in env_options.items())})" if env_options else ""


def _run_compare(args) -> int:
    from ftw_jax import runs
    from ftw_jax.compare import (
        compare,
        diagnostics_table,
        difference_rows,
        markdown_table,
        seed_rows,
        summary_rows,
        tuning_table,
        updates_per_algorithm,
    )

    algorithms = [name.strip() for name in args.algos.split(",") if name.strip()]
    seeds = seeds_of(args)
    learning_rates = list(args.learning_rates) if args.learning_rates else None
    tuned = args.search or (learning_rates and len(learning_rates) > 1)
    tuning_seeds = args.tuning_seeds or ([1000, 1001, 1002] if args.search else [1000, 1001] if tuned else [])
    overrides = given_settings(args, _training_settings())
    search = {
        "search": args.search,
        "search_seed": args.search_seed,
        "tuning_iterations": args.tuning_iterations,
        **({"rungs": args.rungs} if args.rungs != 1 else {}),  # absent from the runs made before it existed
    }
    folder, checkpointer = _open_run(
        args,
        f"compare-{args.env}",
        {
            "algorithms": algorithms,
            "seeds": seeds,
            "learning_rates": learning_rates,
            "tuning_seeds": tuning_seeds,
            "overrides": overrides,
            "env_options": args.env_options,
            "metric": args.metric,
            **({"search": search} if args.search or args.tuning_iterations else {}),
        },
    )
    if checkpointer:  # each algorithm checkpoints in its own folder below this one
        checkpointer.close()
    log = _logger(args)
    log(f"comparing {', '.join(algorithms)} on {args.env} over seeds {seeds}; run folder {folder}")
    started = time.perf_counter()

    def progress(algorithm, phase, period, values, skipped):
        log(
            f"{algorithm:>10} {phase:>6}  period {period + 1:>3}  eval mean {values.mean():8.3f} "
            f"(min {values.min():.3f}, max {values.max():.3f})  skipped {skipped[0]:,}/{skipped[1]:,}"
            f"  {time.perf_counter() - started:7.1f} s"
        )

    comparison = compare(
        args.env,
        algorithms,
        seeds,
        learning_rates=learning_rates,
        tuning_seeds=tuning_seeds,
        **search,
        env_options=args.env_options,
        overrides=overrides,
        metric=args.metric,
        checkpoint_folder=None if args.no_checkpoint else folder / "checkpoints",
        on_period=progress,
        log=log,
    )
    runs.write_csv(folder / "results.csv", summary_rows(comparison))
    runs.write_csv(folder / "seeds.csv", seed_rows(comparison))
    differences = difference_rows(comparison)
    if differences:
        runs.write_csv(folder / "differences.csv", differences)
    tried = [
        {"algorithm": r.algorithm, **{k: v for k, v in row.items() if k != "auc_per_seed"}}
        for r in comparison.results
        for row in r.tuning
    ]
    if tried:
        runs.write_csv(folder / "tuning.csv", tried)
    table, diagnostics = markdown_table(comparison), diagnostics_table(comparison)
    if diagnostics:
        table += "\n" + diagnostics
    (folder / "table.md").write_text(table)
    tuning = tuning_table(comparison)
    if tuning:
        (folder / "tuning.md").write_text(tuning)
    runs.write_arrays(
        folder / "curves.npz",
        {
            "episodes": comparison.episodes,
            **{f"{r.algorithm}_{comparison.metric}": r.curves for r in comparison.results},
            **{f"{r.algorithm}_env_steps": r.env_steps for r in comparison.results},
            **{f"{r.algorithm}_updates": r.updates for r in comparison.results},
            **{
                f"{r.algorithm}_greedy_{comparison.metric}": r.greedy
                for r in comparison.results
                if r.greedy is not None
            },
            **{f"{r.algorithm}_{name}": values for r in comparison.results for name, values in r.diagnostics.items()},
        },
    )
    _save_compare_plots(args, folder, comparison, len(seeds))
    summary = {
        "env": args.env,
        "metric": comparison.metric,
        "seeds": seeds,
        "env_options": args.env_options,
        "overrides": overrides,
        "seconds": time.perf_counter() - started,
        "run_folder": str(folder),
        "algorithms": summary_rows(comparison),
        "differences": difference_rows(comparison),
        "tuning_seeds": tuning_seeds,
        **search,
        "chosen": {r.algorithm: r.settings for r in comparison.results},
        "tuning": {r.algorithm: r.tuning for r in comparison.results},
        "updates": updates_per_algorithm(comparison),
        "warning": applied_warning(
            np.concatenate([r.applied_share for r in comparison.results]),
            [f"{r.algorithm} seed {s}" for r in comparison.results for s in seeds],
        ),
    }
    if summary["warning"]:
        log(summary["warning"])
    runs.write_json(folder / "summary.json", summary)
    if args.json:
        print(json.dumps(summary))
        return 0
    print("\n" + table)
    skipped = ", ".join(
        f"{name} {sum(row['skipped']):,} ({sum(row['nonfinite']):,} non-finite; tuning {row['tuning_skipped']:,})"
        for name, row in summary["updates"].items()
    )
    print(f"updates skipped, all reported seeds: {skipped}")
    print(f"{summary['seconds']:.1f} s; table.md, results.csv, seeds.csv, curves.npz, curves*.png in {folder}")
    return 0


def _quiet_closed_event_loops(unraisable) -> None:
    """Drops the "Event loop is closed" errors Orbax's reader threads leave when a damaged checkpoint is skipped
    (the skip itself is reported on one line); anything else is printed as Python would."""
    if isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(unraisable.exc_value):
        return
    sys.__unraisablehook__(unraisable)


def resume_command(argv: list[str], folder: pathlib.Path) -> str:
    """The command line that continues the run in `folder`: `argv` without --out/--name/--resume, with
    --resume FOLDER."""
    kept, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in ("--out", "--name", "--resume"):
            skip = True
        elif not token.startswith(("--out=", "--name=", "--resume=")):
            kept.append(token)
    return " ".join(["ftw-jax", *kept, "--resume", str(folder)])


# --------------------------------------------------------------------------------------------------------- lm


def _add_lm_parser(subparsers) -> None:
    from ftw_jax.algos.ftw import FTWConfig
    from ftw_jax.lm.learner import LearnConfig
    from ftw_jax.settings import describe

    parser = subparsers.add_parser(
        "lm",
        help="the LLM-agent learner: FTW from a rollout engine's episodes, or the text search agent in-process",
        description="FTW for language-model agents (docs/lm.md). `learn` reads episodes an engine wrote and writes "
        "versioned weights for it to reload (--model PATH: the Hugging Face checkpoint it starts from; "
        "--mesh and jax.distributed for several devices and hosts); `train` runs the text search "
        "agent's whole loop here, on a tiny fresh LM or on a checkpoint (--model PATH).",
    )
    commands = parser.add_subparsers(dest="lm_command", required=True, metavar="{learn,train}")
    learn = commands.add_parser(
        "learn",
        help="FTW updates from episodes in a JSON Lines file; weights written as Hugging Face folders",
        description="Reads episodes (one JSON object per line: tokens, the spans the model wrote with their policy "
        "version and log-probs, the reward; schema in docs/lm.md), B at a time into the pool, each "
        "batch followed by U FTW updates, and writes RUN/weights/version-NNNNNN/ (model.safetensors, "
        "config.json, the tokenizer files) every --save-every iterations, RUN/weights/latest.json "
        "naming the newest.",
    )
    learn.add_argument(
        "--episodes",
        type=pathlib.Path,
        required=True,
        metavar="FILE.jsonl",
        help="the episodes, one JSON object per line",
    )
    learn.add_argument(
        "--model",
        type=pathlib.Path,
        required=True,
        metavar="PATH",
        help="a Hugging Face Llama/Qwen2 folder: the starting weights and the KL's reference",
    )
    learn.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="leave out lines that break the schema (each named) instead of refusing the file",
    )
    learn.add_argument(
        "--mesh",
        type=_mesh,
        default=None,
        metavar="DATAxMODEL",
        help="shard the weights over DATA x MODEL devices (of every process), e.g. 2x4: fully sharded "
        "data parallel over DATA, tensor parallel over MODEL (default: one device)",
    )
    add_settings(learn, [*describe(LearnConfig), *describe(FTWConfig)])
    _add_run_folder_arguments(learn)
    _add_cluster_arguments(learn)
    learn.set_defaults(handler=_run_lm_learn)
    train = commands.add_parser(
        "train",
        help="the text search agent in-process: a warm start on demonstrations, then FTW (or a baseline)",
        description="`ftw-jax train --env text-search`: a tiny Qwen2-shaped LM fitted to the demonstrator's "
        "episodes (--warm-start-demonstrations), then trained by --algorithm on its own rollouts.",
    )
    _add_seeds(train)
    train.add_argument(
        "--model",
        type=pathlib.Path,
        default=None,
        metavar="PATH",
        help="a Hugging Face Llama/Qwen2 folder with its tokenizer: the task is written in its tokens "
        "and chat template, and its weights are the starting policy (default: a tiny fresh LM "
        "over the task's own 58 words); needs --env-options step_limit=N for its longer episodes",
    )
    train.add_argument(
        "--env-options",
        type=_env_options,
        default={},
        help="options of the text search task, e.g. 'two_hop_fraction=1.0,guess_rate=0.8'",
    )
    add_settings(train, _training_settings(), env_defaults="text-search")
    _add_run_folder_arguments(train)
    train.add_argument("--no-plot", action="store_true", help="do not write the learning-curve PNG")
    train.set_defaults(handler=_run_lm_train, env="text-search")


def _run_lm_train(args) -> int:
    if args.model is not None:  # an environment option: the task and the policy both follow the checkpoint
        args.env_options = {**args.env_options, "model": str(args.model)}
    return _run_train(args)


def _mesh(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise argparse.ArgumentTypeError(f"expected DATAxMODEL with positive integers, e.g. 2x4, got {text!r}")
    return int(parts[0]), int(parts[1])


def _run_lm_learn(args) -> int:
    from ftw_jax.algos.ftw import FTWConfig
    from ftw_jax.lm.learner import LearnConfig, learn_from_file
    from ftw_jax.settings import describe

    own = given_settings(args, describe(LearnConfig))
    config = LearnConfig(**own, algorithm_config=FTWConfig(**given_settings(args, describe(FTWConfig))))
    fingerprint = {
        "episodes": str(args.episodes.resolve()),  # resolved: a resume may name them relative or absolute
        "model": str(args.model.resolve()),
        "skip_bad_lines": args.skip_bad_lines,
        "mesh": args.mesh,
        **dataclasses.asdict(config),
    }
    with _native_output_to_stderr() if args.json else contextlib.nullcontext():
        _start_processes(args)
        import jax

        main_process = jax.process_index() == 0  # the one that writes files and prints
        log = _logger(args) if main_process else (lambda message: None)
        folder, checkpointer = _open_run(args, "lm-learn", fingerprint, writer=main_process)
        try:
            summary = learn_from_file(
                config,
                args.episodes,
                args.model,
                folder,
                checkpointer,
                log,
                skip_bad=args.skip_bad_lines,
                mesh=args.mesh,
            )
        finally:
            if checkpointer:
                checkpointer.close()
    if not main_process:
        return 0
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['episodes']} episodes, {summary['iterations']} iterations, policy version "
            f"{summary['version']} ({summary['updates_skipped']:,} updates skipped, {summary['updates_nonfinite']:,} "
            f"non-finite): weights in {summary['weights']} ({summary['seconds']:.1f} s)"
        )
    return 0


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser, with the options every command takes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # SUPPRESS: a subcommand's parser (lm train) must not reset what its parent's (lm) was given.
        self.add_argument(
            "--no-compile-cache",
            action="store_true",
            default=argparse.SUPPRESS,
            help="compile everything afresh, reading and writing no compilation cache (default: "
            f"~/.cache/ftw_jax/jax; {compile_cache.ENVIRONMENT_VARIABLE}=DIR moves it, =off "
            "turns it off)",
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftw-jax", description="Follow the Winners (FTW) in JAX.")
    parser.add_argument("--version", action="version", version=f"ftw-jax {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    _add_bandit_parser(subparsers)
    _add_train_parser(subparsers)
    _add_sweep_parser(subparsers)
    _add_compare_parser(subparsers)
    _add_lm_parser(subparsers)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    compile_cache.configure(turned_off=getattr(args, "no_compile_cache", False))  # before the first compile
    from ftw_jax import runner
    from ftw_jax.skips import SkippedUpdates

    # Commands with a run folder stop between two periods when asked (SIGINT, SIGTERM), the last one checkpointed.
    catch = args.command != "bandit" and threading.current_thread() is threading.main_thread()
    previous = {
        signum: signal.signal(signum, runner.request_stop) for signum in (signal.SIGINT, signal.SIGTERM) if catch
    }
    previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _quiet_closed_event_loops
    try:
        with contextlib.ExitStack() as args.cleanup:  # releases the run folder's lock however the command ends
            return args.handler(args)
    except (ValueError, ImportError, OSError) as error:  # bad input, a missing optional dependency, a bad path
        print(f"error: {error}", file=sys.stderr)
        return 2
    except SkippedUpdates as stop:
        folder = getattr(args, "run_folder", None)
        where = (
            f" Checkpointed where it stopped; resume with: {resume_command(argv, folder)} (add --stop-after-skipped "
            "0 to go on past this)."
            if folder and not getattr(args, "no_checkpoint", True)
            else ""
        )
        print(f"stopped: {stop}{where}", file=sys.stderr)
        return STOPPED_SKIPPING
    except (KeyboardInterrupt, runner.Interrupted) as interrupt:
        folder = getattr(args, "run_folder", None)
        where = (
            f"; the run folder {folder} keeps what its last checkpoint holds. Resume with:\n  "
            f"{resume_command(argv, folder)}"
            if folder and not getattr(args, "no_checkpoint", True)
            else ""
        )
        print(f"\ninterrupted{where}", file=sys.stderr)
        return 128 + interrupt.signum if isinstance(interrupt, runner.Interrupted) else 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        runner.clear_stop()
        sys.unraisablehook = previous_unraisablehook


if __name__ == "__main__":
    sys.exit(main())

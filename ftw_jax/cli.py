"""The `ftw-jax` command."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import os
import pathlib
import sys
import time

import numpy as np

DEFAULT_SEEDS = (42, 43, 44)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one integer, got {text!r}")
    return values


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


def add_bandit_arguments(parser: argparse.ArgumentParser) -> None:
    """The bandit protocol's options (shared with experiments/bandit.py)."""
    from ftw_jax.bandit import BanditConfig

    defaults = BanditConfig()
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=_int_list, help="comma-separated seeds (default 42,43,44)")
    seeds.add_argument("--num-seeds", type=_positive_int, help="run seeds 42, 43, ..., 42 + N - 1")
    parser.add_argument("--arm-means", type=_float_list, default=defaults.arm_means, help="default 1.0,0.3")
    parser.add_argument("--noise-sd", type=float, default=defaults.noise_sd)
    parser.add_argument("--iterations", type=int, default=defaults.num_iterations, help="pulls (one per iteration)")
    parser.add_argument("--pool-capacity", "-N", type=int, default=defaults.pool_capacity)
    parser.add_argument("--batch-size", "-C", type=int, default=defaults.batch_size)
    parser.add_argument("--num-elites", "-K", type=int, default=defaults.num_elites)
    parser.add_argument("--num-batches", "-J", type=int, default=defaults.num_batches)
    parser.add_argument("--kl-coef", type=float, default=defaults.kl_coef)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)


def bandit_seeds(args) -> list[int]:
    if args.seeds:
        return args.seeds
    return [DEFAULT_SEEDS[0] + i for i in range(args.num_seeds)] if args.num_seeds else list(DEFAULT_SEEDS)


def bandit_config(args):
    from ftw_jax.bandit import BanditConfig

    return BanditConfig(
        arm_means=args.arm_means,
        noise_sd=args.noise_sd,
        num_iterations=args.iterations,
        pool_capacity=args.pool_capacity,
        batch_size=args.batch_size,
        num_elites=args.num_elites,
        num_batches=args.num_batches,
        kl_coef=args.kl_coef,
        learning_rate=args.learning_rate,
    )


def _add_bandit_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bandit",
        help="reproduce the two-armed bandit result (the main job)",
        description="FTW on a Gaussian bandit, all seeds in one vmapped jit. Defaults are the paper's protocol.",
    )
    add_bandit_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of a table")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/bandit"),
                        help="folder for the learning-curve PNG (default runs/bandit)")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    parser.set_defaults(handler=_run_bandit)


def _run_bandit(args) -> int:
    from ftw_jax.bandit import run_seeds

    seeds = bandit_seeds(args)
    config = bandit_config(args)
    print(f"running {len(seeds)} seed(s) x {config.num_iterations} iterations in one jit...", file=sys.stderr)
    started = time.perf_counter()
    curves = run_seeds(config, seeds)
    best = np.asarray(curves["best_arm_probability"], dtype=np.float64)  # [S, I + 1]
    reward = np.asarray(curves["expected_reward"], dtype=np.float64)
    seconds = time.perf_counter() - started
    if not np.all(np.isfinite(best)):
        print("error: non-finite policy probabilities; the run is not trustworthy.", file=sys.stderr)
        return 1
    final = best[:, -1]
    result = {
        "seeds": seeds,
        "best_arm": config.best_arm,
        "best_arm_probability_initial": best[:, 0].tolist(),
        "best_arm_probability_final": final.tolist(),
        "expected_reward_final": reward[:, -1].tolist(),
        "best_arm_probability_final_mean": float(final.mean()),
        "updates_applied": np.asarray(curves["metrics"]["applied"]).sum(axis=1).tolist(),
        "seconds": seconds,
        "config": dataclasses.asdict(config),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print_bandit_table(seeds, best, reward)
    print(f"\n{len(seeds)} seed(s) in {seconds:.1f} s (compile included)")
    if not args.no_plot:
        from ftw_jax.plots import save_learning_curves

        path = save_learning_curves(
            args.out / "learning_curve.png", best, [f"seed {seed}" for seed in seeds],
            title=f"FTW bandit: best arm probability (C={config.batch_size}, K={config.num_elites}, "
            f"J={config.num_batches}, beta={config.kl_coef})",
            ylabel="P(best arm)",
        )
        print(f"learning curve: {path}")
    return 0


def print_bandit_table(seeds, best, reward, max_rows: int = 20) -> None:
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
        print("\nfinal P(best) over seeds: sd {:.6f}; min {:.6f}, 5% {:.6f}, 25% {:.6f}, median {:.6f}, "
              "75% {:.6f}, max {:.6f}".format(final.std(), *quantiles))
        print(f"share of seeds within 1e-6 of the max: {at_max:.1%}")


_TRAIN_OPTIONS = {
    # flag: (TrainConfig field, type, help)
    "--iterations": ("num_iterations", int, "training iterations (a multiple of --eval-every)"),
    "--episodes-per-iteration": ("episodes_per_iteration", int, "B, episodes rolled out per iteration"),
    "--updates-per-iteration": ("updates_per_iteration", int, "U, FTW updates per iteration"),
    "--pool-capacity": ("pool_capacity", int, "N"),
    "--num-batches": ("num_batches", int, "J"),
    "--batch-size": ("batch_size", int, "C"),
    "--num-elites": ("num_elites", int, "K"),
    "--optimizer": ("optimizer", str, "adam or sgd"),
    "--learning-rate": ("learning_rate", float, None),
    "--kl-coef": ("kl_coef", float, "beta"),
    "--kl-coef-final": ("kl_coef_final", float, "beta decays linearly to this by the last iteration"),
    "--eval-every": ("eval_every", int, "iterations between evaluations"),
    "--eval-episodes": ("eval_episodes", int, "episodes per evaluation"),
    "--normalisation": ("normalisation", str, "token or trajectory"),
    "--reference": ("reference", str, "initial or previous"),
    "--elite-rule": ("elite_rule", str, "top_k (default), or beat_minimum: only elites above their minibatch's lowest"),
    "--max-staleness": ("max_staleness", int, "evict pool entries played more than V policy versions ago (default: FIFO only)"),
    "--importance-weight-cap": ("importance_weight_cap", float, "weight elites by min(w, c), w = pi(traj)/q(traj) (experiment)"),
    "--monitor-entries": ("monitor_entries", int, "pool entries for the per-update KL / TV monitor (default 16; 0: off)"),
    "--monitor-discount": ("monitor_discount", float, "gamma of the logged TRPO penalty term (default 0.99)"),
    "--staleness-histogram-bins": ("staleness_histogram_bins", int, "log the pool's staleness histogram (default 0: off)"),
    "--probe-tasks": ("probe_tasks", int, "task filtering: M candidate tasks probed each period (default 0: off)"),
    "--probes-per-task": ("probes_per_task", int, "task filtering: n probes per task; kept if 0 < successes < n"),
    "--algorithm": ("algorithm", str, "ftw (default), or a baseline on the same rollouts: reinforce, grpo, ppo"),
    "--group-size": ("group_size", int, "GRPO: G episodes per start state (B a multiple of G)"),
    "--normalise-advantages": ("normalise_advantages", _yes_no, "GRPO: yes (default) or no"),
    "--clip-epsilon": ("clip_epsilon", float, "GRPO's and PPO's ratio clip (default 0.2)"),
    "--discount": ("discount", float, "PPO: gamma (default 1)"),
    "--gae-lambda": ("gae_lambda", float, "PPO: GAE lambda (default 0.95)"),
}


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


def _add_train_parser(subparsers) -> None:
    from ftw_jax.train import ENV_DEFAULTS

    parser = subparsers.add_parser(
        "train",
        help="train FTW on an environment (all seeds in one vmapped, jitted program)",
        description="Every option defaults to a setting that trains on a 2-core CPU (ftw_jax.train.ENV_DEFAULTS).",
    )
    parser.add_argument("--env", required=True, choices=sorted(ENV_DEFAULTS))
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=_int_list, help="comma-separated seeds (default 0,1,2)")
    seeds.add_argument("--num-seeds", type=_positive_int, help="run seeds 0..N-1")
    for flag, (_, kind, help_text) in _TRAIN_OPTIONS.items():
        parser.add_argument(flag, type=kind, default=None, help=help_text)
    parser.add_argument("--env-options", type=_env_options, default={},
                        help="environment options, e.g. 'reward=binary,num_train_levels=1000' (sokoban)")
    _add_run_folder_arguments(parser)
    parser.add_argument("--no-plot", action="store_true", help="do not write the learning-curve PNG")
    parser.set_defaults(handler=_run_train)


def _train_seeds(args) -> list[int]:
    return args.seeds or list(range(args.num_seeds or 3))


def _config_overrides(args, flags) -> dict:
    """The TrainConfig fields of the given `_TRAIN_OPTIONS` flags that were passed on the command line."""
    values = {_TRAIN_OPTIONS[flag][0]: getattr(args, flag[2:].replace("-", "_")) for flag in flags}
    return {field: value for field, value in values.items() if value is not None}


def _make_trainer(config, env_options: dict):
    from ftw_jax.train import make_train

    try:
        return make_train(config, **env_options)
    except TypeError as error:  # an option the environment does not have
        raise ValueError(f"bad --env-options for {config.env}: {error}") from None


def _add_run_folder_arguments(parser: argparse.ArgumentParser) -> None:
    """Where results go, checkpoints and resuming (train and sweep alike)."""
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs"),
                        help="where the run folder is created (default runs/)")
    parser.add_argument("--name", default=None, help="run folder name (default: ENV-DATE-TIME)")
    parser.add_argument("--resume", type=pathlib.Path, default=None, metavar="RUN_FOLDER",
                        help="continue the run in RUN_FOLDER from its last checkpoint (same options as it started with)")
    parser.add_argument("--checkpoint-every", type=_positive_int, default=1, metavar="PERIODS",
                        help="checkpoint every PERIODS evaluation periods, and at the end (default 1)")
    parser.add_argument("--no-checkpoint", action="store_true", help="write no checkpoints")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress goes to stderr)")


def _open_run(args, name: str, fingerprint: dict, *, writer: bool = True):
    """(run folder, Checkpointer or None): a new folder with config.json, or the `--resume` folder after checking
    that it was started with the same configuration. Only the `writer` process writes files."""
    from ftw_jax import runs
    from ftw_jax.checkpoints import Checkpointer, check_same_config

    if args.resume:
        folder = args.resume
        if not (folder / "config.json").exists():
            raise ValueError(f"--resume {folder}: no run there (config.json is missing).")
        check_same_config(json.loads((folder / "config.json").read_text()), fingerprint, f"the run in {folder}")
    elif args.name:
        folder = args.out / args.name
        if writer and (folder / "config.json").exists():
            raise ValueError(f"the run folder {folder} already holds a run; pass --resume {folder} to continue it.")
    else:
        folder = runs.new_run_folder(args.out, name)
    if writer:
        folder.mkdir(parents=True, exist_ok=True)
        runs.write_json(folder / "config.json", fingerprint)
    checkpointer = None if args.no_checkpoint else Checkpointer(folder / "checkpoints", fingerprint,
                                                                every=args.checkpoint_every)
    return folder, checkpointer


def _logger(args):
    return lambda message: print(message, file=sys.stderr if args.json else sys.stdout, flush=True)


def _run_train(args) -> int:
    import jax

    from ftw_jax import runs
    from ftw_jax.checkpoints import rows_from_record, rows_record
    from ftw_jax.train import TrainConfig

    seeds = _train_seeds(args)
    config = TrainConfig.for_env(args.env, **_config_overrides(args, _TRAIN_OPTIONS))
    trainer = _make_trainer(config, args.env_options)
    folder, checkpointer = _open_run(
        args, args.env, {"seeds": seeds, "env_options": args.env_options, **dataclasses.asdict(config)}
    )
    log = _logger(args)
    log(f"training {args.env} for {config.num_iterations} iterations x {len(seeds)} seed(s); run folder {folder}")

    started = time.perf_counter()
    carry = jax.vmap(trainer.init)(jax.numpy.stack([jax.random.key(seed) for seed in seeds]))
    evaluations = []  # per period: {name: [S]}
    restored = checkpointer.restore(carry) if checkpointer else None  # a new folder has none
    if restored:
        periods_done, carry, record = restored
        evaluations = rows_from_record(record["evaluations"])
        log(f"resumed from the checkpoint after iteration {periods_done * config.eval_every}")
    last_iteration = len(evaluations) * config.eval_every
    for log_file in ("metrics.jsonl", "evaluation.jsonl"):  # rows written after that checkpoint come again
        runs.keep_rows_up_to(folder / log_file, last_iteration)
    # Compiled ahead of time, so that throughput is reported without the compile.
    run_period = jax.jit(jax.vmap(trainer.run, in_axes=(0, None)), static_argnums=1).lower(carry, 1).compile()
    compile_seconds = time.perf_counter() - started
    log(f"compiled in {compile_seconds:.1f} s")
    training_started = time.perf_counter()
    steps_before = int(np.asarray(carry.env_steps).sum())
    try:
        for period in range(len(evaluations), config.num_periods):  # one period per call: same result as one scan
            carry, (metrics, evaluation) = run_period(carry)
            metrics = jax.tree.map(lambda leaf: np.asarray(leaf)[:, 0], metrics)  # [S, eval_every]
            evaluation = jax.tree.map(lambda leaf: np.asarray(leaf)[:, 0], evaluation)  # [S]
            iterations = np.asarray(carry.iteration)[0]
            metrics["iteration"] = iterations - config.eval_every + 1 + np.arange(config.eval_every)[None].repeat(len(seeds), 0)
            runs.append_rows(folder / "metrics.jsonl", metrics, seeds)
            runs.append_rows(folder / "evaluation.jsonl", {k: v[:, None] for k, v in evaluation.items()}, seeds)
            evaluations.append(evaluation)
            if checkpointer:
                checkpointer.save(period + 1, carry, {"evaluations": rows_record(evaluations)},
                                  final=period + 1 == config.num_periods)
            seconds = time.perf_counter() - training_started
            steps = int(np.asarray(carry.env_steps).sum())
            success = f"  eval success {evaluation['success'].mean():6.1%}" if trainer.env.has_success else ""
            log(f"iteration {iterations:>5}/{config.num_iterations}  env steps {steps:>10,}  "
                f"train return {metrics['return_mean'][:, -1].mean():9.3f}  eval return {evaluation['return'].mean():9.3f}"
                f"{success}  {(steps - steps_before) / seconds:9,.0f} env steps/s")
            if not np.all(np.isfinite(evaluation["return"])):
                log("error: non-finite evaluation return; stopping (the run folder keeps what was done).")
                return 1
    finally:  # waits for the checkpoint writes in flight
        if checkpointer:
            checkpointer.close()
    training_seconds = time.perf_counter() - training_started
    seconds = time.perf_counter() - started
    final = evaluations[-1]
    summary = {
        "env": args.env,
        "seeds": seeds,
        "return": final["return"].tolist(),
        **({"success": final["success"].tolist()} if trainer.env.has_success else {}),
        "env_steps": np.asarray(carry.env_steps).tolist(),
        "iterations": config.num_iterations,
        "seconds": seconds,  # all of it: init, compile, training, evaluations
        "compile_seconds": compile_seconds,
        # compile excluded; after --resume, of this process's part of the run
        "env_steps_per_second": float((np.asarray(carry.env_steps).sum() - steps_before) / training_seconds),
        "run_folder": str(folder),
        "env_options": args.env_options,
        "config": dataclasses.asdict(config),
    }
    runs.write_json(folder / "summary.json", summary)
    if not args.no_plot:
        from ftw_jax.plots import save_learning_curves

        returns = np.stack([e["return"] for e in evaluations], axis=1)  # [S, periods]
        steps = np.stack([e["env_steps"] for e in evaluations], axis=1)
        save_learning_curves(folder / "learning_curve.png", returns, [f"seed {s}" for s in seeds],
                             title=f"{config.algorithm.upper()} on {args.env}: evaluation return", ylabel="mean episode return",
                             xlabel="env steps", x=steps)
    if args.json:
        print(json.dumps(summary))
        return 0
    successes = summary.get("success", [None] * len(seeds))
    print(f"\n{'seed':>6}  {'final eval return':>17}  {'success':>8}  {'env steps':>10}")
    for seed, value, success, steps in zip(seeds, summary["return"], successes, summary["env_steps"]):
        print(f"{seed:>6}  {value:>17.3f}  {'-' if success is None else f'{success:.1%}':>8}  {steps:>10,}")
    mean_success = f"{np.mean(summary['success']):.1%}" if "success" in summary else "-"
    print(f"{'mean':>6}  {np.mean(summary['return']):>17.3f}  {mean_success:>8}")
    print(f"\n{seconds:.1f} s ({compile_seconds:.1f} s compiling), {summary['env_steps_per_second']:,.0f} env steps/s "
          f"(all seeds, training steps, compile excluded); run folder {folder}")
    return 0


# The training options a sweep takes besides its grid.
_SWEEP_OPTIONS = ("--iterations", "--episodes-per-iteration", "--updates-per-iteration", "--pool-capacity",
                  "--eval-every", "--eval-episodes", "--elite-rule")


def _add_sweep_parser(subparsers) -> None:
    from ftw_jax.train import ENV_DEFAULTS

    parser = subparsers.add_parser(
        "sweep",
        help="run a grid of N, J, C, K, beta, learning rate x seeds as one compiled program",
        description="Every grid point and seed is one member of one vmapped, jitted program, sharded over the "
        "visible devices. Axes not in the grid keep the environment's defaults.",
    )
    parser.add_argument("--env", required=True, choices=sorted(ENV_DEFAULTS))
    parser.add_argument("--grid", required=True, help="e.g. 'C=4,5,8 K=1,2,3 kl=0.01,0.05' (axes: N J C K kl lr)")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=_int_list, help="comma-separated seeds (default 0,1,2)")
    seeds.add_argument("--num-seeds", type=_positive_int, help="run seeds 0..N-1")
    for flag in _SWEEP_OPTIONS:
        _, kind, help_text = _TRAIN_OPTIONS[flag]
        parser.add_argument(flag, type=kind, default=None, help=help_text)
    parser.add_argument("--env-options", type=_env_options, default={}, help="as for train")
    parser.add_argument("--metric", choices=["return", "success"], default=None,
                        help="final metric of the table and heatmap (default: success where defined, else return)")
    parser.add_argument("--heatmap", default=None, help="two grid axes, e.g. 'C,K' (default: the grid's first two)")
    _add_run_folder_arguments(parser)
    cluster = parser.add_argument_group(
        "several processes (one per host)", "all three, the same --name and a shared --out on every process; "
        "or --distributed alone where jax.distributed.initialize() detects the cluster (SLURM, Open MPI)")
    cluster.add_argument("--coordinator", default=None, metavar="HOST:PORT", help="address of process 0")
    cluster.add_argument("--num-processes", type=_positive_int, default=None)
    cluster.add_argument("--process-id", type=int, default=None)
    cluster.add_argument("--distributed", action="store_true", help="jax.distributed.initialize() with no arguments")
    parser.set_defaults(handler=_run_sweep)


def _start_processes(args) -> None:
    """Joins the other processes of a multi-process sweep (before anything else touches jax)."""
    import jax

    explicit = (args.coordinator, args.num_processes, args.process_id)
    if any(value is not None for value in explicit):
        if any(value is None for value in explicit):
            raise ValueError("--coordinator, --num-processes and --process-id go together; got "
                             f"{args.coordinator!r}, {args.num_processes!r}, {args.process_id!r}.")
        if not 0 <= args.process_id < args.num_processes:
            raise ValueError(f"--process-id must be in [0, {args.num_processes}), got {args.process_id}.")
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    elif args.distributed:
        jax.distributed.initialize()
    if jax.process_count() > 1 and not (args.name or args.resume):
        raise ValueError("a sweep over several processes needs --name (or --resume), so they share one run folder.")


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


def _run_sweep(args) -> int:
    import csv

    import jax

    from ftw_jax import runs
    from ftw_jax.sweep import AXES, heatmap_cells, make_sweep, parse_grid, run_sweep, summarise_points, tidy_rows

    grid = parse_grid(args.grid)
    seeds = _train_seeds(args)
    heatmap_axes = (args.heatmap.split(",") if args.heatmap else list(grid)[:2])
    if len(heatmap_axes) not in (1, 2) or any(axis not in grid for axis in heatmap_axes):
        raise ValueError(f"--heatmap must name one or two grid axes among {list(grid)}, got {args.heatmap!r}.")
    sweep = make_sweep(args.env, grid, seeds, args.env_options, **_config_overrides(args, _SWEEP_OPTIONS))
    with _native_output_to_stderr() if args.json else contextlib.nullcontext():
        _start_processes(args)
        trainer = _make_trainer(sweep.config, sweep.env_options)
        metric = args.metric or ("success" if trainer.env.has_success else "return")
        main_process = jax.process_index() == 0  # the one that writes files and prints
        folder, checkpointer = _open_run(args, f"sweep-{args.env}", {
            "grid": grid, "seeds": seeds, "env_options": sweep.env_options, "maxima": dataclasses.asdict(sweep.config)
        }, writer=main_process)
        log = _logger(args) if main_process else (lambda message: None)
        log(f"sweep {args.env}: {len(sweep.members)} members ({len(sweep.members) // len(seeds)} grid points x "
            f"{len(seeds)} seeds) in one program on {jax.device_count()} device(s) in {jax.process_count()} "
            f"process(es); run folder {folder}")
        started = time.perf_counter()
        clock = []  # (seconds since the start, env steps of all members) after each period run here

        def progress(period, row):
            clock.append((time.perf_counter() - started, int(row["env_steps"].sum())))
            log(f"iteration {(period + 1) * sweep.config.eval_every:>5}/{sweep.config.num_iterations}  "
                f"eval {metric} mean {row[metric].mean():9.3f} (min {row[metric].min():.3f}, max {row[metric].max():.3f})"
                f"  {clock[-1][0]:7.1f} s")

        try:
            results = run_sweep(sweep, progress, trainer, checkpointer)
        finally:  # waits for the checkpoint writes in flight
            if checkpointer:
                checkpointer.close()
    seconds = time.perf_counter() - started
    if not main_process:
        return 0
    if not np.all(np.isfinite(results["return"])):
        log("warning: some members' evaluation returns are not finite (see results.csv).")
    rows = tidy_rows(sweep, results)
    with (folder / "results.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    np.savez_compressed(folder / "curves.npz", **results,
                        **{f"member_{axis}": np.array([m[axis] for m in sweep.members]) for axis in [*AXES, "seed"]})

    final = results[metric][:, -1]
    table = summarise_points(sweep, final)
    x_axis, y_axis = heatmap_axes[0], (heatmap_axes[1] if len(heatmap_axes) == 2 else None)
    means, spreads = heatmap_cells(sweep, final, x_axis, y_axis)
    from ftw_jax.plots import save_heatmap

    save_heatmap(folder / "heatmap.png", means, spreads, x_values=grid[x_axis],
                 y_values=grid[y_axis] if y_axis else [""], x_label=x_axis, y_label=y_axis or "",
                 title=f"{args.env}: final {metric}, mean ± sd over {len(seeds)} seeds")
    # The first period run here includes compiling; the throughput is measured after it.
    throughput = ((clock[-1][1] - clock[0][1]) / (clock[-1][0] - clock[0][0])) if len(clock) > 1 else None
    summary = {"env": args.env, "metric": metric, "grid": grid, "seeds": seeds, "seconds": seconds,
               "first_period_seconds": clock[0][0] if clock else None, "env_steps_per_second": throughput,
               "devices": jax.device_count(), "processes": jax.process_count(), "run_folder": str(folder),
               "points": [{**dict(zip(grid, point)), "mean": mean, "sd": sd} for point, mean, sd in table]}
    runs.write_json(folder / "summary.json", summary)
    if args.json:
        print(json.dumps(summary))
        return 0
    print("\n" + "  ".join(f"{axis:>8}" for axis in grid) + f"  {'final ' + metric:>14}  {'sd':>8}")
    for point, mean, sd in table:
        print("  ".join(f"{value:>8}" for value in point) + f"  {mean:>14.3f}  {sd:>8.3f}")
    if throughput is not None:
        print(f"\n{seconds:.1f} s, of which {clock[0][0]:.1f} s to the first evaluation (compiling included); "
              f"then {throughput:,.0f} env steps/s (all members, training steps)")
    print(f"results.csv, curves.npz, heatmap.png in {folder}")
    return 0


# The training options a comparison takes: the budget (the same for every algorithm) and each one's own options.
_COMPARE_OPTIONS = ("--iterations", "--episodes-per-iteration", "--updates-per-iteration", "--eval-every",
                    "--eval-episodes", "--pool-capacity", "--num-batches", "--batch-size", "--num-elites",
                    "--elite-rule", "--kl-coef", "--group-size", "--normalise-advantages", "--clip-epsilon",
                    "--discount", "--gae-lambda")


def _add_compare_parser(subparsers) -> None:
    from ftw_jax.policy_gradient import ALGORITHMS
    from ftw_jax.train import ENV_DEFAULTS

    parser = subparsers.add_parser(
        "compare",
        help="FTW and the baselines (PPO, GRPO, REINFORCE) at a matched budget: curves with CIs, a table",
        description="Every algorithm runs the environment's defaults with the same overrides (same iterations x "
        "episodes, policy network, optimizer, evaluation) and the same tuning: every learning rate of "
        "--learning-rates on the --tuning-seeds, keeping the best mean AUC. Writes table.md, results.csv, "
        "seeds.csv, curves.npz and curves.png.",
    )
    parser.add_argument("--env", required=True, choices=sorted(ENV_DEFAULTS))
    parser.add_argument("--algos", default=",".join(ALGORITHMS),
                        help=f"comma-separated, from {','.join(ALGORITHMS)} (default: all)")
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=_int_list, help="comma-separated reported seeds (default 0..4)")
    seeds.add_argument("--num-seeds", type=_positive_int, help="report seeds 0..N-1 (default 5)")
    parser.add_argument("--learning-rates", type=_float_list, default=None,
                        help="the tuning grid (default: the environment's learning rate alone, no tuning)")
    parser.add_argument("--tuning-seeds", type=_int_list, default=None,
                        help="seeds that choose the learning rate (default 1000,1001 when the grid has several)")
    for flag in _COMPARE_OPTIONS:
        _, kind, help_text = _TRAIN_OPTIONS[flag]
        parser.add_argument(flag, type=kind, default=None, help=help_text)
    parser.add_argument("--env-options", type=_env_options, default={}, help="as for train")
    parser.add_argument("--metric", choices=["return", "success"], default=None,
                        help="what the curves and table report (default: success where defined, else return)")
    _add_run_folder_arguments(parser)
    parser.set_defaults(handler=_run_compare)


def _options_label(env_options: dict) -> str:
    return f" ({', '.join(f'{name}={value}' for name, value in env_options.items())})" if env_options else ""


def _run_compare(args) -> int:
    import csv

    from ftw_jax import runs
    from ftw_jax.compare import bootstrap_interval, compare, markdown_table, seed_rows, summary_rows

    algorithms = [name.strip() for name in args.algos.split(",") if name.strip()]
    seeds = args.seeds or list(range(args.num_seeds or 5))
    learning_rates = list(args.learning_rates) if args.learning_rates else None
    tuning_seeds = args.tuning_seeds or ([1000, 1001] if learning_rates and len(learning_rates) > 1 else [])
    overrides = _config_overrides(args, _COMPARE_OPTIONS)
    folder, checkpointer = _open_run(args, f"compare-{args.env}", {
        "algorithms": algorithms, "seeds": seeds, "learning_rates": learning_rates, "tuning_seeds": tuning_seeds,
        "overrides": overrides, "env_options": args.env_options, "metric": args.metric,
    })
    if checkpointer:  # each algorithm checkpoints in its own folder below this one
        checkpointer.close()
    log = _logger(args)
    log(f"comparing {', '.join(algorithms)} on {args.env} over seeds {seeds}; run folder {folder}")
    started = time.perf_counter()

    def progress(algorithm, phase, period, values):
        log(f"{algorithm:>10} {phase:>6}  period {period + 1:>3}  eval mean {values.mean():8.3f} "
            f"(min {values.min():.3f}, max {values.max():.3f})  {time.perf_counter() - started:7.1f} s")

    comparison = compare(args.env, algorithms, seeds, learning_rates=learning_rates, tuning_seeds=tuning_seeds,
                         env_options=args.env_options, overrides=overrides, metric=args.metric,
                         checkpoint_folder=None if args.no_checkpoint else folder / "checkpoints", on_period=progress)
    for name, rows in (("results.csv", summary_rows(comparison)), ("seeds.csv", seed_rows(comparison))):
        with (folder / name).open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    table = markdown_table(comparison)
    (folder / "table.md").write_text(table)
    np.savez_compressed(folder / "curves.npz", episodes=comparison.episodes,
                        **{f"{r.algorithm}_{comparison.metric}": r.curves for r in comparison.results},
                        **{f"{r.algorithm}_env_steps": r.env_steps for r in comparison.results})
    from ftw_jax.plots import save_banded_curves

    bands = {r.algorithm: (r.curves.mean(axis=0), *bootstrap_interval(r.curves)) for r in comparison.results}
    save_banded_curves(folder / "curves.png", comparison.episodes, bands,
                       title=f"{args.env}{_options_label(args.env_options)}: mean of {len(seeds)} seeds, 95% bootstrap CI",
                       xlabel="training episodes", ylabel=f"evaluation {comparison.metric}")
    summary = {"env": args.env, "metric": comparison.metric, "seeds": seeds, "env_options": args.env_options,
               "overrides": overrides, "seconds": time.perf_counter() - started, "run_folder": str(folder),
               "algorithms": summary_rows(comparison),
               "tuning": {r.algorithm: r.tuning for r in comparison.results}}
    runs.write_json(folder / "summary.json", summary)
    if args.json:
        print(json.dumps(summary))
        return 0
    print("\n" + table)
    print(f"{summary['seconds']:.1f} s; table.md, results.csv, seeds.csv, curves.npz, curves.png in {folder}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftw-jax", description="Follow the Winners (FTW) in JAX.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_bandit_parser(subparsers)
    _add_train_parser(subparsers)
    _add_sweep_parser(subparsers)
    _add_compare_parser(subparsers)
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (ValueError, ImportError) as error:  # bad input, or an optional dependency that is not installed
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

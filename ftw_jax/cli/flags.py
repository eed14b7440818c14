"""The flags every command shares: value types, settings turned into flags, seeds, the environment, the run folder.

Every setting is declared once, as a `ftw_jax.core.settings.setting` field of `TrainConfig`, of an algorithm's config
(`ftw_jax.algos`) or of the bandit (`GaussianBandit`); its flag, type, choices, help and default come from there.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import pathlib
import re
import sys
import typing
from collections.abc import Callable, Iterable

from ftw_jax.core.checks import MAX_SEED, check_seed

if typing.TYPE_CHECKING:  # imported where they are used, so that `ftw-jax --help` stays fast
    from ftw_jax.core.settings import Setting
    from ftw_jax.envs.base import Environment
    from ftw_jax.running.checkpoints import Checkpointer, CheckpointSettings

# Every subcommand's default seeds (the bandit protocol's); `--num-seeds N` runs 42, 43, ..., 42 + N - 1.
FIRST_SEED = 42


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    return values


MAX_NUM_SEEDS = 1_000_000


def seed_list(text: str) -> list[int]:
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


def one_seed(text: str) -> int:
    try:
        value = int(text)
        check_seed("the seed", value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {MAX_SEED}], got {text!r}") from None
    return value


def folder_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder name, got an empty one")
    return text


def _num_seeds(text: str) -> int:
    value = positive_int(text)
    if value > MAX_NUM_SEEDS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_NUM_SEEDS:,} seeds, got {text}")
    return value


def float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def rate_list(text: str) -> tuple[float, ...]:
    """Comma-separated positive finite numbers (learning rates): NaN, infinities and rates <= 0 refused here."""
    values = float_list(text)
    bad = [value for value in values if not (math.isfinite(value) and value > 0)]
    if bad:
        raise argparse.ArgumentTypeError(f"expected positive finite numbers, got {bad[0]!r} in {text!r}")
    return values


def _yes_no(text: str) -> bool:
    if text.lower() in ("yes", "true", "1"):
        return True
    if text.lower() in ("no", "false", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected yes or no, got {text!r}")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def env_options(text: str) -> dict:
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


# Annotation -> how its flag's text becomes a value.
_VALUE_TYPES = {
    int: int,
    float: float,
    bool: _yes_no,
    str: str,
    tuple[int, ...]: lambda text: tuple(_int_list(text)),
    tuple[float, ...]: float_list,
}


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def add_settings(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    settings: Iterable[Setting],
    *,
    env_defaults: bool | str = False,
    defaults_here: dict | None = None,
) -> None:
    """One flag per setting name (the first declaration's help; its default shown, with each environment's own
    (`ftw_jax.algos.defaults`) when `env_defaults` is True, or that environment's when it names one, or the
    command's own in `defaults_here`). Every flag defaults to None: not given."""
    from ftw_jax.algos import defaults

    seen = set()
    for item in settings:
        if item.name in seen:
            continue
        seen.add(item.name)
        kind = typing.get_origin(item.base_type) is typing.Literal and str or item.base_type
        default = f"default {_shown(item.default)}"
        if defaults_here and item.name in defaults_here:  # a command whose defaults are not the setting's own
            default = f"default {_shown(defaults_here[item.name])}"
        elif isinstance(env_defaults, str):
            default = f"default {defaults.shown(env_defaults, item.name) or _shown(item.default)}"
        elif env_defaults:
            shown = {env: defaults.shown(env, item.name) for env in defaults.DEFAULTS}
            default += "".join(f"; {env} {value}" for env, value in shown.items() if value is not None)
        metavar = None if item.choices else item.flag[2:].upper().replace("-", "_")
        bare = {"nargs": "?", "const": True, "metavar": "yes|no"} if kind is bool else {}  # `--follow` = `--follow yes`
        negation = f"--no-{item.flag[2:]}"
        parser.add_argument(
            *filter(None, (item.flag, item.short)),
            dest=item.name,
            type=_VALUE_TYPES[kind],
            choices=item.choices,
            default=None,
            **{"metavar": metavar, **bare},
            # names in `quotes` become flags when printed (`as_flags`)
            help=f"{item.help} ({default}{f'; {negation}: no' if kind is bool else ''})",
        )
        if kind is bool:  # `--no-follow` = `--follow no`
            parser.add_argument(negation, dest=item.name, action="store_const", const=False, help=argparse.SUPPRESS)


def given_settings(args: argparse.Namespace, settings: Iterable[Setting]) -> dict:
    """{name: value} of the settings whose flags were given."""
    return {item.name: getattr(args, item.name) for item in settings if getattr(args, item.name, None) is not None}


def training_settings() -> list[Setting]:
    """The settings of a training run: the run's own, then every algorithm's."""
    from ftw_jax import algos
    from ftw_jax.core.settings import describe
    from ftw_jax.lab.train import TrainConfig

    return [*describe(TrainConfig), *(item for entry in algos.ALGORITHMS.values() for item in describe(entry.config))]


def train_overrides(args: argparse.Namespace, log: Callable[[str], None], algorithm: str | None = None) -> dict:
    """The training settings whose flags were given; those that belong to other algorithms only are named and
    left out."""
    from ftw_jax.algos.defaults import DEFAULT_ALGORITHM
    from ftw_jax.lab.train import RUN_FIELDS

    overrides = given_settings(args, training_settings())
    return applicable_settings(overrides, algorithm or overrides.get("algorithm", DEFAULT_ALGORITHM), log, RUN_FIELDS)


def applicable_settings(
    overrides: dict, algorithm: str, log: Callable[[str], None], run_fields: Iterable[str] = ()
) -> dict:
    """The settings of `overrides` that apply to a run of `algorithm` (the run's `run_fields` and its config's);
    those that belong to other algorithms only are named and left out (`note_other_algorithms`)."""
    from ftw_jax import algos

    run, own, others = algos.split_settings(algorithm, overrides, frozenset(run_fields))
    note_other_algorithms(algorithm, log)(others)
    return {**run, **own}


def note_other_algorithms(algorithm: str, log: Callable[[str], None]) -> Callable[[dict], None]:
    """What a command says of the flags it was given that only other algorithms take: their names, ignored."""

    def note(others: dict) -> None:
        if others:
            flags = ", ".join("--" + name.replace("_", "-") for name in others)
            log(f"note: {flags} do(es) not apply to {algorithm}; ignored.")

    return note


def add_seeds(parser: argparse.ArgumentParser, count: int = 3) -> None:
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seeds", type=seed_list, help=f"comma-separated seeds (default {FIRST_SEED}..{FIRST_SEED + count - 1})"
    )
    seeds.add_argument(  # default None: argparse misses a clash with --seeds when the value given is the default's
        "--num-seeds",
        type=_num_seeds,
        default=None,
        help=f"run seeds {FIRST_SEED}, {FIRST_SEED + 1}, ..., {FIRST_SEED} + N - 1 (default {count})",
    )
    parser.set_defaults(default_num_seeds=count)


def seeds_of(args: argparse.Namespace) -> list[int]:
    """The seeds of `--seeds`, or `--num-seeds` of them from 42."""
    count = args.num_seeds if args.num_seeds is not None else args.default_num_seeds
    return args.seeds or [FIRST_SEED + i for i in range(count)]


def add_env(parser: argparse.ArgumentParser) -> None:
    from ftw_jax import envs

    parser.add_argument("--env", required=True, choices=sorted(envs.ENVIRONMENTS))
    parser.add_argument(
        "--env-options",
        type=env_options,
        default={},
        help="environment options, e.g. 'reward=binary,num_train_levels=1000' (sokoban)",
    )


def add_run_folder_arguments(parser: argparse.ArgumentParser) -> None:
    """Where results go, checkpoints and resuming (train, sweep and compare alike)."""
    parser.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path("runs"), help="where the run folder is created (default runs/)"
    )
    parser.add_argument(
        "--name", type=folder_name, default=None, help="run folder name (default: COMMAND-ENV-DATE-TIME)"
    )
    parser.add_argument(
        "--resume",
        type=pathlib.Path,
        default=None,
        metavar="RUN_FOLDER",
        help="continue the run in RUN_FOLDER from its last checkpoint (same options as it started with)",
    )
    add_checkpoint_arguments(parser)
    add_metric_writer_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress goes to stderr)")


def add_metric_writer_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the rows go beside the JSON lines: TensorBoard by default, W&B when asked."""
    parser.add_argument(
        "--no-tensorboard",
        action="store_true",
        help="write no TensorBoard event files (default: RUN/tensorboard/, one run per seed or member; "
        "`tensorboard --logdir RUN/tensorboard`)",
    )
    parser.add_argument(
        "--wandb",
        default=None,
        metavar="PROJECT",
        help="also log every row to Weights & Biases project PROJECT, one W&B run per seed or member (the `wandb` "
        "extra; WANDB_MODE=offline works without a network; default: off)",
    )


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `CheckpointSettings`, every command's the same: --checkpoint-every, --checkpoints-kept, and
    --no-checkpoint (a bare flag)."""
    from ftw_jax.core.settings import describe
    from ftw_jax.running.checkpoints import CheckpointSettings

    settings = describe(CheckpointSettings)
    add_settings(parser, [item for item in settings if item.base_type is not bool])
    for item in settings:
        if item.base_type is bool:  # off unless given
            parser.add_argument(
                item.flag, dest=item.name, action="store_const", const=True, default=None, help=item.help
            )


def checkpoint_settings(args: argparse.Namespace) -> CheckpointSettings:
    """The run's `CheckpointSettings` from the flags given."""
    from ftw_jax.core.settings import describe
    from ftw_jax.running.checkpoints import CheckpointSettings

    return CheckpointSettings(**given_settings(args, describe(CheckpointSettings)))


@dataclasses.dataclass
class Session:
    """What `main` gives a command and reads back however it ends: the exit stack that releases the run folder
    (its lock) and, once the command opens one, the run folder and whether its checkpoints can resume it; and the
    command line, which the run's records name (`provenance`)."""

    cleanup: contextlib.ExitStack
    run_folder: pathlib.Path | None = None
    resumable: bool = False
    command: tuple[str, ...] = ("ftw-jax",)

    def provenance(self) -> dict:
        """What the run's config.json, summary.json and phase records say about the code that ran them."""
        from ftw_jax.running.provenance import provenance

        return provenance(self.command)


def open_checkpointed_run(
    args: argparse.Namespace, session: Session, default_name: str, fingerprint: dict, *, writer: bool = True
) -> tuple[pathlib.Path, Checkpointer | None]:
    """The command's run folder (`open_run_folder`) and its checkpointer (None with --no-checkpoint)."""
    folder = open_run_folder(args, session, default_name, fingerprint, writer=writer)
    return folder, checkpoint_settings(args).checkpointer(folder / "checkpoints", fingerprint)


def open_run_folder(
    args: argparse.Namespace, session: Session, default_name: str, fingerprint: dict, *, writer: bool = True
) -> pathlib.Path:
    """The command's run folder (`ftw_jax.running.run_files.open_run`) from its flags, told to `session`."""
    from ftw_jax.running import run_files

    checkpoints = checkpoint_settings(args)
    folder = run_files.open_run(
        args.out,
        args.name,
        args.resume,
        default_name,
        fingerprint,
        writer=writer,
        checkpoints=checkpoints,
        cleanup=session.cleanup,
        provenance=session.provenance(),
    )
    session.run_folder, session.resumable = folder, not checkpoints.off  # for what an interrupt prints
    return folder


# Every command's flags by the name of what each sets (`dest`): a setting's, or a parameter's such as `resume`.
FLAGS: dict[str, str] = {}
_NAMED = re.compile(r"`([a-z][a-z0-9_]*)`")
_LEADING = re.compile(r"^([a-z][a-z0-9_]*)(?=( \([^)]*\))? must be )")


def as_flags(text: str) -> str:
    """`text` (an error, a note, a help) as the command line says it: each `name` quoted so that names a setting or
    parameter that a flag sets, and a leading "name must be", written as its flag (`max_grad_norm` -> --max-grad-norm);
    other quoted names lose their quotes."""
    text = _LEADING.sub(lambda match: FLAGS.get(match[1], match[1]), text)
    return _NAMED.sub(lambda match: FLAGS.get(match[1], match[1]), text)


def logger(args: argparse.Namespace) -> Callable[[str], None]:
    return lambda message: print(as_flags(message), file=sys.stderr if args.json else sys.stdout, flush=True)


def default_metric(args: argparse.Namespace, env: Environment) -> str:
    if args.metric == "success" and not env.has_success:
        raise ValueError(f"--metric success is not defined for {args.env} (it has no notion of success); use return.")
    return args.metric or ("success" if env.has_success else "return")

"""The `ftw-jax` command: parses, calls the package, prints.

One module per command (`bandit`, `train`, `sweep`, `compare`, `lm`), each with its parser and its `run`; the flags
they share in `flags` (training flags generated from the configs' settings) and `cluster` (several processes);
what they write and print in `outputs`. This module assembles the parser and runs the command: bad input, an
interrupt and a stopped run each end in one line and an exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import signal
import sys
import threading

from ftw_jax import __version__
from ftw_jax.cli import bandit, compare, lm, sweep, train
from ftw_jax.cli.bandit import add_bandit_arguments, bandit_protocol
from ftw_jax.cli.flags import FLAGS, Session, as_flags, seeds_of
from ftw_jax.cli.outputs import print_bandit_table
from ftw_jax.running import compile_cache, threefry

__all__ = [
    "STOPPED_SKIPPING",
    "add_bandit_arguments",
    "build_parser",
    "bandit_protocol",
    "main",
    "print_bandit_table",
    "seeds_of",
]

# The exit status of a run stopped on purpose: a member applied no update for too long (`--stop-after-skipped`), an
# engine's log-probs are not the policy's (`--sampler-gap-limit`); 2 is bad input, 1 a non-finite evaluation,
# 128 + N a signal.
STOPPED_SKIPPING = 3


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


def _noted(action: argparse.Action) -> argparse.Action:
    """`action`, its long flag noted by what it sets (`FLAGS`)."""
    long = [option for option in action.option_strings if option.startswith("--")]
    if long:
        FLAGS.setdefault(action.dest, long[0])
    return action


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser, with the options every command takes; it notes each flag by what it sets (`FLAGS`),
    so that what the package says of a setting reads as the flag that sets it (`as_flags`), help included."""

    def add_argument(self, *args, **kwargs):
        return _noted(super().add_argument(*args, **kwargs))

    def add_argument_group(self, *args, **kwargs):
        group = super().add_argument_group(*args, **kwargs)
        add = group.add_argument
        group.add_argument = lambda *args, **kwargs: _noted(add(*args, **kwargs))  # a group's flags are noted too
        return group

    def format_help(self) -> str:
        return as_flags(super().format_help())

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})  # `--seed 5` is no `--seeds 5`
        # SUPPRESS: a subcommand's parser (lm train) must not reset what its parent's (lm) was given.
        self.add_argument(
            "--no-compile-cache",
            action="store_true",
            default=argparse.SUPPRESS,
            help="compile everything afresh, reading and writing no compilation cache (default: "
            f"~/.cache/ftw_jax/jax; {compile_cache.ENVIRONMENT_VARIABLE}=DIR moves it, =off "
            "turns it off)",
        )


def build_parser() -> argparse.ArgumentParser:
    """The `ftw-jax` parser, every command's; building it notes each flag by what it sets (`FLAGS`)."""
    parser = argparse.ArgumentParser(
        prog="ftw-jax",
        allow_abbrev=False,
        description="Follow the Winners (FTW) in JAX. Every command lowers JAX's threefry hash unrolled on CPU, as JAX "
        f"does on GPU: the same random bits, compiled and run faster ({threefry.ENVIRONMENT_VARIABLE}=rolled: JAX's "
        "own loop).",
    )
    parser.add_argument("--version", action="version", version=f"ftw-jax {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    for command in (bandit, train, sweep, compare, lm):
        command.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    # The command line opts in to JAX's unrolled threefry on CPU (importing ftw_jax does not): the same random bits,
    # compiled and run faster; FTW_JAX_THREEFRY=rolled keeps JAX's own lowering.
    threefry.use_unrolled()
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    compile_cache.configure(turned_off=getattr(args, "no_compile_cache", False))  # before the first compile
    from ftw_jax.running import signals
    from ftw_jax.running.skips import StoppedRun

    # Commands with a run folder stop between two periods when asked (SIGINT, SIGTERM), the last one checkpointed.
    catch = args.command != "bandit" and threading.current_thread() is threading.main_thread()
    previous = {
        signum: signal.signal(signum, signals.request_stop) for signum in (signal.SIGINT, signal.SIGTERM) if catch
    }
    previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _quiet_closed_event_loops
    session = Session(contextlib.ExitStack())  # what the command opens, for the lines below
    try:
        with session.cleanup:  # releases the run folder's lock however the command ends
            return args.handler(args, session)
    except (ValueError, ImportError, OSError) as error:  # bad input, a missing optional dependency, a bad path
        print(f"error: {as_flags(str(error))}", file=sys.stderr)
        return 2
    except StoppedRun as stop:
        folder = session.run_folder if session.resumable else None
        where = (
            f" Checkpointed where it stopped; resume with: {resume_command(argv, folder)} (add "
            f"{as_flags(stop.go_on)} to go on past this)."
            if folder
            else ""
        )
        print(f"stopped: {as_flags(str(stop))}{where}", file=sys.stderr)
        return STOPPED_SKIPPING
    except (KeyboardInterrupt, signals.Interrupted) as interrupt:
        folder = session.run_folder if session.resumable else None
        where = (
            f"; the run folder {folder} keeps what its last checkpoint holds. Resume with:\n  "
            f"{resume_command(argv, folder)}"
            if folder
            else ""
        )
        print(f"\ninterrupted{where}", file=sys.stderr)
        return 128 + interrupt.signum if isinstance(interrupt, signals.Interrupted) else 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signals.clear_stop()
        sys.unraisablehook = previous_unraisablehook

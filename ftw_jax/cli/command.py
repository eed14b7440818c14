"""The command line's parser and what runs a command: bad input, an interrupt and a stopped run each end in one line
and an exit status (`ftw_jax.cli.main` takes the stop signals first, then imports this, and JAX with it)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import pathlib
import shlex
import sys

from ftw_jax import __version__
from ftw_jax.cli import bandit, compare, lm, sweep, train
from ftw_jax.cli.bandit import add_bandit_arguments, bandit_protocol
from ftw_jax.cli.flags import FLAGS, Session, as_flags, seeds_of
from ftw_jax.cli.outputs import print_bandit_table
from ftw_jax.running import checkpoints, compile_cache, run_files, signals, threefry
from ftw_jax.running.skips import StoppedRun

__all__ = [
    "STOPPED_SKIPPING",
    "add_bandit_arguments",
    "build_parser",
    "bandit_protocol",
    "print_bandit_table",
    "resume_command",
    "run",
    "seeds_of",
]

# The exit status of a run stopped on purpose: a member applied no update for too long (`--stop-after-skipped`), an
# engine's log-probs are not the policy's (`--sampler-gap-limit`); 2 is bad input, 1 a non-finite evaluation,
# 128 + N a signal.
STOPPED_SKIPPING = 3


# Where Orbax's background threads log a failed checkpoint write (absl's log; asyncio's for its tasks).
_ORBAX_LOGGERS = ("absl", "asyncio")


def _not_orbax_error(record: logging.LogRecord) -> bool:
    """A log filter that drops the errors, with their tracebacks, that Orbax's background threads log where a
    checkpoint write fails (a full disk, say): the main thread meets the same error at its next save or wait, and
    the command says it in one line (`Checkpointer._writing`)."""
    orbax = f"{os.sep}orbax{os.sep}"
    return not (record.levelno >= logging.ERROR and (orbax in record.pathname or orbax in record.getMessage()))


def _quiet_closed_event_loops(unraisable) -> None:
    """Drops the "Event loop is closed" errors Orbax's reader threads leave when a damaged checkpoint is skipped
    (the skip itself is reported on one line); anything else is printed as Python would."""
    if isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(unraisable.exc_value):
        return
    sys.__unraisablehook__(unraisable)


def resume_command(argv: list[str], folder: pathlib.Path) -> str:
    """The command line that continues the run in `folder`: `argv` without --out/--name/--resume, with
    --resume FOLDER, quoted for a shell (`--grid 'C=4,8 K=1,2'`)."""
    kept, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in ("--out", "--name", "--resume"):
            skip = True
        elif not token.startswith(("--out=", "--name=", "--resume=")):
            kept.append(token)
    return shlex.join(["ftw-jax", *kept, "--resume", str(folder)])


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
        # SUPPRESS: a subcommand's parser (lm learn) must not reset what its parent's (lm) was given.
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


def interrupted(argv: list[str], session: Session) -> str:
    """What a stopped run prints: that it was interrupted and, where its folder can resume it, how."""
    folder = session.run_folder if session.resumable else None
    where = (
        f"; the run folder {folder} keeps what its last checkpoint holds. Resume with:\n  "
        f"{resume_command(argv, folder)}"
        if folder
        else ""
    )
    return f"\ninterrupted{where}"


def _end_now(argv: list[str], session: Session, signum: int) -> None:
    """What the stop signals' watcher does before it ends the process, where the command reached no boundary
    within the grace: the checkpoint in flight lands whole, the run folder's lock goes, and the line is printed
    that the command would have printed (a half-written log line or table is what a kill leaves too: a resume
    drops or rewrites it)."""
    checkpoints.finish_writes()
    if session.run_folder is not None:
        run_files.release_lock(session.run_folder)
    print(interrupted(argv, session), file=sys.stderr, flush=True)


def run(argv: list[str], watcher: signals.Watcher | None = None) -> int:
    """Runs the command `argv` says; its exit status. `watcher` (`ftw_jax.running.signals.watching`) ends the
    process at once where a stop signal finds no boundary within the grace."""
    # The command line opts in to JAX's unrolled threefry on CPU (importing ftw_jax does not): the same random bits,
    # compiled and run faster; FTW_JAX_THREEFRY=rolled keeps JAX's own lowering.
    threefry.use_unrolled()
    argv = lm.current_spelling(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    compile_cache.configure(turned_off=getattr(args, "no_compile_cache", False))  # before the first compile
    # What the command opens, for the lines below, and its command line, for the run's records.
    session = Session(contextlib.ExitStack(), command=("ftw-jax", *argv))
    if watcher is not None:  # once a run folder is open, the run may reach a boundary, for a clean stop
        watcher.grace = lambda: signals.GRACE_SECONDS if session.run_folder is not None else 0.0
        watcher.finish = functools.partial(_end_now, argv, session)
    previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _quiet_closed_event_loops
    for name in _ORBAX_LOGGERS:  # kept to the end: an unretrieved task's error is logged when it is collected
        logging.getLogger(name).addFilter(_not_orbax_error)
    try:
        with session.cleanup:  # releases the run folder's lock however the command ends
            try:
                return args.handler(args, session)
            finally:
                if watcher is not None:
                    signals.end_here()  # a stop signal from here on finds the command ending already
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
        print(interrupted(argv, session), file=sys.stderr)
        return 128 + interrupt.signum if isinstance(interrupt, signals.Interrupted) else 130
    finally:
        sys.unraisablehook = previous_unraisablehook

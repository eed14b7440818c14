"""The `ftw-jax` command: parses, calls the package, prints.

One module per command (`bandit`, `train`, `sweep`, `compare`, `lm`), each with its parser and its `run`; the flags
they share in `flags` (training flags generated from the configs' settings) and `cluster` (several processes);
what they write and print in `outputs`; the parser and what runs a command in `command`. This module is the door:
`main` takes the stop signals (SIGINT, SIGTERM) before anything heavy is imported, so that a stop while JAX
loads ends in one line too, then runs the command: bad input, an interrupt and a stopped run each end in one line
and an exit status.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers; at run time imported by `main`, or on first use (`__getattr__`)
    from ftw_jax.cli.command import (
        STOPPED_SKIPPING,
        add_bandit_arguments,
        bandit_protocol,
        build_parser,
        print_bandit_table,
        resume_command,
        seeds_of,
    )

__all__ = [
    "STOPPED_SKIPPING",
    "add_bandit_arguments",
    "build_parser",
    "bandit_protocol",
    "main",
    "print_bandit_table",
    "resume_command",
    "seeds_of",
]


def main(argv: list[str] | None = None) -> int:
    """Runs `ftw-jax ARGV` (default: the process's arguments, and then the stop signals stay taken until it exits);
    its exit status. A stop signal ends it within seconds wherever it is, with one line
    (`ftw_jax.running.signals`)."""
    from ftw_jax.running import signals  # imports nothing heavy: the signals are taken before JAX loads

    entry = argv is None  # the process's own command (`ftw-jax`, `python -m ftw_jax.cli`), not a caller's
    argv = sys.argv[1:] if argv is None else argv
    with signals.watching(to_the_end=entry) as watcher:
        from ftw_jax.cli import command

        return command.run(argv, watcher)


def __getattr__(name: str):
    """The command module's public names, imported on first use (`import ftw_jax.cli` costs no JAX import)."""
    if name not in __all__:
        raise AttributeError(f"module 'ftw_jax.cli' has no attribute {name!r}")
    return getattr(importlib.import_module("ftw_jax.cli.command"), name)

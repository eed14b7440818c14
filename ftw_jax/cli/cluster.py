"""Runs over several processes (one per host): their flags, joining them, and keeping stdout for the JSON."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator

from ftw_jax.cli.flags import positive_int


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group(
        "several processes (one per host)",
        "all three, the same --name and a shared --out on every process; "
        "or --distributed alone where jax.distributed.initialize() detects the cluster (SLURM, Open MPI)",
    )
    cluster.add_argument("--coordinator", default=None, metavar="HOST:PORT", help="address of process 0")
    cluster.add_argument("--num-processes", type=positive_int, default=None)
    cluster.add_argument("--process-id", type=int, default=None)
    cluster.add_argument("--distributed", action="store_true", help="jax.distributed.initialize() with no arguments")


@contextlib.contextmanager
def native_output_to_stderr() -> Iterator[None]:
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


def start_processes(args: argparse.Namespace) -> None:
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

"""One comparison's reported seeds run as groups (each a comparison of its own), merged into the whole comparison.

    python experiments/protocol/seed_groups.py start runs/1hop-seeds-5-9 --like runs/1hop-seeds-0-4 --seeds 5,...,9
    python experiments/protocol/seed_groups.py merge runs/search-1hop runs/1hop-seeds-0-4 runs/1hop-seeds-5-9 ...
    ftw-jax compare ... --seeds 0,...,29 --resume runs/search-1hop      # reads every phase record, trains nothing

Why groups, what `start` and `merge` write, and why a seed's numbers do not depend on its group: the docstring
of `ftw_jax.lab.reports.seed_groups`, which does the moving; this is its command line.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from ftw_jax.lab.reports.seed_groups import merge, start  # no JAX imported


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A comparison's reported seeds run as groups, then merged.")
    commands = parser.add_subparsers(dest="command", required=True)
    started = commands.add_parser("start", help="a group's run folder, from the first group's")
    started.add_argument("group", type=pathlib.Path)
    started.add_argument("--like", type=pathlib.Path, required=True, help="the first group's run folder (finished)")
    started.add_argument("--seeds", required=True, help="the group's seeds, comma-separated")
    merged = commands.add_parser("merge", help="the whole comparison's run folder, from its finished groups")
    merged.add_argument("whole", type=pathlib.Path)
    merged.add_argument("groups", type=pathlib.Path, nargs="+", help="the groups' run folders, in seed order")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            try:
                seeds = [int(seed) for seed in args.seeds.split(",")]
            except ValueError:
                raise SystemExit(f"error: --seeds {args.seeds!r}: expected integers separated by commas") from None
            count = start(args.group, args.like, seeds, made_by="experiments/protocol/seed_groups.py start")
            print(f"{args.group}: seeds {seeds}, {count} tuning records from {args.like}")
        else:
            command = ["python", "experiments/protocol/seed_groups.py", *(argv or sys.argv[1:])]
            seeds, count = merge(args.whole, args.groups, command)
            print(
                f"{args.whole}: seeds {seeds} from {len(args.groups)} groups, {count} tuning records; "
                "resume it to write its tables"
            )
    except ValueError as error:  # the library names a setting (`seeds`); this names its flag
        raise SystemExit(f"error: {str(error).replace('`seeds`', '--seeds')}") from None


if __name__ == "__main__":
    main()

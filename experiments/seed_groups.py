"""One comparison's reported seeds run as groups (each a comparison of its own), merged into the whole comparison.

    python experiments/seed_groups.py start runs/search-1hop-seeds-5-9 --like runs/search-1hop-seeds-0-4 --seeds 5,...,9
    python experiments/seed_groups.py merge runs/search-1hop runs/search-1hop-seeds-0-4 runs/search-1hop-seeds-5-9 ...
    ftw-jax compare ... --seeds 0,...,29 --resume runs/search-1hop      # reads every phase record, trains nothing

Why: a phase that outlasts the machine it runs on never finishes, since a phase resumes from checkpoints
(megabytes per seed) that stay on that machine, where its finished record (kilobytes) is committed. One-hop
search's report phase, 30 seeds in one phase, would take longer than a session. Run as groups of a few seeds, each
group's report is a phase of its own; the first group also runs the tuning, which the others take from its records
(a tuning phase's fingerprint names its tuning seeds and settings, never the reported seeds).

`start` makes a group's run folder: the first group's config.json with the group's seeds, and the first group's
finished tuning records. `merge` makes the whole comparison's run folder from finished groups: config.json with
every group's seeds in order, the tuning records, and each algorithm's report record with the groups' members,
per-period rows and applied shares laid end to end and their seconds summed. A resume of that folder with the
same flags and all the seeds then writes the comparison's tables, curves and plots.

On one CPU device the compiled program runs its members one after another (`ftw_jax.running.loop.member_loop`),
so a seed's numbers do not depend on the group it ran in; on an accelerator (members batched) they may differ in
the last bits. Nothing here imports JAX: it moves JSON.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from ftw_jax.running.run_files import read_json, write_atomically, write_json  # no JAX imported

REPORT = "-report.json"


def read(path: pathlib.Path, keys: tuple[str, ...]) -> dict:
    """A JSON object with `keys`: SystemExit (one line) where it is missing, torn or something else."""
    try:
        value = read_json(path)
    except FileNotFoundError:
        raise SystemExit(f"error: {path} is missing") from None
    except ValueError as error:  # it names the file and where
        raise SystemExit(f"error: {error}") from None
    missing = [key for key in keys if not isinstance(value, dict) or key not in value]
    if missing:
        raise SystemExit(f"error: {path} has no {', '.join(missing)}: not what a comparison writes there")
    return value


CONFIG = ("algorithms", "seeds")  # what a comparison's config.json holds, at least
RECORD = ("fingerprint", "seconds", "updates_applied_share", "history")  # and a finished phase's record


def comparison(config: dict) -> dict:
    """What a comparison is, less its reported seeds and the record of who opened it."""
    return {key: value for key, value in config.items() if key not in ("seeds", "provenance")}


def finished_config(folder: pathlib.Path) -> dict:
    """A finished group's config.json: SystemExit (one line) where the group has not finished."""
    if not (folder / "summary.json").is_file():
        raise SystemExit(f"error: {folder} has not finished (no summary.json there); run it to its end first")
    return read(folder / "config.json", CONFIG)


def copy_tuning_records(source: pathlib.Path, target: pathlib.Path) -> int:
    """The finished tuning phases' records of `source` into `target` (each whole or not at all, one already there
    with other bytes replaced); how many."""
    (target / "checkpoints").mkdir(parents=True, exist_ok=True)
    records = [path for path in sorted((source / "checkpoints").glob("*.json")) if not path.name.endswith(REPORT)]
    for path in records:
        copy = target / "checkpoints" / path.name
        if not copy.exists() or copy.read_bytes() != path.read_bytes():
            write_atomically(copy, path.read_bytes())
    return len(records)


def start(group: pathlib.Path, like: pathlib.Path, seeds: list[int]) -> None:
    """`group`'s run folder: `like`'s comparison with `seeds`, and `like`'s tuning records."""
    config = finished_config(like)
    if (group / "config.json").exists():
        raise SystemExit(f"error: {group} already holds a run; resume it")
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise SystemExit(f"error: --seeds repeats {repeated}; give each seed once")
    overlap = sorted(set(seeds) & set(config["seeds"]))
    if overlap:
        raise SystemExit(f"error: seeds {overlap} are reported by {like} already; give each group seeds of its own")
    group.mkdir(parents=True, exist_ok=True)
    count = copy_tuning_records(like, group)
    made = {"seed_group": {"like": str(like), "made_by": "experiments/seed_groups.py start"}}
    write_json(group / "config.json", {**comparison(config), "seeds": seeds, "provenance": [made]})
    print(f"{group}: seeds {seeds}, {count} tuning records from {like}")


def merged_report(records: list[tuple[pathlib.Path, dict]], command: list[str]) -> dict:
    """One report record from the groups' (their folders and records, in seed order)."""
    first_folder, first = records[0]
    for folder, record in records[1:]:
        for key in ("algorithm", "phase", "config"):
            mine, theirs = record["fingerprint"].get(key), first["fingerprint"].get(key)
            if mine != theirs:
                if isinstance(mine, dict) and isinstance(theirs, dict):
                    mine, theirs = differences(theirs, mine)
                raise SystemExit(
                    f"error: {folder}'s report differs from {first_folder}'s in its {key}: {mine} against {theirs}"
                )
        commits = [(entry.get("provenance") or {}).get("commit") for entry in (record, first)]
        if commits[0] != commits[1]:
            raise SystemExit(
                f"error: {folder}'s report ran at {commits[0]}, {first_folder}'s at {commits[1]}; run both at one"
            )
        periods = [len(entry["history"]["rows"]) for entry in (record, first)]
        if periods[0] != periods[1]:
            raise SystemExit(f"error: {folder}'s report has {periods[0]} evaluations, {first_folder}'s {periods[1]}")
    rows = [
        {name: [value for _, record in records for value in record["history"]["rows"][period][name]] for name in row}
        for period, row in enumerate(first["history"]["rows"])
    ]
    provenance = first.get("provenance") or {}
    return {
        "fingerprint": {
            **first["fingerprint"],
            "members": [member for _, record in records for member in record["fingerprint"]["members"]],
        },
        "seconds": sum(record["seconds"] for _, record in records),
        "updates_applied_share": [share for _, record in records for share in record["updates_applied_share"]],
        "history": {"rows": rows, "dtypes": first["history"]["dtypes"]},
        "provenance": {
            "commit": provenance.get("commit"),
            "dirty": provenance.get("dirty"),
            "versions": provenance.get("versions"),
            "command": command,
            "merged_from": [
                {"group": str(folder), "seconds": record["seconds"], "provenance": record.get("provenance")}
                for folder, record in records
            ],
        },
    }


def differences(first: dict, other: dict) -> tuple[dict, dict]:
    """The entries where two dicts differ: (other's, first's)."""
    keys = sorted(key for key in first.keys() | other.keys() if first.get(key) != other.get(key))
    return {key: other.get(key) for key in keys}, {key: first.get(key) for key in keys}


def merge(whole: pathlib.Path, groups: list[pathlib.Path], command: list[str]) -> None:
    """`whole`'s run folder from finished `groups`: their seeds in order, the first's tuning records, and each
    algorithm's report records laid end to end."""
    configs = [finished_config(group) for group in groups]
    first = comparison(configs[0])
    for group, config in zip(groups[1:], map(comparison, configs[1:])):
        if config != first:
            theirs, mine = differences(first, config)
            raise SystemExit(f"error: {group} is another comparison than {groups[0]}: {theirs} against {mine}")
    seeds = [seed for config in configs for seed in config["seeds"]]
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise SystemExit(f"error: the groups report seeds {repeated} more than once; give each group seeds of its own")
    config = {**first, "seeds": seeds}
    if (whole / "config.json").exists():
        stored = read(whole / "config.json", CONFIG)
        stored = {**comparison(stored), "seeds": stored["seeds"]}
        if stored != config:
            theirs, mine = differences(config, stored)
            raise SystemExit(
                f"error: {whole} holds another comparison ({theirs} against the groups' {mine}); merge elsewhere"
            )
    reports = {  # every check before anything is written
        algorithm: merged_report(
            [(group, read(group / "checkpoints" / f"{algorithm}{REPORT}", RECORD)) for group in groups], command
        )
        for algorithm in configs[0]["algorithms"]
    }
    whole.mkdir(parents=True, exist_ok=True)
    count = copy_tuning_records(groups[0], whole)
    for algorithm, report in reports.items():
        write_json(whole / "checkpoints" / f"{algorithm}{REPORT}", report)
    if not (whole / "config.json").exists():  # last: a folder with config.json is one a resume may take
        made = {"seed_groups": [str(group) for group in groups], "command": command}
        write_json(whole / "config.json", {**config, "provenance": [made]})
    print(f"{whole}: seeds {seeds} from {len(groups)} groups, {count} tuning records; resume it to write its tables")


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
    if args.command == "start":
        try:
            seeds = [int(seed) for seed in args.seeds.split(",")]
        except ValueError:
            raise SystemExit(f"error: --seeds {args.seeds!r}: expected integers separated by commas") from None
        start(args.group, args.like, seeds)
    else:
        merge(args.whole, args.groups, ["python", "experiments/seed_groups.py", *(argv or sys.argv[1:])])


if __name__ == "__main__":
    main()

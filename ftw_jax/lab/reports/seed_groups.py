"""One comparison's reported seeds run as groups (each a comparison of its own), merged into the whole comparison.

Why: a phase that outlasts the machine it runs on never finishes, since a phase resumes from checkpoints
(megabytes per seed) that stay on that machine, where its finished record (kilobytes) is committed. One-hop
search's report phase, 30 seeds in one phase, would take longer than a session. Run as groups of a few seeds, each
group's report is a phase of its own; the first group also runs the tuning, which the others take from its records
(a tuning phase's fingerprint names its tuning seeds and settings, never the reported seeds).

`start` makes a group's run folder: the first group's config.json with the group's seeds, and the first group's
finished tuning records. `merge` makes the whole comparison's run folder from finished groups: config.json with
every group's seeds in order, the tuning records, and each algorithm's report record with the groups' members,
per-period rows and applied shares laid end to end and their seconds summed. A resume of that folder with the
same settings and all the seeds then writes the comparison's tables, curves and plots.

On one CPU device the compiled program runs its members one after another (`ftw_jax.running.loop.member_loop`),
so a seed's numbers do not depend on the group it ran in; on an accelerator (members batched) they may differ in
the last bits. Nothing here imports JAX: it moves JSON. Every refusal is a ValueError of one line, raised before
anything is written.
"""

from __future__ import annotations

import pathlib
from typing import Any

from ftw_jax.running.run_files import read_json, write_atomically, write_json  # no JAX imported

REPORT = "-report.json"
CONFIG = ("algorithms", "seeds")  # what a comparison's config.json holds, at least
RECORD = ("fingerprint", "seconds", "updates_applied_share", "history")  # and a finished phase's record


def read(path: pathlib.Path, keys: tuple[str, ...]) -> dict:
    """A JSON object with `keys`: a ValueError (one line) where it is missing, torn or something else."""
    try:
        value = read_json(path)
    except FileNotFoundError:
        raise ValueError(f"{path} is missing") from None
    missing = [key for key in keys if not isinstance(value, dict) or key not in value]
    if missing:
        raise ValueError(f"{path} has no {', '.join(missing)}: not what a comparison writes there")
    return value


def comparison(config: dict) -> dict:
    """What a comparison is, less its reported seeds and the record of who opened it."""
    return {key: value for key, value in config.items() if key not in ("seeds", "provenance")}


def finished_config(folder: pathlib.Path) -> dict:
    """A finished group's config.json: a ValueError (one line) where the group has not finished."""
    if not (folder / "summary.json").is_file():
        raise ValueError(f"{folder} has not finished (no summary.json there); run it to its end first")
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


def start(group: pathlib.Path, like: pathlib.Path, seeds: list[int], made_by: str) -> int:
    """`group`'s run folder: `like`'s comparison with `seeds`, and `like`'s tuning records (how many); `made_by`
    (the command that made it) goes into its config.json's provenance."""
    config = finished_config(like)
    if (group / "config.json").exists():
        raise ValueError(f"{group} already holds a run; resume it")
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise ValueError(f"`seeds` repeats {repeated}; give each seed once")
    overlap = sorted(set(seeds) & set(config["seeds"]))
    if overlap:
        raise ValueError(f"seeds {overlap} are reported by {like} already; give each group seeds of its own")
    group.mkdir(parents=True, exist_ok=True)
    count = copy_tuning_records(like, group)
    made = {"seed_group": {"like": str(like), "made_by": made_by}}
    write_json(group / "config.json", {**comparison(config), "seeds": seeds, "provenance": [made]})
    return count


def check_alike(records: list[tuple[pathlib.Path, dict]]) -> None:
    """A ValueError (one line) unless the groups' report records are one phase: the same algorithm, phase and
    configuration, written at one commit, with as many evaluations."""
    first_folder, first = records[0]
    for folder, record in records[1:]:
        for key in ("algorithm", "phase", "config"):
            mine, theirs = record["fingerprint"].get(key), first["fingerprint"].get(key)
            if mine != theirs:
                if isinstance(mine, dict) and isinstance(theirs, dict):
                    mine, theirs = differences(theirs, mine)
                raise ValueError(
                    f"{folder}'s report differs from {first_folder}'s in its {key}: {mine} against {theirs}"
                )
        commits = [(entry.get("provenance") or {}).get("commit") for entry in (record, first)]
        if commits[0] != commits[1]:
            raise ValueError(
                f"{folder}'s report ran at {commits[0]}, {first_folder}'s at {commits[1]}; run both at one"
            )
        periods = [len(entry["history"]["rows"]) for entry in (record, first)]
        if periods[0] != periods[1]:
            raise ValueError(f"{folder}'s report has {periods[0]} evaluations, {first_folder}'s {periods[1]}")


def merged_report(records: list[tuple[pathlib.Path, dict]], command: list[str]) -> dict:
    """One report record from the groups' (their folders and records, in seed order); `command` (the merge's)
    goes into its provenance."""
    check_alike(records)
    first = records[0][1]
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


def merged_config(whole: pathlib.Path, groups: list[pathlib.Path]) -> dict[str, Any]:
    """The whole comparison's config (the groups' seeds in order, no provenance); a ValueError (one line) where
    the groups are not one comparison, report a seed twice, or `whole` holds another comparison."""
    configs = [finished_config(group) for group in groups]
    first = comparison(configs[0])
    for group, config in zip(groups[1:], map(comparison, configs[1:])):
        if config != first:
            theirs, mine = differences(first, config)
            raise ValueError(f"{group} is another comparison than {groups[0]}: {theirs} against {mine}")
    seeds = [seed for config in configs for seed in config["seeds"]]
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise ValueError(f"the groups report seeds {repeated} more than once; give each group seeds of its own")
    config = {**first, "seeds": seeds}
    if (whole / "config.json").exists():
        stored = read(whole / "config.json", CONFIG)
        stored = {**comparison(stored), "seeds": stored["seeds"]}
        if stored != config:
            theirs, mine = differences(config, stored)
            raise ValueError(f"{whole} holds another comparison ({theirs} against the groups' {mine}); merge elsewhere")
    return config


def merge(whole: pathlib.Path, groups: list[pathlib.Path], command: list[str]) -> tuple[list[int], int]:
    """`whole`'s run folder from finished `groups`: their seeds in order, the first's tuning records, and each
    algorithm's report records laid end to end; (the seeds, how many tuning records). `command` (the merge's)
    goes into the provenance of config.json and of each report record."""
    config = merged_config(whole, groups)
    reports = {  # every check before anything is written
        algorithm: merged_report(
            [(group, read(group / "checkpoints" / f"{algorithm}{REPORT}", RECORD)) for group in groups], command
        )
        for algorithm in config["algorithms"]
    }
    whole.mkdir(parents=True, exist_ok=True)
    count = copy_tuning_records(groups[0], whole)
    for algorithm, report in reports.items():
        write_json(whole / "checkpoints" / f"{algorithm}{REPORT}", report)
    if not (whole / "config.json").exists():  # last: a folder with config.json is one a resume may take
        made = {"seed_groups": [str(group) for group in groups], "command": command}
        write_json(whole / "config.json", {**config, "provenance": [made]})
    return config["seeds"], count

"""Threefry lowered unrolled (ftw_jax.running.threefry, the default) against JAX's rolled CPU loop, whole commands.

    python experiments/benchmarks/bench_threefry.py                       # bandit, cartpole, sokoban, search; 3 rounds
    python experiments/benchmarks/bench_threefry.py --cases sokoban --rounds 5 --json

Each case is an `ftw-jax` command of experiments/benchmarks/bench_compile_cache.py (one seed, one evaluation period, no
compilation cache, so every process compiles) and the bandit command over 1000 seeds, run as a process with
FTW_JAX_THREEFRY=unrolled and =rolled, alternating which goes first, `--rounds` times. Reported: medians of
the process's wall time, the command's own compile seconds and env steps per second, and whether the two gave
the same numbers (they must: the hash is the same function, only its lowering differs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile

from bench_compile_cache import CASES as TRAIN_CASES  # noqa: E402
from bench_compile_cache import timed_command

CASES = {
    "bandit": ["bandit", "--num-seeds", "1000", "--no-plot"],
    **{name: [*TRAIN_CASES[name], "--no-checkpoint"] for name in ("cartpole", "sokoban", "search")},
}
LOWERINGS = ("unrolled", "rolled")
# What must agree between the two lowerings: the command's reported results.
RESULTS = ("best_arm_probability_final", "return", "success", "env_steps")
MEASURES = ("whole", "compile", "steps_per_second")


def run(command: list[str], lowering: str, out: str) -> dict:
    folder = [] if command[0] == "bandit" else ["--out", out]
    whole, summary = timed_command(
        [*command, "--json", *folder], {"FTW_JAX_THREEFRY": lowering, "FTW_JAX_COMPILE_CACHE": "off"}
    )
    return {
        "whole": whole,
        "compile": summary.get("compile_seconds"),
        "steps_per_second": summary.get("env_steps_per_second"),
        "results": {key: summary[key] for key in RESULTS if key in summary},
    }


def shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def median(rows: list[dict], key: str) -> float | None:
    values = [row[key] for row in rows if row[key] is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {list(CASES)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; choose from {list(CASES)}")
    table = {}
    with tempfile.TemporaryDirectory() as out:
        for case in cases:
            rows = {lowering: [] for lowering in LOWERINGS}
            for round_ in range(args.rounds):
                for lowering in LOWERINGS if round_ % 2 == 0 else LOWERINGS[::-1]:
                    rows[lowering].append(run(CASES[case], lowering, out))
                print(f"{case} round {round_ + 1}/{args.rounds}", file=sys.stderr, flush=True)
            first = rows["unrolled"][0]["results"]
            table[case] = {
                **{lowering: {key: median(rows[lowering], key) for key in MEASURES} for lowering in LOWERINGS},
                "same_results": all(row["results"] == first for lowering in LOWERINGS for row in rows[lowering]),
                "seconds": {lowering: [row["whole"] for row in rows[lowering]] for lowering in LOWERINGS},
            }
    if args.json:
        print(json.dumps(table))
        return
    print(f"medians of {args.rounds} processes each, no compilation cache; rolled / unrolled > 1: unrolled is faster")
    print("| command | whole s: unrolled | rolled | rolled / unrolled | compile s: unrolled | rolled ", end="")
    print("| env steps/s: unrolled | rolled | same results |\n|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for case, row in table.items():
        unrolled, rolled = row["unrolled"], row["rolled"]
        cells = [shown(unrolled["whole"]), shown(rolled["whole"]), f"{rolled['whole'] / unrolled['whole']:.2f}"]
        cells += [shown(side[key]) for key in ("compile", "steps_per_second") for side in (unrolled, rolled)]
        print(f"| {case} | " + " | ".join(cells) + f" | {'yes' if row['same_results'] else 'NO'} |")


if __name__ == "__main__":
    main()

"""The persistent compilation cache, first run against second: whole-process seconds and compile seconds.

    python experiments/benchmarks/bench_compile_cache.py  # the four environments' defaults and a sweep, one period each
    python experiments/benchmarks/bench_compile_cache.py --cases cartpole,sweep --json

Each case is an `ftw-jax` command run as a process twice with the same fresh cache folder
(`FTW_JAX_COMPILE_CACHE`): the first compiles and writes its programs, the second reads them. The runs are
cut to one evaluation period (`--iterations` = `--eval-every`) so that compiling is most of what they do;
`compile` is the command's own count (the training period's program), `whole` the process's wall time
(import, every compile, the run and its files). Then once more with `--no-compile-cache`, for reference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

COMMON = ["--json", "--no-checkpoint"]
CASES = {
    "bandit": ["train", "--seeds", "0", "--no-plot", "--env", "bandit", "--iterations", "24", "--eval-every", "24"],
    "cartpole": ["train", "--seeds", "0", "--no-plot", "--env", "cartpole", "--iterations", "10", "--eval-every", "10"],
    "sokoban": ["train", "--seeds", "0", "--no-plot", "--env", "sokoban", "--iterations", "20", "--eval-every", "20"],
    "search": ["train", "--seeds", "0", "--no-plot", "--env", "search", "--iterations", "40", "--eval-every", "40"],
    "sweep": [
        "sweep",
        "--seeds",
        "0",
        "--env",
        "cartpole",
        "--grid",
        "C=4,8",
        "--iterations",
        "10",
        "--eval-every",
        "10",
    ],
}


def run(command: list[str], cache: str, out: str, *flags: str) -> dict:
    whole, summary = timed_command([*command, *COMMON, "--out", out, *flags], {"FTW_JAX_COMPILE_CACHE": cache})
    return {"whole": whole, "compile": summary.get("compile_seconds")}


def timed_command(arguments: list[str], environ: dict[str, str]) -> tuple[float, dict]:
    """`ftw-jax ARGUMENTS` (which prints one JSON object) as a process with `environ` added: (its wall seconds,
    the object)."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "ftw_jax.cli", *arguments],
        env={**os.environ, **environ},
        capture_output=True,
        text=True,
        check=False,
    )
    whole = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(arguments)} failed:\n{done.stderr[-2000:]}")
    return whole, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = {}
    for name in args.cases.split(","):
        with tempfile.TemporaryDirectory() as scratch:
            cache, out = os.path.join(scratch, "cache"), os.path.join(scratch, "runs")
            first, second = run(CASES[name], cache, out), run(CASES[name], cache, out)
            off = run(CASES[name], cache, out, "--no-compile-cache")
        rows[name] = {"first": first, "second": second, "no_cache": off}
        print(
            f"{name}: first {first['whole']:.1f} s (compile {first['compile']:.1f} s), second "
            f"{second['whole']:.1f} s (compile {second['compile']:.1f} s), no cache {off['whole']:.1f} s",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(rows))
        return
    print("| command | first run: whole (compile) | second run: whole (compile) | --no-compile-cache: whole |")
    print("|---|---:|---:|---:|")
    for name, row in rows.items():
        print(
            f"| {name} | {row['first']['whole']:.1f} s ({row['first']['compile']:.1f} s) | "
            f"{row['second']['whole']:.1f} s ({row['second']['compile']:.1f} s) | {row['no_cache']['whole']:.1f} s |"
        )


if __name__ == "__main__":
    main()

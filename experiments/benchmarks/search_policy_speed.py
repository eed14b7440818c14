"""The search task's default training run with each policy, side by side: the LM acting through its KV cache
(`--policy lm`, the default) against the small transformer that re-reads the history at every step.

    python experiments/benchmarks/search_policy_speed.py                      # ftw-jax train --env search, as it stands
    python experiments/benchmarks/search_policy_speed.py --repeats 2 --out results/search-policy-speed

Each run is a whole `ftw-jax train` process (import, compile, training, evaluations); the policies alternate
(transformer, lm, transformer, lm, ...) so both share the machine's load alike. Prints a table of final
success per seed, env steps/s (compile excluded) and wall clock, and writes it with every run's summary.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

POLICIES = ("transformer", "lm")


def train(policy: str, seeds: str | None, iterations: int | None, folder: pathlib.Path) -> dict:
    """One `ftw-jax train --env search` process; its summary plus the process's wall clock."""
    command = [
        sys.executable,
        "-m",
        "ftw_jax.cli",
        "train",
        "--env",
        "search",
        "--policy",
        policy,
        "--json",
        "--no-plot",
        "--no-checkpoint",
        "--out",
        str(folder.parent),
        "--name",
        folder.name,
    ]
    if seeds is not None:
        command += ["--seeds", seeds]
    if iterations is not None:
        command += ["--iterations", str(iterations)]
    started = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode != 0:
        sys.exit(f"error: {' '.join(command)} failed:\n{finished.stderr[-2000:]}")
    return {**json.loads(finished.stdout), "process_seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default=None, help="default: the command's own (42,43,44)")
    parser.add_argument("--iterations", type=int, default=None, help="default: the search task's (400)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each policy, alternating")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="folder for table.md and runs.json")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    runs = {policy: [] for policy in POLICIES}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            for policy in POLICIES:
                summary = train(policy, args.seeds, args.iterations, pathlib.Path(scratch) / f"{policy}-{repeat}")
                runs[policy].append(summary)
                print(
                    f"{policy:>11} run {repeat + 1}: {summary['process_seconds']:6.1f} s, "
                    f"{summary['env_steps_per_second']:8,.0f} env steps/s, success "
                    f"{', '.join(f'{s:.1%}' for s in summary['success'])}",
                    file=sys.stderr,
                    flush=True,
                )
    median = lambda policy, key: statistics.median(run[key] for run in runs[policy])  # noqa: E731
    lines = [
        "| policy | final success per seed (last run) | mean | env steps/s | compile s | wall clock s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for policy in POLICIES:
        success = runs[policy][-1]["success"]
        lines.append(
            f"| {policy} | {', '.join(f'{s:.1%}' for s in success)} | {statistics.mean(success):.1%} | "
            f"{median(policy, 'env_steps_per_second'):,.0f} | {median(policy, 'compile_seconds'):.1f} | "
            f"{median(policy, 'process_seconds'):.1f} |"
        )
    speedup = median("lm", "env_steps_per_second") / median("transformer", "env_steps_per_second")
    wall = median("transformer", "process_seconds") / median("lm", "process_seconds")
    lines.append(
        f"\nlm / transformer: {speedup:.2f}x env steps/s, {wall:.2f}x wall clock "
        f"(medians of {args.repeats} alternating run(s) each; seeds {runs['lm'][-1]['seeds']})"
    )
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.md").write_text(table + "\n")
        (args.out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()

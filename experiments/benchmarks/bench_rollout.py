"""CartPole env steps per second, early and late in training, for this tree and an earlier revision side by side.

    # this tree against the last full-length scan
    python experiments/benchmarks/bench_rollout.py --before af7490d --repeats 2

Each measurement is a process that trains `ftw-jax train --env cartpole` at its defaults (one seed) and
reports every evaluation period's training env steps per second (evaluation included, compile excluded)
and the period's mean episode length. The earlier revision runs from a temporary `git worktree`; the two
alternate, `--repeats` times each, and the medians are printed per period. Episodes last ~20 steps early
and up to 500 late, so a rollout that always plays T = 500 steps shows as a low rate early on.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]

MEASURE = r"""
import json
import numpy as np
from ftw_jax.running.loop import MemberRun, seed_keys
from ftw_jax.lab.train import TrainConfig, make_train
from ftw_jax.running import threefry

threefry.use_unrolled()
trainer = make_train(TrainConfig.for_env("cartpole"))
run = MemberRun(trainer, seed_keys([0]))
rows, before = [], (0.0, 0)
for metrics, evaluation in run.periods():
    (seconds, steps), B = run.clock[-1], trainer.config.episodes_per_iteration
    rows.append({"steps_per_second": (steps - before[1]) / (seconds - before[0]),
                 "episode_length": (steps - before[1]) / (B * trainer.config.eval_every),
                 "return": float(evaluation["return"][0])})
    before = (seconds, steps)
print(json.dumps(rows))
"""


def measure(tree: pathlib.Path) -> list[dict]:
    environ = {**os.environ, "PYTHONPATH": str(tree), "FTW_JAX_COMPILE_CACHE": "off"}
    done = subprocess.run([sys.executable, "-c", MEASURE], cwd=tree, env=environ, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the measurement in {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the revision to compare with (af7490d: the scan)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        worktree = pathlib.Path(scratch) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), args.before],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            runs = {"before": [], "after": []}
            for repeat in range(args.repeats):
                for name, tree in (("before", worktree), ("after", ROOT)):
                    runs[name].append(measure(tree))
                    print(f"repeat {repeat + 1}: {name} done", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    median = {
        name: [
            {key: statistics.median(run[period][key] for run in rows) for key in rows[0][period]}
            for period in range(len(rows[0]))
        ]
        for name, rows in runs.items()
    }
    if args.json:
        print(json.dumps({"before": args.before, "median": median, "runs": runs}))
        return
    print(
        f"CartPole defaults, one seed, median of {args.repeats}: env steps/s per evaluation period "
        f"(before = {args.before}, after = this tree)"
    )
    print("| period | mean episode length | return | before | after | after / before |")
    print("|---:|---:|---:|---:|---:|---:|")
    for period, (old, new) in enumerate(zip(median["before"], median["after"])):
        print(
            f"| {period + 1} | {new['episode_length']:.0f} | {new['return']:.0f} | {old['steps_per_second']:,.0f} | "
            f"{new['steps_per_second']:,.0f} | {new['steps_per_second'] / old['steps_per_second']:.2f}x |"
        )


if __name__ == "__main__":
    main()

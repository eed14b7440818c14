"""Golden runs: short runs of every command, environment and algorithm, whose numbers are committed.

A refactor must keep them: `python -m pytest -k golden` compares each run with `tests/golden/NAME.json`.
Integers, booleans and strings must match exactly; floats to 1e-6 plus 1e-4 of their column's largest pinned
magnitude (a column: a list of values, e.g. every iteration's loss). A refactor that changes the compiled
program changes the order in which XLA sums float32 terms: a logged loss or KL moves by a few ulps at first
and by ~1e-6 of its scale after some Adam steps. A real change of behaviour moves them far more: a different
sampled action changes returns, env steps and everything after it.

What a file pins is only what survives a change of float kernels. Another CPU (its cache sizes choose the
matrix products' blocking, so their sums round differently), another thread count or another XLA rounds the
last bits differently, and a short run amplifies that: a sampled action on a near-tie flips, or Adam turns a
gradient that is only rounding (the KL's at params = reference, a loss with every return equal) into steps of
the learning rate's size. So `python tests/test_golden.py` runs every case more than once: in this process,
in a subprocess whose float kernels are changed on purpose (`PERTURBATIONS`: XLA's fast math, which
reassociates sums and approximates transcendental functions), and from the recordings of other machines given
with `--also DIR`. A value is pinned only where every observation agrees with a margin (exact for integers,
half the test's tolerance for floats, measured on the value's own magnitude). A log's rows are pinned up to
the first iteration where any observation disagrees: that iteration keeps its agreeing values, the
iterations after it are not pinned (null in the file), and neither is the last evaluation or a run's summary
once its log has diverged. The pinned part of every case is at least its first iteration, so every command,
environment and algorithm stays covered. After an intended change, rewrite them with
`python tests/test_golden.py` and say in the commit which numbers changed and why.
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import sys

import numpy as np
import pytest

from ftw_jax import cli
from ftw_jax.algos import ALGORITHMS
from ftw_jax.envs import ENVIRONMENTS

GOLDEN = pathlib.Path(__file__).parent / "golden"
SMALL = [
    "--seeds",
    "0,1",
    "--iterations",
    "4",
    "--eval-every",
    "2",
    "--episodes-per-iteration",
    "8",
    "--eval-episodes",
    "8",
    "--pool-capacity",
    "16",
    "--num-batches",
    "4",
    "--batch-size",
    "4",
    "--num-elites",
    "1",
    "--group-size",
    "4",
    "--kl-coef",
    "0.1",
    "--no-plot",
]
SMALL_EXTRA = {"text-search": ["--warm-start-demonstrations", "16", "--warm-start-steps", "3"]}  # a warm start, small
CASES = {
    "bandit": ["bandit", "--seeds", "42,43", "--iterations", "40", "--no-plot"],
    **{
        f"train-{env}-{algorithm}": ["train", "--env", env, "--algorithm", algorithm, *SMALL, *SMALL_EXTRA.get(env, [])]
        for env in sorted(ENVIRONMENTS)
        for algorithm in ALGORITHMS
    },  # a new one needs its golden file
    # The search task's earlier policy, still an option (version 0.4.0's comparison ran with it).
    "train-search-ftw-transformer": [
        "train",
        "--env",
        "search",
        "--algorithm",
        "ftw",
        "--policy",
        "transformer",
        *SMALL,
    ],
    "sweep": [
        "sweep",
        "--env",
        "bandit",
        "--grid",
        "C=2,4 kl=0,0.5",
        "--seeds",
        "0",
        "--iterations",
        "8",
        "--eval-every",
        "4",
        "--eval-episodes",
        "16",
    ],
    "compare": [
        "compare",
        "--env",
        "bandit",
        "--algos",
        "ftw,grpo",
        "--seeds",
        "0,1",
        "--learning-rates",
        "0.03,0.3",
        "--tuning-seeds",
        "7",
        "--iterations",
        "8",
        "--episodes-per-iteration",
        "8",
        "--eval-every",
        "4",
        "--eval-episodes",
        "16",
    ],
}


def _jsonl(path: pathlib.Path, *names: str) -> dict:
    """Columns of a run's JSON-lines log (rows by iteration, then seed), those of `names` it has."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {name: [row[name] for row in rows] for name in names if name in rows[0]}


def run_case(name: str, folder: pathlib.Path) -> dict:
    """The numbers one golden run gives: what it prints, and for training runs their per-iteration logs."""
    argv = CASES[name]
    if argv[0] != "bandit":
        argv = [*argv, "--out", str(folder), "--name", "run"]
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        assert cli.main([*argv, "--json"]) == 0
    printed = json.loads(stdout.getvalue())
    if argv[0] == "bandit":
        return {key: printed[key] for key in ("best_arm_probability_final", "expected_reward_final", "updates_applied")}
    if argv[0] == "train":
        run = folder / "run"
        return {
            "summary": {key: printed[key] for key in ("return", "success", "env_steps") if key in printed},
            "metrics": _jsonl(run / "metrics.jsonl", "iteration", "return_mean", "loss", "kl", "applied", "env_steps"),
            "evaluation": _jsonl(run / "evaluation.jsonl", "iteration", "return", "success", "env_steps"),
        }
    if argv[0] == "sweep":
        return {"points": printed["points"], "return": np.load(folder / "run" / "curves.npz")["return"].tolist()}
    return {
        "algorithms": [{key: row[key] for key in row if key != "seconds"} for row in printed["algorithms"]],
        "tuning": printed["tuning"],
    }


FLOAT_ABSOLUTE, FLOAT_RELATIVE = 1e-6, 1e-4  # the latter of a column's largest magnitude; see the module docstring
RECORDING_MARGIN = 0.5  # at recording, observations agree within this fraction of the test's tolerance


def assert_matches(got, expected, where: str = "", scale: float | None = None) -> None:
    """Integers and strings exactly, floats to `FLOAT_ABSOLUTE` + `FLOAT_RELATIVE` of their column's scale (the
    largest magnitude among the pinned values of the innermost list holding them, or their own), through nested
    dicts and lists. An expected None is a value the golden file does not pin."""
    if expected is None:
        return
    if isinstance(expected, dict):
        assert sorted(got) == sorted(expected), f"{where}: keys {sorted(got)} != {sorted(expected)}"
        for key in expected:
            assert_matches(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(got) == len(expected), f"{where}: length {len(got)} != {len(expected)}"
        numbers = [abs(value) for value in expected if isinstance(value, float)]
        column_scale = max(numbers) if numbers else None
        for index, (a, b) in enumerate(zip(got, expected)):
            assert_matches(a, b, f"{where}[{index}]", column_scale)
    elif isinstance(expected, float) or isinstance(got, float):
        scale = abs(expected) if scale is None else scale
        np.testing.assert_allclose(got, expected, rtol=0, atol=FLOAT_ABSOLUTE + FLOAT_RELATIVE * scale, err_msg=where)
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


@pytest.mark.slow
@pytest.mark.usefixtures("unchecked_key_reuse")
@pytest.mark.parametrize("name", CASES)
def test_golden_run(name, tmp_path):
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    assert expected["argv"] == CASES[name], "the case changed: rewrite its golden file (python tests/test_golden.py)"
    assert_matches(run_case(name, tmp_path), expected["values"], name)


# Recording: which values survive a change of float kernels.

# Subprocess runs whose float kernels differ from the default's: (name, environment variables).
PERTURBATIONS = (("fast-math", {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}),)


def agree(observations: list) -> bool:
    """Whether every observation of one value equals the first: exactly, or for floats within `RECORDING_MARGIN`
    of the test's tolerance on the value's own magnitude (never more than the test allows a column)."""
    first = observations[0]
    if isinstance(first, float):
        tolerance = RECORDING_MARGIN * (FLOAT_ABSOLUTE + FLOAT_RELATIVE * abs(first))
        return all(isinstance(other, (int, float)) and abs(other - first) <= tolerance for other in observations)
    return all(other == first for other in observations)


def pin_log(observations: list[dict], end: int | None = None) -> tuple[dict, int | None]:
    """A log's columns with None where not pinned, and the first iteration where the observations disagree (None
    when they never do). Rows from iteration `end` on are not pinned either (another log diverged there)."""
    first = observations[0]
    iterations = first["iteration"]
    rows = range(len(iterations))
    for other in observations[1:]:
        assert other.get("iteration", iterations) == iterations, "observations of one case ran other iterations"
    disagreed = {
        (name, row)
        for name in first
        for row in rows
        if not agree([other[name][row] for other in observations if name in other])
    }
    diverged = min((iterations[row] for _, row in disagreed), default=None)

    def pinned(row: int) -> bool:
        return (diverged is None or iterations[row] <= diverged) and (end is None or iterations[row] < end)

    columns = {
        name: [first[name][row] if pinned(row) and (name, row) not in disagreed else None for row in rows]
        for name in first
    }
    return columns, diverged


def pin(name: str, observations: list[dict]):
    """The values of one case that every observation agrees on, None elsewhere (see the module docstring)."""
    if CASES[name][0] != "train":
        return _pin_nested(observations)
    metrics, diverged = pin_log([other["metrics"] for other in observations])
    evaluation, diverged_evaluation = pin_log([other["evaluation"] for other in observations], diverged)
    if diverged_evaluation is not None and (diverged is None or diverged_evaluation < diverged):
        # An evaluation after iteration e that disagrees: the params the iterations after e start from differ.
        metrics, _ = pin_log([other["metrics"] for other in observations], diverged_evaluation + 1)
    clean = diverged is None and diverged_evaluation is None
    summary = {
        key: value if clean else [None] * len(value)
        for key, value in _pin_nested([other["summary"] for other in observations]).items()
    }
    if metrics["env_steps"][0] is None:
        raise SystemExit(
            f"error: {name} diverges in its first iteration under a change of float kernels: pick a case off that tie"
        )
    return {"summary": summary, "metrics": metrics, "evaluation": evaluation}


def _pin_nested(observations: list):
    """Values every observation agrees on, None elsewhere, through nested dicts and lists."""
    first = observations[0]
    if isinstance(first, dict):
        return {key: _pin_nested([other[key] for other in observations if key in other]) for key in first}
    if isinstance(first, list):
        return [_pin_nested([other[index] for other in observations]) for index in range(len(first))]
    return first if agree(observations) else None


def observe(name: str, environment: dict[str, str]) -> dict:
    """One case run in a fresh process with these environment variables added (its own compilation)."""
    import os
    import subprocess

    env = {**os.environ, **environment, "FTW_JAX_COMPILE_CACHE": "off"}
    done = subprocess.run(
        [sys.executable, __file__, "--observe", name], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"{name} under {environment} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def run_here(name: str) -> dict:
    import tempfile

    import jax

    with jax.debug_key_reuse(False), tempfile.TemporaryDirectory() as folder:
        return run_case(name, pathlib.Path(folder))


def write(names: list[str], also: list[pathlib.Path]) -> None:
    """Runs the cases as they are and perturbed, and writes what they agree on as their golden files."""
    GOLDEN.mkdir(exist_ok=True)
    for name in names:
        observations = [run_here(name)]
        observations += [observe(name, environment) for _, environment in PERTURBATIONS]
        for folder in also:
            recorded = json.loads((folder / f"{name}.json").read_text())
            if recorded["argv"] != CASES[name]:
                raise SystemExit(f"error: {folder / name}.json recorded another command line")
            observations.append(recorded["values"])
        values = pin(name, observations)
        (GOLDEN / f"{name}.json").write_text(json.dumps({"argv": CASES[name], "values": values}, indent=1) + "\n")
        print(f"wrote {GOLDEN / name}.json", file=sys.stderr)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Record the golden runs (all of them, or the cases named).")
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"cases: {', '.join(CASES)}")
    parser.add_argument(
        "--also",
        type=pathlib.Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of golden files recorded elsewhere (another machine): only what agrees is pinned",
    )
    parser.add_argument("--observe", metavar="NAME", help=argparse.SUPPRESS)  # one run, printed (for `observe`)
    args = parser.parse_args()
    unknown = [name for name in args.names if name not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; cases: {', '.join(CASES)}")
    if args.observe:
        print(json.dumps(run_here(args.observe)))
    else:
        write(args.names or list(CASES), args.also)

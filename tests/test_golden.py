"""Golden runs: short runs of every command, environment and algorithm, whose numbers are committed.

A refactor must keep them: `python -m pytest -k golden` compares each run with `tests/golden/NAME.json`.
Integers (env steps, update counts) must match exactly; floats to 1e-6 plus 1e-4 of their column's largest
magnitude (a column: a list of values, e.g. every iteration's loss). The margin covers the install too: with
the code that wrote it, a fresh install (on this machine and on CI's, 2026-12-01) logs search PPO's last KL
1.4e-5 of its column's scale away from the committed number, so 1e-5 failed. A refactor that changes the compiled
program (a carry without a pool, another fusion) changes the order in which XLA sums float32 terms: a logged
loss or KL moves by a few ulps at first and by ~1e-6 of its scale after some Adam steps, and a sum of O(1)
terms that cancels to nearly 0 (a KL at params = reference, a surrogate on normalised advantages) keeps
rounding of the terms' size, ~1e-7, whatever its own. A real change of behaviour moves these numbers far
more: a different sampled action changes returns, env steps and everything after it. After an intended change,
rewrite them with `python tests/test_golden.py` and say in the commit which numbers changed and why.
The numbers are those of jax's CPU build at the versions `pip install -e .` takes today; another XLA version
or a GPU may sample differently, and then the golden files are rewritten, not the tests loosened.
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
    # The search task's earlier policy, still an option (the issue-16 comparison ran with it).
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
    """The numbers one golden run pins: what it prints, and for training runs their per-iteration logs."""
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
            "metrics": _jsonl(run / "metrics.jsonl", "return_mean", "loss", "kl", "applied", "env_steps"),
            "evaluation": _jsonl(run / "evaluation.jsonl", "return", "success", "env_steps"),
        }
    if argv[0] == "sweep":
        return {"points": printed["points"], "return": np.load(folder / "run" / "curves.npz")["return"].tolist()}
    return {
        "algorithms": [{key: row[key] for key in row if key != "seconds"} for row in printed["algorithms"]],
        "tuning": printed["tuning"],
    }


FLOAT_ABSOLUTE, FLOAT_RELATIVE = 1e-6, 1e-4  # the latter of a column's largest magnitude; see the module docstring


def assert_matches(got, expected, where: str = "", scale: float | None = None) -> None:
    """Integers and strings exactly, floats to `FLOAT_ABSOLUTE` + `FLOAT_RELATIVE` of their column's scale (the
    largest magnitude in the innermost list holding them, or their own), through nested dicts and lists."""
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


def write(names: list[str]) -> None:
    """Runs the cases and writes their golden files (after an intended change of behaviour)."""
    import tempfile

    import jax

    GOLDEN.mkdir(exist_ok=True)
    with jax.debug_key_reuse(False):
        for name in names:
            with tempfile.TemporaryDirectory() as folder:
                values = run_case(name, pathlib.Path(folder))
            (GOLDEN / f"{name}.json").write_text(json.dumps({"argv": CASES[name], "values": values}, indent=1) + "\n")
            print(f"wrote {GOLDEN / name}.json", file=sys.stderr)


if __name__ == "__main__":
    write(sys.argv[1:] or list(CASES))

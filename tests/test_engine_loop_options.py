"""experiments/lm/engine_loop.py's options: its results land under the git-ignored runs/ unless told otherwise (the
committed results/engine-loop/ are not overwritten by a run as documented), and every option says what it sets."""

import argparse
import importlib.util
import pathlib

_REPOSITORY = pathlib.Path(__file__).parents[1]


def _engine_loop():
    """The script as a module (importing it imports neither torch nor jax)."""
    spec = importlib.util.spec_from_file_location("engine_loop", _REPOSITORY / "experiments" / "lm" / "engine_loop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_engine_loop_writes_under_runs_unless_told_otherwise():
    parser = _engine_loop().parser()
    defaults = parser.parse_args([])
    assert defaults.out.parts[0] == "runs" and defaults.scratch.parts[0] == "runs"
    assert "runs/" in (_REPOSITORY / ".gitignore").read_text().splitlines()
    assert parser.parse_args(["--out", "results/engine-loop"]).out == pathlib.Path("results/engine-loop")


def test_engine_loop_options_all_have_help_and_the_worker_options_stay_hidden():
    parser = _engine_loop().parser()
    shown = {action.dest: action.help for action in parser._actions if action.help != argparse.SUPPRESS}
    assert all(shown.values()), [name for name, text in shown.items() if not text]
    assert {"worker", "work", "learner_python"}.isdisjoint(shown)
    letters = {"batch": "B", "pool": "N", "num_batches": "J", "minibatch": "C", "elites": "K", "updates": "U"}
    assert all(shown[name].startswith(f"{letter},") for name, letter in letters.items())
    text = " ".join(parser.format_help().split())  # unwrapped
    assert "results/engine-loop" in text and "(default: runs/engine-loop)" in text and "--worker" not in text

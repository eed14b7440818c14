"""The documents' scripts run as written: the API tour (docs/api.md) and the extension example (docs/extending.md)."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

DOCS = pathlib.Path(__file__).parents[1] / "docs"


def python_block(page: str, marker: str) -> str:
    (block,) = [
        block for block in re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S) if marker in block
    ]
    return block


@pytest.mark.slow
def test_api_tour_runs():
    exec(compile(python_block("api.md", "make_update"), "docs/api.md (API tour)", "exec"), {})


@pytest.mark.slow
def test_the_lab_and_agent_tour_runs():
    exec(compile(python_block("api.md", "make_train"), "docs/api.md (the lab and the agent)", "exec"), {})


@pytest.mark.slow
def test_a_new_algorithm_and_environment_train_from_the_command_line():
    # A fresh process: the example adds to the registries, which other tests must not see.
    done = subprocess.run(
        [sys.executable, "-c", python_block("extending.md", "ALGORITHMS")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary, comparison = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    assert summary["config"]["algorithm"] == "top_half" and summary["config"]["algorithm_config"] == {"quantile": 0.75}
    assert summary["return"][0] > 0.75  # the uniform policy earns 0.6, the best arm 1.0
    # Registered after `import ftw_jax.lab.train`, searched over its own space by `compare --search`.
    assert [row["algorithm"] for row in comparison["algorithms"]] == ["top_half", "reinforce"]
    assert comparison["chosen"]["top_half"]["quantile"] in (0.5, 0.75, 0.9)
    assert len(comparison["tuning"]["top_half"]) == 4  # 3 drawn, and its defaults as its reference recipe
    assert comparison["tuning"]["top_half"][-1]["candidate"] == "reference"
    assert (
        comparison["tuning"]["top_half"][-1]["quantile"] == 0.5 and comparison["tuning"]["top_half"][-1]["kl_coef"] == 0
    )

"""The README's API tour runs as written."""

import pathlib
import re

import pytest


@pytest.mark.slow
def test_api_tour_runs():
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    (tour,) = [block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "make_update" in block]
    exec(compile(tour, "README.md (API tour)", "exec"), {})

"""The API tour (docs/api.md) runs as written."""

import pathlib
import re

import pytest


@pytest.mark.slow
def test_api_tour_runs():
    tour_page = (pathlib.Path(__file__).parents[1] / "docs" / "api.md").read_text()
    (tour,) = [block for block in re.findall(r"```python\n(.*?)```", tour_page, re.S) if "make_update" in block]
    exec(compile(tour, "docs/api.md (API tour)", "exec"), {})

"""The version is declared once and every file that states it agrees: the package, the command, the
changelog's newest release and the citation."""

import pathlib
import re

import pytest

import ftw_jax
from ftw_jax import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_command_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"ftw-jax {ftw_jax.__version__}"


def test_the_changelog_and_the_citation_name_the_package_version():
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    citation = (ROOT / "CITATION.cff").read_text()
    assert releases[0][0] == ftw_jax.__version__
    assert re.search(rf"^version: {re.escape(ftw_jax.__version__)}$", citation, re.M)
    assert re.search(rf'^date-released: "{releases[0][1]}"$', citation, re.M)
    assert [version for version, _ in releases] == sorted(
        (version for version, _ in releases), key=lambda v: tuple(map(int, v.split("."))), reverse=True
    )

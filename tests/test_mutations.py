"""The mutation table (tests/mutations.py) still fits the source: a mutation whose text has moved plants nothing.

Running the mutations takes minutes; checking that each one applies takes none, so it runs with every test.
"""

import pathlib

import mutations
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mutation", mutations.MUTATIONS, ids=lambda mutation: mutation.name)
def test_every_mutation_applies_to_exactly_one_place(mutation, tmp_path):
    target = tmp_path / mutation.path
    target.parent.mkdir(parents=True)
    target.write_text((ROOT / mutation.path).read_text())
    mutation.apply(tmp_path)  # LookupError unless the text occurs exactly once
    assert target.read_text() != (ROOT / mutation.path).read_text()


def test_mutation_names_are_distinct():
    names = [mutation.name for mutation in mutations.MUTATIONS]
    assert len(names) == len(set(names))

"""Public functions and methods of the package are annotated: their arguments and what they return.

Nested functions (the closures factories return) and private names are left to their readers; a public name
is one without a leading underscore, at module level or in a public class.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "ftw_jax"


def unannotated(path: pathlib.Path) -> list[str]:
    """`NAME(missing, ...)` for every public function or method of the file that lacks an annotation."""
    found = []

    def visit(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                not node.name.startswith("_") or node.name == "__call__"
            ):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if prefix and arguments and arguments[0].arg in ("self", "cls"):
                    arguments = arguments[1:]
                arguments += [a for a in (node.args.vararg, node.args.kwarg) if a is not None]
                missing = [a.arg for a in arguments if a.annotation is None]
                missing += ["return"] if node.returns is None else []
                if missing:
                    found.append(f"{prefix}{node.name}({', '.join(missing)}) at line {node.lineno}")

    visit(ast.parse(path.read_text()).body, "")
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_public_functions_are_annotated(path):
    assert unannotated(path) == []


def test_the_check_finds_a_missing_annotation(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        "def shown(x: int) -> int: ...\n"
        "def bare(x, y: int): ...\n"
        "def _private(x): ...\n"
        "class Public:\n"
        "    def method(self, z) -> None: ...\n"
        "    def _helper(self, z): ...\n"
    )
    assert unannotated(source) == ["bare(x, return) at line 2", "Public.method(z) at line 5"]

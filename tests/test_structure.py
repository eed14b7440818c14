"""The package reads from the door: its folders are its layers (`LAYERS`, bottom first), with no import cycle
and no import from a layer above; the LM model library and the FTW core import nothing outside them, running
imports no program, nothing but the command line imports the command line, and functions and modules stay short
enough to read.

Imports are read from the source: at module level, inside functions and under `TYPE_CHECKING` alike, so an import
deferred into a function, or one made for type checkers only, still counts.
"""

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "ftw_jax"
MAX_FUNCTION_LINES = 60  # of code: docstrings, comments and blank lines aside
MAX_MODULE_LINES = 500  # with everything


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(source: str, own_name: str) -> set[str]:
    """The package's modules that `source` imports (a package's `__init__` where a name is not a module)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module
                for alias in node.names
            }
    return {name for name in found if name in MODULES and name != own_name}


GRAPH = {name: imported(path.read_text(), name) for name, path in MODULES.items()}


def test_no_import_cycle():
    def cycle_from(start):
        stack, seen = [(start, [start])], set()
        while stack:
            name, trail = stack.pop()
            for target in sorted(GRAPH[name]):
                if target == start:
                    return trail
                if target not in seen:
                    seen.add(target)
                    stack.append((target, [*trail, target]))
        return None

    cycles = [cycle for cycle in map(cycle_from, GRAPH) if cycle]
    assert cycles == []


# The package's layers, bottom first (README's Layout), each a folder: a module imports from its own layer and those
# below. The programs are two wings, the lab and the agent, that never import each other (`WINGS`).
LAYERS = {
    "core": ("core",),
    "algorithms": ("algos",),
    "models": ("policies", "lm"),
    "environments": ("envs",),
    "running": ("running",),
    "programs": ("lab", "agent"),
    "interface": ("cli", ""),  # "": the package's __init__
}
WINGS = ("ftw_jax.lab", "ftw_jax.agent")


def layer_of(module: str) -> int:
    """The index in LAYERS of a module of the package (its first name after `ftw_jax.`)."""
    top = module.removeprefix("ftw_jax").removeprefix(".").split(".")[0]
    found = [index for index, names in enumerate(LAYERS.values()) if top in names]
    assert found, f"{module} is in no layer: give it one in LAYERS (and README's Layout)"
    return found[0]


def test_no_module_imports_from_a_layer_above_its_own():
    upward = {
        name: sorted(target for target in targets if layer_of(target) > layer_of(name))
        for name, targets in GRAPH.items()
    }
    assert {name: targets for name, targets in upward.items() if targets} == {}


def test_the_layer_check_sees_an_upward_import():
    assert layer_of("ftw_jax.core.pool") < layer_of("ftw_jax.lab.train") < layer_of("ftw_jax.cli.train")
    assert layer_of("ftw_jax.envs.text_search") > layer_of("ftw_jax.lm.tokenizer")


def wing_crossings(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """{module of one wing: the modules of the other wing it imports}, those that import any."""
    wing_of = lambda name: next((w for w in WINGS if name == w or name.startswith(w + ".")), None)  # noqa: E731
    found = {
        name: sorted(t for t in targets if wing_of(t) not in (None, wing_of(name)))
        for name, targets in graph.items()
        if wing_of(name)
    }
    return {name: targets for name, targets in found.items() if targets}


def test_the_lab_and_the_agent_never_import_each_other():
    assert set(WINGS) <= set(MODULES)
    assert wing_crossings(GRAPH) == {}


def test_the_wing_check_sees_a_planted_import():
    planted = {name: set(targets) for name, targets in GRAPH.items()}
    planted["ftw_jax.agent.learner"].add("ftw_jax.lab.train")
    planted["ftw_jax.lab.compare"].add("ftw_jax.agent.episodes")
    assert wing_crossings(planted) == {
        "ftw_jax.agent.learner": ["ftw_jax.lab.train"],
        "ftw_jax.lab.compare": ["ftw_jax.agent.episodes"],
    }
    source = "def late():\n    from ftw_jax.lab.rollout import rollout\n"
    assert wing_crossings({"ftw_jax.agent.feed": imported(source, "ftw_jax.agent.feed")}) == {
        "ftw_jax.agent.feed": ["ftw_jax.lab.rollout"]
    }


def outside(package: str) -> dict[str, list[str]]:
    """{module of `package`: the package's modules outside `package` it imports}, those that import any."""
    inside = lambda name: name == package or name.startswith(package + ".")  # noqa: E731
    found = {name: sorted(t for t in targets if not inside(t)) for name, targets in GRAPH.items() if inside(name)}
    return {name: targets for name, targets in found.items() if targets}


def test_the_lm_model_library_and_the_core_import_nothing_outside_them():
    assert outside("ftw_jax.lm") == {}
    assert outside("ftw_jax.core") == {}


def test_running_imports_no_program_and_no_command():
    imported_by_running = {
        target for name, targets in GRAPH.items() if name.startswith("ftw_jax.running") for target in targets
    }
    assert {name for name in imported_by_running if layer_of(name) >= layer_of("ftw_jax.lab.train")} == set()


def test_only_the_command_line_imports_the_command_line():
    importers = {
        name
        for name, targets in GRAPH.items()
        if not name.startswith("ftw_jax.cli") and any(t.startswith("ftw_jax.cli") for t in targets)
    }
    assert importers == set()


def code_lines(function: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    body = function.body
    docstring = set()
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        docstring = set(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    assert function.end_lineno is not None
    return sum(
        1
        for number in range(function.lineno, function.end_lineno + 1)
        if number not in docstring and lines[number - 1].strip() and not lines[number - 1].strip().startswith("#")
    )


def long_functions() -> set[str]:
    found = set()
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and code_lines(node, lines) > MAX_FUNCTION_LINES
            ):
                found.add(f"{path.relative_to(PACKAGE)}:{node.name}")
    return found


def test_functions_are_short():
    assert long_functions() == set()


def test_modules_are_short():
    long = {
        str(path.relative_to(PACKAGE))
        for path in MODULES.values()
        if len(path.read_text().splitlines()) > MAX_MODULE_LINES
    }
    assert long == set()


def test_the_import_reader_sees_deferred_imports_and_those_for_type_checkers():
    source = (
        "import typing\n"
        "from ftw_jax.core import pool\n"
        "if typing.TYPE_CHECKING:\n"
        "    from ftw_jax.running.loop import MemberRun\n"
        "def late():\n"
        "    from ftw_jax.lab.train import make_train\n"
        "    import ftw_jax.lm.model\n"
    )
    expected = {"ftw_jax.core.pool", "ftw_jax.running.loop", "ftw_jax.lab.train", "ftw_jax.lm.model"}
    assert imported(source, "ftw_jax.lm.load") == expected


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")


def strings_naming_flags(source: str) -> list[str]:
    """'line: --flag' for every string of `source` but its docstrings (messages, help texts) that names a flag."""
    tree = ast.parse(source)
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, documented) and node.body and isinstance(node.body[0], ast.Expr)
    }
    return [
        f"{node.lineno}: {found[0]}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        if (found := FLAG.search(node.value))
    ]


def test_no_library_module_outside_the_command_line_names_a_flag():
    # The library names settings (`max_grad_norm`); the command line prints them as its flags (cli.flags.as_flags).
    named = {
        str(path.relative_to(PACKAGE)): strings_naming_flags(path.read_text())
        for name, path in MODULES.items()
        if not name.startswith("ftw_jax.cli")
    }
    assert {path: lines for path, lines in named.items() if lines} == {}


def test_the_flag_reader_sees_messages_and_f_strings_but_not_docstrings():
    source = (
        '"""Run it with --resume."""\n'
        "def f(x):\n"
        '    """Pass --seed."""\n'
        '    raise ValueError(f"{x} needs --no-checkpoint off")\n'
        'HELP = "a ratio (not a--flag), see `max_grad_norm`; or --max-grad-norm"\n'
    )
    assert sorted(strings_naming_flags(source)) == ["4: --no-checkpoint", "5: --max-grad-norm"]


def test_the_line_counter_counts_code_alone():
    source = 'def f(x):\n    """A docstring\n    of two lines."""\n\n    # a comment\n    y = x + 1\n    return y\n'
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    assert code_lines(function, source.splitlines()) == 3  # the def, the assignment and the return


def test_the_public_api_is_its_all_and_every_name_resolves():
    import ftw_jax

    assert set(ftw_jax.__all__) == {"lm", *ftw_jax._HOMES}
    assert dir(ftw_jax) == sorted([*ftw_jax.__all__, "__version__"])
    for name in ("TrainConfig", "make_train", "compare", "LearnConfig", "learn_from_file", "rank_occupancy"):
        assert callable(getattr(ftw_jax, name)), name
    for old_spelling in ("pool", "losses", "train"):  # one spelling per module: ftw_jax.core.pool, ftw_jax.lab.train
        assert old_spelling not in dir(ftw_jax)

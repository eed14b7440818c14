"""Where the test suite's time goes: the slowest tests and the totals by file, from pytest's own timings.

    python -m pytest --durations=0 > pytest.log             # every test's setup, call and teardown seconds
    python experiments/suite/test_durations.py pytest.log         # the 40 slowest tests and the seconds per file
    python experiments/suite/test_durations.py before.log after.log   # the same, side by side
    python experiments/suite/test_durations.py .venv/junit.xml    # what `.ci/run` wrote (pytest's --junitxml)

With `--compiles FILE` (lines `WALL wall SECONDS compile COUNT n  NODEID  [...]`, as written by the pytest plugin
`experiments/suite/pytest_compile_times.py`) the table also
says how many of each test's seconds went to XLA compiling, and how many programs it compiled.
A test's time is the sum of its setup, call and teardown; pytest leaves out those under 5 ms.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re

LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(\S+)")


def seconds_per_test(log: pathlib.Path) -> dict[str, float]:
    """{node id: seconds} from the `slowest durations` section of a pytest log, or from a JUnit XML report."""
    if log.suffix == ".xml":
        import xml.etree.ElementTree as ElementTree

        cases = ElementTree.parse(log).getroot().iter("testcase")
        return {
            f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}": float(case.get("time", 0))
            for case in cases
        }
    text = log.read_text()
    if "slowest durations" not in text:
        raise SystemExit(f"error: {log} has no durations; run pytest with --durations=0")
    section = text.split("slowest durations", 1)[1]
    times: dict[str, float] = collections.defaultdict(float)
    for line in section.splitlines():
        match = LINE.match(line)
        if match:
            times[match.group(3)] += float(match.group(1))
    return dict(times)


def compiles(path: pathlib.Path | None) -> dict[str, tuple[float, int]]:
    """{node id: (seconds compiling, programs compiled)} from a `--compiles` file."""
    found = {}
    for line in path.read_text().splitlines() if path else []:
        parts = line.split()
        found[parts[6]] = (float(parts[2]), int(parts[4]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=pathlib.Path, help="one pytest log, or a before and an after")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--compiles", type=pathlib.Path, help="per-test compile times (see the docstring)")
    args = parser.parse_args()
    runs = [seconds_per_test(log) for log in args.logs]
    compiled = compiles(args.compiles)
    last = runs[-1]
    names = [f"`{log.name}` s" for log in args.logs]
    extra = ["XLA compile s (programs)"] if compiled else []
    print(f"| test | {' | '.join(names + extra)} |")
    print("|---|" + "---:|" * (len(names) + len(extra)))
    for node in sorted(last, key=last.get, reverse=True)[: args.top]:
        cells = [f"{run[node]:.1f}" if node in run else "" for run in runs]
        if compiled:
            seconds, count = compiled.get(node, (0.0, 0))
            cells.append(f"{seconds:.1f} ({count})" if node in compiled else "")
        print(f"| {node.removeprefix('tests/')} | {' | '.join(cells)} |")
    print()
    files = sorted({node.split("::")[0] for run in runs for node in run})
    totals = [
        {file: sum(seconds for node, seconds in run.items() if node.split("::")[0] == file) for file in files}
        for run in runs
    ]
    print(f"| file | {' | '.join(names)} |")
    print("|---|" + "---:|" * len(names))
    for file in sorted(files, key=lambda file: totals[-1][file], reverse=True):
        print(f"| {file.removeprefix('tests/')} | {' | '.join(f'{total[file]:.0f}' for total in totals)} |")
    print(f"| **all** | {' | '.join(f'{sum(run.values()):.0f}' for run in runs)} |")


if __name__ == "__main__":
    main()

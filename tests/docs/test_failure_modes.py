"""docs/design.md's failure-mode table: every row names the test that proves it.

A row's last column lists ``tests/<path>.py::<test function>`` references. Each must
point at a file that exists and defines that test function, and at least one of a
row's references must be a test that starts real processes (a module marked
``acceptance`` or ``fault``, or one under tests/acceptance, tests/fault, tests/flower
or tests/operate), so a reader finds the real-process proof from the row itself.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")
PROCESS_DIRS = ("tests/acceptance/", "tests/fault/", "tests/flower/", "tests/operate/")


def table_rows() -> list[tuple[str, str]]:
    """(row title, proof column) of each row of the "Failure modes" table."""
    section = DESIGN.read_text().split("\n## Failure modes\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| **")]
    out = []
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        out.append((re.sub(r"\*\*(.*?)\*\*.*", r"\1", cells[0]), cells[-1]))
    return out


def test_the_table_has_a_proof_column() -> None:
    section = DESIGN.read_text().split("\n## Failure modes\n", 1)[1]
    header = next(line for line in section.splitlines() if line.startswith("| "))
    assert header.rstrip(" |").endswith("proved by"), header
    assert len(table_rows()) >= 20


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _runs_processes(path: str) -> bool:
    if path.startswith(PROCESS_DIRS):
        return True
    text = (ROOT / path).read_text()
    return bool(re.search(r"pytest\.mark\.(acceptance|fault)", text))


@pytest.mark.parametrize(("title", "proof"), table_rows(), ids=[t for t, _ in table_rows()])
def test_each_row_names_an_existing_real_process_test(title: str, proof: str) -> None:
    refs = REFERENCE.findall(proof)
    assert refs, f"the row {title!r} names no test (`tests/...py::test_...`) in its last column"
    for path, function in refs:
        assert (ROOT / path).exists(), f"{title!r}: {path} does not exist"
        assert function in _functions(ROOT / path), f"{title!r}: {path} has no {function}"
    assert any(_runs_processes(path) for path, _ in refs), (
        f"the row {title!r} names no test that runs real processes: {refs}")

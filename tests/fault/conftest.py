"""Fault proofs: real beat, worker and service processes under injected faults.

Every test here is long and marked ``fault`` (and ``acceptance``): the default run
leaves them out, ``python -m pytest -m fault`` runs them (CI's second step runs
``-m "fault or slow"``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.fault)
            item.add_marker(pytest.mark.acceptance)

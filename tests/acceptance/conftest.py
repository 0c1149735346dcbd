"""What every acceptance scenario shares: a work directory for its processes' logs."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Where a scenario's child processes write their logs (and its summary)."""
    path = tmp_path / "procs"
    path.mkdir()
    return path

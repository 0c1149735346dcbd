"""The package stays typed (strict mypy) and lint-clean (ruff)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_mypy_strict_passes() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_passes() -> None:
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "celery_elarion_beat", "tests",
                           "benchmarks", "examples"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_py_typed_ships_and_the_entry_point_resolves() -> None:
    from importlib.metadata import entry_points

    assert (ROOT / "celery_elarion_beat" / "py.typed").exists()
    (alias,) = [ep for ep in entry_points(group="celery.beat_schedulers") if ep.name == "elarion"]
    from celery_elarion_beat import ClaimingScheduler

    assert alias.load() is ClaimingScheduler

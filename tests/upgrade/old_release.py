"""The release before clusters (0.2, commit :data:`OLD_COMMIT`), to run beside this one.

The package is pure Python and needs nothing this virtualenv lacks: its
``celery_elarion_beat/`` tree at that commit *is* the release's code. It is taken
from this repository's git history (``git archive``) once per machine, into a cache
directory named after the commit, and run by putting that directory first on
``PYTHONPATH`` (:func:`old_env`): a child process then imports the old package, with
this virtualenv's Celery, SQLAlchemy and drivers, as a deployment of 0.2 would.

A clone without that commit (a shallow one) fails the tests that need it, saying
how to fetch it; they never skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from celery_elarion_beat.testing._harness import clean_env

#: The release 0.2 as it landed: the last commit whose tables have no cluster (and whose
#: package is still one flat folder, as every deployment of 0.2 has it).
OLD_COMMIT = "3a6fe95"
ROOT = Path(__file__).resolve().parents[2]


def old_release() -> Path:
    """A directory holding the ``celery_elarion_beat`` package of :data:`OLD_COMMIT`."""
    cache = Path(tempfile.gettempdir()) / f"celery-elarion-beat-{OLD_COMMIT}"
    if (cache / "celery_elarion_beat" / "__init__.py").exists():
        return cache
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{OLD_COMMIT}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        pytest.fail(f"the release before clusters (commit {OLD_COMMIT}) is not in this clone "
                    f"({found.stderr.strip()}): fetch the history (`git fetch --unshallow`) "
                    "to run the upgrade tests", pytrace=False)
    staging = Path(tempfile.mkdtemp(prefix=f"celery-elarion-beat-{OLD_COMMIT}-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", OLD_COMMIT,
                              "celery_elarion_beat"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(staging)], input=archive.stdout, check=True)
    try:
        os.rename(staging, cache)  # atomic: a racing run finds it whole, or makes its own
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return cache


def old_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child that runs the old release (then this repository's
    test apps, which it imports from the repository root)."""
    env = clean_env(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(old_release()), env["PYTHONPATH"]])
    return env

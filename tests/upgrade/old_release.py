"""The release 0.2 as it landed (commit :data:`OLD_COMMIT`), to run beside this one.

The package is pure Python and needs nothing this virtualenv lacks: its
``celery_elarion_beat/`` tree at that commit *is* the release's code. It ships with
the tests as :data:`ARCHIVE` (made with ``git archive --format=tar 3a6fe95
celery_elarion_beat | gzip -9n``), so the upgrade tests need no git history: CI's clone
may be shallow. It is unpacked once per machine into a cache directory named after the
commit, and run by putting that directory first on ``PYTHONPATH`` (:func:`old_env`): a
child process then imports the old package, with this virtualenv's Celery, SQLAlchemy
and drivers, as a deployment of 0.2 would.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

from celery_elarion_beat.testing._harness import clean_env

#: The release 0.2 as it landed: the last commit whose tables have no cluster (and whose
#: package is still one flat folder, as every deployment of 0.2 has it).
OLD_COMMIT = "3a6fe95"
#: Its ``celery_elarion_beat/`` tree.
ARCHIVE = Path(__file__).with_name("release-0.2.tar.gz")


def old_release() -> Path:
    """A directory holding the ``celery_elarion_beat`` package of :data:`OLD_COMMIT`."""
    cache = Path(tempfile.gettempdir()) / f"celery-elarion-beat-{OLD_COMMIT}"
    if (cache / "celery_elarion_beat" / "__init__.py").exists():
        return cache
    staging = Path(tempfile.mkdtemp(prefix=f"celery-elarion-beat-{OLD_COMMIT}-"))
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(staging, filter="data")
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

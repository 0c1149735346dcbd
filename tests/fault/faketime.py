"""Run a child process on a faked wall clock with Debian's ``faketime`` (libfaketime).

``faked_env("+20s")`` is a clock 20 s ahead; ``faked_env("@2027-03-28 00:59:00")``
starts the clock at that UTC instant and lets it run at real speed: each process
from its own launch, so two processes launched a second apart disagree by that
second; processes that must share one fake clock take one offset computed once
(``faked_env(f"+{round(target - time.time())}s")``). Only the wall
clock is faked (``FAKETIME_DONT_FAKE_MONOTONIC=1``): timeouts and sleeps keep real
durations, as on a node whose NTP is off. ``.ci/install-packages.sh`` installs the
package; a missing library fails the test naming that script.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from celery_elarion_beat.testing._harness import clean_env

LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/aarch64-linux-gnu/faketime",
                "/usr/lib/faketime")
SITE = Path(__file__).parent / "faketime_site"


def library() -> str:
    for directory in LIBRARY_DIRS:
        candidate = Path(directory) / "libfaketime.so.1"
        if candidate.exists():
            return str(candidate)
    pytest.fail("libfaketime is not installed: run `bash .ci/install-packages.sh` "
                "(Debian's faketime package)", pytrace=False)


def faked_env(spec: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment entries that run a child on the fake clock *spec* (FAKETIME syntax).

    Merge them last into the child's environment (they set PYTHONPATH to the package
    root plus :data:`SITE`, whose ``sitecustomize`` works around libfaketime's sleep).
    """
    pythonpath = clean_env()["PYTHONPATH"]
    env = {
        "LD_PRELOAD": library(),
        "FAKETIME": spec,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
        "PYTHONPATH": str(SITE) + os.pathsep + pythonpath,
    }
    env.update(extra or {})
    return env

"""The process harness now lives in :mod:`celery_elarion_beat.testing`; import it from there.

This re-export remains for the test modules that still import it from here
(``tests/flower``, ``tests/acceptance/every_node.py``).
"""

from __future__ import annotations

from celery_elarion_beat.testing._harness import ChildProcess as CeleryProcess
from celery_elarion_beat.testing._harness import ProcessError, ProcessManager, clean_env, wait_until

__all__ = ["CeleryProcess", "ProcessError", "ProcessManager", "clean_env", "wait_until"]

"""Loaded (through PYTHONPATH) by the processes :mod:`tests.fault.faketime` starts.

libfaketime 0.9.10 rewrites the deadline of an absolute ``clock_nanosleep`` on the
monotonic clock even when ``FAKETIME_DONT_FAKE_MONOTONIC=1`` leaves that clock
alone, so CPython's ``time.sleep`` (which sleeps that way since 3.11) fails with
EINVAL. The wall clock stays faked by libfaketime; only the sleep is replaced, by a
wait on a lock, which CPython bounds with the real monotonic clock.
"""

from __future__ import annotations

import os
import threading
import time

if os.environ.get("FAKETIME") and os.environ.get("LD_PRELOAD", "").find("faketime") >= 0:

    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        lock = threading.Lock()
        lock.acquire()
        lock.acquire(timeout=seconds)

    time.sleep = _sleep

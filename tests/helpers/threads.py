"""Threads a test leaves behind: the ones it started that are still alive at its end."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator

__all__ = ["lingering", "no_new_threads"]


def lingering(before: set[threading.Thread], prefix: str,
              timeout: float = 5.0) -> list[threading.Thread]:
    """The threads named *prefix*... started since *before* that are still alive after
    what was dropped is collected and each had up to *timeout* seconds in all to end
    (a join: the wait ends as soon as they do)."""
    gc.collect()
    deadline = time.monotonic() + timeout
    for thread in set(threading.enumerate()) - before:
        if thread.name.startswith(prefix):
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t for t in set(threading.enumerate()) - before
            if t.name.startswith(prefix) and t.is_alive()]


@contextlib.contextmanager
def no_new_threads(prefix: str, timeout: float = 5.0) -> Iterator[None]:
    """Fail if a thread named *prefix*... started inside the block outlives it (the
    objects it made dropped and collected)."""
    before = set(threading.enumerate())
    yield
    left = lingering(before, prefix, timeout)
    assert not left, f"threads left running: {sorted(t.name for t in left)}"

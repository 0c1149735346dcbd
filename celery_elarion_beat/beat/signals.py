"""Hold SIGTERM and SIGINT back while a batch of claims is being published.

Beat stops on SIGTERM by raising ``SystemExit`` wherever the main thread is. If
that happened between winning a claim and publishing it, the occurrence would
be lost for the whole cluster (the other nodes have already moved on). Inside
:func:`deferred_signals` the handlers only note the signal; it is delivered to
the original handler as soon as the block ends. Outside the main thread (where
handlers cannot be changed) it does nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

__all__ = ["deferred_signals"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Run the block with SIGTERM/SIGINT deferred until it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, FrameType | None]] = []

    def note(signum: int, frame: FrameType | None) -> None:
        pending.append((signum, frame))

    previous: dict[int, Any] = {}
    sig: int
    try:
        for sig in map(int, _SIGNALS):
            previous[sig] = signal.signal(sig, note)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum, frame in pending[:1]:
            handler = previous.get(signum)
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)

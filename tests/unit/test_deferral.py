"""SIGTERM during a claim batch is delivered after the batch, not inside it."""

from __future__ import annotations

import os
import signal

import pytest

from celery_elarion_beat.deferral import deferred_signals


def test_sigterm_waits_for_the_block_then_reaches_the_original_handler() -> None:
    seen: list[str] = []

    def handler(signum: int, frame: object) -> None:
        seen.append("handler")
        raise SystemExit(signum)

    original = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(SystemExit):
            with deferred_signals():
                os.kill(os.getpid(), signal.SIGTERM)
                seen.append("claimed")
                seen.append("published")
        assert seen == ["claimed", "published", "handler"]
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, original)


def test_without_a_signal_nothing_happens() -> None:
    before = signal.getsignal(signal.SIGINT)
    with deferred_signals():
        pass
    assert signal.getsignal(signal.SIGINT) is before

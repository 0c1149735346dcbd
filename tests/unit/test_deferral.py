"""SIGTERM during a claim batch is delivered after the batch, not inside it."""

from __future__ import annotations

import os
import signal

import pytest

from celery_elarion_beat.beat.signals import deferred_signals


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


def test_heartbeat_and_close_finish_their_database_io_before_sigterm() -> None:
    """A SIGTERM during a heartbeat (or while the pool closes) raised SystemExit
    inside the pool in 0.1 and logged a traceback; it now waits for the I/O."""
    import uuid
    from datetime import datetime, timezone

    from celery import Celery

    from celery_elarion_beat import ClaimingScheduler, MemoryClaimStore
    from celery_elarion_beat.store.records import NodeState

    done: list[str] = []

    class SignalledStore(MemoryClaimStore):
        def heartbeat(self, state: NodeState, retention=None, live_within=None):  # type: ignore[no-untyped-def]
            os.kill(os.getpid(), signal.SIGTERM)  # the signal lands mid-I/O
            answer = super().heartbeat(state, retention, live_within)
            done.append("heartbeat")
            return answer

        def close(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            done.append("closed")

    def handler(signum: int, frame: object) -> None:  # what celery beat installs
        done.append("exit")
        raise SystemExit(signum)

    app = Celery("sig", broker=f"memory://{uuid.uuid4().hex}", set_as_current=False)
    app.conf.update(elarion_beat_dsn="memory://", beat_schedule={})
    original = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(SystemExit):
            ClaimingScheduler(app, store=SignalledStore(uuid.uuid4().hex),
                              clock=lambda: datetime.now(timezone.utc))
        assert done == ["heartbeat", "exit"]
        signal.signal(signal.SIGTERM, lambda *_: None)
        beat = ClaimingScheduler(app, store=SignalledStore(uuid.uuid4().hex))
        signal.signal(signal.SIGTERM, handler)
        done.clear()
        with pytest.raises(SystemExit):
            beat.close()
        assert done == ["closed", "exit"]
    finally:
        signal.signal(signal.SIGTERM, original)

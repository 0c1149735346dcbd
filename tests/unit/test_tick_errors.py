"""A tick that raises: one ERROR with its traceback, repeats at a low rate, beat goes on.

In process (tests/operate/test_tick_errors.py proves it on the real ``celery beat``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from celery.schedules import schedule

from celery_elarion_beat import MemoryClaimStore
from celery_elarion_beat.beat.tick_errors import REPEAT_EVERY, RETRY, TickFailures
from celery_elarion_beat.testing.hooks import FailingTickScheduler
from tests.helpers.fakes import FakeClock, make_app, published

LOGGER = "celery_elarion_beat.beat.tick_errors"


class Ticker:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def raise_at_one_place(message: str) -> None:
    raise RuntimeError(message)


def raise_at_another(message: str) -> None:
    raise RuntimeError(message)


def fail(failures: TickFailures, where: object, message: str) -> None:
    try:
        where(message)  # type: ignore[operator]
    except RuntimeError as exc:
        failures.failed(exc, 1.0)


def records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


def test_a_failure_is_logged_once_with_its_traceback_then_at_a_low_rate_with_a_count(
        caplog: pytest.LogCaptureFixture) -> None:
    ticker = Ticker()
    failures = TickFailures(monotonic=ticker)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for n in range(100):  # the message changes, the failure is the same
            fail(failures, raise_at_one_place, f"slot {n}")
            ticker.now += 1.0
        first, = records(caplog)
        assert first.levelno == logging.ERROR and first.exc_info is not None
        assert first.getMessage().startswith("beat: a tick failed, RuntimeError: slot 0")
        assert first.action == "tick-failed"  # type: ignore[attr-defined]
        ticker.now = 1000.0 + REPEAT_EVERY
        fail(failures, raise_at_one_place, "slot 100")
        _, again = records(caplog)
        assert again.levelno == logging.ERROR and again.exc_info is None
        assert "RuntimeError: slot 100 (100 times in the last 5m" in again.getMessage()
        assert again.repeats == 100  # type: ignore[attr-defined]
        fail(failures, raise_at_another, "elsewhere")  # another failure: logged in full
        *_, other = records(caplog)
        assert other.exc_info is not None and "elsewhere" in other.getMessage()
    assert failures.failed_ticks == 102


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"tickerr-{uuid.uuid4().hex}"
    yield name
    MemoryClaimStore.reset(name)


def test_a_failed_tick_does_not_stop_the_next_ones(
        namespace: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Every tick with ``boom`` due raises; ``good``, due between them, goes out; the
    sleep after a failure runs to the next entry due (RETRY when one is due already)."""
    monkeypatch.setenv("ELARION_TEST_FAIL_JOB", "boom")
    clock = FakeClock(datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc))
    app = make_app({"good": {"task": "tasks.good", "schedule": schedule(90, nowfun=clock)},
                    "boom": {"task": "tasks.boom", "schedule": schedule(60, nowfun=clock)}})
    beat = FailingTickScheduler(app, clock=clock, store=MemoryClaimStore(namespace, clock=clock))
    try:
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            clock.advance(60)
            assert beat.tick() == pytest.approx(30, abs=0.5)  # boom failed; good at 90 s
            clock.advance(30)
            beat.tick()  # good, alone
            clock.advance(30)
            beat.tick()  # boom again: counted, not logged again
            monkeypatch.setattr(beat, "populate_heap", lambda *a: raise_at_another("heap"))
            beat.schedule.touch()  # an edit: the next tick rebuilds its heap, and fails
            assert beat.tick() == RETRY  # no heap to read the next run from
        assert [m["headers"]["elarion_job"] for m in published(app)] == ["good"]
        assert len([r for r in records(caplog) if r.exc_info]) == 2  # apply, then heap
        assert beat.tick_failures.failed_ticks == 3
    finally:
        beat.close()


def test_sigterm_and_ctrl_c_still_end_beat(namespace: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock(datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc))
    app = make_app({"job": {"task": "tasks.job", "schedule": schedule(60, nowfun=clock)}})
    beat = FailingTickScheduler(app, clock=clock, store=MemoryClaimStore(namespace, clock=clock))
    try:
        for exc in (SystemExit(), KeyboardInterrupt()):
            def stop(*args: object, exc: BaseException = exc, **kwargs: object) -> None:
                raise exc

            monkeypatch.setattr(beat, "apply_entries", stop)
            beat.schedule.touch()  # the heap is rebuilt: an exit leaves it as it was
            clock.advance(60)
            with pytest.raises(type(exc)):
                beat.tick()
    finally:
        beat.close()

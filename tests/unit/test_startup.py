"""How the scheduler refuses to start (:mod:`celery_elarion_beat.beat.startup`), in process.

Built by ``celery beat`` (its Service passes ``schedule_filename``), a refusal logs one
CRITICAL line and raises SystemExit with the documented code; built directly, the
scheduler raises the error itself. The real CLI is tests/operate/test_startup_errors.py.
"""

from __future__ import annotations

import logging
import uuid

import pytest

from celery_elarion_beat import ClaimingScheduler, ConfigurationError, MemoryClaimStore
from celery_elarion_beat.beat.startup import EXIT_CONFIG, EXIT_REFUSED, EXIT_SOFTWARE
from celery_elarion_beat.exceptions import StoreRefused
from tests.helpers.fakes import make_app

BEAT = {"schedule_filename": "celerybeat-schedule"}  # what celery beat's Service passes
ENTRIES = {"tick": {"task": "t", "schedule": 5.0}}


class FailingStore(MemoryClaimStore):
    """A store whose schema step raises *error*."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(uuid.uuid4().hex)
        self.error = error
        self.closed = False

    def ensure_schema(self) -> None:
        raise self.error

    def close(self) -> None:
        self.closed = True
        super().close()


def critical(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.CRITICAL]


def test_a_refusing_database_exits_77_with_one_critical_line(
        caplog: pytest.LogCaptureFixture) -> None:
    store = FailingStore(StoreRefused("the claims database refused this node (fix it)"))
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as caught:
        ClaimingScheduler(make_app(ENTRIES), store=store, **BEAT)
    assert caught.value.code == EXIT_REFUSED and store.closed
    (line,) = critical(caplog)
    assert line.getMessage() == ("beat: cannot start: the claims database refused this node "
                                 "(fix it)")
    assert line.exc_info is None  # no traceback below DEBUG
    assert line.__dict__["action"] == "refused-start" and line.__dict__["exit_code"] == 77


def test_a_refusing_database_with_fail_closed_starts_and_records_the_outage() -> None:
    store = FailingStore(StoreRefused("refused"))
    beat = ClaimingScheduler(make_app(ENTRIES, elarion_beat_startup_errors="fail_closed"),
                             store=store, **BEAT)
    try:
        assert beat.outage.since is not None  # failing closed from the start
    finally:
        beat.close()


def test_built_directly_the_scheduler_raises_instead_of_exiting() -> None:
    with pytest.raises(StoreRefused):
        ClaimingScheduler(make_app(ENTRIES), store=FailingStore(StoreRefused("refused")))
    with pytest.raises(ConfigurationError, match="elarion_beat_claim_timeout"):
        ClaimingScheduler(make_app(ENTRIES, elarion_beat_claim_timeout="abc"))


def test_a_bad_setting_waits_for_the_real_scheduler_past_the_banner(
        caplog: pytest.LogCaptureFixture) -> None:
    """Celery builds a lazy scheduler for its banner before its logging is set up: the
    banner says the start is refused, and the real scheduler exits 78."""
    app = make_app(ENTRIES, elarion_beat_claim_timeout="abc")
    banner = ClaimingScheduler(app, lazy=True, **BEAT)
    assert "cannot start" in banner.info
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as caught:
        ClaimingScheduler(app, **BEAT)
    assert caught.value.code == EXIT_CONFIG
    (line,) = critical(caplog)
    assert line.getMessage() == ("beat: cannot start: elarion_beat_claim_timeout must be a "
                                 "number of seconds, not 'abc'")


def test_an_unexpected_error_exits_70_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    store = FailingStore(RuntimeError("a bug"))
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as caught:
        ClaimingScheduler(make_app(ENTRIES), store=store, **BEAT)
    assert caught.value.code == EXIT_SOFTWARE
    (line,) = critical(caplog)
    assert line.getMessage() == "beat: cannot start: RuntimeError: a bug"
    assert line.exc_info is not None and line.exc_info[0] is RuntimeError


def test_an_app_without_a_main_name_and_no_cluster_exits_78_naming_the_setting(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Celery()`` names no app: beat cannot tell its rows from another app's, and
    refuses to start (78) until elarion_beat_cluster is set or the app is named."""
    monkeypatch.delenv("ELARION_BEAT_CLUSTER", raising=False)
    app = make_app(ENTRIES)
    app.main = None
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as caught:
        ClaimingScheduler(app, **BEAT)
    assert caught.value.code == EXIT_CONFIG
    (line,) = critical(caplog)
    assert "elarion_beat_cluster is not set" in line.getMessage()
    assert 'Celery("proj")' in line.getMessage() and "ELARION_BEAT_CLUSTER" in line.getMessage()
    app.conf.elarion_beat_cluster = "proj"  # the fix: it starts
    ClaimingScheduler(app, store=MemoryClaimStore(uuid.uuid4().hex), **BEAT).close()

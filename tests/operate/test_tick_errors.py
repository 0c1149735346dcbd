"""A tick that raises, proven on the real ``celery beat`` CLI: one ERROR, and beat goes on.

An exception inside a tick (after start) used to end beat: Celery logged it as
CRITICAL ``beat raised exception``, and the traceback printed on the way out went
through beat's redirected stderr, one WARNING line per line of it. Now the tick logs
it once as ERROR with its traceback, repeats of the same failure at a low rate with a
count (:mod:`celery_elarion_beat.beat.tick_errors`), and beat keeps ticking. The tick
fails through the test hook ``FailingTickScheduler`` (:mod:`celery_elarion_beat.testing.hooks`):
every tick with the entry ``boom`` due raises; the entry ``tick``, due alone every
other time, still goes out.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_elarion_beat.exceptions import StoreError
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.store.states import PUBLISHED
from celery_elarion_beat.testing._harness import ProcessManager
from tests.operate.support import settings_for

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]

APP = "tests.operate.proj_startup"
FAILING = "celery_elarion_beat.testing.hooks.FailingTickScheduler"
#: generous: a celery process importing on a loaded 2-core machine
START_TIMEOUT = 120.0


@pytest.fixture
def pm(tmp_path: Path, redis_url: str) -> Iterator[ProcessManager]:
    manager = ProcessManager(tmp_path / "procs", APP, {
        "ELARION_STARTUP_BROKER": redis_url, "ELARION_STARTUP_RUN": uuid.uuid4().hex[:8]})
    try:
        yield manager
    finally:
        manager.stop_all()


def published_runs(store: PostgresClaimStore, job: str) -> int | None:
    try:
        return len([row for row in store.find_claims(job=job) if row.state == PUBLISHED])
    except StoreError:  # the table is not there yet
        return None


def test_a_failing_tick_is_one_error_with_its_traceback_and_beat_goes_on(
        pm: ProcessManager, pg_dsn: str, table_name: str) -> None:
    beat = pm.beat("failing", scheduler=FAILING, env={
        "ELARION_BEAT_LOG_FORMAT": "text", "ELARION_BEAT_DSN": pg_dsn,
        "ELARION_BEAT_TABLE": table_name, "ELARION_STARTUP_SCHEDULE": "failing-tick",
        "ELARION_TEST_FAIL_JOB": "boom"})
    store = PostgresClaimStore(settings_for(pg_dsn, table_name))
    try:
        # three runs of the good entry take 4.5 s: boom was due (and failed) 4 times
        beat.wait_ready(lambda: (published_runs(store, "tick") or 0) >= 3, START_TIMEOUT,
                        "three runs of the entry 'tick' after the failing ticks")
        assert store.find_claims(job="boom") == []  # its ticks failed before any claim
    finally:
        store.close()
    beat.sigterm()
    assert beat.wait(60) == 0, beat.tail()
    out = beat.log()
    lines = out.splitlines()
    errors = [i for i, line in enumerate(lines) if "ERROR/MainProcess" in line]
    assert len(errors) == 1, f"{len(errors)} ERROR lines\n{beat.tail(80)}"
    (at,) = errors
    assert "beat: a tick failed" in lines[at] and "RuntimeError" in lines[at], lines[at]
    assert lines[at + 1].startswith("Traceback"), beat.tail(80)
    assert out.count("Traceback") == 1, beat.tail(80)
    assert "a tick with boom due fails" in lines[at + 1 + [
        line.startswith("RuntimeError") for line in lines[at + 1:]].index(True)]
    fragments = [line for line in lines if "WARNING/MainProcess" in line
                 and ("Traceback" in line or 'File "' in line or "Error" in line)]
    assert fragments == [], "\n".join(fragments)
    assert "beat raised exception" not in out and "CRITICAL" not in out, beat.tail(80)

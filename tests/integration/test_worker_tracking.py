"""Worker-side run tracking, in process: Celery's own test worker
(``celery.contrib.testing.worker.start_worker``, what pytest-celery's in-process
``celery_worker`` fixture runs) consumes what a ClaimingScheduler published, and the
runs land on the real PostgreSQL claims table. The multi-process cases are in
tests/acceptance/test_runs.py."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.schedules import crontab

from celery_elarion_beat import (
    ClaimingScheduler,
    MemoryClaimStore,
    Outcome,
    SkipReason,
    install_worker,
    open_store,
)
from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.worker.runs import RunTracker
from tests.helpers.fakes import FakeClock

START = datetime(2026, 11, 29, 2, 59, 59, 500000, tzinfo=timezone.utc)


def _app(dsn: str, table: str, entries: dict) -> Celery:
    app = Celery(f"wt{uuid.uuid4().hex[:6]}", broker=f"memory://{uuid.uuid4().hex}",
                 set_as_current=False)
    app.conf.update(beat_schedule=entries, elarion_beat_dsn=dsn, elarion_beat_table=table,
                    elarion_beat_node="node-a", elarion_beat_events=False,
                    result_backend="cache+memory://",
                    # the memory broker's queues are one per process, whatever the URL:
                    # a queue of its own keeps another test's leftovers off this worker
                    task_default_queue=f"q-{uuid.uuid4().hex[:8]}")
    return app


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def test_runs_are_recorded_from_claim_to_finish(pg_dsn: str, table_name: str,
                                                gate: threading.Event) -> None:
    clock = FakeClock(START)
    entries = {
        "ok": {"task": "t.ok", "schedule": crontab(nowfun=clock)},
        "boom": {"task": "t.boom", "schedule": crontab(nowfun=clock)},
        "flaky": {"task": "t.flaky", "schedule": crontab(nowfun=clock)},
        "local": {"task": "t.ok", "schedule": crontab(nowfun=clock),
                  "options": {"placement": "every_node"}},
    }
    app = _app(pg_dsn, table_name, entries)
    ran: list[str] = []
    seen: list[str] = []

    @app.task(name="t.ok", bind=True)
    def ok(self) -> str:
        ran.append(self.request.id)
        seen.append(self.request.hostname)
        time.sleep(0.2)
        return "fine"

    @app.task(name="t.boom")
    def boom() -> None:
        raise ValueError("no input file")

    attempts: list[int] = []

    @app.task(name="t.flaky", bind=True, max_retries=1)
    def flaky(self) -> None:
        attempts.append(self.request.retries)
        if not self.request.retries:
            raise self.retry(countdown=0)

    tracker = install_worker(app)
    assert isinstance(tracker, RunTracker)
    beat = ClaimingScheduler(app, clock=clock)
    store = open_store(Settings.from_app(app))
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10,
                          queues=[app.conf.task_default_queue, beat.node_queue.name]) as worker:
            clock.advance(0.6)  # 03:00:00.1: every entry is due
            beat.tick()
            app.send_task("t.ok")  # not from beat: no headers, not followed
            _wait(lambda: len(ran) == 3)
            _wait(lambda: len(attempts) == 2)
            _wait(lambda: tracker.flush(0.1) and _finished(store, ("ok", "boom", "local")))
            _wait(lambda: tracker.flush(0.1) and _finished(store, ("flaky",), ("succeeded",)))
    finally:
        beat.close()
    rows = {r.job: r for r in store.find_claims()}
    store.close()
    ok_row, boom_row, local = rows["ok"], rows["boom"], rows["local"]
    # the retry carries beat's headers (Celery keeps custom headers): its run is the
    # same row, running again, then succeeded
    assert rows["flaky"].run_state == "succeeded" and rows["flaky"].run_error is None
    assert (ok_row.state, ok_row.run_state, ok_row.run_error) == ("published", "succeeded", None)
    assert ok_row.started_at >= ok_row.claimed_at and ok_row.finished_at >= ok_row.started_at
    assert 0.15 <= ok_row.runtime < 5, ok_row.runtime
    assert ok_row.worker == seen[0]  # the worker's host name, as the task saw it
    assert worker.hostname
    assert boom_row.run_state == "failed"
    assert boom_row.run_error.startswith("ValueError: no input file")
    # the every-node run has a row of its own, keyed by the run's start
    assert (local.kind, local.node, local.run_state) == ("node", "node-a", "succeeded")
    assert set(rows) - {"elarion.purge"} == {"ok", "boom", "flaky", "local"}  # nothing else


def _finished(store, jobs, states=("succeeded", "failed")) -> bool:
    rows = {r.job: r for r in store.find_claims()}
    return all(job in rows and rows[job].run_state in states for job in jobs)


def test_overlap_skip_holds_the_next_slot_until_the_run_finishes(gate: threading.Event) -> None:
    """In process, one clock: a run that waits on *gate* keeps the next two slots
    skipped (still-running); once it finishes, the following slot runs."""
    clock = FakeClock(START)
    namespace = f"wt-{uuid.uuid4().hex}"
    store = MemoryClaimStore(namespace, clock=clock)
    entries = {"report": {"task": "t.slow", "schedule": crontab(nowfun=clock),
                          "options": {"overlap": "skip"}}}
    app = _app(f"memory://{namespace}", "claims", entries)
    started = threading.Event()

    @app.task(name="t.slow")
    def slow() -> None:
        started.set()
        gate.wait(10)

    tracker = RunTracker(app, store=lambda: store)
    tracker.connect()
    beat = ClaimingScheduler(app, clock=clock, store=store)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            clock.advance(0.6)
            beat.tick()
            assert started.wait(10)
            _wait(lambda: tracker.flush(0.1) and _state(store) == "running")
            for _ in range(2):
                clock.advance(60)
                beat.tick()
            skips = beat.recorder.total(Outcome.SKIPPED, SkipReason.STILL_RUNNING)
            assert skips == 2
            gate.set()
            _wait(lambda: tracker.flush(0.1) and _state(store) == "succeeded")
            clock.advance(60)
            beat.tick()
            assert beat.recorder.total(Outcome.DISPATCHED) == 2
    finally:
        beat.close()
    states = sorted((r.occurrence.minute, r.state) for r in store.find_claims(job="report"))
    assert states == [(0, "published"), (1, "skipped"), (2, "skipped"), (3, "published")]


def _state(store) -> str | None:
    """The run state of the first slot's run."""
    rows = [r for r in store.find_claims(job="report") if r.occurrence.minute == 0]
    return rows[0].run_state if rows else None


class _Lines(logging.Handler):
    """The records of one logger (the test worker reconfigures the root logger,
    so pytest's caplog misses them)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_tasks_run_when_the_ledger_is_unreachable_and_one_line_says_so(
        pg_dsn: str, table_name: str) -> None:
    clock = FakeClock(START)
    entries = {f"job-{i}": {"task": "t.quick", "schedule": crontab(nowfun=clock)}
               for i in range(5)}
    app = _app(pg_dsn, table_name, entries)
    done: list[str] = []

    @app.task(name="t.quick", bind=True)
    def ok(self) -> None:
        done.append(self.request.id)

    # beat claims in the real database; the worker's ledger is a port nobody listens on
    dead = "postgresql://postgres@127.0.0.1:1/test"
    dead_settings = Settings.from_mapping({"elarion_beat_dsn": dead,
                                           "elarion_beat_claim_timeout": 1})
    tracker = RunTracker(app, store=lambda: open_store(dead_settings))
    tracker.connect()
    beat = ClaimingScheduler(app, clock=clock)
    lines = _Lines()
    logger = logging.getLogger("celery_elarion_beat.worker")
    logger.addHandler(lines)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10,
                          loglevel="INFO"):
            for _ in range(3):
                clock.advance(60)
                beat.tick()
            _wait(lambda: len(done) == 15, timeout=30)
            tracker.flush(10)
    finally:
        beat.close()
        logger.removeHandler(lines)
    said = [r for r in lines.records if "could not record runs" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert tracker.dropped == 30 and tracker.written == 0  # 15 starts, 15 finishes

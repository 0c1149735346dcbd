"""RunTracker in one process, driven through Celery's task signals with the memory
store: which messages it follows, how each Celery state ends a run, and that a
failing ledger costs one log line. (Real workers: tests/integration/test_worker_tracking.py
and tests/acceptance/test_runs.py.)"""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from celery import Celery, signals

from celery_elarion_beat import ClaimRequest, MemoryClaimStore
from celery_elarion_beat.exceptions import StoreUnavailable
from celery_elarion_beat.worker import RunTracker

SLOT = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)


@pytest.fixture
def app() -> Celery:
    app = Celery(f"wk{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)
    app.conf.update(elarion_beat_dsn="memory://", elarion_beat_events=False)
    return app


class _Task:
    """What the signal handlers read of a task: its app and its request (the message's
    headers become attributes of ``task.request``, as Celery makes them)."""

    def __init__(self, app: Celery, **headers: object) -> None:
        self.app = app
        self.request = SimpleNamespace(hostname="celery@w1", **headers)


def _task(app: Celery, **headers: object) -> _Task:
    return _Task(app, **headers)


def _beat_headers(job: str = "report") -> dict[str, object]:
    return {"elarion_job": job, "elarion_occurrence": "2026-11-29T03:00:00Z",
            "elarion_node": "node-a", "elarion_placement": "cluster"}


def _run(app: Celery, tracker: RunTracker, task: _Task, state: str,
         task_id: str, exc: BaseException | None = None) -> None:
    signals.task_prerun.send(sender=task, task_id=task_id, task=task)
    if exc is not None:
        signals.task_failure.send(sender=task, task_id=task_id, exception=exc)
    signals.task_postrun.send(sender=task, task_id=task_id, task=task, state=state)
    assert tracker.flush(5)


@pytest.mark.parametrize(("state", "exc", "run_state", "error"), [
    ("SUCCESS", None, "succeeded", None),
    ("FAILURE", KeyError("id"), "failed", "KeyError: 'id'"),
    ("RETRY", None, "retried", None),
    ("IGNORED", None, "succeeded", None),     # raised Ignore: ended on purpose
    ("REJECTED", None, "failed", "state REJECTED"),
])
def test_each_celery_state_ends_the_run(app: Celery, state: str, exc: BaseException | None,
                                        run_state: str, error: str | None) -> None:
    store = MemoryClaimStore(uuid.uuid4().hex)
    task_id = str(uuid.uuid4())
    store.claim("node-a", [ClaimRequest.for_slot("report", SLOT, task_id)])
    tracker = RunTracker(app, store=lambda: store)
    tracker.connect()
    _run(app, tracker, _task(app, **_beat_headers()), state, task_id, exc)
    (row,) = store.find_claims(job="report")
    assert (row.run_state, row.run_error, row.worker) == (run_state, error, "celery@w1")
    assert row.state == "published" and row.runtime is not None and row.runtime >= 0


def test_only_messages_with_beats_headers_are_followed(app: Celery) -> None:
    store = MemoryClaimStore(uuid.uuid4().hex)
    tracker = RunTracker(app, store=lambda: store)
    tracker.connect()
    _run(app, tracker, _task(app), "SUCCESS", "plain-call")
    other = Celery("another-app", broker="memory://", set_as_current=False)
    _run(app, tracker, _task(other, **_beat_headers()), "SUCCESS", "other-app")
    assert tracker.written == 0 and store.find_claims() == []


def test_an_every_node_run_gets_its_own_row(app: Celery) -> None:
    store = MemoryClaimStore(uuid.uuid4().hex)
    tracker = RunTracker(app, store=lambda: store)
    tracker.connect()
    headers = {**_beat_headers("cache"), "elarion_placement": "every_node",
               "elarion_occurrence": None}
    _run(app, tracker, _task(app, **headers), "SUCCESS", "t-1")
    (row,) = store.find_claims(job="cache")
    assert (row.kind, row.node, row.task_id, row.run_state) == ("node", "node-a", "t-1",
                                                                 "succeeded")


class _Down(MemoryClaimStore):
    def __init__(self) -> None:
        super().__init__(uuid.uuid4().hex)
        self.up = False

    def record_runs(self, reports) -> None:  # type: ignore[no-untyped-def]
        if not self.up:
            raise StoreUnavailable("the claims database is unreachable")
        super().record_runs(reports)


def test_a_ledger_that_fails_costs_one_warning_and_one_notice(
        app: Celery, caplog: pytest.LogCaptureFixture) -> None:
    store = _Down()
    tracker = RunTracker(app, store=lambda: store)
    tracker.connect()
    caplog.set_level(logging.INFO, logger="celery_elarion_beat.worker")
    for i in range(5):
        _run(app, tracker, _task(app, **_beat_headers()), "SUCCESS", f"t-{i}")
    store.up = True
    _run(app, tracker, _task(app, **_beat_headers()), "SUCCESS", "t-back")
    said = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records]
    assert said == [("WARNING", "elarion: could not record runs in the claims ledger"),
                    ("INFO", "elarion: recording runs in the claims ledger again")]
    assert tracker.dropped == 10


def test_a_full_queue_drops_and_counts(app: Celery) -> None:
    store = MemoryClaimStore(uuid.uuid4().hex)
    tracker = RunTracker(app, store=lambda: store, maxsize=1)
    tracker.connect()
    task = _task(app, **_beat_headers())
    # hold the writer: the first record waits in _write while the next ones arrive
    gate = threading.Event()
    original = store.record_runs

    def slow(reports):  # type: ignore[no-untyped-def]
        gate.wait(5)
        original(reports)

    store.record_runs = slow  # type: ignore[method-assign]
    for i in range(5):
        signals.task_prerun.send(sender=task, task_id=f"t-{i}", task=task)
    gate.set()
    tracker.flush(5)
    # one or two records reach the writer before it blocks, one waits, the rest drop
    assert tracker.dropped >= 2 and tracker.written + tracker.dropped == 5

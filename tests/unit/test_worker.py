"""RunTracker in one process, driven through Celery's task signals with the memory
store: which messages it follows, how each Celery state ends a run, and that a
failing ledger costs one log line. (Real workers: tests/integration/test_worker_tracking.py
and tests/acceptance/test_runs.py.)"""

from __future__ import annotations

import gc
import logging
import threading
import uuid
import weakref
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from celery import Celery, signals

from celery_elarion_beat import ClaimRequest, MemoryClaimStore, install_worker
from celery_elarion_beat.exceptions import StoreUnavailable
from celery_elarion_beat.worker.runs import RunTracker

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


# -- one tracker per app object, not per app name ------------------------------------
# Celery's ``celery_app`` fixture names every app ``celery.tests``: two apps of one
# process with the same ``main`` must each record into their own store.


def _named_app(main: str, namespace: str) -> Celery:
    app = Celery(main, broker="memory://", set_as_current=False)
    app.conf.update(elarion_beat_dsn=f"memory://{namespace}", elarion_beat_events=False)
    return app


def _claimed(namespace: str, task_id: str) -> MemoryClaimStore:
    store = MemoryClaimStore(namespace)
    store.claim("node-a", [ClaimRequest.for_slot("report", SLOT, task_id)])
    return store


@pytest.mark.parametrize("first_closed", [False, True], ids=["first-left", "first-closed"])
def test_two_apps_with_one_name_each_record_in_their_own_store(first_closed: bool) -> None:
    main, ns1, ns2 = f"twin-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex, uuid.uuid4().hex
    first, second = _named_app(main, ns1), _named_app(main, ns2)
    store1, store2 = _claimed(ns1, "t-1"), _claimed(ns2, "t-2")
    tracker1 = install_worker(first)
    assert tracker1 is not None
    _run(first, tracker1, _task(first, **_beat_headers()), "SUCCESS", "t-1")
    if first_closed:
        tracker1.close()
    tracker2 = install_worker(second)
    assert tracker2 is not None and tracker2 is not tracker1
    try:
        _run(second, tracker2, _task(second, **_beat_headers()), "SUCCESS", "t-2")
        assert tracker1.flush(5)
        (row2,) = store2.find_claims(job="report")
        (row1,) = store1.find_claims(job="report")
        assert (row2.task_id, row2.run_state) == ("t-2", "succeeded")
        assert (row1.task_id, row1.run_state) == ("t-1", "succeeded")  # t-2 is not there
        assert (tracker1.written, tracker2.written) == (2, 2)
    finally:
        tracker1.close()
        tracker2.close()


def test_installing_twice_keeps_one_tracker_and_one_record_per_transition() -> None:
    namespace = uuid.uuid4().hex
    app = _named_app(f"twice-{uuid.uuid4().hex[:6]}", namespace)
    store = _claimed(namespace, "t-twice")
    tracker = install_worker(app)
    assert tracker is not None
    try:
        assert install_worker(app) is tracker
        tracker.connect()  # connecting again changes nothing either
        _run(app, tracker, _task(app, **_beat_headers()), "SUCCESS", "t-twice")
        assert tracker.written == 2  # running, then succeeded: once each
        (row,) = store.find_claims(job="report")
        assert (row.task_id, row.run_state) == ("t-twice", "succeeded")
    finally:
        tracker.close()


def test_a_closed_tracker_records_nothing_more(app: Celery) -> None:
    store = MemoryClaimStore(uuid.uuid4().hex)
    tracker = RunTracker(app, store=lambda: store)
    tracker.connect()
    _run(app, tracker, _task(app, **_beat_headers()), "SUCCESS", "t-1")
    tracker.close()
    task = _task(app, **_beat_headers())
    signals.task_prerun.send(sender=task, task_id="t-2", task=task)
    signals.task_postrun.send(sender=task, task_id="t-2", task=task, state="SUCCESS")
    assert tracker.written == 2 and tracker.dropped == 0
    assert install_worker(app) is not tracker  # the app has no tracker any more


def test_the_signals_do_not_keep_a_dropped_app_alive() -> None:
    for close in (False, True):  # dropped as it is, and closed after a recorded run
        app = _named_app(f"gone-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex)
        tracker = install_worker(app)
        assert tracker is not None
        if close:
            _run(app, tracker, _task(app, **_beat_headers()), "SUCCESS", "t-gone")
            tracker.close()
        gone = weakref.ref(app)
        del app, tracker
        gc.collect()
        assert gone() is None, "something still holds the app"

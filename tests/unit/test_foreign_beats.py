"""The workers' watch for beats that claim nothing
(:mod:`celery_elarion_beat.worker.foreign_beats`), in process, on the memory store: which
messages are a foreign beat's, one ERROR per sender, the entry named, the counts
recorded, a store that fails keeps them. The real processes (a stock ``celery beat`` of
an old image beside claiming beats and a worker) are
tests/acceptance/test_foreign_beat.py.
"""

from __future__ import annotations

import logging
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from celery import signals

from celery_elarion_beat import MemoryClaimStore, StoreUnavailable, install_worker
from celery_elarion_beat.config.headers import from_foreign_beat, origin_host
from celery_elarion_beat.testing._harness import wait_until
from celery_elarion_beat.worker.foreign_beats import WATCH_ATTRIBUTE, ForeignBeatWatch
from tests.helpers.fakes import make_app

TASK = "proj.tasks.report"
ORIGIN = "gen4242@web-3"
ENTRIES = {"nightly": {"task": TASK, "schedule": 60.0},
           "hourly": {"task": TASK, "schedule": 3600.0},
           "poll": {"task": "proj.tasks.poll", "schedule": 5.0}}


@pytest.mark.parametrize(("headers", "foreign"), [
    ({"celery_beat_task": True}, True),                                # stock beat, Celery 5.7
    ({"celery_beat_task": True, "elarion_job": "nightly"}, False),     # ours
    ({"elarion_job": "nightly"}, False),
    ({}, False),                                                       # .delay(), old Celery
    ({"celery_beat_task": False}, False),
])
def test_which_messages_are_a_foreign_beats(headers: dict[str, Any], foreign: bool) -> None:
    assert from_foreign_beat(headers) is foreign


def test_the_host_of_an_origin() -> None:
    assert origin_host(ORIGIN) == "web-3" and origin_host("no-at-sign") == "no-at-sign"


class Consumer:
    """What the worker's consumer is to the signal: its app and host name (a sender)."""

    def __init__(self, app: Any, hostname: str) -> None:
        self.app, self.hostname = app, hostname


class Watched:
    """A watch on an app of its own, writing to a memory namespace of its own."""

    def __init__(self, schedule: dict[str, Any] | None = None, store: Any = None) -> None:
        self.app = make_app(ENTRIES if schedule is None else schedule,
                            elarion_beat_events=False)
        self.name = uuid.uuid4().hex
        self.store = MemoryClaimStore(self.name)
        self.watch = ForeignBeatWatch(self.app, store=store or (lambda: MemoryClaimStore(
            self.name)), interval=0.05)
        self.watch.connect()
        self.consumer = Consumer(self.app, "celery@worker-1")

    def receive(self, origin: str = ORIGIN, task: str = TASK, **headers: Any) -> None:
        """Celery's signal as the worker's consumer sends it for a received message."""
        request = SimpleNamespace(task_name=task, request_dict={
            "task": task, "origin": origin, **headers})
        signals.task_received.send(sender=self.consumer, request=request)


@pytest.fixture
def watched() -> Any:
    made = Watched()
    yield made
    made.watch.close()


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.__dict__.get("action") == "foreign-beat"]


def test_one_error_per_sender_naming_origin_task_and_entries(
        watched: Watched, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            watched.receive(celery_beat_task=True)
        watched.receive(task="proj.tasks.poll", celery_beat_task=True)
        watched.receive(origin="gen7@old-1", task="proj.tasks.other", celery_beat_task=True)
        watched.receive(celery_beat_task=True, elarion_job="nightly")  # ours: not counted
        watched.receive()  # .delay(): not counted
    first, other = errors(caplog)
    assert first.levelno == logging.ERROR
    assert (first.__dict__["origin"], first.__dict__["host"], first.__dict__["task"],
            first.__dict__["entry"], first.__dict__["worker"]) == (
        ORIGIN, "web-3", TASK, "hourly, nightly", "celery@worker-1")
    for words in (ORIGIN, TASK, "'hourly, nightly'", "beat_scheduler = \"elarion\""):
        assert words in first.getMessage(), words
    assert other.__dict__["entry"] is None
    assert "no entry of this app's beat_schedule" in other.getMessage()
    assert watched.watch.seen == 5


def test_the_counts_are_recorded_per_sender_and_task(watched: Watched) -> None:
    for _ in range(3):
        watched.receive(celery_beat_task=True)
    watched.receive(task="proj.tasks.poll", celery_beat_task=True)
    assert watched.watch.write()
    rows = {(r.origin, r.task): r for r in watched.store.foreign_beats()[1]}
    assert (rows[(ORIGIN, TASK)].count, rows[(ORIGIN, TASK)].entry) == (3, "hourly, nightly")
    assert (rows[(ORIGIN, "proj.tasks.poll")].count,
            rows[(ORIGIN, "proj.tasks.poll")].entry) == (1, "poll")
    assert rows[(ORIGIN, TASK)].worker == "celery@worker-1"
    watched.receive(celery_beat_task=True)
    assert watched.watch.write()
    assert {(r.origin, r.task): r.count for r in watched.store.foreign_beats()[1]}[
        (ORIGIN, TASK)] == 4


def test_the_writer_thread_records_without_being_asked(watched: Watched) -> None:
    watched.receive(celery_beat_task=True)
    (row,) = wait_until(lambda: watched.store.foreign_beats()[1], 5, interval=0.02,
                        message="the writer to record the sighting")
    assert row.count == 1


def test_a_store_that_fails_keeps_the_counts_and_warns_once(
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    name = uuid.uuid4().hex

    class Flaky(MemoryClaimStore):
        def record_foreign_beats(self, sightings: Any, retention: Any = None) -> None:
            calls.append("record")
            if len(calls) <= 2:
                raise StoreUnavailable("the claims database is unreachable")
            super().record_foreign_beats(sightings, retention)

    made = Watched(store=lambda: Flaky(name), schedule={})
    try:
        made.watch._stopping.set()  # no writer thread: this test writes itself
        with caplog.at_level(logging.INFO):
            made.watch.saw(ORIGIN, TASK, "w1")
            assert not made.watch.write()
            made.watch.saw(ORIGIN, TASK, "w1")
            assert not made.watch.write()
            assert made.watch.write()
        warnings = [r for r in caplog.records
                    if r.__dict__.get("action") == "foreign-beat-unrecorded"]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        assert [r.__dict__.get("action") for r in caplog.records].count(
            "foreign-beat-recorded") == 1
        (row,) = MemoryClaimStore(name).foreign_beats()[1]
        assert row.count == 2  # nothing lost
    finally:
        made.watch.close()


def test_install_worker_watches_once_per_app_whatever_track_runs_says() -> None:
    app = make_app({}, elarion_beat_events=False)
    install_worker(app, track_runs=False)
    watch = getattr(app, WATCH_ATTRIBUTE)
    install_worker(app, track_runs=False)
    assert getattr(app, WATCH_ATTRIBUTE) is watch
    # another app's messages are not this watch's
    other = Consumer(make_app({}), "celery@elsewhere")
    signals.task_received.send(sender=other, request=SimpleNamespace(
        task_name=TASK, request_dict={"celery_beat_task": True, "origin": ORIGIN}))
    assert watch.seen == 0
    watch.close()

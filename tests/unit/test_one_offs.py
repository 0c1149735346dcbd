"""Durable one-offs in-process: the API (schedule_once, cancel, ...) and the beat side
(OneOffRunner inside ClaimingScheduler) with an injected clock, the memory store and
kombu's memory broker."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery
from kombu.exceptions import OperationalError

from celery_elarion_beat import (
    ClaimingScheduler,
    ConfigurationError,
    MemoryClaimStore,
    OneOffNotFound,
    OneOffState,
    StoreUnavailable,
    cancel,
    get_one_off,
    list_one_offs,
    schedule_once,
)
from celery_elarion_beat.one_offs.api import apply_at, close_stores
from tests.helpers.fakes import FakeClock, make_app, make_scheduler, published

START = datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def namespace() -> Iterator[str]:
    name = f"unit-{uuid.uuid4().hex}"
    yield name
    close_stores()
    MemoryClaimStore.reset(name)


def one_off_app(namespace: str, **conf: Any) -> Celery:
    app = make_app({}, **conf)
    app.conf.elarion_beat_dsn = f"memory://{namespace}"

    @app.task(name="proj.tasks.remind", shared=False)
    def remind(*args: Any, **kwargs: Any) -> None:
        return None

    return app


def nodes(app: Celery, clock: FakeClock, namespace: str, count: int = 3) -> list[ClaimingScheduler]:
    out = []
    for i in range(count):
        out.append(make_scheduler(app, clock, namespace, f"node-{i}"))  # set up, not lazy
    return out


def tick_all(beats: list[ClaimingScheduler]) -> list[float]:
    return [beat.tick() for beat in beats]


def close_all(beats: list[ClaimingScheduler]) -> None:
    for beat in beats:
        beat.close()


# -- the API ---------------------------------------------------------------------------


def test_schedule_once_needs_only_the_store_and_a_key_writes_one_row(namespace: str) -> None:
    app = one_off_app(namespace)
    eta = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    first = schedule_once(app, "proj.tasks.remind", args=(1,), kwargs={"b": 2}, eta=eta,
                          options={"queue": "reminders"}, key="remind-1")
    again = schedule_once(app, "proj.tasks.remind", args=(9,), countdown=5, key="remind-1")
    assert again == first
    assert first.due == datetime(2030, 1, 1, 10, tzinfo=timezone.utc)
    assert first.state is OneOffState.SCHEDULED and dict(first.options) == {"queue": "reminders"}
    assert [o.id for o in list_one_offs(app)] == [first.id]
    assert get_one_off(app, "remind-1") == first and get_one_off(app, "nope") is None
    as_dict = first.as_dict()
    assert as_dict["due"] == "2030-01-01T10:00:00Z" and as_dict["state"] == "scheduled"
    assert "body" not in as_dict


def test_countdown_counts_from_the_store_clock(namespace: str) -> None:
    app = one_off_app(namespace)
    before = datetime.now(timezone.utc)
    row = schedule_once(app, app.tasks["proj.tasks.remind"], countdown=90)
    assert before + timedelta(seconds=89) < row.due < datetime.now(timezone.utc) + timedelta(
        seconds=91)
    shortcut = apply_at(app.tasks["proj.tasks.remind"], countdown=90, key="short")
    assert shortcut.task == "proj.tasks.remind" and shortcut.key == "short"


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"eta": datetime(2030, 1, 1)}, "eta"),
    ({"eta": datetime(2030, 1, 1, tzinfo=timezone.utc), "countdown": 5}, "countdown"),
    ({"options": {"task_id": "mine"}}, "'task_id'"),
    ({"options": {"expires": datetime(2030, 1, 1, tzinfo=timezone.utc)}}, "'expires'"),
    ({"key": ""}, "key"),
    ({"countdown": float("nan")}, "countdown"),
    ({"args": (object(),)}, "task_serializer"),
])
def test_bad_requests_are_refused_naming_what_is_wrong(namespace: str, kwargs: dict[str, Any],
                                                       named: str) -> None:
    app = one_off_app(namespace)
    with pytest.raises(ConfigurationError, match=named):
        schedule_once(app, "proj.tasks.remind", **kwargs)
    assert list_one_offs(app) == []


def test_cancel_before_due_and_unknown_ids(namespace: str, clock: FakeClock) -> None:
    app = one_off_app(namespace)
    row = schedule_once(app, "proj.tasks.remind", eta=START + timedelta(seconds=10), key="c")
    assert cancel(app, "c").state is OneOffState.CANCELLED
    with pytest.raises(OneOffNotFound):
        cancel(app, "no-such-one-off")
    beats = nodes(app, clock, namespace)
    try:
        clock.advance(20)
        tick_all(beats)
        assert published(app) == []
        assert get_one_off(app, row.id).state is OneOffState.CANCELLED  # type: ignore[union-attr]
    finally:
        close_all(beats)


# -- beat ------------------------------------------------------------------------------


def test_a_due_one_off_is_sent_once_by_three_nodes_with_its_id(namespace: str,
                                                                clock: FakeClock) -> None:
    app = one_off_app(namespace)
    beats = nodes(app, clock, namespace)
    try:
        row = schedule_once(app, "proj.tasks.remind", args=(7,), kwargs={"x": "é"},
                            eta=START + timedelta(seconds=5), options={"priority": 4})
        tick_all(beats)
        assert published(app) == []  # not before due
        clock.advance(5)
        tick_all(beats)
        tick_all(beats)
        sent = published(app)
        assert len(sent) == 1
        headers = sent[0]["headers"]
        assert headers["id"] == row.id and headers["task"] == "proj.tasks.remind"
        assert headers["elarion_one_off"] == row.id
        assert headers["argsrepr"] == "[7]" and "'x': 'é'" in headers["kwargsrepr"]
        assert sent[0]["properties"]["priority"] == 4
        done = get_one_off(app, row.id)
        assert done is not None and done.state is OneOffState.PUBLISHED
        assert headers["elarion_node"] == done.node and done.attempts == 1
    finally:
        close_all(beats)


def test_the_sleep_reaches_the_next_one_off(namespace: str, clock: FakeClock) -> None:
    app = one_off_app(namespace)
    (beat,) = nodes(app, clock, namespace, count=1)
    try:
        assert beat.tick() > 1.5  # nothing scheduled: no one-second polling
        schedule_once(app, "proj.tasks.remind", eta=START + timedelta(seconds=1.5))
        beat.tick()  # the wake that sees it (the memory store: the next wake)
        assert beat.tick() == pytest.approx(1.5, abs=0.01)  # less the real time the tick took
    finally:
        beat.close()


def test_an_unregistered_task_fails_alone_with_one_error_line(
        namespace: str, clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    app = one_off_app(namespace)
    (beat,) = nodes(app, clock, namespace, count=1)
    try:
        bad = schedule_once(app, "proj.tasks.gone", eta=START - timedelta(seconds=2))
        good = schedule_once(app, "proj.tasks.remind", eta=START - timedelta(seconds=1))
        with caplog.at_level(logging.ERROR):
            beat.tick()
        assert [m["headers"]["id"] for m in published(app)] == [good.id]
        failed = get_one_off(app, bad.id)
        assert failed is not None and failed.state is OneOffState.FAILED
        assert failed.error == f"task 'proj.tasks.gone' is not registered in app '{app.main}'"
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert [(getattr(r, "action", None), getattr(r, "one_off", None))
                for r in errors] == [("one-off-failed", bad.id)]
    finally:
        beat.close()


def test_an_expired_lease_is_taken_over_with_the_same_task_id(namespace: str,
                                                              clock: FakeClock) -> None:
    app = one_off_app(namespace, elarion_beat_one_offs_lease=30)
    beats = nodes(app, clock, namespace, count=2)
    try:
        row = schedule_once(app, "proj.tasks.remind", eta=START)
        # node-0 leases it and dies before publishing
        died = MemoryClaimStore(namespace, clock=clock)
        assert [x.id for x in died.lease_one_offs("node-0", limit=10,
                                                  lease=timedelta(seconds=30))] == [row.id]
        tick_all(beats)
        assert published(app) == []  # the lease holds
        clock.advance(31)
        tick_all(beats)
        sent = published(app)
        assert [m["headers"]["id"] for m in sent] == [row.id]
        done = get_one_off(app, row.id)
        assert done is not None and done.state is OneOffState.PUBLISHED and done.attempts == 2
        died.finish_one_offs("node-0", published=[], failed={row.id: "late"})
        assert get_one_off(app, row.id).state is OneOffState.PUBLISHED  # type: ignore[union-attr]
    finally:
        close_all(beats)


def test_a_broker_failure_releases_the_batch_and_it_is_sent_later(
        namespace: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    app = one_off_app(namespace)
    (beat,) = nodes(app, clock, namespace, count=1)
    try:
        rows = [schedule_once(app, "proj.tasks.remind", eta=START - timedelta(seconds=s))
                for s in (3, 2, 1)]
        real = app.send_task
        calls: list[str] = []

        def down(*args: Any, **kwargs: Any) -> Any:
            calls.append(kwargs["task_id"])
            raise OperationalError("broker unreachable")

        monkeypatch.setattr(app, "send_task", down)
        beat.tick()
        assert len(calls) == 1  # the rest of the batch is not tried against a dead broker
        assert {o.state for o in list_one_offs(app)} == {OneOffState.SCHEDULED}
        monkeypatch.setattr(app, "send_task", real)
        clock.advance(1)
        beat.tick()
        assert sorted(m["headers"]["id"] for m in published(app)) == sorted(r.id for r in rows)
        assert {o.state for o in list_one_offs(app)} == {OneOffState.PUBLISHED}
    finally:
        beat.close()


def test_one_offs_off_leaves_them_to_other_nodes(namespace: str, clock: FakeClock) -> None:
    app = one_off_app(namespace, elarion_beat_one_offs=False)
    (beat,) = nodes(app, clock, namespace, count=1)
    try:
        row = schedule_once(app, "proj.tasks.remind", eta=START - timedelta(seconds=1))
        beat.tick()
        assert published(app) == []
        assert get_one_off(app, row.id).state is OneOffState.SCHEDULED  # type: ignore[union-attr]
    finally:
        beat.close()


def test_the_purge_pass_deletes_old_finished_one_offs(namespace: str, clock: FakeClock) -> None:
    app = one_off_app(namespace, elarion_beat_claim_retention=3600)
    (beat,) = nodes(app, clock, namespace, count=1)
    try:
        sent = schedule_once(app, "proj.tasks.remind", eta=START - timedelta(seconds=1))
        waiting = schedule_once(app, "proj.tasks.remind", eta=START + timedelta(days=1))
        beat.tick()
        assert get_one_off(app, sent.id).state is OneOffState.PUBLISHED  # type: ignore[union-attr]
        clock.advance(3601)
        assert beat.maintenance is not None
        beat.maintenance.purge()
        assert get_one_off(app, sent.id) is None
        assert get_one_off(app, waiting.id) is not None
    finally:
        beat.close()


def test_the_pause_hook_marks_the_leased_batch(namespace: str, clock: FakeClock,
                                               tmp_path: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from celery_elarion_beat.testing.hooks import PausingScheduler

    marker = tmp_path / "paused.json"
    monkeypatch.setenv("ELARION_TEST_PAUSE_ONE_OFF", "1")
    monkeypatch.setenv("ELARION_TEST_PAUSE_MARKER", str(marker))
    monkeypatch.setenv("ELARION_TEST_PAUSE_SECONDS", "0")
    app = one_off_app(namespace)
    app.conf.elarion_beat_node = "node-p"
    beat = PausingScheduler(app, clock=clock, store=MemoryClaimStore(namespace, clock=clock))
    try:
        row = schedule_once(app, "proj.tasks.remind", eta=START - timedelta(seconds=1))
        beat.tick()
        assert json.loads(marker.read_text())["one_offs"] == [row.id]
        assert [m["headers"]["id"] for m in published(app)] == [row.id]
    finally:
        beat.close()


def test_without_the_table_beat_starts_and_warns_once(tmp_path: Any, clock: FakeClock,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """elarion_beat_create_table = False on tables of a version before one-offs: beat
    runs its schedule, and says once that no one-offs are sent."""
    from sqlalchemy import create_engine, text

    dsn = f"sqlite:///{tmp_path / 'claims.db'}"
    app = make_app({})
    app.conf.elarion_beat_dsn = dsn
    first = ClaimingScheduler(app, clock=clock).store
    first.ensure_schema()
    first.close()
    engine = create_engine(dsn)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE elarion_scheduler_oneoffs"))
    engine.dispose()
    app.conf.elarion_beat_create_table = False
    with caplog.at_level(logging.WARNING):  # the first look is at start
        beat = ClaimingScheduler(app, clock=clock)
    try:
        with caplog.at_level(logging.WARNING):
            beat.tick()
            beat.tick()
        missing = [r for r in caplog.records if getattr(r, "action", None) == "one-offs-missing"]
        assert len(missing) == 1 and "elarion_scheduler_oneoffs" in missing[0].getMessage()
        with pytest.raises(Exception, match="elarion_scheduler_oneoffs does not exist"):
            schedule_once(app, "proj.tasks.remind")
    finally:
        beat.close()
        close_stores()


def test_a_failing_database_is_asked_once_per_heartbeat_interval(namespace: str,
                                                                 clock: FakeClock) -> None:
    """In an outage each question may hang for the claim timeout: the runner asks once
    per heartbeat interval (every-node entries must not wait for it at every wake), and
    at the next wake once the claims reach the database again."""
    from celery_elarion_beat.config.settings import Settings
    from celery_elarion_beat.one_offs.runner import OneOffRunner

    class Down(MemoryClaimStore):
        shared = True  # as a database: beat polls
        asked = 0

        def next_one_off_due(self) -> Any:
            Down.asked += 1
            raise StoreUnavailable("the claims database does not answer")

        lease_one_offs = next_one_off_due  # type: ignore[assignment]

    app = one_off_app(namespace, elarion_beat_heartbeat_interval=30.0)
    store = Down(namespace, clock=clock)
    now = [1000.0]
    runner = OneOffRunner(app, Settings.from_app(app), lambda: store, clock,
                          monotonic=lambda: now[0])
    waits = []
    for _ in range(60):  # one minute of one-second wakes
        waits.append(runner.run())
        now[0] += 1.0
    assert Down.asked == 2  # at 0 s and at 30 s
    assert max(waits) <= 1.0  # elarion_beat_one_offs_poll: beat still wakes each second
    runner.database_back()
    runner.run()
    assert Down.asked == 3

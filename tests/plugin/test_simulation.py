"""The plugin's fixtures and ``simulate`` beyond the DST weekends: a cluster driven
tick by tick, time zones of the span, overlap and jitter options, the wake-up cap."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.schedules import crontab, schedule

from celery_elarion_beat import MemoryClaimStore
from celery_elarion_beat.testing import BeatClock, Cluster, SimulationError, simulate

UTC = timezone.utc


def user_app(entries: dict[str, dict[str, object]], **conf: object) -> Celery:
    app = Celery(f"sim{uuid.uuid4().hex[:6]}", broker="redis://redis.invalid:6379/0",
                 set_as_current=False)
    app.conf.update(beat_schedule=entries, **conf)
    return app


def test_a_cluster_moves_with_its_clock(beat_clock: BeatClock,
                                        beat_cluster: Callable[..., Cluster],
                                        claims_store: MemoryClaimStore) -> None:
    app = user_app({"report": {"task": "t.report", "schedule": crontab(minute=0)}})
    beat_clock.set("2026-11-29T02:59:58Z")
    cluster = beat_cluster(3, app=app)
    assert 0 < cluster.tick() <= 2.0  # nothing due: every node sleeps until 03:00
    assert cluster.sent() == []
    cluster.advance(1)
    assert cluster.sent() == []  # 02:59:59
    cluster.advance(timedelta(hours=1, seconds=1))  # through 03:00, up to 04:00 included
    sent = cluster.sent()
    assert [(o.job, o.slot) for o in sent] == [
        ("report", datetime(2026, 11, 29, 3, tzinfo=UTC)),
        ("report", datetime(2026, 11, 29, 4, tzinfo=UTC))]
    assert beat_clock() == datetime(2026, 11, 29, 4, tzinfo=UTC)
    claims = sorted((r.occurrence, r.node) for r in claims_store.find_claims()
                    if r.job == "report")
    assert claims == [(o.slot, o.node) for o in sent]  # the winners sent, nobody else


def test_a_span_without_offset_is_read_in_tz() -> None:
    app = user_app({"hourly": {"task": "t.h", "schedule": crontab(minute=0)}})  # UTC app
    berlin = simulate(app, "2026-01-10T00:00", "2026-01-10T03:00", tz="Europe/Berlin")
    assert [o.slot for o in berlin] == [datetime(2026, 1, 9, 23, tzinfo=UTC),
                                        datetime(2026, 1, 10, 0, tzinfo=UTC),
                                        datetime(2026, 1, 10, 1, tzinfo=UTC)]
    explicit = simulate(app, "2026-01-10T00:00Z", datetime(2026, 1, 10, 2, tzinfo=UTC))
    assert [o.slot.hour for o in explicit] == [0, 1]  # an offset wins over tz; end excluded


def test_overlap_skip_entries_run_every_slot() -> None:
    # no task runs in a simulation: each claimed run counts as finished at once
    app = user_app({"sync": {"task": "t.sync", "schedule": crontab(minute="*/10"),
                             "options": {"overlap": "skip"}}})
    sent = simulate(app, "2026-05-01T00:00Z", "2026-05-01T01:00Z")
    assert [o.slot.minute for o in sent] == [0, 10, 20, 30, 40, 50]


def test_jitter_delays_each_slot_by_one_offset_for_the_cluster() -> None:
    app = user_app({"spread": {"task": "t.s", "schedule": crontab(minute=0),
                               "options": {"jitter": timedelta(seconds=60)}}})
    first = simulate(app, "2026-05-01T00:00Z", "2026-05-01T06:00Z")
    again = simulate(app, "2026-05-01T00:00Z", "2026-05-01T06:00Z", nodes=2)
    assert [o.slot.hour for o in first] == [0, 1, 2, 3, 4, 5]
    offsets = [o.sent_at - o.slot for o in first]
    assert all(timedelta(0) <= d < timedelta(seconds=60) for d in offsets)
    assert len(set(offsets)) > 1  # an offset per slot, not one for the job
    assert [o.sent_at for o in again] == [o.sent_at for o in first]  # whatever the nodes


class _AlwaysDue(schedule):
    """A broken schedule: due on every tick, with no time to the next run."""

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        return True, 0.0


def test_a_schedule_due_on_every_tick_stops_at_the_cap() -> None:
    app = user_app({"spin": {"task": "t.spin",
                             "schedule": _AlwaysDue(timedelta(seconds=1))}})
    with pytest.raises(SimulationError, match="woke 300 times"):
        simulate(app, "2026-05-01T00:00Z", "2026-05-02T00:00Z", nodes=1, max_wakeups=300)


def test_an_empty_schedule_sends_nothing_at_once() -> None:
    app = user_app({})
    assert simulate(app, "2026-05-01T00:00Z", "2026-05-08T00:00Z", max_wakeups=1000) == []


def test_a_simulation_does_not_warn_that_the_memory_store_is_local(
        caplog: pytest.LogCaptureFixture) -> None:
    """simulate() runs on the memory store on purpose: the user's test log must not
    carry beat's "memory:// coordinates this process only" warning once per node."""
    app = user_app({"m": {"task": "t.m", "schedule": crontab(minute="*/30")}})
    with caplog.at_level(logging.WARNING):
        sent = simulate(app, "2026-01-01T00:00Z", "2026-01-01T02:00Z", nodes=3)
    assert len(sent) == 4
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []

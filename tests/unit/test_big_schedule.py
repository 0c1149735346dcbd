"""A tick costs what is due, not the size of the schedule; an edit is still noticed.

Stock beat compares the whole schedule with a copy on every tick. Here the entries
count how often they are compared and asked whether they are due, so a test can
tell a tick that walks 3,000 entries from one that touches only the due ones."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from celery.beat import ScheduleEntry
from celery.schedules import crontab

from celery_elarion_beat import ClaimingScheduler, MemoryClaimStore
from tests.helpers.fakes import FakeClock, make_app, published

N = 3000


class CountingEntry(ScheduleEntry):
    compared = 0
    asked = 0

    def __eq__(self, other: object) -> bool:
        CountingEntry.compared += 1
        return super().__eq__(other)

    __hash__ = ScheduleEntry.__hash__  # type: ignore[assignment]

    def is_due(self) -> Any:
        CountingEntry.asked += 1
        return super().is_due()


class CountingScheduler(ClaimingScheduler):
    Entry = CountingEntry


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc))


@pytest.fixture
def node(clock: FakeClock) -> Iterator[CountingScheduler]:
    namespace = f"unit-{uuid.uuid4().hex}"
    # N entries due once a day at 14:xx, and one every minute
    entries: dict[str, Any] = {
        f"daily-{i}": {"task": "tasks.work",
                       "schedule": crontab(minute=i % 60, hour=14, nowfun=clock)}
        for i in range(N)}
    entries["minutely"] = {"task": "tasks.work", "schedule": crontab(nowfun=clock)}
    app = make_app(entries, elarion_beat_node="node-a", elarion_beat_events=False)
    scheduler = CountingScheduler(app, clock=clock,
                                  store=MemoryClaimStore(namespace, clock=clock))
    scheduler.tick()  # the first tick builds the heap
    yield scheduler
    scheduler.close()
    MemoryClaimStore.reset(namespace)


def counted(scheduler: CountingScheduler, ticks: int = 1) -> tuple[int, int]:
    CountingEntry.compared = CountingEntry.asked = 0
    for _ in range(ticks):
        scheduler.tick()
    return CountingEntry.compared, CountingEntry.asked


def sent_jobs(scheduler: ClaimingScheduler) -> list[str]:
    return [m["headers"]["elarion_job"] for m in published(scheduler.app)]


def test_a_tick_that_sends_nothing_touches_no_entry(node: CountingScheduler,
                                                    clock: FakeClock) -> None:
    clock.advance(10)  # 02:59:40: nothing due
    assert counted(node, ticks=20) == (0, 0)


def test_a_tick_that_sends_touches_only_what_is_due(node: CountingScheduler,
                                                    clock: FakeClock) -> None:
    published(node.app)
    clock.advance(30.2)  # 03:00:00.2: only "minutely" is due
    compared, asked = counted(node)
    assert sent_jobs(node) == ["minutely"]
    assert compared < 10 and asked <= 2, (compared, asked)  # not N


def test_every_kind_of_edit_is_noticed_at_the_next_tick(node: CountingScheduler,
                                                         clock: FakeClock) -> None:
    published(node.app)
    clock.advance(10)  # 02:59:40; a new entry runs from its next slot, as in stock beat
    # an entry added through the mapping
    node.schedule["added"] = node.Entry(name="added", task="tasks.work", app=node.app,
                                        schedule=crontab(nowfun=clock))
    # one replaced by update_from_dict, one by merge_inplace (beat's own merge), one removed
    node.update_from_dict({"daily-1": {"task": "tasks.work",
                                       "schedule": crontab(minute=0, hour=3, nowfun=clock)}})
    del node.schedule["minutely"]
    clock.advance(20.2)  # 03:00:00.2
    node.tick()
    assert sorted(sent_jobs(node)) == ["added", "daily-1"]
    merged = {name: {"task": e.task, "schedule": e.schedule}
              for name, e in node.schedule.items()}
    merged["daily-2"]["schedule"] = crontab(minute=1, hour=3, nowfun=clock)
    node.merge_inplace(merged)
    clock.advance(60)  # 03:01:00.2
    node.tick()
    assert sorted(sent_jobs(node)) == ["added", "daily-2"]
    # the whole schedule replaced
    node.schedule = {"only": node.Entry(name="only", task="tasks.work", app=node.app,
                                        schedule=crontab(nowfun=clock))}
    clock.advance(60)
    node.tick()
    assert sent_jobs(node) == ["only"]


def test_the_heartbeat_fingerprint_follows_an_edit(node: CountingScheduler) -> None:
    assert node.maintenance is not None
    before = node.maintenance.state()
    CountingEntry.compared = 0
    assert node.maintenance.state().fingerprint == before.fingerprint
    node.schedule["added"] = node.Entry(name="added", task="tasks.other", app=node.app,
                                        schedule=crontab(minute=5))
    after = node.maintenance.state()
    assert after.fingerprint != before.fingerprint
    assert "added" in after.entries and "added" not in before.entries

"""name_occurrence, window_length, slot_task_id and Occurrence."""

from __future__ import annotations

import math
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from celery.schedules import crontab, schedule, solar

from celery_elarion_beat import ClaimKind, Occurrence, cron, name_occurrence, slot_task_id
from celery_elarion_beat.schedules.slots import window_length

from .slot_helpers import BERLIN, app_in, utc

NOW = utc(2026, 10, 25, 1, 20, 30, 250000)  # 02:20:30.25 CET, the second 02:20 in Berlin


def test_crontab_is_a_slot() -> None:
    occ = name_occurrence("job", crontab(minute="*/15", app=app_in(BERLIN)), NOW, tolerance=1.0)
    assert occ.kind is ClaimKind.SLOT and occ.window is None
    assert occ.slot == utc(2026, 10, 25, 1, 15)  # 02:15 CET (every hour: its own slot)
    assert occ.label() == "slot 2026-10-25T01:15:00Z"


def test_solar_is_a_slot() -> None:
    s = solar("sunrise", 52.52, 13.405, app=app_in("UTC"))
    occ = name_occurrence("job", s, utc(2026, 6, 21, 12), tolerance=1.0)
    assert occ.kind is ClaimKind.SLOT
    # Berlin sunrise 2026-06-21: 04:43 CEST = 02:43Z
    assert utc(2026, 6, 21, 2, 42) <= occ.slot <= utc(2026, 6, 21, 2, 44)


def test_cron_is_a_slot() -> None:
    occ = name_occurrence("job", cron("0 */5 * * * *", tz=BERLIN), NOW, tolerance=1.0)
    assert occ.kind is ClaimKind.SLOT and occ.slot == utc(2026, 10, 25, 1, 20)


@pytest.mark.parametrize(("run_every", "tolerance", "window"), [
    (timedelta(minutes=10), 5.0, timedelta(minutes=9, seconds=55)),  # 600 s - 5 s
    (timedelta(minutes=10), 120.0, timedelta(minutes=9)),  # capped at 10%: 600 - 60
    (timedelta(minutes=10), 0.0, timedelta(minutes=10)),
    (30, 1.0, timedelta(seconds=29)),  # a number of seconds, as in beat_schedule
    (timedelta(hours=24), 2.5, timedelta(hours=24) - timedelta(seconds=2.5)),
    (timedelta(seconds=5), 1.0, timedelta(seconds=4.5)),  # 10% of 5 s is 0.5 s
])
def test_interval_is_a_window(run_every, tolerance, window) -> None:
    occ = name_occurrence("job", schedule(run_every=run_every), NOW, tolerance=tolerance)
    assert occ.kind is ClaimKind.WINDOW and occ.slot is None
    assert occ.window == window


def test_window_length_is_never_shorter_than_90_percent() -> None:
    for seconds in (2, 7, 60, 3600, 86400):
        interval = timedelta(seconds=seconds)
        for tolerance in (0.0, 0.5, 1.0, 30.0, 1e9):
            window = window_length(interval, tolerance)
            assert interval * 0.9 <= window <= interval
            assert window == interval - min(timedelta(seconds=tolerance), interval * 0.1)


class _OwnSlots:
    """A custom schedule that names its own slots (naive, with microseconds)."""

    def elarion_slot(self, now: datetime) -> datetime:
        return datetime(2026, 1, 1, 12, 0, 0, 987654)  # naive: taken as UTC


def test_custom_schedule_with_its_own_slot() -> None:
    occ = name_occurrence("job", _OwnSlots(), NOW, tolerance=1.0)
    assert occ.kind is ClaimKind.SLOT and occ.slot == utc(2026, 1, 1, 12, 0, 0)


class _Opaque:
    """A custom schedule that says nothing about its instants."""


@pytest.mark.parametrize(("next_due", "window"), [
    (30, timedelta(seconds=29)),  # its own interval, less the 1 s tolerance
    (30.0, timedelta(seconds=29)),
    (600, timedelta(seconds=599)),
    (5, timedelta(seconds=4.5)),
    (None, timedelta(seconds=1)),  # no answer: the minimum window
    (0, timedelta(seconds=1)),
    (0.2, timedelta(seconds=1)),
    (-7, timedelta(seconds=1)),
])
def test_other_custom_schedule_falls_back_to_a_window(next_due, window) -> None:
    occ = name_occurrence("job", _Opaque(), NOW, tolerance=1.0, next_due=next_due)
    assert occ.kind is ClaimKind.WINDOW and occ.window == window


@pytest.mark.parametrize("next_due", [
    math.nan, math.inf, -math.inf, 1e16, 10**400, timedelta(seconds=30), "soon", object()])
def test_odd_next_due_never_crashes(next_due) -> None:
    # A custom schedule's odd "seconds to next run" must not stop its entry from being named.
    occ = name_occurrence("job", _Opaque(), NOW, tolerance=1.0, next_due=next_due)
    assert occ.kind is ClaimKind.WINDOW
    assert timedelta(seconds=1) <= occ.window <= timedelta(days=366)


def test_timedelta_next_due_is_read_as_seconds() -> None:
    occ = name_occurrence("job", _Opaque(), NOW, tolerance=1.0, next_due=timedelta(minutes=1))
    assert occ.window == timedelta(seconds=59)


def test_slot_task_id_is_a_deterministic_uuid5() -> None:
    slot = utc(2026, 10, 25, 1, 15)
    task_id = slot_task_id("job", slot)
    assert uuid.UUID(task_id).version == 5
    assert slot_task_id("job", slot) == task_id
    # the same instant in any representation, and sub-second noise, give the same id
    assert slot_task_id("job", slot.astimezone(timezone(timedelta(hours=-5)))) == task_id
    assert slot_task_id("job", slot.replace(tzinfo=None)) == task_id
    assert slot_task_id("job", slot + timedelta(microseconds=999)) == task_id
    # another job or another slot: another id
    assert slot_task_id("other", slot) != task_id
    assert slot_task_id("job", slot + timedelta(seconds=1)) != task_id
    assert slot_task_id("job", slot + timedelta(hours=1)) != task_id  # the other 02:15


def test_occurrence_validates_itself() -> None:
    with pytest.raises(ValueError):
        Occurrence("job", ClaimKind.SLOT)
    with pytest.raises(ValueError):
        Occurrence("job", ClaimKind.WINDOW)
    with pytest.raises(ValueError):
        Occurrence("job", ClaimKind.WINDOW, window=timedelta(0))
    window = Occurrence("job", ClaimKind.WINDOW, window=timedelta(seconds=9.5))
    assert window.label() == "window 9.5s"
    assert str(ClaimKind.SLOT) == "slot" and str(ClaimKind.WINDOW) == "window"

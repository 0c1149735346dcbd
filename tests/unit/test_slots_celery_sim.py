"""Celery's REAL crontab.is_due, driven over daylight-saving days, against crontab_slot.

A simulated beat ticks every 7-20 s (jittered) with ``nowfun`` returning its own
clock; whenever Celery says the entry is due, we name the slot for that moment.
Then:

* each slot is at or before the firing and less than one period before it;
* distinct firings name distinct slots;
* every slot is an instant the crontab really has (minute-by-minute reference);
* Celery fires every scheduled instant, except that it may skip the second
  instant of a repeated hour (it computes the next run in wall time);
* a node started at another moment names the same slots.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab

from celery_elarion_beat.schedules.slots import crontab_slot

from .slot_helpers import (
    BERLIN,
    BERLIN_FALL,
    BERLIN_SPRING,
    NEW_YORK,
    NY_FALL,
    NY_SPRING,
    Node,
    app_in,
    celery_fires_in_the_gap_at_the_jump,
    celery_loops_in_the_repeated_hour,
    crontab_instants,
    jittered,
    run_beat,
    second_instants,
)

DAYS = [
    pytest.param(BERLIN, BERLIN_SPRING, id="berlin-spring"),
    pytest.param(BERLIN, BERLIN_FALL, id="berlin-fall"),
    pytest.param(NEW_YORK, NY_SPRING, id="newyork-spring"),
    pytest.param(NEW_YORK, NY_FALL, id="newyork-fall"),
]

# (crontab kwargs, period: the longest gap between two instants on an ordinary day)
CRONTABS = [
    pytest.param(dict(minute=30, hour=2), timedelta(days=1), id="daily-0230"),
    pytest.param(dict(minute=30, hour=1), timedelta(days=1), id="daily-0130"),
    pytest.param(dict(minute=0), timedelta(hours=1), id="hourly"),
    pytest.param(dict(minute="*/15"), timedelta(minutes=15), id="quarter"),
    pytest.param(dict(minute="*/15", hour="0-4"), timedelta(hours=19, minutes=15),
                 id="quarter-0to4"),
]


def _simulate(tzname: str, kwargs: dict, start: datetime, end: datetime, seed: int) -> Node:
    node = Node(crontab(app=app_in(tzname), **kwargs), start=start, tz=ZoneInfo(tzname))
    run_beat(node, end, jittered(seed, 7, 20))
    return node


@pytest.mark.parametrize(("kwargs", "period"), CRONTABS)
@pytest.mark.parametrize(("tzname", "transition"), DAYS)
def test_celery_firings_name_distinct_real_slots(tzname, transition, kwargs, period) -> None:
    start, end = transition - timedelta(hours=3), transition + timedelta(hours=5)
    node = _simulate(tzname, kwargs, start, end, seed=1)
    c = node.schedule
    slots = [crontab_slot(c, fired) for fired in node.fires]

    for fired, slot in zip(node.fires, slots):
        assert slot <= fired, (fired, slot)
        assert fired - slot < period, (fired, slot)
    assert len(set(slots)) == len(slots), f"two firings share a slot: {slots}"

    reference = crontab_instants(c, tzname, start - period, end)
    assert set(slots) <= set(reference), sorted(set(slots) - set(reference))

    # Celery fires every instant after its start and before the last tick's reach,
    # except perhaps the second instants of a repeated hour.
    expected = {i for i in reference if start < i <= end - timedelta(seconds=20)}
    missed = expected - set(slots)
    assert missed <= second_instants(tzname, start, end), sorted(missed)


@pytest.mark.parametrize(("kwargs", "period"), CRONTABS)
@pytest.mark.parametrize(("tzname", "transition"), DAYS)
@pytest.mark.parametrize("offset_minutes", [61, 197])  # before and just after the transition
def test_a_node_started_later_names_the_same_slots(tzname, transition, kwargs, period,
                                                    offset_minutes) -> None:
    start, end = transition - timedelta(hours=3), transition + timedelta(hours=5)
    early = _simulate(tzname, kwargs, start, end, seed=2)
    late_start = start + timedelta(minutes=offset_minutes, seconds=17)
    late = _simulate(tzname, kwargs, late_start, end, seed=3)

    early_slots = {crontab_slot(early.schedule, t) for t in early.fires}
    late_slots = {crontab_slot(late.schedule, t) for t in late.fires}
    window = second_instants(tzname, start, end)

    def comparable(slots: set[datetime]) -> set[datetime]:
        # Instants after both started and before both stopped; the second instants of a
        # repeated hour are left out (Celery fires those or not depending on its history).
        return {s for s in slots if late_start < s <= end - timedelta(seconds=20)} - window

    assert comparable(early_slots) == comparable(late_slots)
    # Whatever the late node fires at all, the early node names alike or never fired.
    for t in late.fires:
        slot = crontab_slot(late.schedule, t)
        assert slot in early_slots or slot in window or slot <= late_start, (t, slot)


def test_celery_firing_in_the_gap_and_its_slot() -> None:
    # Berlin, crontab(minute=30, hour=2) on 2026-03-29, asked every 7-20 s: Celery 5.5.2
    # and later resolve the missing 02:30 to 03:30 CEST = 01:30Z and fire then; earlier
    # versions fire at the first tick after the jump. The slot is the jump, 01:00Z.
    node = _simulate(BERLIN, dict(minute=30, hour=2), BERLIN_SPRING - timedelta(hours=2),
                     BERLIN_SPRING + timedelta(hours=3), seed=4)
    assert len(node.fires) == 1
    fired = node.fires[0]
    sent = BERLIN_SPRING if celery_fires_in_the_gap_at_the_jump() else (
        BERLIN_SPRING + timedelta(minutes=30))
    assert sent <= fired < sent + timedelta(seconds=20)
    assert crontab_slot(node.schedule, fired) == BERLIN_SPRING


@pytest.mark.parametrize(("kwargs", "expected_minutes", "looping_only"), [
    # Not every hour: the repeated 02:xx CET are no slots; they collapse onto the last
    # first-instant slot, 02:45 CEST = 00:45Z, then 03:00 CET = 02:00Z.
    pytest.param(dict(minute="*/15", hour="0-4"), [-15, 60], [], id="quarter-0to4"),
    # Every hour: 02:00..02:45 CET are slots of their own (01:00Z..01:45Z), then 02:00Z;
    # 02:00 CET, ten minutes before the start, is fired only by a Celery that loops.
    pytest.param(dict(minute="*/15"), [0, 15, 30, 45, 60], [0], id="quarter"),
])
def test_node_started_in_the_repeated_hour(kwargs, expected_minutes, looping_only) -> None:
    """Berlin, 2026-10-25: a node starts at 01:10Z = 02:10 CET, inside the repeated hour.

    Its last_run_at then carries fold=1. Celery 5.5.2 and later drop it in their ffwd
    arithmetic (``dt.replace(...) + timedelta(0)`` gives fold=0), compute the next run
    in the FIRST 02:xx, in the past, and say "due, next in 0 s" at every tick until the
    repeated hour is over; earlier versions fire the next matching wall times of the
    second pass. The slots absorb both: however many times Celery fires, the firings
    name only these instants, so the claims let one run per slot through.
    """
    node = _simulate(BERLIN, kwargs, BERLIN_FALL + timedelta(minutes=10),
                     BERLIN_FALL + timedelta(hours=1, minutes=10), seed=5)
    slots = [crontab_slot(node.schedule, t) for t in node.fires]
    if not celery_loops_in_the_repeated_hour():
        expected_minutes = [m for m in expected_minutes if m not in looping_only]
    assert sorted(set(slots)) == [BERLIN_FALL + timedelta(minutes=m) for m in expected_minutes]
    for fired, slot in zip(node.fires, slots):
        assert slot <= fired
    assert slots == sorted(slots)  # never back to an earlier slot

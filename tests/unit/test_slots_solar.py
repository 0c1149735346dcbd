"""solar_slot: the latest solar event at or before now, as a whole second, the same
on every node whatever its now.

The expected times are almanac values (sunrise/sunset with the upper limb and
34' refraction, as Celery's solar uses), to the minute; solar noon is
12:00 UTC - longitude/15 h - equation of time.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import ephem
import pytest
from celery.schedules import solar

from celery_elarion_beat.schedules.slots import solar_slot

from .slot_helpers import app_in, utc

BERLIN = (52.52, 13.405)
NEW_YORK = (40.7128, -74.006)
SYDNEY = (-33.8688, 151.2093)
TROMSO = (69.6496, 18.956)

ALMANAC = [
    # Berlin, 2026-06-21: sunrise 04:43 CEST, sunset 21:33 CEST
    pytest.param("sunrise", BERLIN, utc(2026, 6, 21, 12), utc(2026, 6, 21, 2, 43),
                 id="berlin-sunrise"),
    pytest.param("sunset", BERLIN, utc(2026, 6, 21, 23), utc(2026, 6, 21, 19, 33),
                 id="berlin-sunset"),
    # New York, 2026-12-21: sunrise 07:16 EST, sunset 16:32 EST
    pytest.param("sunrise", NEW_YORK, utc(2026, 12, 21, 15), utc(2026, 12, 21, 12, 16),
                 id="newyork-sunrise"),
    pytest.param("sunset", NEW_YORK, utc(2026, 12, 22, 1), utc(2026, 12, 21, 21, 32),
                 id="newyork-sunset"),
    # solar noon = 12:00Z - lon/15 h - EoT; Dec 21: EoT = +1.8 min
    #   New York: 12:00 + 4 h 56.0 min - 1.8 min = 16:54Z
    #   Sydney:   12:00 - 10 h 04.8 min - 1.8 min = 01:53Z
    pytest.param("solar_noon", NEW_YORK, utc(2026, 12, 21, 20), utc(2026, 12, 21, 16, 54),
                 id="newyork-noon"),
    pytest.param("solar_noon", SYDNEY, utc(2026, 12, 21, 5), utc(2026, 12, 21, 1, 53),
                 id="sydney-noon"),
    # the event of the day before, when today's has not happened yet (Berlin 2026-06-20: 04:43 CEST)
    pytest.param("sunrise", BERLIN, utc(2026, 6, 21, 2, 30), utc(2026, 6, 20, 2, 43),
                 id="berlin-sunrise-not-yet"),
]


def _solar(event: str, place: tuple[float, float]) -> solar:
    return solar(event, *place, app=app_in("UTC"))


def _ephem_event(s: solar, start: datetime) -> datetime:
    """The first event of *s* after *start*, straight from ephem (to the microsecond)."""
    kwargs = {"use_center": True} if s.use_center else {}
    search = getattr(s.cal.copy(), s.method)
    found = search(ephem.Sun(), start=ephem.Date(start.replace(tzinfo=None)), **kwargs)
    return found.datetime().replace(tzinfo=start.tzinfo)


@pytest.mark.parametrize(("event", "place", "now", "expected_minute"), ALMANAC)
def test_matches_the_almanac(event, place, now, expected_minute) -> None:
    slot = solar_slot(_solar(event, place), now)
    assert slot.microsecond == 0 and slot.utcoffset() == timedelta(0)
    assert abs(slot - (expected_minute + timedelta(seconds=30))) <= timedelta(seconds=90), slot
    assert slot <= now


CASES = [
    ("sunrise", BERLIN, utc(2026, 6, 21)),
    ("sunset", NEW_YORK, utc(2026, 12, 21)),
    ("solar_noon", SYDNEY, utc(2026, 12, 20)),
    ("dawn_civil", BERLIN, utc(2026, 3, 29)),
    ("dusk_astronomical", SYDNEY, utc(2026, 6, 21)),
    ("sunrise", TROMSO, utc(2026, 1, 20)),  # a few days after the polar night
]


@pytest.mark.parametrize(("event", "place", "day"), CASES, ids=lambda v: str(v)[:10])
def test_same_second_for_every_now_until_the_next_event(event, place, day) -> None:
    s = _solar(event, place)
    first = _ephem_event(s, day)
    following = _ephem_event(s, first + timedelta(hours=2))
    expected = (first + timedelta(milliseconds=500)).replace(microsecond=0)  # nearest second
    rng = random.Random(f"{event}{place}{day}")
    gap = (following - first).total_seconds()
    offsets = [0, 0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 0.9, 1.0, 1.5, 60, 3600, gap - 2]
    offsets += [rng.uniform(0, gap - 2) for _ in range(40)]
    got = {solar_slot(s, first + timedelta(seconds=o)) for o in offsets}
    assert got == {expected}
    # and the next event is a slot of its own
    assert solar_slot(s, following + timedelta(seconds=1)) == (
        following + timedelta(milliseconds=500)).replace(microsecond=0)


@pytest.mark.parametrize(("event", "place", "day"), CASES, ids=lambda v: str(v)[:10])
def test_celery_firing_at_the_event_names_that_event(event, place, day) -> None:
    """Drive Celery's REAL solar.is_due in 10 ms steps across the event, from several
    last_run_at values (ephem's estimate drifts by milliseconds with its start): the
    moment Celery fires, and any moment after, names the same second, today's event."""
    s = _solar(event, place)
    event_at = _ephem_event(s, day)
    expected = (event_at + timedelta(milliseconds=500)).replace(microsecond=0)
    clock = [event_at]
    s.nowfun = lambda: clock[0]
    for hours_before in (1, 5, 11, 17):
        last_run_at = event_at - timedelta(hours=hours_before, seconds=13)
        clock[0] = event_at - timedelta(milliseconds=300)
        while not s.is_due(last_run_at)[0]:
            clock[0] += timedelta(milliseconds=10)
            assert clock[0] < event_at + timedelta(seconds=1), "celery never fired"
        fired = clock[0]
        for late in (0, 0.005, 0.05, 0.1, 0.15, 0.3, 1, 30):
            assert solar_slot(s, fired + timedelta(seconds=late)) == expected, (hours_before, late)


def test_consecutive_days_are_distinct_slots() -> None:
    s = _solar("sunrise", BERLIN)
    slots = [solar_slot(s, utc(2026, 3, 20, 12) + timedelta(days=d)) for d in range(14)]
    assert len(set(slots)) == 14
    for earlier, later in zip(slots, slots[1:]):
        # one day apart, give or take the few minutes sunrise moves
        assert timedelta(hours=23, minutes=50) < later - earlier < timedelta(hours=24, minutes=10)

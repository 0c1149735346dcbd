"""crontab_slot: the latest instant <= now at which a Celery crontab fires.

Every expected slot below is worked out by hand from the calendar; the comment on
each row gives the wall time it comes from. Offsets: CET = UTC+1, CEST = UTC+2,
EST = UTC-5, EDT = UTC-4. 2026-03-29, 2026-10-25, 2026-03-08 and 2026-11-01 are
Sundays; 2026-01-01 is a Thursday.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
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
    app_in,
    reference_crontab_slot,
    utc,
)

# (crontab kwargs, now, expected slot), all in UTC
BERLIN_ROWS = [
    # -- crontab(minute=30, hour=2): daily 02:30 --------------------------------------
    pytest.param(dict(minute=30, hour=2), utc(2026, 3, 28, 12, 0), utc(2026, 3, 28, 1, 30),
                 id="daily-0230-ordinary-day"),  # 02:30 CET Sat
    pytest.param(dict(minute=30, hour=2), utc(2026, 3, 29, 0, 59, 59), utc(2026, 3, 28, 1, 30),
                 id="daily-0230-just-before-gap"),  # 01:59:59 CET: today's 02:30 not yet
    pytest.param(dict(minute=30, hour=2), utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 0),
                 id="daily-0230-gap-maps-to-jump"),  # 02:30 does not exist: 03:00 CEST = 01:00Z
    pytest.param(dict(minute=30, hour=2), utc(2026, 3, 29, 1, 30, 15), utc(2026, 3, 29, 1, 0),
                 id="daily-0230-gap-when-celery-fires"),  # celery fires at 03:30 CEST
    pytest.param(dict(minute=30, hour=2), utc(2026, 3, 30, 0, 29, 59), utc(2026, 3, 29, 1, 0),
                 id="daily-0230-day-after-gap-before"),
    pytest.param(dict(minute=30, hour=2), utc(2026, 3, 30, 0, 30), utc(2026, 3, 30, 0, 30),
                 id="daily-0230-day-after-gap"),  # 02:30 CEST
    pytest.param(dict(minute=30, hour=2), utc(2026, 10, 25, 0, 29, 59), utc(2026, 10, 24, 0, 30),
                 id="daily-0230-before-overlap"),  # 02:30 CEST Sat
    pytest.param(dict(minute=30, hour=2), utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 0, 30),
                 id="daily-0230-overlap-first"),  # first 02:30 (CEST)
    pytest.param(dict(minute=30, hour=2), utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 0, 30),
                 id="daily-0230-overlap-second-is-not-a-slot"),  # second 02:30 (CET)
    pytest.param(dict(minute=30, hour=2), utc(2026, 10, 25, 23, 0), utc(2026, 10, 25, 0, 30),
                 id="daily-0230-overlap-day-evening"),
    pytest.param(dict(minute=30, hour=2), utc(2026, 10, 26, 1, 30), utc(2026, 10, 26, 1, 30),
                 id="daily-0230-after-overlap"),  # 02:30 CET Mon
    # -- crontab(minute=0): hourly, all 24 hours -> both instants of a repeated hour -----
    pytest.param(dict(minute=0), utc(2026, 3, 29, 0, 59, 59), utc(2026, 3, 29, 0, 0),
                 id="hourly-before-gap"),  # 01:00 CET
    pytest.param(dict(minute=0), utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 0),
                 id="hourly-gap"),  # 02:00 (skipped) and 03:00 CEST are both 01:00Z
    pytest.param(dict(minute=0), utc(2026, 3, 29, 1, 59, 59), utc(2026, 3, 29, 1, 0),
                 id="hourly-after-gap"),
    pytest.param(dict(minute=0), utc(2026, 3, 29, 2, 0), utc(2026, 3, 29, 2, 0),
                 id="hourly-0400-cest"),
    pytest.param(dict(minute=0), utc(2026, 10, 25, 0, 59, 59), utc(2026, 10, 25, 0, 0),
                 id="hourly-overlap-first"),  # 02:00 CEST
    pytest.param(dict(minute=0), utc(2026, 10, 25, 1, 0), utc(2026, 10, 25, 1, 0),
                 id="hourly-overlap-second"),  # 02:00 CET: a slot of its own
    pytest.param(dict(minute=0), utc(2026, 10, 25, 1, 59, 59), utc(2026, 10, 25, 1, 0),
                 id="hourly-overlap-second-late"),
    pytest.param(dict(minute=0), utc(2026, 10, 25, 2, 0), utc(2026, 10, 25, 2, 0),
                 id="hourly-after-overlap"),  # 03:00 CET
    # -- crontab(minute='*/15') --------------------------------------------------------
    pytest.param(dict(minute="*/15"), utc(2026, 3, 29, 0, 59, 59), utc(2026, 3, 29, 0, 45),
                 id="quarter-before-gap"),  # 01:45 CET
    pytest.param(dict(minute="*/15"), utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 0),
                 id="quarter-gap-collapses"),  # 02:00..02:45 and 03:00 CEST: one instant
    pytest.param(dict(minute="*/15"), utc(2026, 3, 29, 1, 14, 59), utc(2026, 3, 29, 1, 0),
                 id="quarter-gap-collapses-late"),
    pytest.param(dict(minute="*/15"), utc(2026, 3, 29, 1, 15), utc(2026, 3, 29, 1, 15),
                 id="quarter-after-gap"),  # 03:15 CEST
    pytest.param(dict(minute="*/15"), utc(2026, 10, 25, 0, 50), utc(2026, 10, 25, 0, 45),
                 id="quarter-overlap-first"),  # 02:45 CEST
    pytest.param(dict(minute="*/15"), utc(2026, 10, 25, 1, 20), utc(2026, 10, 25, 1, 15),
                 id="quarter-overlap-second"),  # 02:15 CET (all hours: second instant too)
    # -- crontab(minute='*/15', hour='1-3'): not every hour -> first instant only ------
    pytest.param(dict(minute="*/15", hour="1-3"), utc(2026, 10, 25, 1, 20),
                 utc(2026, 10, 25, 0, 45), id="quarter-1to3-overlap-second-skipped"),
    pytest.param(dict(minute="*/15", hour="1-3"), utc(2026, 10, 25, 2, 0),
                 utc(2026, 10, 25, 2, 0), id="quarter-1to3-after-overlap"),  # 03:00 CET
    pytest.param(dict(minute="*/15", hour="1-3"), utc(2026, 3, 29, 1, 5),
                 utc(2026, 3, 29, 1, 0), id="quarter-1to3-gap"),
    # -- every minute of 2 o'clock: all 60 skipped minutes map to the jump, exactly ----
    pytest.param(dict(minute="*", hour=2), utc(2026, 3, 29, 1, 33, 24, 990979),
                 utc(2026, 3, 29, 1, 0, 0), id="minutely-hour2-gap-exact-second"),
    pytest.param(dict(minute="*", hour=2), utc(2026, 3, 29, 4, 14, 51), utc(2026, 3, 29, 1, 0, 0),
                 id="minutely-hour2-gap-later"),
    pytest.param(dict(minute="*", hour=2), utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 0, 59),
                 id="minutely-hour2-overlap-second-skipped"),  # 02:59 CEST
    # -- 03:00 is not repeated in Berlin --------------------------------------------------
    pytest.param(dict(minute=0, hour=3), utc(2026, 10, 25, 1, 59), utc(2026, 10, 24, 1, 0),
                 id="daily-0300-before"),  # 03:00 CEST Sat
    pytest.param(dict(minute=0, hour=3), utc(2026, 10, 25, 2, 0), utc(2026, 10, 25, 2, 0),
                 id="daily-0300-fall-day"),  # 03:00 CET
    pytest.param(dict(minute=0, hour=3), utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 0),
                 id="daily-0300-spring-day"),  # 03:00 CEST
    # -- day of month -----------------------------------------------------------------------
    pytest.param(dict(minute=0, hour=0, day_of_month=31), utc(2026, 4, 15, 12),
                 utc(2026, 3, 30, 22, 0), id="31st-march"),  # Mar 31 00:00 CEST
    pytest.param(dict(minute=0, hour=0, day_of_month=31), utc(2026, 3, 30, 21, 59, 59),
                 utc(2026, 1, 30, 23, 0), id="31st-skips-february"),  # Jan 31 00:00 CET
    pytest.param(dict(minute=0, hour=0, day_of_month=31), utc(2026, 12, 30, 23, 0),
                 utc(2026, 12, 30, 23, 0), id="31st-december-exact"),  # Dec 31 00:00 CET
    pytest.param(dict(minute=0, hour=0, day_of_month=31), utc(2026, 12, 30, 22, 59, 59),
                 utc(2026, 10, 30, 23, 0), id="31st-skips-november"),  # Oct 31 00:00 CET
    # -- month of year ----------------------------------------------------------------------
    pytest.param(dict(minute=0, hour=12, month_of_year="2,8"), utc(2026, 4, 15),
                 utc(2026, 2, 28, 11, 0), id="feb-aug-noon-april"),  # Feb 28 12:00 CET
    pytest.param(dict(minute=0, hour=12, month_of_year="2,8"), utc(2026, 8, 1, 9, 59, 59),
                 utc(2026, 2, 28, 11, 0), id="feb-aug-noon-aug1-before"),
    pytest.param(dict(minute=0, hour=12, month_of_year="2,8"), utc(2026, 8, 1, 10, 0),
                 utc(2026, 8, 1, 10, 0), id="feb-aug-noon-aug1"),  # 12:00 CEST
    pytest.param(dict(minute=0, hour=12, month_of_year="2,8"), utc(2026, 12, 1),
                 utc(2026, 8, 31, 10, 0), id="feb-aug-noon-december"),  # Aug 31 12:00 CEST
    # -- day of week ------------------------------------------------------------------------
    pytest.param(dict(minute=0, hour=9, day_of_week="mon-fri"), utc(2026, 3, 29, 12),
                 utc(2026, 3, 27, 8, 0), id="weekdays-sunday"),  # Fri 09:00 CET
    pytest.param(dict(minute=0, hour=9, day_of_week="mon-fri"), utc(2026, 3, 30, 6, 59, 59),
                 utc(2026, 3, 27, 8, 0), id="weekdays-monday-early"),
    pytest.param(dict(minute=0, hour=9, day_of_week="mon-fri"), utc(2026, 3, 30, 7, 0),
                 utc(2026, 3, 30, 7, 0), id="weekdays-monday"),  # Mon 09:00 CEST
]

NEW_YORK_ROWS = [
    # -- crontab(minute=30, hour=2): 02:30 is skipped in spring, NOT repeated in fall ---------
    pytest.param(dict(minute=30, hour=2), utc(2026, 3, 8, 6, 59, 59), utc(2026, 3, 7, 7, 30),
                 id="daily-0230-before-gap"),  # Sat 02:30 EST
    pytest.param(dict(minute=30, hour=2), utc(2026, 3, 8, 7, 0), utc(2026, 3, 8, 7, 0),
                 id="daily-0230-gap-maps-to-jump"),  # 03:00 EDT
    pytest.param(dict(minute=30, hour=2), utc(2026, 3, 9, 6, 30), utc(2026, 3, 9, 6, 30),
                 id="daily-0230-after-gap"),  # 02:30 EDT
    pytest.param(dict(minute=30, hour=2), utc(2026, 11, 1, 7, 29, 59), utc(2026, 10, 31, 6, 30),
                 id="daily-0230-fall-before"),  # Sat 02:30 EDT
    pytest.param(dict(minute=30, hour=2), utc(2026, 11, 1, 7, 30), utc(2026, 11, 1, 7, 30),
                 id="daily-0230-fall-day"),  # 02:30 EST, happens once
    # -- crontab(minute=30, hour=1): 01:30 happens twice on Nov 1 -----------------------------
    pytest.param(dict(minute=30, hour=1), utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 5, 30),
                 id="daily-0130-overlap-first"),  # 01:30 EDT
    pytest.param(dict(minute=30, hour=1), utc(2026, 11, 1, 6, 45), utc(2026, 11, 1, 5, 30),
                 id="daily-0130-overlap-second-is-not-a-slot"),  # 01:30 EST ignored
    # -- crontab(minute=30): every hour, so both 01:30s --------------------------------------
    pytest.param(dict(minute=30), utc(2026, 11, 1, 6, 15), utc(2026, 11, 1, 5, 30),
                 id="hourly30-overlap-between"),  # 01:15 EST: last was 01:30 EDT
    pytest.param(dict(minute=30), utc(2026, 11, 1, 6, 45), utc(2026, 11, 1, 6, 30),
                 id="hourly30-overlap-second"),  # 01:30 EST
    pytest.param(dict(minute=30), utc(2026, 3, 8, 6, 59), utc(2026, 3, 8, 6, 30),
                 id="hourly30-before-gap"),  # 01:30 EST
    pytest.param(dict(minute=30), utc(2026, 3, 8, 7, 10), utc(2026, 3, 8, 7, 0),
                 id="hourly30-gap"),  # 02:30 does not exist: the jump, 03:00 EDT = 07:00Z
    pytest.param(dict(minute=30), utc(2026, 3, 8, 7, 30), utc(2026, 3, 8, 7, 30),
                 id="hourly30-after-gap"),  # 03:30 EDT
    # -- every other hour (not all hours) ------------------------------------------------------
    pytest.param(dict(minute=0, hour="*/2"), utc(2026, 11, 1, 6, 30), utc(2026, 11, 1, 4, 0),
                 id="two-hourly-fall"),  # 00:00 EDT
    pytest.param(dict(minute=0, hour="*/2"), utc(2026, 11, 1, 7, 0), utc(2026, 11, 1, 7, 0),
                 id="two-hourly-fall-0200"),  # 02:00 EST
    pytest.param(dict(minute=0, hour=2), utc(2026, 3, 8, 7, 0, 1), utc(2026, 3, 8, 7, 0),
                 id="daily-0200-gap"),  # 02:00 does not exist -> 03:00 EDT
    # -- first Sunday of the month (Celery: day of month AND day of week) -----------------------
    pytest.param(dict(minute=30, hour=4, day_of_week="sun", day_of_month="1-7"),
                 utc(2026, 11, 1, 12), utc(2026, 11, 1, 9, 30),
                 id="first-sunday-nov"),  # 04:30 EST
    pytest.param(dict(minute=30, hour=4, day_of_week="sun", day_of_month="1-7"),
                 utc(2026, 11, 1, 9, 29), utc(2026, 10, 4, 8, 30),
                 id="first-sunday-oct"),  # 04:30 EDT
    # -- Feb 29 ---------------------------------------------------------------------------
    pytest.param(dict(minute=0, hour=0, day_of_month=29, month_of_year=2), utc(2026, 4, 15),
                 utc(2024, 2, 29, 5, 0), id="feb29-2024"),  # 00:00 EST
    pytest.param(dict(minute=0, hour=0, day_of_month=29, month_of_year=2),
                 utc(2028, 2, 29, 4, 59, 59), utc(2024, 2, 29, 5, 0), id="feb29-2028-before"),
    pytest.param(dict(minute=0, hour=0, day_of_month=29, month_of_year=2), utc(2028, 2, 29, 5, 0),
                 utc(2028, 2, 29, 5, 0), id="feb29-2028"),
]

UTC_ROWS = [
    # Friday the 13th, with Celery's AND: 2026 has Feb 13, Mar 13 and Nov 13 on Fridays.
    # (With cron's OR it would be Friday Oct 30.)
    pytest.param(dict(minute=0, hour=0, day_of_week="fri", day_of_month=13), utc(2026, 10, 31),
                 utc(2026, 3, 13, 0, 0), id="friday-13th-and"),
    pytest.param(dict(minute=0, hour=0, day_of_week="fri", day_of_month=13), utc(2026, 12, 1),
                 utc(2026, 11, 13, 0, 0), id="friday-13th-november"),
    # Feb 29 that is also a Monday: 2016-02-29 (next: 2044).
    pytest.param(dict(minute=0, hour=0, day_of_week="mon", day_of_month=29, month_of_year=2),
                 utc(2026, 4, 15), utc(2016, 2, 29, 0, 0), id="feb29-monday"),
    pytest.param(dict(minute="*/5"), utc(2026, 5, 1, 10, 7, 30, 123456), utc(2026, 5, 1, 10, 5),
                 id="five-minutely-utc"),
    pytest.param(dict(minute="*/5"), utc(2026, 5, 1, 10, 5), utc(2026, 5, 1, 10, 5),
                 id="five-minutely-exact-instant-is-its-own-slot"),
    pytest.param(dict(minute=59, hour=23, day_of_month=31, month_of_year=12),
                 utc(2026, 12, 31, 23, 58), utc(2025, 12, 31, 23, 59),
                 id="new-years-eve-last-minute"),
]


def _check(tzname: str, kwargs: dict, now: datetime, expected: datetime) -> None:
    c = crontab(app=app_in(tzname), **kwargs)
    got = crontab_slot(c, now)
    assert got == expected, f"{c!r} in {tzname} at {now}: got {got}, want {expected}"
    assert got.tzinfo is not None and got.utcoffset() == timedelta(0)
    assert got.microsecond == 0


@pytest.mark.parametrize(("kwargs", "now", "expected"), BERLIN_ROWS)
def test_berlin(kwargs: dict, now: datetime, expected: datetime) -> None:
    _check(BERLIN, kwargs, now, expected)


@pytest.mark.parametrize(("kwargs", "now", "expected"), NEW_YORK_ROWS)
def test_new_york(kwargs: dict, now: datetime, expected: datetime) -> None:
    _check(NEW_YORK, kwargs, now, expected)


@pytest.mark.parametrize(("kwargs", "now", "expected"), UTC_ROWS)
def test_utc(kwargs: dict, now: datetime, expected: datetime) -> None:
    _check("UTC", kwargs, now, expected)


def test_now_in_any_representation_gives_the_same_slot() -> None:
    # 2026-10-25 01:20Z = 02:20 CET (second instant) = 03:20 in UTC+2 = naive 01:20 (UTC).
    c = crontab(minute="*/15", app=app_in(BERLIN))
    aware = utc(2026, 10, 25, 1, 20)
    forms = [aware, aware.astimezone(ZoneInfo(BERLIN)),
             aware.astimezone(timezone(timedelta(hours=2))), aware.replace(tzinfo=None)]
    assert {crontab_slot(c, now) for now in forms} == {utc(2026, 10, 25, 1, 15)}


@pytest.mark.parametrize("tzname,transition", [
    (BERLIN, BERLIN_SPRING), (BERLIN, BERLIN_FALL), (NEW_YORK, NY_SPRING), (NEW_YORK, NY_FALL),
    ("Australia/Lord_Howe", datetime(2026, 4, 4, 15, 0, tzinfo=timezone.utc)),  # 30-minute shift
    ("Australia/Lord_Howe", datetime(2026, 10, 3, 15, 30, tzinfo=timezone.utc)),
])
@pytest.mark.parametrize("kwargs", [
    dict(minute=30, hour=2), dict(minute=0), dict(minute="*/15"), dict(minute="*/15", hour="1-3"),
    dict(minute="*", hour=2), dict(minute="5,35", hour="*/2"), dict(minute=59, hour=1),
    dict(minute=0, hour="2,3"), dict(minute=45, hour=1),
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_matches_minute_by_minute_reference_around_transitions(tzname, transition, kwargs) -> None:
    """crontab_slot agrees with a brute-force, minute-by-minute reading of the spec
    for random moments within 4 hours of each transition."""
    c = crontab(app=app_in(tzname), **kwargs)
    rng = random.Random(f"{tzname}{transition}{kwargs}")
    for _ in range(12):
        now = transition + timedelta(seconds=rng.uniform(-4 * 3600, 4 * 3600))
        assert crontab_slot(c, now) == reference_crontab_slot(c, tzname, now), now


def test_slot_is_stable_between_instants() -> None:
    # Every now from one instant up to (not including) the next names that instant.
    c = crontab(minute="*/15", app=app_in(BERLIN))
    instant = utc(2026, 10, 25, 1, 15)  # 02:15 CET (second instant)
    for seconds in (0, 0.000001, 1, 59.5, 600, 899.999999):
        assert crontab_slot(c, instant + timedelta(seconds=seconds)) == instant
    assert crontab_slot(c, instant - timedelta(microseconds=1)) == utc(2026, 10, 25, 1, 0)


def test_rare_schedule_is_found_quickly() -> None:
    # Feb 29 on a Monday, searched from 2043: 2016-02-29 is 27 years back.
    c = crontab(minute=0, hour=0, day_of_week="mon", day_of_month=29, month_of_year=2,
                app=app_in(BERLIN))
    assert crontab_slot(c, utc(2043, 12, 31)) == utc(2016, 2, 28, 23, 0)  # 00:00 CET
    assert crontab_slot(c, utc(2044, 3, 1)) == utc(2044, 2, 28, 23, 0)

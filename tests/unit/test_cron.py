"""cron: 5 fields = standard cron, 6 fields = SECONDS FIRST, in its own time zone.

croniter alone reads a sixth field as seconds LAST; the tests below show both
readings side by side so that nobody gets a silent surprise. Expected instants are
worked out by hand (CET = UTC+1, CEST = UTC+2; 2026-01-01 is a Thursday).
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_elarion_beat import ConfigurationError, cron
from celery_elarion_beat.schedules.cron import _SPANS
from celery_elarion_beat.schedules.slots import ClaimKind, name_occurrence

from .slot_helpers import (
    BERLIN,
    BERLIN_FALL,
    BERLIN_SPRING,
    NEW_YORK,
    NY_FALL,
    NY_SPRING,
    UTC,
    app_in,
    cron_instants,
    utc,
)

ONE_SECOND = timedelta(seconds=1)
ONE_MICROSECOND = timedelta(microseconds=1)


def _walk(c: cron, start: datetime, count: int) -> list[datetime]:
    out, t = [], start
    for _ in range(count):
        t = c.next_after(t)
        out.append(t)
    return out


# -- seconds first ----------------------------------------------------------------------


def test_six_fields_every_ten_seconds() -> None:
    c = cron("*/10 * * * * *")
    start = utc(2026, 1, 1, 0, 0, 0)
    assert _walk(c, start, 4) == [utc(2026, 1, 1, 0, 0, s) for s in (10, 20, 30, 40)]
    assert c.elarion_slot(utc(2026, 1, 1, 0, 0, 15)) == utc(2026, 1, 1, 0, 0, 10)
    assert c.elarion_slot(utc(2026, 1, 1, 0, 0, 10)) == utc(2026, 1, 1, 0, 0, 10)
    assert c.elarion_slot(utc(2026, 1, 1, 0, 0, 9, 999999)) == utc(2026, 1, 1, 0, 0, 0)
    # croniter alone reads the same text as "minute */10 ... second *": every second.
    assert croniter("*/10 * * * * *", start.replace(tzinfo=None)).get_next(datetime) == \
        datetime(2026, 1, 1, 0, 0, 1)


def test_six_fields_daily_at_three() -> None:
    c = cron("0 0 3 * * *")  # second 0, minute 0, hour 3: 03:00:00 every day
    start = utc(2026, 1, 1, 12, 0)
    assert _walk(c, start, 3) == [utc(2026, 1, d, 3, 0, 0) for d in (2, 3, 4)]
    assert c.elarion_slot(utc(2026, 1, 3, 2, 59, 59)) == utc(2026, 1, 2, 3, 0, 0)
    assert c.elarion_slot(utc(2026, 1, 3, 3, 0, 3)) == utc(2026, 1, 3, 3, 0, 0)
    # not at second 3, not at minute 3, not on day 3 at midnight
    for t in _walk(c, utc(2026, 1, 1), 40):
        assert (t.hour, t.minute, t.second) == (3, 0, 0)
    # croniter alone: "minute 0, hour 0, day 3, second *": 2026-01-03 00:00:00, 00:00:01, ...
    alone = croniter("0 0 3 * * *", start.replace(tzinfo=None))
    assert [alone.get_next(datetime) for _ in range(2)] == [
        datetime(2026, 1, 3, 0, 0, 0), datetime(2026, 1, 3, 0, 0, 1)]


def test_six_fields_weekday_is_the_last_field() -> None:
    c = cron("30 0 3 * * 5")  # 03:00:30 on Fridays; 2026-01-02 is a Friday
    assert _walk(c, utc(2026, 1, 1), 2) == [utc(2026, 1, 2, 3, 0, 30), utc(2026, 1, 9, 3, 0, 30)]


def test_five_fields_are_standard_cron() -> None:
    c = cron("0 3 * * *")  # minute 0, hour 3
    assert _walk(c, utc(2026, 1, 1, 12), 2) == [utc(2026, 1, 2, 3, 0), utc(2026, 1, 3, 3, 0)]
    assert c.elarion_slot(utc(2026, 1, 2, 3, 0, 0)) == utc(2026, 1, 2, 3, 0)
    assert c.elarion_slot(utc(2026, 1, 2, 2, 59, 59, 999999)) == utc(2026, 1, 1, 3, 0)
    assert not c.with_seconds and cron("0 0 3 * * *").with_seconds


def test_five_and_six_field_forms_agree() -> None:
    five, six = cron("*/15 9-17 * * mon-fri"), cron("0 */15 9-17 * * mon-fri")
    start = utc(2026, 1, 1, 16, 50)
    assert _walk(five, start, 20) == _walk(six, start, 20)
    # Fri 2026-01-02 17:45 is the last of the week; next Mon 2026-01-05 09:00
    assert five.elarion_slot(utc(2026, 1, 4, 12)) == utc(2026, 1, 2, 17, 45)
    assert five.next_after(utc(2026, 1, 4, 12)) == utc(2026, 1, 5, 9, 0)


def test_day_of_month_or_day_of_week_as_in_cron() -> None:
    # cron (unlike Celery's crontab) runs when EITHER day field matches: the 13th or Fridays.
    c = cron("0 0 13 * 5")
    assert _walk(c, utc(2026, 1, 1), 4) == [
        utc(2026, 1, 2), utc(2026, 1, 9), utc(2026, 1, 13), utc(2026, 1, 16)]


# -- time zones and daylight saving time -----------------------------------------------------

BERLIN_ROWS = [
    # 03:00:00 CET / CEST every day
    pytest.param("0 0 3 * * *", utc(2026, 3, 28, 12), utc(2026, 3, 28, 2, 0), id="0300-cet"),
    pytest.param("0 0 3 * * *", utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 0), id="0300-cest"),
    # 02:30:00: missing on Mar 29 (runs at the jump, 03:00 CEST = 01:00Z), twice on Oct 25
    # (runs at the first, 02:30 CEST = 00:30Z)
    pytest.param("0 30 2 * * *", utc(2026, 3, 29, 0, 59, 59), utc(2026, 3, 28, 1, 30),
                 id="0230-before-gap"),
    pytest.param("0 30 2 * * *", utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 0), id="0230-gap"),
    pytest.param("0 30 2 * * *", utc(2026, 3, 29, 12), utc(2026, 3, 29, 1, 0), id="0230-gap-later"),
    pytest.param("0 30 2 * * *", utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 0, 30),
                 id="0230-first"),
    pytest.param("0 30 2 * * *", utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 0, 30),
                 id="0230-second-is-not-a-slot"),
    pytest.param("0 30 2 * * *", utc(2026, 10, 26, 1, 30), utc(2026, 10, 26, 1, 30),
                 id="0230-after"),
    pytest.param("30 2 * * *", utc(2026, 10, 25, 1, 45), utc(2026, 10, 25, 0, 30),
                 id="five-field-0230-second-is-not-a-slot"),
    # hour '*' follows the clock: both 02:00s on Oct 25 ...
    pytest.param("0 0 * * * *", utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 1, 0),
                 id="hourly-second"),
    pytest.param("0 0 * * * *", utc(2026, 10, 25, 0, 59, 59), utc(2026, 10, 25, 0, 0),
                 id="hourly-first"),
    # ... and no run for the missing 02:30 on Mar 29 (01:30 CET = 00:30Z, then 03:30 CEST)
    pytest.param("0 30 * * * *", utc(2026, 3, 29, 1, 10), utc(2026, 3, 29, 0, 30),
                 id="half-past-gap"),
    pytest.param("0 30 * * * *", utc(2026, 3, 29, 1, 30), utc(2026, 3, 29, 1, 30),
                 id="half-past-0330"),
    # every 10 s in 2 o'clock: all of 02:xx:xx missing -> one run at the jump; on Oct 25 only
    # the first 02:xx:xx (the last is 02:59:50 CEST = 00:59:50Z)
    pytest.param("*/10 * 2 * * *", utc(2026, 3, 29, 1, 0, 5), utc(2026, 3, 29, 1, 0), id="10s-gap"),
    pytest.param("*/10 * 2 * * *", utc(2026, 3, 29, 5, 0), utc(2026, 3, 29, 1, 0),
                 id="10s-gap-later"),
    pytest.param("*/10 * 2 * * *", utc(2026, 10, 25, 1, 30), utc(2026, 10, 25, 0, 59, 50),
                 id="10s-second-hour-skipped"),
    pytest.param("*/10 * 2 * * *", utc(2026, 10, 25, 0, 30, 15), utc(2026, 10, 25, 0, 30, 10),
                 id="10s-first-hour"),
    # every 10 s, every hour: straight through both transitions
    pytest.param("*/10 * * * * *", utc(2026, 10, 25, 1, 0, 5), utc(2026, 10, 25, 1, 0, 0),
                 id="10s-fall"),
    pytest.param("*/10 * * * * *", utc(2026, 3, 29, 1, 0, 0), utc(2026, 3, 29, 1, 0, 0),
                 id="10s-spring"),
]


@pytest.mark.parametrize(("expr", "now", "expected"), BERLIN_ROWS)
def test_berlin_slots(expr: str, now: datetime, expected: datetime) -> None:
    assert cron(expr, tz=BERLIN).elarion_slot(now) == expected


def test_daily_job_runs_once_on_the_fall_back_day() -> None:
    # croniter alone gives 02:30 CEST (00:30Z) AND 02:30 CET (01:30Z): two runs of a daily job.
    c = cron("0 30 2 * * *", tz=BERLIN)
    assert _walk(c, utc(2026, 10, 24, 12), 3) == [
        utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30), utc(2026, 10, 27, 1, 30)]
    ny = cron("15 1 * * *", tz=NEW_YORK)  # 01:15 happens twice in New York on Nov 1
    assert _walk(ny, utc(2026, 10, 31, 12), 2) == [utc(2026, 11, 1, 5, 15), utc(2026, 11, 2, 6, 15)]


@pytest.mark.parametrize(("tzname", "transition"), [
    (BERLIN, BERLIN_SPRING), (BERLIN, BERLIN_FALL), (NEW_YORK, NY_SPRING), (NEW_YORK, NY_FALL)])
@pytest.mark.parametrize("expr", [
    "0 30 2 * * *", "0 30 * * * *", "*/20 * 1-3 * * *", "0 */15 * * * *", "30 2 * * *",
    "* 2 * * *", "15 1 * * *", "5,35 */2 * * *", "0 0 1-4 * * *", "0 0 * * * *"])
def test_instants_and_slots_match_the_wall_clock_reference(tzname, transition, expr) -> None:
    c = cron(expr, tz=tzname)
    start, end = transition - timedelta(hours=4), transition + timedelta(hours=4)
    everything = cron_instants(expr, tzname, start - timedelta(days=1), end)
    got, t = [], start - timedelta(microseconds=1)
    while (t := c.next_after(t)) <= end:
        got.append(t)
    assert got == [i for i in everything if i >= start]
    # elarion_slot: the latest of those at or before any moment
    rng = random.Random(f"{expr}{tzname}")
    for _ in range(40):
        now = start + timedelta(seconds=rng.uniform(0, 8 * 3600))
        assert c.elarion_slot(now) == max(i for i in everything if i <= now), now


@pytest.mark.parametrize(("tzname", "transition"), [(BERLIN, BERLIN_SPRING), (NEW_YORK, NY_SPRING)])
@pytest.mark.parametrize("expr", [
    "*/10 * 2 * * *", "*/10 */15 */2 * * *", "*/20 59 1-3 * * *", "5,35 */7 2 * * *",
    "30 */15 2 * * *", "5,35 0 2,3 * * *", "*/20 0 2 * * *"])
def test_slot_is_the_latest_instant_is_due_runs_at(tzname, transition, expr) -> None:
    """Whatever croniter makes of a seconds field across a spring-forward gap, the slot
    named at any moment is the latest of the instants next_after (so is_due) runs at:
    a node that fires at one of them names it, never a neighbour or the day before."""
    c = cron(expr, tz=tzname)
    walk, t = [], transition - timedelta(days=1, hours=3)
    while (t := c.next_after(t)) <= transition + timedelta(hours=3):
        walk.append(t)
    rng = random.Random(expr)
    nows = [i + timedelta(seconds=d) for i in walk if i >= transition - timedelta(hours=3)
            for d in (0, 0.5, 4.9)]
    nows += [transition + timedelta(seconds=rng.uniform(-3 * 3600, 3 * 3600)) for _ in range(30)]
    for now in nows:
        assert c.elarion_slot(now) == max(i for i in walk if i <= now), now


@pytest.mark.parametrize(("expr", "expected"), [
    # Berlin 2026-03-29, hours 2 only: all 02:xx:xx are skipped -> one run at the jump, 01:00:00Z
    ("30 * 2 * * *", [utc(2026, 3, 29, 1, 0, 0)]),  # croniter: 01:00:30Z
    ("5,35 */7 2 * * *", [utc(2026, 3, 29, 1, 0, 0)]),  # croniter: 01:00:05Z
    # hours 2 and 3: the skipped 02:xx at the jump, then 03:00:05 and 03:00:35 CEST
    ("5,35 0 2,3 * * *", [utc(2026, 3, 29, 1, 0, 0), utc(2026, 3, 29, 1, 0, 5),
                          utc(2026, 3, 29, 1, 0, 35)]),  # croniter: no 01:00:00Z
])
def test_seconds_in_a_skipped_hour_run_at_the_jump(expr, expected) -> None:
    """croniter alone moves a skipped 02:00:30 forward by the gap, to 03:00:30 CEST (an
    instant the expression does not name), and drops it when hour 3 also matches; cron
    names the instants near a transition itself (cron_dst), so they run at the jump."""
    c = cron(expr, tz=BERLIN)
    got, t = [], utc(2026, 3, 29, 0, 30)
    while (t := c.next_after(t)) <= utc(2026, 3, 29, 2, 0):
        got.append(t)
    assert got == expected


SECONDS_TRANSITIONS = [(BERLIN, BERLIN_SPRING), (BERLIN, BERLIN_FALL), (NEW_YORK, NY_SPRING),
                       (NEW_YORK, NY_FALL)]


def _field(values: set[int]) -> str:
    return ",".join(map(str, sorted(values)))


def _steps(low: int, high: int) -> st.SearchStrategy[str]:
    return st.integers(low, high).map(lambda n: f"*/{n}")


_seconds = st.one_of(st.sets(st.integers(0, 59), min_size=1, max_size=3).map(_field), _steps(2, 30))
_minutes = st.one_of(st.sets(st.integers(0, 59), min_size=1, max_size=3).map(_field),
                     _steps(2, 30), st.just("*"))
_hours = st.one_of(st.just("*"), _steps(2, 12),
                   st.sets(st.integers(0, 4), min_size=1, max_size=3).map(_field),  # near DST
                   st.sets(st.integers(0, 23), min_size=1, max_size=4).map(_field))


def _fresh(method: Callable[[datetime], datetime], moment: datetime) -> datetime:
    """*method* (elarion_slot or next_after) computed anew, not read from the span cache."""
    _SPANS.spans.clear()
    return method(moment)


def _is_instant(expr: str, tzname: str, instant: datetime) -> bool:
    """Whether *expr* runs at *instant* by the spec, independently of cron and cron_dst:
    its wall time matches (and is not a repeat, unless the hour is '*'), or the clocks
    jump at *instant* over a wall time that matches (unless the hour is '*')."""
    tz, every_hour = ZoneInfo(tzname), expr.split()[2] == "*"
    local = instant.astimezone(tz)
    wall = local.replace(tzinfo=None)
    repeat = local.replace(fold=0).astimezone(UTC) != instant
    if croniter.match(expr, wall, second_at_beginning=True) and (every_hour or not repeat):
        return True
    follows = (instant - ONE_SECOND).astimezone(tz).replace(tzinfo=None) + ONE_SECOND
    if every_hour or follows == wall:
        return False
    skipped = croniter(expr, follows - ONE_SECOND, second_at_beginning=True).get_next(datetime)
    return bool(skipped < wall)


# seconds from the transition: anywhere within 5 hours, often within 10 minutes
_offsets = st.lists(st.one_of(st.floats(-5 * 3600, 5 * 3600), st.floats(-600, 600)),
                    min_size=2, max_size=6)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(transition=st.sampled_from(SECONDS_TRANSITIONS), second=_seconds, minute=_minutes,
       hour=_hours, offsets=_offsets)
def test_slots_with_seconds_are_consistent_around_transitions(transition, second, minute, hour,
                                                              offsets) -> None:
    """For any expression with seconds, at moments within 5 hours of a transition (so
    on croniter's path and on cron_dst's): the slot never lies after the moment, never
    goes back as the moment advances, and changes next exactly at next_after(slot),
    both being instants the expression runs at."""
    tzname, at = transition
    expr = f"{second} {minute} {hour} * * *"
    c = cron(expr, tz=tzname)
    nows = sorted(at + timedelta(seconds=offset) for offset in offsets)
    slots = [_fresh(c.elarion_slot, now) for now in nows]
    assert slots == sorted(slots), (expr, nows)
    for now, slot in zip(nows, slots):
        assert slot <= now, (expr, now)
        upcoming = _fresh(c.next_after, slot)
        assert now < upcoming, (expr, now)
        assert _fresh(c.next_after, now) == upcoming, (expr, now)
        # the slot stays until the upcoming instant and changes to it there
        for moment in (now + (upcoming - now) / 2, upcoming - ONE_MICROSECOND):
            assert _fresh(c.elarion_slot, moment) == slot, (expr, now, moment)
        assert _fresh(c.elarion_slot, upcoming) == upcoming, (expr, now)
        assert _is_instant(expr, tzname, slot) and _is_instant(expr, tzname, upcoming), \
            (expr, now, slot, upcoming)


def test_time_zone_defaults_to_the_app() -> None:
    app = app_in(BERLIN)
    c = cron("0 0 3 * * *", app=app)
    assert c.zone == ZoneInfo(BERLIN)
    assert c.elarion_slot(utc(2026, 7, 1, 12)) == utc(2026, 7, 1, 1, 0)  # 03:00 CEST
    # an explicit tz wins over the app's
    assert cron("0 0 3 * * *", tz="UTC", app=app).elarion_slot(utc(2026, 7, 1, 12)) == \
        utc(2026, 7, 1, 3, 0)


# -- is_due -------------------------------------------------------------------------------------


def test_is_due_returns_due_and_seconds_to_next() -> None:
    now = utc(2026, 1, 1, 0, 0, 25)
    c = cron("*/10 * * * * *", nowfun=lambda: now)
    assert tuple(c.is_due(utc(2026, 1, 1, 0, 0, 12))) == (True, 5.0)   # 00:00:20 has passed
    assert tuple(c.is_due(utc(2026, 1, 1, 0, 0, 21))) == (False, 5.0)  # next is 00:00:30
    assert tuple(c.is_due(utc(2026, 1, 1, 0, 0, 20))) == (False, 5.0)  # 00:00:20 already ran
    assert c.remaining_estimate(utc(2026, 1, 1, 0, 0, 21)) == timedelta(seconds=5)


def test_is_due_on_the_fall_back_day_runs_a_daily_job_once() -> None:
    c = cron("0 30 2 * * *", tz=BERLIN)
    clock = [utc(2026, 10, 24, 23, 0)]
    c.nowfun = lambda: clock[0]
    last_run_at, fired = clock[0], []
    while clock[0] < utc(2026, 10, 25, 6, 0):
        due, _ = c.is_due(last_run_at)
        if due:
            fired.append(clock[0])
            last_run_at = clock[0]
        clock[0] += timedelta(seconds=17)
    assert [c.elarion_slot(t) for t in fired] == [utc(2026, 10, 25, 0, 30)]


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    (("* * * *",), {}, "has 4 fields"),
    (("0 0 3 * * * *",), {}, "has 7 fields"),
    (("",), {}, "has 0 fields"),
    (("@daily",), {}, "has 1 fields"),
    (("61 * * * *",), {}, "not a valid cron expression"),
    (("60 * * * * *",), {}, "not a valid cron expression"),  # second 60
    (("* 24 * * *",), {}, "not a valid cron expression"),
    (("* * 32 * *",), {}, "not a valid cron expression"),
    (("* * * * * 8",), {}, "not a valid cron expression"),  # weekday 8 (seconds first)
    (("* * * * *",), {"tz": "Mars/Olympus_Mons"},
     r"tz='Mars/Olympus_Mons'\) is not a known time zone"),
    (("* * * * *",), {"tz": ""}, "is not a known time zone"),
    (("* * * * *",), {"tz": "../../etc/passwd"}, "is not a known time zone"),
])
def test_invalid_configuration_is_named(args, kwargs, message) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        cron(*args, **kwargs)
    assert isinstance(info.value, ValueError)


def test_field_count_message_explains_both_forms() -> None:
    with pytest.raises(ValueError) as info:
        cron("1 2 3 4")
    text = str(info.value)
    assert "5 (minute hour day month weekday)" in text and "6 with the seconds first" in text


# -- identity -----------------------------------------------------------------------------------


def test_pickle_repr_and_equality() -> None:
    c = cron("  0  30 2 * * * ", tz=BERLIN)
    assert c.expr == "0 30 2 * * *"
    assert repr(c) == "<cron: 0 30 2 * * * tz=Europe/Berlin>"
    copy = pickle.loads(pickle.dumps(c))
    assert copy == c and hash(copy) == hash(c)
    assert copy.elarion_slot(utc(2026, 10, 25, 1, 30)) == utc(2026, 10, 25, 0, 30)
    assert cron("0 30 2 * * *") != c
    assert cron("0 30 2 * * *", tz="UTC") != c


def test_name_occurrence_uses_its_exact_slot() -> None:
    occ = name_occurrence("report", cron("*/10 * * * * *"), utc(2026, 1, 1, 0, 0, 25, 700000),
                          tolerance=1.0)
    assert occ.kind is ClaimKind.SLOT and occ.slot == utc(2026, 1, 1, 0, 0, 20)

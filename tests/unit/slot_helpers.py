"""Helpers shared by the slot-naming tests: apps, clocks, simulated beats, references.

The references here are deliberately *independent* of ``celery_elarion_beat.schedules.slots``
and ``celery_elarion_beat.cron``: they enumerate instants the slow, obvious way
(minute by minute in UTC, or wall time by wall time), so a test comparing the
library with them can fail.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from celery import Celery
from celery.schedules import crontab
from croniter import croniter

UTC = timezone.utc
ONE_MINUTE = timedelta(minutes=1)

# 2026 daylight-saving transitions used throughout (instants in UTC):
#   Europe/Berlin     2026-03-29 01:00 UTC: 02:00 CET  -> 03:00 CEST (gap 02:00-02:59)
#                     2026-10-25 01:00 UTC: 03:00 CEST -> 02:00 CET  (02:00-02:59 twice)
#   America/New_York  2026-03-08 07:00 UTC: 02:00 EST  -> 03:00 EDT  (gap 02:00-02:59)
#                     2026-11-01 06:00 UTC: 02:00 EDT  -> 01:00 EST  (01:00-01:59 twice)
BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
BERLIN_SPRING = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
BERLIN_FALL = datetime(2026, 10, 25, 1, 0, tzinfo=UTC)
NY_SPRING = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
NY_FALL = datetime(2026, 11, 1, 6, 0, tzinfo=UTC)


def utc(*args: int) -> datetime:
    """``utc(2026, 3, 29, 1, 0)``: an aware UTC datetime."""
    return datetime(*args, tzinfo=UTC)


def app_in(tzname: str) -> Celery:
    """A Celery app (not the current one) whose schedules read time in *tzname*."""
    app = Celery(set_as_current=False)
    app.conf.timezone = tzname
    return app


# -- how the installed Celery's crontab fires around DST ----------------------------
#
# Celery 5.5.2 (celery/celery#9669) made ``remaining()`` subtract in UTC; before, it
# subtracted wall times of one zone. Two firings differ (the slots they name do not):


def celery_fires_in_the_gap_at_the_jump() -> bool:
    """Whether the installed Celery, asked just after the clocks jumped over a crontab's
    wall time (Berlin, 2026-03-29, ``02:30`` is missing), says "due" at once (5.3 to
    5.5.1: wall-time arithmetic) or waits for the wall time read with the old offset,
    ``03:30 CEST`` (5.5.2 and later)."""
    c = crontab(minute=30, hour=2, app=app_in(BERLIN))
    c.nowfun = lambda: (BERLIN_SPRING + timedelta(minutes=5)).astimezone(ZoneInfo(BERLIN))
    return bool(c.is_due(datetime(2026, 3, 28, 2, 30, tzinfo=ZoneInfo(BERLIN)))[0])


def celery_loops_in_the_repeated_hour() -> bool:
    """Whether the installed Celery, with ``last_run_at`` in the second pass of a repeated
    hour (Berlin, 2026-10-25 02:10 CET), says "due, next in 0 s" until the hour is over
    (5.5.2 and later: its ffwd step drops the fold, the next run lands in the first pass,
    in the past) or waits for the next matching wall time of the second pass (before)."""
    c = crontab(minute=30, hour=2, app=app_in(BERLIN))
    started = datetime(2026, 10, 25, 2, 10, fold=1, tzinfo=ZoneInfo(BERLIN))
    c.nowfun = lambda: started
    return bool(c.is_due(started)[0])


# -- crontab reference ---------------------------------------------------------


def _wall_matches(c: crontab, wall: datetime) -> bool:
    # Celery semantics: month, day of month AND day of week must all match.
    return (wall.month in c.month_of_year and wall.day in c.day_of_month
            and wall.isoweekday() % 7 in c.day_of_week
            and wall.hour in c.hour and wall.minute in c.minute)


def crontab_fires_at(c: crontab, tz: ZoneInfo, m: datetime) -> bool:
    """Whether, by the spec, crontab *c* fires at the whole UTC minute *m*.

    * an ordinary instant fires when its wall time matches;
    * the second instant of a repeated wall time (fall back) fires only when the
      hour field covers all 24 hours;
    * the instant the clocks jump (spring forward) also fires for every matching
      wall time that the jump skipped.
    """
    local = m.astimezone(tz)
    wall = local.replace(tzinfo=None)
    second_instant = local.replace(fold=0).astimezone(UTC) != m
    if _wall_matches(c, wall) and (not second_instant or len(c.hour) == 24):
        return True
    before = (m - ONE_MINUTE).astimezone(tz).replace(tzinfo=None)
    skipped = before + ONE_MINUTE
    while skipped < wall:  # only inside a spring-forward gap
        if _wall_matches(c, skipped):
            return True
        skipped += ONE_MINUTE
    return False


def crontab_instants(c: crontab, tzname: str, start: datetime, end: datetime) -> list[datetime]:
    """Every instant in [start, end] at which *c* fires, minute by minute."""
    tz = ZoneInfo(tzname)
    m = start.replace(second=0, microsecond=0)
    if m < start:
        m += ONE_MINUTE
    out = []
    while m <= end:
        if crontab_fires_at(c, tz, m):
            out.append(m)
        m += ONE_MINUTE
    return out


def reference_crontab_slot(c: crontab, tzname: str, now: datetime,
                           horizon: timedelta = timedelta(days=2)) -> datetime:
    """The latest instant <= now at which *c* fires (searching back *horizon*)."""
    tz = ZoneInfo(tzname)
    m = now.replace(second=0, microsecond=0)
    stop = now - horizon
    while m >= stop:
        if crontab_fires_at(c, tz, m):
            return m
        m -= ONE_MINUTE
    raise AssertionError(f"{c!r} does not fire in the {horizon} before {now}")


def second_instants(tzname: str, start: datetime, end: datetime) -> set[datetime]:
    """The whole UTC minutes in [start, end] whose wall time is a repeat (second fold)."""
    tz = ZoneInfo(tzname)
    out = set()
    m = start.replace(second=0, microsecond=0)
    while m <= end:
        local = m.astimezone(tz)
        if local.replace(fold=0).astimezone(UTC) != m:
            out.add(m)
        m += ONE_MINUTE
    return out


# -- cron reference --------------------------------------------------------------


def cron_instants(expr: str, tzname: str, start: datetime, end: datetime) -> list[datetime]:
    """Every instant in [start, end] of a ``cron`` expression, by the spec.

    croniter is used only on naive wall times (no time zone, so none of its DST
    handling); the wall times are then placed in *tzname* by hand, as in Vixie
    cron: with fixed hours a skipped wall time runs when the clocks jump and a
    repeated one runs once (first instant); with hour ``*`` skipped wall times do
    not run and repeated ones run twice.
    """
    tz = ZoneInfo(tzname)
    with_seconds = len(expr.split()) == 6
    every_hour = "*" in croniter.expand(expr, second_at_beginning=with_seconds)[0][1]
    # A wall time is at most a DST shift (an hour here; two at most anywhere) away
    # from its instant, so walls from 2 h before start to 2 h after end cover it.
    walls = croniter(expr, (start - timedelta(hours=2)).astimezone(tz).replace(tzinfo=None),
                     second_at_beginning=with_seconds)
    out: set[datetime] = set()
    while True:
        wall = walls.get_next(datetime)
        first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
        second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
        if first == second:
            instants = [first]
        elif first.astimezone(tz).replace(tzinfo=None) != wall:  # does not exist
            instants = [] if every_hour else [_jump(tz, wall, second, first)]
        else:  # happens twice
            instants = [first, second] if every_hour else [first]
        out.update(i for i in instants if start <= i <= end)
        if first > end + timedelta(hours=2):
            return sorted(out)


def _jump(tz: ZoneInfo, wall: datetime, lo: datetime, hi: datetime) -> datetime:
    """The first whole second at which the local time is >= the nonexistent *wall*."""
    t = lo.replace(microsecond=0)
    while t.astimezone(tz).replace(tzinfo=None) < wall:
        t += timedelta(seconds=1)
    return t


# -- simulated beat ----------------------------------------------------------------


@dataclass
class Node:
    """One simulated beat: its clock runs *skew* ahead of real time."""

    schedule: object
    start: datetime  # real time the node starts (and sets last_run_at)
    skew: timedelta = timedelta(0)
    tz: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    fires: list[datetime] = field(default_factory=list)  # own-clock times it fired

    @property
    def own_start(self) -> datetime:
        return self.start + self.skew


def run_beat(node: Node, end: datetime, steps: Iterable[float]) -> list[datetime]:
    """Drive *node*'s REAL ``schedule.is_due`` until real time *end*.

    The node's ``nowfun`` returns its own (skewed) clock in the app's time zone,
    as Celery's ``app.now()`` does; when due, ``last_run_at`` becomes that time,
    as Celery beat does. *steps* are the seconds between ticks.
    """
    real = node.start
    clock: list[datetime] = [real + node.skew]
    node.schedule.nowfun = lambda: clock[0].astimezone(node.tz)  # type: ignore[attr-defined]
    last_run_at = clock[0].astimezone(node.tz)
    step_iter = iter(steps)
    while real < end:
        clock[0] = real + node.skew
        due, _ = node.schedule.is_due(last_run_at)  # type: ignore[attr-defined]
        if due:
            node.fires.append(clock[0])
            last_run_at = clock[0].astimezone(node.tz)
        real += timedelta(seconds=next(step_iter))
    return node.fires


def jittered(seed: int, low: float, high: float) -> Iterable[float]:
    rng = random.Random(seed)
    while True:
        yield rng.uniform(low, high)


def slots_of(fires: Iterable[datetime], name: Callable[[datetime], datetime]) -> list[datetime]:
    return [name(t) for t in fires]

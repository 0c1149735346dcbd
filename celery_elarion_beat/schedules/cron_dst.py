"""The instants of a :class:`~.cron.cron` expression near daylight-saving transitions.

croniter is right in the middle of a stretch of constant UTC offset and wrong
around a transition: it moves a skipped wall time with a nonzero second forward
by the gap (02:00:30 becomes 03:00:30 CEST, an instant the expression does not
name) and drops it when hour 3 also matches, and it runs every repeated wall
time twice. So near a transition :class:`~.cron.cron` asks this module instead.

Here croniter only reads **naive** wall times (no time zone, so none of its own
daylight-saving handling). The time line is cut into stretches of constant
offset; within one, an instant is its wall time less the offset. Then the rules of
:func:`celery_elarion_beat.schedules.slots.crontab_slot` apply:

* the wall times a spring-forward gap skips run once, at the instant the clocks
  jump, unless the hour field is ``*`` (every hour): then they do not run;
* a repeated wall time (fall back) runs at its first instant only, unless the
  hour field is ``*``: then at both.

Every instant is a whole second (cron fields and zone offsets are whole seconds),
so everything here works to the second. Offsets are read by converting instants
(``astimezone``), never by localizing wall times: any ``tzinfo`` does.
"""

from __future__ import annotations

import bisect
import copy
import functools
from datetime import datetime, timedelta, timezone, tzinfo

from croniter import croniter

from .slots import DST_MARGIN

__all__ = ["iterate", "last_instant", "next_instant", "steady"]

#: wider than any daylight-saving shift, and shorter than the time between two
#: transitions of one zone: within it a zone changes its offset at most once
NEAR = DST_MARGIN
#: how finely offsets are sampled to find a transition (none lasts under an hour)
_PROBE = timedelta(hours=1)
#: how far one step of a search looks for a transition before moving on
_HORIZON = timedelta(days=7)
_SECOND = timedelta(seconds=1)


def iterate(expr: str, with_seconds: bool, start: datetime) -> croniter:
    """A croniter of *expr* from *start* (naive: wall times; aware: croniter's own
    reading of the zone). The expression is parsed once, not on every call: parsing
    costs croniter more than a step does."""
    instants = copy.copy(_parsed(expr, with_seconds))
    instants.set_current(start, force=True)
    return instants


@functools.lru_cache(maxsize=1024)
def _parsed(expr: str, with_seconds: bool) -> croniter:
    return croniter(expr, datetime(2000, 1, 1), second_at_beginning=with_seconds)


def steady(tz: tzinfo, start: datetime, end: datetime) -> bool:
    """Whether *tz* keeps one UTC offset from *start* to *end* (aware UTC)."""
    return first_change(tz, start, end) is None


def next_instant(expr: str, with_seconds: bool, every_hour: bool, tz: tzinfo,
                 moment: datetime) -> datetime:
    """The first instant of *expr* in *tz* strictly after *moment* (aware UTC)."""
    start = _whole(moment) + _SECOND
    while True:
        offset = _offset(tz, start)
        before = _offset(tz, start - _SECOND)
        if offset > before and not every_hour and _any_wall(
                expr, with_seconds, _wall(start, before), _wall(start, offset)):
            return start  # wall times in the gap run when the clocks jump
        found = _instant(_wall_at_or_after(expr, with_seconds, _wall(start, offset)), offset)
        limit = min(found, start + _HORIZON)
        change = first_change(tz, start, limit)
        if change is None:
            if found > limit:  # nothing within the horizon: look on from there
                start = limit
                continue
            fold = None if every_hour else _repeat(tz, found)
            if fold is None:
                return found
            start = fold[1]  # a repeated wall time: past its second instants
            continue
        start = change


def last_instant(expr: str, with_seconds: bool, every_hour: bool, tz: tzinfo,
                 now: datetime) -> datetime:
    """The latest instant of *expr* in *tz* at or before *now* (aware UTC)."""
    end = _whole(now)
    while True:
        offset = _offset(tz, end)
        found = _instant(_wall_at_or_before(expr, with_seconds, _wall(end, offset)), offset)
        limit = max(found, end - _HORIZON)
        change = _last_change(tz, limit, end)
        if change is None:
            if found < limit:
                end = limit - _SECOND
                continue
            fold = None if every_hour else _repeat(tz, found)
            if fold is None:
                return found
            end = fold[0] - _SECOND  # a second instant: the first is before the fall back
            continue
        before = _offset(tz, change - _SECOND)
        if offset > before and not every_hour and _any_wall(
                expr, with_seconds, _wall(change, before), _wall(change, offset)):
            return change
        end = change - _SECOND


def _repeat(tz: tzinfo, instant: datetime) -> tuple[datetime, datetime] | None:
    """If *instant* is the second instant of a repeated wall time, the stretch of
    such instants, ``[fall back, first new wall time)``; else None."""
    earlier = instant - NEAR
    before, offset = _offset(tz, earlier), _offset(tz, instant)
    if before <= offset:
        return None
    change = first_change(tz, earlier, instant)
    assert change is not None  # the offsets at its ends differ
    end = change + (before - offset)
    return (change, end) if instant < end else None


def first_change(tz: tzinfo, start: datetime, end: datetime) -> datetime | None:
    """The first whole second in ``(start, end]`` with another offset than *start*'s."""
    low, end = _whole(start), _whole(end)
    for year in range(low.year, end.year + 1):
        changes = _changes(tz, year)
        i = bisect.bisect_right(changes, low)
        if i < len(changes):
            return changes[i] if changes[i] <= end else None
    return None


def _last_change(tz: tzinfo, start: datetime, end: datetime) -> datetime | None:
    """The latest whole second in ``(start, end]`` whose offset is *end*'s and the
    second before's is not: where *end*'s stretch of constant offset begins."""
    end = _whole(end)
    for year in range(end.year, start.year - 1, -1):
        changes = _changes(tz, year)
        i = bisect.bisect_right(changes, end)
        if i:
            return changes[i - 1] if changes[i - 1] > start else None
    return None


#: (id of the zone, year) -> (the zone, its changes that year); the zone is held so
#: that its id stays its own (any tzinfo will do: some are not hashable)
_CHANGES: dict[tuple[int, int], tuple[tzinfo, tuple[datetime, ...]]] = {}
_CHANGES_MAX = 512


def _changes(tz: tzinfo, year: int) -> tuple[datetime, ...]:
    """The whole seconds of UTC *year* at which *tz* changes its offset (each is the
    first second of the new offset), in order. Found once per zone and year by
    sampling the offset every :data:`_PROBE` and bisecting where it differs: a year
    of a zone costs about 9,000 conversions once, and any span's transitions after
    that are a binary search, however far its next occurrence (a yearly entry looks
    half a year ahead: sampled on every call, 10,000 of them took minutes)."""
    key = (id(tz), year)
    held = _CHANGES.get(key)
    if held is not None and held[0] is tz:
        return held[1]
    changes = _year_changes(tz, year)
    if len(_CHANGES) >= _CHANGES_MAX:
        _CHANGES.clear()
    _CHANGES[key] = (tz, changes)
    return changes


def _year_changes(tz: tzinfo, year: int) -> tuple[datetime, ...]:
    low = datetime(year, 1, 1, tzinfo=timezone.utc)
    stop = datetime(year + 1, 1, 1, tzinfo=timezone.utc)
    previous = low - _SECOND  # a change at the year's first second counts in this year
    offset = _offset(tz, previous)
    found = []
    while previous < stop - _SECOND:
        high = min(previous + _PROBE, stop - _SECOND)
        ahead = _offset(tz, high)
        if ahead != offset:
            change = _bisect(tz, previous, high, offset)
            found.append(change)
            previous, offset = change, _offset(tz, change)
            continue
        previous = high
    return tuple(found)


def _bisect(tz: tzinfo, low: datetime, high: datetime, offset: timedelta) -> datetime:
    """The whole second in ``(low, high]`` where the offset stops being *offset*
    (at *low* it is, at *high* it is not; both whole seconds)."""
    while high - low > _SECOND:
        middle = low + timedelta(seconds=(high - low) // _SECOND // 2)
        if _offset(tz, middle) == offset:
            low = middle
        else:
            high = middle
    return high


def _offset(tz: tzinfo, instant: datetime) -> timedelta:
    offset = instant.astimezone(tz).utcoffset()
    assert offset is not None  # an aware datetime
    return offset


def _whole(instant: datetime) -> datetime:
    return instant.replace(microsecond=0)


def _wall(instant: datetime, offset: timedelta) -> datetime:
    return (instant + offset).replace(tzinfo=None)


def _instant(wall: datetime, offset: timedelta) -> datetime:
    return (wall - offset).replace(tzinfo=timezone.utc)


def _wall_at_or_after(expr: str, with_seconds: bool, wall: datetime) -> datetime:
    found: datetime = iterate(expr, with_seconds, wall - _SECOND).get_next(datetime)
    return found


def _wall_at_or_before(expr: str, with_seconds: bool, wall: datetime) -> datetime:
    found: datetime = iterate(expr, with_seconds, wall + _SECOND).get_prev(datetime)
    return found


def _any_wall(expr: str, with_seconds: bool, start: datetime, end: datetime) -> bool:
    """Whether *expr* names a wall time in ``[start, end)`` (naive, whole seconds)."""
    return _wall_at_or_after(expr, with_seconds, start) < end

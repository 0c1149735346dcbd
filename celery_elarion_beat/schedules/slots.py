"""Slot naming: which occurrence a due entry is, as a claim key.

Pure functions with no I/O; the time is always passed in (``now``, aware UTC).

* Cron-like schedules (Celery ``crontab``, ``solar``, our :class:`~.cron.cron`)
  compute the same instants on every node, so an occurrence is named by its
  **exact slot**: the latest scheduled instant at or before ``now``, in UTC at
  second precision. A node that starts late, fires late (by under one period)
  or has a skewed clock names the same slot as every other node.
* Interval schedules are anchored at each node's own start, so their instants
  never agree between nodes; they claim a **window** instead ("nobody ran this
  job within the last interval", checked on the database clock).
* Any other schedule may name its own slots by defining
  ``elarion_slot(now: datetime) -> datetime``; otherwise it falls back to a
  window as long as the schedule's own time until its next run.
"""

from __future__ import annotations

import enum
import functools
import math
import uuid
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone, tzinfo
from typing import Any

from celery.schedules import crontab, schedule, solar

from .clock import as_utc

__all__ = [
    "ClaimKind",
    "Occurrence",
    "crontab_due",
    "crontab_last_run",
    "crontab_slot",
    "is_slotted",
    "name_occurrence",
    "next_slot",
    "recent_slots",
    "slot_task_id",
    "solar_slot",
    "window_length",
]

#: UUID namespace of deterministic task ids (uuid5 of job and slot).
TASK_ID_NAMESPACE = uuid.UUID("6f0b7c1e-3c47-5a8e-9d0e-5e1a4f2b9c31")

DST_MARGIN = timedelta(hours=3)  # wider than any daylight-saving shift in the tz database
_MAX_DAYS = 366 * 29  # Feb 29 on a given weekday repeats within 28 years
_MIN_WINDOW = timedelta(seconds=1)
_MAX_FALLBACK_WINDOW = timedelta(days=366)  # an unknown schedule's window at most
_SOLAR_GRACE = timedelta(seconds=1)  # see solar_slot


class ClaimKind(str, enum.Enum):
    """How an occurrence is claimed."""

    SLOT = "slot"
    WINDOW = "window"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Occurrence:
    """One occurrence of one job, named so that every node names it alike."""

    job: str
    kind: ClaimKind
    slot: datetime | None = None
    window: timedelta | None = None

    def __post_init__(self) -> None:
        if self.kind is ClaimKind.SLOT and self.slot is None:
            raise ValueError("a slot occurrence needs its slot")
        if self.kind is ClaimKind.WINDOW and (self.window is None or self.window <= timedelta(0)):
            raise ValueError("a window occurrence needs a positive window")

    def label(self) -> str:
        """A short text for logs: ``slot 2026-11-29T03:00:00Z`` or ``window 10s``."""
        if self.slot is not None:
            return f"slot {iso(self.slot)}"
        assert self.window is not None
        return f"window {self.window.total_seconds():g}s"


@functools.lru_cache(maxsize=4096)
def iso(value: datetime) -> str:
    """Format an aware datetime as ``2026-11-29T03:00:00Z`` (UTC, seconds); kept for
    the datetimes seen last (a tick names the same slot for every entry due in it)."""
    return as_utc(value).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> datetime:
    """Read an aware datetime written by :func:`iso` (or any ISO 8601 with an offset)."""
    return as_utc(datetime.fromisoformat(text.strip().replace("Z", "+00:00")))


def slot_task_id(job: str, slot: datetime) -> str:
    """The deterministic task id of an exact slot: uuid5 of job name and slot."""
    return str(uuid.uuid5(TASK_ID_NAMESPACE, f"{job}\x00{iso(slot)}"))


def window_length(interval: timedelta, tolerance: float) -> timedelta:
    """The window an interval claim checks: the interval less the jitter tolerance.

    The tolerance forgives timer jitter (a node that wakes a few milliseconds
    before its previous claim is one interval old). It is capped at 10% of the
    interval, so a run never lands closer than 90% of the interval after the last.
    """
    forgiven = min(timedelta(seconds=tolerance), interval * 0.1)
    return max(interval - forgiven, _MIN_WINDOW if interval >= _MIN_WINDOW else interval)


def is_slotted(sched: Any) -> bool:
    """Whether *sched* names exact slots that every node computes alike (crontab,
    solar, our cron); interval and unknown schedules claim windows."""
    return callable(getattr(sched, "elarion_slot", None)) or isinstance(sched, (crontab, solar))


def name_occurrence(
    job: str,
    sched: Any,
    now: datetime,
    *,
    tolerance: float,
    next_due: float | None = None,
) -> Occurrence:
    """Name the occurrence of *job* (schedule *sched*) that is due at *now*.

    *next_due* is the schedule's own answer for "seconds until the next run",
    used only by the fallback for schedules we do not know.
    """
    now = as_utc(now)
    own = getattr(sched, "elarion_slot", None)
    if callable(own):
        return Occurrence(job, ClaimKind.SLOT, slot=_second(as_utc(own(now))))
    if isinstance(sched, crontab):
        return Occurrence(job, ClaimKind.SLOT, slot=crontab_slot(sched, now))
    if isinstance(sched, solar):
        return Occurrence(job, ClaimKind.SLOT, slot=solar_slot(sched, now))
    if isinstance(sched, schedule):
        return Occurrence(job, ClaimKind.WINDOW,
                          window=window_length(sched.run_every, tolerance))
    interval = timedelta(seconds=min(max(_seconds(next_due), _MIN_WINDOW.total_seconds()),
                                     _MAX_FALLBACK_WINDOW.total_seconds()))
    return Occurrence(job, ClaimKind.WINDOW, window=window_length(interval, tolerance))


def next_slot(job: str, sched: Any, slot: datetime, now: datetime,
              limit: timedelta = timedelta(days=_MAX_DAYS)) -> datetime | None:
    """The next slot of *sched* after *slot* (the slot it names at *now*), which is
    after *now*; None beyond *limit*.

    Found by naming the occurrence at doubling distances, then halving the last
    step to the second, and naming the slot there: about 50 namings, for any
    schedule that names exact slots. Used when a schedule says "due" again for a
    slot this node has handled (a crontab inside a repeated daylight-saving hour),
    to sleep until the next one.
    """
    def named(moment: datetime) -> datetime | None:
        return name_occurrence(job, sched, moment, tolerance=0.0).slot

    def later(moment: datetime) -> bool:
        found = named(moment)
        return found is not None and found > slot

    step = timedelta(seconds=1)
    low, high = now, now + step
    while not later(high):
        if step > limit:
            return None
        low, step = high, step * 2
        high = now + step
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if later(middle):
            high = middle
        else:
            low = middle
    return named(high)


def recent_slots(job: str, sched: Any, end: datetime, start: datetime,
                 limit: int) -> list[datetime]:
    """The exact slots of *sched* in ``[start, end]``, newest first, at most *limit*;
    empty for a schedule that names no exact slots. Walks back by naming, one
    naming per slot."""
    out: list[datetime] = []
    cursor = end
    for _ in range(limit * 3):
        try:
            occ = name_occurrence(job, sched, cursor, tolerance=0.0)
        except Exception:  # a schedule with no slot that far back: stop there
            break
        if occ.kind is not ClaimKind.SLOT or occ.slot is None or occ.slot < start:
            break
        if out and occ.slot >= out[-1]:  # a schedule that rounds forward: step past it
            cursor = out[-1] - timedelta(seconds=2)
            continue
        out.append(occ.slot)
        if len(out) >= limit:
            break
        cursor = occ.slot - timedelta(microseconds=1)
    return out


def _seconds(next_due: Any) -> float:
    """A schedule's own "seconds until the next run" as a number; 0 when it gives none.

    Any answer is accepted (a timedelta, NaN, infinity, something else) so that a
    custom schedule's odd answer never stops its entry from being named.
    """
    if isinstance(next_due, timedelta):
        next_due = next_due.total_seconds()
    try:
        seconds = float(next_due) if next_due else 0.0
    except OverflowError:  # an int too large for a float
        return math.inf
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if math.isnan(seconds) else seconds


def _second(value: datetime) -> datetime:
    return value.replace(microsecond=0)


# -- crontab -----------------------------------------------------------------


def crontab_slot(c: crontab, now: datetime) -> datetime:
    """The latest instant at or before *now* at which the Celery crontab *c* fires.

    The crontab is read in its own time zone (``app.conf.timezone``), with
    Celery's semantics: month, day of month and day of week must all match.
    Daylight saving time:

    * a wall time that does not exist (spring forward) maps to the instant the
      clocks jump, so all of the gap's wall times share one slot;
    * a wall time that happens twice (fall back) is one slot at its first
      instant, except for crontabs that run every hour: those also get the
      second instant, as in Vixie cron.
    """
    tz = _tz(c)
    now = as_utc(now)
    both_folds = len(c.hour) == 24
    minutes = sorted(c.minute)
    hours = sorted(c.hour)
    near_transition = not _no_transition(tz, now - DST_MARGIN, now + DST_MARGIN)
    local_limit = (now + DST_MARGIN if near_transition else now).astimezone(tz).replace(tzinfo=None)
    best: datetime | None = None
    best_wall: datetime | None = None
    day = local_limit.date()
    for _ in range(_MAX_DAYS):
        if day_matches(c, day):
            for wall in _walls_desc(day, hours, minutes, local_limit):
                if best is not None and best_wall is not None and wall < best_wall - DST_MARGIN:
                    return best
                for instant in _instants(wall, tz, both_folds):
                    if instant <= now and (best is None or instant > best):
                        best, best_wall = instant, wall
                        if _no_transition(tz, instant - DST_MARGIN, now + DST_MARGIN):
                            return best
        if (best is not None and best_wall is not None
                and datetime.combine(day, datetime.min.time()) < best_wall - DST_MARGIN):
            return best
        day -= timedelta(days=1)
    if best is not None:
        return best
    raise ValueError(f"{c!r} has no occurrence in the {_MAX_DAYS} days before {iso(now)}")


def crontab_due(c: crontab, last_run_at: datetime, now: datetime,
                answer: tuple[bool, float]) -> tuple[bool, float]:
    """Celery's ``is_due`` *answer* for the crontab *c*, corrected around a fall back.

    An every-hour crontab has two slots in a repeated hour (see :func:`crontab_slot`),
    but Celery's crontab steps by wall time and never says the second one is due: from
    02:00 CEST its next run is 03:00 CET, an hour after 02:00 CET. Within a few hours
    of a transition, a slot named after *last_run_at* is due now, and beat wakes for
    the next slot named, whichever comes first.
    """
    due, next_in = answer
    tz = _tz(c)
    if due or len(c.hour) != 24 or _no_transition(tz, now - DST_MARGIN, now + DST_MARGIN):
        return answer
    now = as_utc(now)
    slot = crontab_slot(c, now)
    if slot > as_utc(last_run_at):
        return True, next_in
    upcoming = next_slot("", c, slot, now, limit=timedelta(seconds=max(next_in, 1.0)))
    if upcoming is not None:
        next_in = min(next_in, max(0.0, (upcoming - now).total_seconds()))
    return False, next_in


def crontab_last_run(c: crontab, last_run_at: datetime) -> datetime:
    """*last_run_at* as Celery's crontab *c* must be asked with it: aware, in *c*'s zone.

    Celery before 5.7 matches a crontab's fields against ``last_run_at``'s own wall
    time: one written in UTC (a ``nowfun`` in UTC, a simulation's start) made
    ``crontab(minute=30, hour=2)`` of an app in Europe/Berlin fire at 02:30 UTC, an
    hour after its slot. Celery 5.7 converts it itself; converted here, every
    version fires the same wall times.
    """
    aware: datetime = c.maybe_make_aware(last_run_at)
    return aware.astimezone(_tz(c))


def _tz(sched: Any) -> tzinfo:
    tz = sched.tz
    return timezone.utc if tz is None else tz


def day_matches(c: crontab, day: date) -> bool:
    return (day.month in c.month_of_year and day.day in c.day_of_month
            and day.isoweekday() % 7 in c.day_of_week)


def _walls_desc(day: date, hours: list[int], minutes: list[int], limit: datetime):  # type: ignore[no-untyped-def]
    """The crontab's wall times of *day* not after *limit* (naive local), latest first;
    on *limit*'s own day the later hours and minutes are stepped over, not built."""
    today = day == limit.date()
    for hour in reversed(hours):
        if today and hour > limit.hour:
            continue
        for minute in reversed(minutes):
            if today and hour == limit.hour and minute > limit.minute:
                continue
            yield datetime(day.year, day.month, day.day, hour, minute)


def _instants(wall: datetime, tz: tzinfo, both_folds: bool) -> list[datetime]:
    first = wall.replace(tzinfo=tz, fold=0).astimezone(timezone.utc)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(timezone.utc)
    if first == second:
        return [first]
    if first.astimezone(tz).replace(tzinfo=None) != wall:
        return [_gap_end(wall, tz, lo=second, hi=first)]
    return [second, first] if both_folds else [first]


def _gap_end(wall: datetime, tz: tzinfo, lo: datetime, hi: datetime) -> datetime:
    """The instant the clocks jump past the nonexistent *wall* (to the second).

    Invariant: the local time at *lo* is before *wall*, at *hi* at or after it.
    The jump happens at a whole second J with lo < J <= hi; once hi - lo <= 1 s
    the only whole second in (lo, hi] is the one after lo's second. (Rounding
    *hi* up instead is wrong: hi may lie up to a second after J.)
    """
    while hi - lo > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(tz).replace(tzinfo=None) >= wall:
            hi = mid
        else:
            lo = mid
    return _second(lo) + timedelta(seconds=1)


def _no_transition(tz: tzinfo, start: datetime, end: datetime) -> bool:
    return start.astimezone(tz).utcoffset() == end.astimezone(tz).utcoffset()


# -- solar -------------------------------------------------------------------


def solar_slot(s: solar, now: datetime) -> datetime:
    """The latest solar event of *s* at or before *now*, rounded to the second.

    ephem's answer drifts by milliseconds with the time the search starts from,
    so the event is found near *now*, then computed again from a canonical start
    (one hour before the event's hour) and rounded to the nearest second: every
    node gets the same second, whatever its *now*.

    The search for the event starts :data:`_SOLAR_GRACE` after *now*: Celery fires
    a solar entry at its own estimate of the event, which can be tens of
    milliseconds before ours, and ephem's ``previous_*`` search does not see an
    event less than about 0.15 s before its start (it returns the day before).
    So for a *now* within that second before the event, the event is named.
    """
    ephem = s.ephem
    observer = s.cal.copy()
    kwargs = {"use_center": True} if s.use_center else {}
    previous = getattr(observer, s.method.replace("next_", "previous_"))
    following = getattr(observer, s.method)
    start = (as_utc(now) + _SOLAR_GRACE).replace(tzinfo=None)
    approx = previous(ephem.Sun(), start=ephem.Date(start), **kwargs)
    approx_dt = approx.datetime().replace(tzinfo=timezone.utc)
    canonical = approx_dt.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    exact = following(ephem.Sun(), start=ephem.Date(canonical.replace(tzinfo=None)), **kwargs)
    event = exact.datetime().replace(tzinfo=timezone.utc)
    # Always round to the nearest second: a result that depended on *now* (say,
    # rounding down while the rounded-up second is still ahead of *now*) names
    # the same event differently on a node that fires at once and one a second later.
    return _second(event + timedelta(microseconds=500_000))

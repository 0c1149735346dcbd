"""DST marks: how one entry's occurrences meet its time zone's offset changes.

For ``elarion-beat preview``. The occurrences themselves come from the real slot
naming (:mod:`.slots`, :mod:`.cron`, :mod:`.cron_dst`); this module only reads them
and says what happened at each transition:

* an occurrence whose UTC offset differs from the previous one's:
  ``DST +1h (CET->CEST)``;
* spring forward: the wall times of the gap the schedule names, and what became of
  them: ``02:30 does not exist: runs once at the jump (03:00 CEST)`` when a slot lies
  at the jump (``...; 03:00 CEST runs at the jump as usual`` when the schedule names
  03:00 too: one run either way), else ``skipped``;
* fall back: a wall time of the repeated hour that runs at both its instants
  (``1st of 2`` / ``2nd of 2``) or at its first one only (``runs once``), as the
  slot naming answers for the other instant.

Wall times are read for Celery's ``crontab`` and our ``cron`` (the schedules that
name wall times); other schedules get the offset mark only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

from celery.schedules import crontab

from .cron import cron, zone_name
from .cron_dst import first_change, iterate
from .slots import day_matches, name_occurrence

__all__ = ["Transition", "dst_marks", "offset_text", "transitions"]

_SECOND = timedelta(seconds=1)
#: wall times named in one gap at most (a schedule every second names 3,600)
_MOST_WALLS = 10_000


@dataclass(frozen=True)
class Transition:
    """A change of *zone*'s UTC offset: *at* is the first instant of the new offset."""

    zone: tzinfo
    at: datetime

    @property
    def before(self) -> timedelta:
        return _offset(self.zone, self.at - _SECOND)

    @property
    def after(self) -> timedelta:
        return _offset(self.zone, self.at)

    @property
    def shift(self) -> timedelta:
        return self.after - self.before

    @property
    def names(self) -> tuple[str, str]:
        """The zone's abbreviations before and after: ``("CET", "CEST")``."""
        return (str((self.at - _SECOND).astimezone(self.zone).tzname()),
                str(self.at.astimezone(self.zone).tzname()))

    @property
    def walls(self) -> tuple[datetime, datetime]:
        """The naive wall times ``[lo, hi)`` that do not exist (spring forward) or
        happen twice (fall back)."""
        old, new = _wall(self.at, self.before), _wall(self.at, self.after)
        return (old, new) if old < new else (new, old)

    def mark(self, zone_shown: bool = False) -> str:
        """``DST +1h (CET->CEST)`` (with the zone's name when *zone_shown*)."""
        old, new = self.names
        where = f", {zone_name(self.zone)}" if zone_shown else ""
        return f"DST {_span(self.shift)} ({old}->{new}{where})"

    def describe(self) -> str:
        """``02:00 CET -> 03:00 CEST (+1h)``: what the clocks do."""
        old, new = self.names
        return (f"{_wall(self.at, self.before):%H:%M} {old} -> "
                f"{_wall(self.at, self.after):%H:%M} {new} ({_span(self.shift)})")


def transitions(zone: tzinfo, start: datetime, end: datetime) -> list[Transition]:
    """Every offset change of *zone* in ``(start, end]`` (aware UTC)."""
    found: list[Transition] = []
    cursor = start
    while (change := first_change(zone, cursor, end)) is not None:
        found.append(Transition(zone, change))
        cursor = change
    return found


def dst_marks(job: str, sched: Any, zone: tzinfo, instants: Sequence[datetime],
              previous: datetime | None, zone_shown: bool = False) -> list[list[str]]:
    """The marks of each of *instants* (sorted, aware UTC) of *sched* read in *zone*;
    *previous* is the occurrence before the first (or the start of the window)."""
    marks: list[list[str]] = [[] for _ in instants]
    if not instants:
        return marks
    earlier = previous if previous is not None else instants[0]
    walls = isinstance(sched, (crontab, cron))
    for i, instant in enumerate(instants):
        before = instants[i - 1] if i else earlier
        if _offset(zone, before) == _offset(zone, instant):
            continue
        change = first_change(zone, before, instant)
        if change is None:
            continue
        shift = Transition(zone, change)
        marks[i].append(shift.mark(zone_shown))
        if walls and shift.shift > timedelta(0):
            note = _gap_note(sched, shift, instant)
            if note:
                marks[i].append(note)
    if walls:
        start = previous if previous is not None else instants[0]
        for shift in transitions(zone, start - _SECOND, instants[-1] + timedelta(hours=3)):
            if shift.shift < timedelta(0):
                _repeat_notes(job, sched, shift, instants, marks)
    return marks


def offset_text(moment: datetime) -> str:
    """``+01:00`` (or ``-04:00``, ``+05:45``) of an aware datetime."""
    offset = moment.utcoffset() or timedelta(0)
    sign = "-" if offset < timedelta(0) else "+"
    minutes = int(abs(offset).total_seconds()) // 60
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def _gap_note(sched: Any, shift: Transition, instant: datetime) -> str:
    lo, hi = shift.walls
    named = _named_walls(sched, lo, hi)
    if not named:
        return ""
    verb = "does" if len(named) == 1 else "do"
    if instant == shift.at:
        local = instant.astimezone(shift.zone)
        if _named_walls(sched, hi, hi + _SECOND):  # the jump's own wall time is scheduled
            return (f"{_walls_text(named)} {verb} not exist; {local:%H:%M} {local.tzname()} "
                    "runs at the jump as usual")
        sent = (named[0] - shift.before).replace(tzinfo=timezone.utc)
        if isinstance(sched, crontab) and sent != instant:
            # beat sleeps from its last run until the missing wall time read with the
            # old offset (Celery 5.5.2 and later compute it so; earlier versions' wall
            # time arithmetic gives the same sleep): it sends later than the jump,
            # under the jump's slot name
            at = sent.astimezone(shift.zone)
            return (f"{_walls_text(named)} {verb} not exist: Celery sends it once, at "
                    f"{at:%H:%M} {at.tzname()} ({sent:%H:%M}Z), claimed as the "
                    f"{local:%H:%M} {local.tzname()} slot")
        return (f"{_walls_text(named)} {verb} not exist: runs once at the jump "
                f"({local:%H:%M} {local.tzname()})")
    return f"{_walls_text(named)} {verb} not exist: skipped"


def _repeat_notes(job: str, sched: Any, shift: Transition, instants: Sequence[datetime],
                  marks: list[list[str]]) -> None:
    """Mark the occurrences of the repeated wall times around the fall back *shift*."""
    lo, hi = shift.walls
    back = -shift.shift
    for i, instant in enumerate(instants):
        local = instant.astimezone(shift.zone)
        wall = local.replace(tzinfo=None)
        if not (lo <= wall < hi and shift.at - back <= instant < shift.at + back):
            continue
        first = instant < shift.at
        twin = instant + back if first else instant - back
        both = _is_slot(job, sched, twin)
        text = _clock(wall)
        if first:
            marks[i].append(f"{text} happens twice: 1st of 2 ({local.tzname()})" if both
                            else f"{text} happens twice: runs once, at the first "
                                 f"({local.tzname()})")
        else:
            marks[i].append(f"{text} again: 2nd of 2 ({local.tzname()})" if both
                            else f"{text} again ({local.tzname()})")


def _is_slot(job: str, sched: Any, instant: datetime) -> bool:
    """Whether the slot naming names *instant* itself as a slot of *sched*."""
    try:
        return name_occurrence(job, sched, instant, tolerance=0.0).slot == instant
    except ValueError:
        return False


def _named_walls(sched: Any, lo: datetime, hi: datetime) -> list[datetime]:
    """The naive wall times in ``[lo, hi)`` that *sched* names (its fields alone)."""
    found: list[datetime] = []
    if isinstance(sched, cron):
        steps = iterate(sched.expr, sched.with_seconds, lo - _SECOND)
        while len(found) < _MOST_WALLS:
            wall: datetime = steps.get_next(datetime)
            if wall >= hi:
                break
            found.append(wall)
    elif isinstance(sched, crontab):
        wall = lo.replace(second=0, microsecond=0)
        wall += timedelta(minutes=1) if wall < lo else timedelta(0)
        while wall < hi:
            if (day_matches(sched, wall.date()) and wall.hour in sched.hour
                    and wall.minute in sched.minute):
                found.append(wall)
            wall += timedelta(minutes=1)
    return found


def _walls_text(walls: Sequence[datetime]) -> str:
    if len(walls) == 1:
        return _clock(walls[0])
    return f"{_clock(walls[0])}-{_clock(walls[-1])} ({len(walls)} wall times)"


def _clock(wall: datetime) -> str:
    return f"{wall:%H:%M:%S}" if wall.second else f"{wall:%H:%M}"


def _span(shift: timedelta) -> str:
    sign = "-" if shift < timedelta(0) else "+"
    minutes = int(abs(shift).total_seconds()) // 60
    hours, rest = divmod(minutes, 60)
    return sign + (f"{hours}h" if hours else "") + (f"{rest}m" if rest else "")


def _offset(zone: tzinfo, instant: datetime) -> timedelta:
    return instant.astimezone(zone).utcoffset() or timedelta(0)


def _wall(instant: datetime, offset: timedelta) -> datetime:
    return (instant + offset).replace(tzinfo=None)

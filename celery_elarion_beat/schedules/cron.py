"""``cron``: a croniter-based schedule with seconds and its own time zone.

Usable directly in ``beat_schedule``::

    from celery_elarion_beat import cron

    app.conf.beat_schedule = {
        "report": {"task": "tasks.report", "schedule": cron("0 0 3 * * *", tz="Europe/Berlin")},
    }

Five fields are standard cron (``minute hour day-of-month month day-of-week``).
Six fields put the **seconds first** (``second minute hour ...``), as Quartz and
Cronos do: ``0 0 3 * * *`` is 03:00:00 every day and ``*/10 * * * * *`` is every
ten seconds. (croniter on its own reads a sixth field as seconds *last*.)
Day of month and day of week follow cron: either may match.

Daylight saving time, as for Celery's ``crontab`` (see
:func:`celery_elarion_beat.schedules.slots.crontab_slot`): a wall time that does not
exist runs when the clocks jump; a wall time that happens twice runs once, at
its first instant, unless the hour field is ``*`` (every hour), as in Vixie cron;
with hour ``*`` a wall time that does not exist does not run. croniter alone gets
these wrong (it runs every repeated wall time twice and moves a skipped wall time
with a nonzero second forward by the gap), so within a few hours of a transition
the instants come from :mod:`.cron_dst` instead, and from croniter elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import BaseSchedule, schedstate
from croniter import croniter

from ..exceptions import ConfigurationError
from .clock import as_utc
from .cron_dst import NEAR, iterate, last_instant, next_instant, steady

__all__ = ["cron", "zone_name"]

class cron(BaseSchedule):  # noqa: N801 - named like celery's crontab and solar
    """A cron expression (5 fields, or 6 with seconds first) in a time zone."""

    def __init__(
        self,
        expr: str,
        tz: str | tzinfo | None = None,
        nowfun: Callable[[], datetime] | None = None,
        app: Any = None,
    ) -> None:
        super().__init__(nowfun=nowfun, app=app)
        fields = str(expr).split()
        if len(fields) not in (5, 6):
            raise ConfigurationError(
                f"cron({expr!r}) has {len(fields)} fields; use 5 (minute hour day month "
                "weekday) or 6 with the seconds first (second minute hour day month weekday)"
            )
        self.expr = " ".join(fields)
        self.with_seconds = len(fields) == 6
        if not croniter.is_valid(self.expr, second_at_beginning=self.with_seconds):
            raise ConfigurationError(f"cron({expr!r}) is not a valid cron expression")
        self._zone = _zone(tz)
        hours = croniter.expand(self.expr, second_at_beginning=self.with_seconds)[0][1]
        self._every_hour = "*" in hours or len(set(hours)) == 24

    @property
    def zone(self) -> tzinfo:
        """The time zone the expression is read in (the app's when none was given)."""
        if self._zone is not None:
            return self._zone
        app_tz = self.app.timezone
        return timezone.utc if app_tz is None else app_tz

    def _iter(self, start: datetime) -> croniter:
        return iterate(self.expr, self.with_seconds, as_utc(start).astimezone(self.zone))

    def next_after(self, moment: datetime) -> datetime:
        """The first instant strictly after *moment* (aware UTC)."""
        moment = as_utc(moment)
        span = _SPANS.find(self._key(), moment)
        return span[1] if span is not None else self._span(moment)[1]

    def elarion_slot(self, now: datetime) -> datetime:
        """The latest instant at or before *now* (aware UTC): the exact slot."""
        now = as_utc(now)
        span = _SPANS.find(self._key(), now)
        return span[0] if span is not None else self._span(now)[0]

    def _key(self) -> tuple[str, bool, str]:
        return (self.expr, self.with_seconds, str(self.zone))

    def _span(self, moment: datetime) -> tuple[datetime, datetime]:
        """The instants around *moment*: the slot at or before it and the next one.

        No instant lies strictly between the two, so every moment in
        ``[slot, next)`` has the same answers: the span is remembered and shared by
        every ``cron`` of the same expression and zone (10,000 entries of one
        expression cost croniter one search per slot, not 10,000).
        """
        span = (self._compute_slot(moment), self._compute_next_after(moment))
        if span[0] <= moment < span[1]:
            _SPANS.add(self._key(), span)
        return span

    def _compute_next_after(self, moment: datetime) -> datetime:
        zone = self.zone
        if steady(zone, moment - NEAR, moment + NEAR):
            fast = as_utc(self._iter(moment).get_next(datetime))
            if steady(zone, moment, fast + NEAR):
                return fast
        return next_instant(self.expr, self.with_seconds, self._every_hour, zone, moment)

    def _compute_slot(self, now: datetime) -> datetime:
        """The latest instant at or before *now* (aware UTC): the exact slot.

        croniter answers where the zone keeps one UTC offset from a few hours
        before its answer to a few hours after *now*; near a transition (where
        croniter's answers are wrong) :mod:`.cron_dst` does, from naive wall times.
        """
        zone = self.zone
        if steady(zone, now - NEAR, now + NEAR):
            fast = as_utc(self._iter(now + timedelta(microseconds=1)).get_prev(datetime))
            if fast <= now and steady(zone, fast - NEAR, now):
                return fast
        return last_instant(self.expr, self.with_seconds, self._every_hour, zone, now)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return self.next_after(self.maybe_make_aware(last_run_at)) - as_utc(self.now())

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        now = as_utc(self.maybe_make_aware(self.now()))
        upcoming = self.next_after(self.maybe_make_aware(last_run_at))
        if upcoming <= now:
            state = schedstate(True, (self.next_after(now) - now).total_seconds())
        else:
            state = schedstate(False, (upcoming - now).total_seconds())
        return (bool(state.is_due), float(state.next))

    def __repr__(self) -> str:
        zone = "" if self._zone is None else f" tz={zone_name(self._zone)}"
        return f"<cron: {self.expr}{zone}>"

    def __reduce__(self) -> tuple[Any, ...]:
        # a ZoneInfo travels as its key; any other zone (fixed offsets, pytz, dateutil)
        # as itself: zone_name() is a name, not always one ZoneInfo can load again (and
        # dateutil 4's zones have a ``key`` too, but a copy must stay a dateutil zone)
        zone = self._zone
        return self.__class__, (self.expr, zone.key if isinstance(zone, ZoneInfo) else zone)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, cron):
            return self.expr == other.expr and self._zone == other._zone
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.expr, str(self._zone)))


class _SpanCache:
    """A few recent ``(slot, next)`` spans per expression; thread-safe enough for
    beat (a lost race only recomputes a span)."""

    def __init__(self, per_key: int = 4, max_keys: int = 4096) -> None:
        self.per_key = per_key
        self.max_keys = max_keys
        self.spans: dict[tuple[str, bool, str], list[tuple[datetime, datetime]]] = {}

    def find(self, key: tuple[str, bool, str],
             moment: datetime) -> tuple[datetime, datetime] | None:
        for span in self.spans.get(key, ()):
            if span[0] <= moment < span[1]:
                return span
        return None

    def add(self, key: tuple[str, bool, str], span: tuple[datetime, datetime]) -> None:
        if len(self.spans) >= self.max_keys and key not in self.spans:
            self.spans.clear()
        kept = [s for s in self.spans.get(key, []) if s != span][: self.per_key - 1]
        self.spans[key] = [span, *kept]


#: Pickles and schedule fingerprints name the class by its module: keep the path of
#: earlier releases (``celery_elarion_beat.cron`` re-exports it), so a pickled ``cron``
#: loads on every version and nodes of two releases compare equal in the drift check.
cron.__module__ = "celery_elarion_beat.cron"

_SPANS = _SpanCache()


#: a memory address in a repr (``<X object at 0x7f...>``): it differs in every process
ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def zone_name(tz: tzinfo) -> str:
    """A stable name of *tz*, equal on every node for zones that give the same slots.

    The IANA key of a ``ZoneInfo`` (or a pytz zone's ``.zone``, or the zoneinfo path of
    a dateutil ``tzfile``); ``UTC`` or ``UTC+02:00`` for a fixed offset (of
    ``datetime.timezone``, pytz or dateutil: the offset decides, not its label); else
    the zone's repr without memory addresses. Schedule fingerprints and ``repr`` use it.
    """
    for attribute in ("key", "zone"):  # ZoneInfo, pytz
        name = getattr(tz, attribute, None)
        if isinstance(name, str) and name:
            return name
    filename = getattr(tz, "_filename", None)  # dateutil.tz.tzfile
    if isinstance(filename, str) and filename:
        return filename.rpartition("zoneinfo/")[2] or filename
    try:
        offset = tz.utcoffset(None)  # fixed offsets answer without a date
    except Exception:  # noqa: BLE001 - a tzinfo may refuse None: it has no fixed offset
        offset = None
    if isinstance(offset, timedelta):
        return _offset_name(offset)
    return ADDRESS.sub("", repr(tz))


def _offset_name(offset: timedelta) -> str:
    """``UTC``, ``UTC+02:00``, ``UTC-03:30``, ``UTC+05:45:30`` (as ``datetime.timezone``)."""
    if not offset:
        return "UTC"
    sign = "-" if offset < timedelta(0) else "+"
    hours, rest = divmod(abs(offset), timedelta(hours=1))
    minutes, rest = divmod(rest, timedelta(minutes=1))
    text = f"UTC{sign}{hours:02d}:{minutes:02d}"
    if rest:
        text += f":{rest.seconds:02d}" + (f".{rest.microseconds:06d}" if rest.microseconds else "")
    return text


def _zone(tz: str | tzinfo | None) -> tzinfo | None:
    if tz is None or isinstance(tz, tzinfo):
        return tz
    try:
        return ZoneInfo(str(tz))
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"cron(tz={tz!r}) is not a known time zone; use an IANA name such as 'Europe/Berlin'"
        ) from None

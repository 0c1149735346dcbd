"""A fake beat clock: the one clock a simulated cluster and its schedules read.

Aware UTC, like :func:`celery_elarion_beat.schedules.clock.utcnow`; it moves only when told
(:meth:`BeatClock.advance`, :meth:`BeatClock.set`).
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone, tzinfo

from ..exceptions import ConfigurationError
from ..schedules.clock import as_utc

__all__ = ["BeatClock", "moment"]

#: Where a clock built without a start begins (a Monday, far from any DST change).
DEFAULT_START = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)


def moment(value: datetime | date | str, tz: tzinfo | None = None) -> datetime:
    """*value* as an aware UTC datetime.

    An ISO 8601 string (``"2026-03-29"``, ``"2026-03-29T02:30"``, ``"...Z"``), a
    ``date`` (its midnight) or a ``datetime``; one without an offset is read as wall
    time in *tz* (UTC when None). A wall time that happens twice is its first instant.
    """
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigurationError(
                f"{value!r} is not an ISO 8601 date or datetime; write it as "
                "'2026-03-29' or '2026-03-29T02:30:00' (or pass a datetime)") from None
    if not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    if value.tzinfo is None:
        value = value.replace(tzinfo=tz or timezone.utc)
    return as_utc(value)


class BeatClock:
    """A clock that stands still until moved: call it for the time (aware UTC).

    Pass it as ``clock=`` to :class:`~celery_elarion_beat.ClaimingScheduler` and
    :class:`~celery_elarion_beat.MemoryClaimStore`, and as ``nowfun=`` to schedules,
    or let :class:`~celery_elarion_beat.testing.Cluster` do both.
    """

    def __init__(self, start: datetime | date | str | None = None) -> None:
        self.now = moment(start) if start is not None else DEFAULT_START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, by: float | timedelta) -> datetime:
        """Move the clock *by* seconds (or a timedelta; negative moves it back)."""
        self.now += by if isinstance(by, timedelta) else timedelta(seconds=by)
        return self.now

    def set(self, when: datetime | date | str) -> datetime:
        """Put the clock at *when* (see :func:`moment`; naive means UTC)."""
        self.now = moment(when)
        return self.now

    def __repr__(self) -> str:
        return f"BeatClock({self.now.isoformat()})"

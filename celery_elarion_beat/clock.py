"""The one clock: aware UTC datetimes.

The scheduler reads :func:`utcnow` once per tick and passes the value down
(``now=``); nothing below it reads the clock again. Tests inject their own
:data:`Clock`. Where several nodes' clocks must agree (interval windows) the
database clock decides instead, see :mod:`celery_elarion_beat.store`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

__all__ = ["Clock", "as_utc", "iso_utc", "utcnow"]

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    """Return *value* as an aware UTC datetime; a naive value is taken as UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def iso_utc(value: datetime | None) -> str | None:
    """*value* as ISO text in UTC with a ``Z`` (its full precision), or None."""
    return as_utc(value).isoformat().replace("+00:00", "Z") if value is not None else None

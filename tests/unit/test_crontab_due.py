"""crontab_due: an every-hour Celery crontab runs both instants of a repeated hour."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat.slots import crontab_due

UTC = timezone.utc


def fires(zone: str, kwargs: dict[str, object], start: datetime, end: datetime) -> list[datetime]:
    """Drive Celery's real is_due, corrected by crontab_due, every 5 s."""
    app = Celery(set_as_current=False)
    app.conf.timezone = zone
    c = crontab(app=app, **kwargs)
    last, now, out = start, start, []
    while now <= end:
        c.nowfun = lambda now=now: now
        due, _ = crontab_due(c, last, now, c.is_due(last))
        if due:
            out.append(now)
            last = now
        now += timedelta(seconds=5)
    return out


@pytest.mark.parametrize(("zone", "fall"), [
    ("Europe/Berlin", datetime(2027, 10, 31, 1, tzinfo=UTC)),
    ("America/New_York", datetime(2027, 11, 7, 6, tzinfo=UTC)),
])
def test_hourly_crontab_fires_the_second_instant_of_the_repeated_hour(zone: str,
                                                                     fall: datetime) -> None:
    got = fires(zone, {"minute": 0}, fall - timedelta(hours=1, minutes=2),
                fall + timedelta(hours=1, minutes=2))
    assert got == [fall - timedelta(hours=1), fall, fall + timedelta(hours=1)]


def test_named_hour_keeps_the_first_instant_only() -> None:
    fall = datetime(2027, 10, 31, 1, tzinfo=UTC)
    got = fires("Europe/Berlin", {"minute": 0, "hour": 2}, fall - timedelta(hours=1, minutes=2),
                fall + timedelta(hours=1, minutes=2))
    assert got == [fall - timedelta(hours=1)]

"""crontab_due: an every-hour Celery crontab runs both instants of a repeated hour."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat.schedules.slots import crontab_due, crontab_last_run

UTC = timezone.utc


def fires(zone: str, kwargs: dict[str, object], start: datetime, end: datetime) -> list[datetime]:
    """Drive Celery's real is_due, corrected by crontab_due, every 5 s, as beat asks:
    its now is ``app.now()`` (in the app's zone), its last run in the crontab's zone."""
    app = Celery(set_as_current=False)
    app.conf.timezone = zone
    c = crontab(app=app, **kwargs)
    last, now, out = start, start, []
    while now <= end:
        c.nowfun = lambda now=now: now.astimezone(app.timezone)
        asked = crontab_last_run(c, last)
        due, _ = crontab_due(c, asked, now, c.is_due(asked))
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


def test_a_last_run_written_in_utc_fires_at_the_zones_wall_time() -> None:
    """Celery before 5.7 matches a crontab against last_run_at's own wall time: asked
    with a UTC last_run_at, ``crontab(minute=30, hour=2)`` of an app in Berlin would
    fire at 02:30 UTC. crontab_last_run puts it in the crontab's zone first, so every
    Celery version fires at 02:30 CET (01:30 UTC)."""
    app = Celery(set_as_current=False)
    app.conf.timezone = "Europe/Berlin"
    c = crontab(minute=30, hour=2, app=app)
    last = datetime(2026, 1, 10, 3, 0, tzinfo=UTC)  # 04:00 CET, after the day's run
    asked = crontab_last_run(c, last)
    assert asked == last and asked.utcoffset() == timedelta(hours=1)
    c.nowfun = lambda: last.astimezone(app.timezone)
    _, next_in = c.is_due(asked)
    assert last + timedelta(seconds=next_in) == datetime(2026, 1, 11, 1, 30, tzinfo=UTC)

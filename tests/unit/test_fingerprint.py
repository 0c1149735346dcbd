"""Schedule fingerprints tell time zones apart: a zone changes every slot of a cron entry.

(``zone_name`` is imported inside the tests that use it, so that the fingerprint tests
show their own failure, not an ImportError, on a version without it.)"""

from __future__ import annotations

import pickle
from datetime import datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.beat import ScheduleEntry
from dateutil import tz as dateutil_tz

from celery_elarion_beat import cron
from celery_elarion_beat.observe.fingerprint import describe_schedule, entry_digests, fingerprint

EXPR = "0 0 3 * * *"


def digests(schedule: cron) -> dict[str, str]:
    app = Celery("fingerprint", broker="memory://", set_as_current=False)
    entry = ScheduleEntry(name="report", task="tasks.report", schedule=schedule, app=app)
    return entry_digests({"report": entry})


def offset(hours: float) -> timezone:
    return timezone(timedelta(hours=hours))


class NamelessZone(tzinfo):
    """A zone with no name, no fixed offset and the default repr (a memory address)."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None if dt is None else timedelta(hours=1)

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        return None


class PytzLikeZone(NamelessZone):
    """What pytz zones have and ZoneInfo has not: the name as ``.zone``."""

    zone = "Asia/Tokyo"


def test_same_expression_in_different_fixed_offsets_gets_different_fingerprints() -> None:
    plus2, minus5 = digests(cron(EXPR, tz=offset(2))), digests(cron(EXPR, tz=offset(-5)))
    assert plus2 != minus5
    assert fingerprint(plus2) != fingerprint(minus5)
    assert digests(cron(EXPR)) not in (plus2, minus5)  # and neither is the app's zone


def test_the_same_zone_given_twice_gets_equal_fingerprints() -> None:
    first = digests(cron(EXPR, tz=ZoneInfo.no_cache("Europe/Berlin")))
    second = digests(cron(EXPR, tz=ZoneInfo.no_cache("Europe/Berlin")))
    assert first == second and fingerprint(first) == fingerprint(second)
    assert digests(cron(EXPR, tz="Europe/Berlin")) == first
    assert digests(cron(EXPR, tz=offset(2))) == digests(cron(EXPR, tz=offset(2)))


def test_the_description_names_the_zone() -> None:
    assert describe_schedule(cron(EXPR, tz=offset(2))) == f"cron({EXPR}; tz=UTC+02:00)"
    assert describe_schedule(cron(EXPR, tz="Europe/Berlin")) == f"cron({EXPR}; tz=Europe/Berlin)"
    assert describe_schedule(cron(EXPR)) == f"cron({EXPR}; tz=app)"


@pytest.mark.parametrize(("zone", "name"), [
    (ZoneInfo("Europe/Berlin"), "Europe/Berlin"),
    (ZoneInfo("UTC"), "UTC"),
    (timezone.utc, "UTC"),
    (timezone(timedelta(0), "Z"), "UTC"),
    (offset(2), "UTC+02:00"),
    (timezone(timedelta(hours=2), "CEST"), "UTC+02:00"),  # the offset decides, not the label
    (timezone(-timedelta(hours=3, minutes=30)), "UTC-03:30"),
    (timezone(timedelta(hours=5, minutes=45, seconds=30)), "UTC+05:45:30"),
    (dateutil_tz.gettz("Europe/Berlin"), "Europe/Berlin"),
    (dateutil_tz.tzoffset(None, 7200), "UTC+02:00"),
    (dateutil_tz.tzutc(), "UTC"),
    (dateutil_tz.tzstr("EST5EDT"), "tzstr('EST5EDT')"),
    (PytzLikeZone(), "Asia/Tokyo"),
])
def test_zone_names(zone: tzinfo, name: str) -> None:
    from celery_elarion_beat.schedules.cron import zone_name

    assert zone_name(zone) == name


def test_a_zone_without_a_name_gets_a_name_without_a_memory_address() -> None:
    from celery_elarion_beat.schedules.cron import zone_name

    assert "0x" in repr(NamelessZone())
    name = zone_name(NamelessZone())
    assert "0x" not in name and name == zone_name(NamelessZone())
    assert "NamelessZone" in name


@pytest.mark.parametrize("zone", [offset(2), dateutil_tz.gettz("Europe/Berlin"),
                                  ZoneInfo("Europe/Berlin")])
def test_repr_names_the_zone_and_pickling_round_trips(zone: tzinfo) -> None:
    from celery_elarion_beat.schedules.cron import zone_name

    c = cron(EXPR, tz=zone)
    assert repr(c) == f"<cron: {EXPR} tz={zone_name(zone)}>"
    copy = pickle.loads(pickle.dumps(c))
    assert copy == c and repr(copy) == repr(c) and digests(copy) == digests(c)
    assert copy.elarion_slot(datetime(2026, 7, 1, 12, tzinfo=timezone.utc)) == \
        c.elarion_slot(datetime(2026, 7, 1, 12, tzinfo=timezone.utc))

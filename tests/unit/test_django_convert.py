"""django-celery-beat rows converted (contrib/django/convert.py): each schedule kind,
the options, start time and expiry, one-offs, the ledger anchor of an interval, and
every refusal naming the row and the field. Pure: no Django, no database (the rows
as django-celery-beat's models hold them are tested in
tests/integration/test_django_import_postgres.py)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery

from celery_elarion_beat import Settings
from celery_elarion_beat.contrib.django.convert import (
    EntryPlan,
    OneOffPlan,
    Refused,
    Skipped,
    SourceTask,
    convert,
    one_off_key,
)

UTC = timezone.utc
NOW = datetime(2026, 12, 2, 10, 20, tzinfo=UTC)
SETTINGS = Settings.from_mapping({"elarion_beat_dsn": "memory://",
                                  "elarion_beat_db_entries": True,
                                  "elarion_beat_db_entry_tasks": "dj.*"})
APP = Celery(f"conv{uuid.uuid4().hex[:6]}", set_as_current=False)
APP.conf.timezone = "UTC"


def row(**fields: Any) -> SourceTask:
    base: dict[str, Any] = {"id": 7, "name": "nightly", "task": "dj.report",
                            "schedules": {"crontab": {
                                "minute": "0", "hour": "6", "day_of_month": "*",
                                "month_of_year": "*", "day_of_week": "1-5",
                                "timezone": ZoneInfo("Europe/Berlin")}}}
    return SourceTask(**{**base, **fields})


def entry(task: SourceTask, **kw: Any) -> EntryPlan:
    found = convert(task, NOW, SETTINGS, APP, **kw)
    assert isinstance(found, EntryPlan), found
    return found


def refused(task: SourceTask) -> Refused:
    found = convert(task, NOW, SETTINGS, APP)
    assert isinstance(found, Refused), found
    return found


def test_a_zoned_crontab_keeps_its_time_zone_and_its_options() -> None:
    plan = entry(row(queue="reports", exchange="ex", routing_key="rk", priority=7,
                     headers='{"team": "ops"}', args='[1, "a"]', kwargs='{"days": 7}',
                     expire_seconds=300))
    d = plan.definition
    assert d.schedule.as_json() == {"crontab": "0 6 * * 1-5", "tz": "Europe/Berlin"}
    assert (d.task, d.args, dict(d.kwargs), d.enabled) == ("dj.report", (1, "a"), {"days": 7},
                                                           True)
    assert dict(d.options) == {"queue": "reports", "exchange": "ex", "routing_key": "rk",
                               "priority": 7, "expires": 300,
                               "headers": {"team": "ops", "periodic_task_name": "nightly"}}
    assert (plan.effective, plan.ends, plan.anchor) == (None, None, None)


def test_without_tz_awareness_a_crontab_runs_in_the_apps_time_zone() -> None:
    plan = entry(row(), tz_aware=False)  # DJANGO_CELERY_BEAT_TZ_AWARE = False
    assert plan.definition.schedule.as_json() == {"crontab": "0 6 * * 1-5"}


def test_crontab_fields_are_read_as_django_celery_beat_shows_them() -> None:
    plan = entry(row(schedules={"crontab": {"minute": "0, 30", "hour": "", "day_of_month": "*",
                                            "month_of_year": "*", "day_of_week": "*",
                                            "timezone": ZoneInfo("UTC")}}))
    assert plan.definition.schedule.as_json() == {"crontab": "0,30 * * * *", "tz": "UTC"}


@pytest.mark.parametrize(("every", "period", "seconds"), [
    (2, "days", 172800), (3, "hours", 10800), (15, "minutes", 900), (30, "seconds", 30),
    (500000, "microseconds", 0.5)])
def test_an_interval_becomes_every_seconds(every: int, period: str, seconds: float) -> None:
    plan = entry(row(schedules={"interval": {"every": every, "period": period}}))
    assert plan.definition.schedule.as_json() == {"every": seconds}


def test_an_interval_keeps_its_rhythm_through_its_last_run() -> None:
    last = NOW - timedelta(minutes=20)
    plan = entry(row(schedules={"interval": {"every": 1, "period": "hours"}},
                     last_run_at=last))
    assert plan.anchor == last and plan.effective is None  # the ledger's newest claim
    disabled = entry(row(schedules={"interval": {"every": 1, "period": "hours"}},
                         last_run_at=last, enabled=False))
    assert disabled.anchor is None and disabled.definition.enabled is False


def test_a_solar_schedule_becomes_solar() -> None:
    plan = entry(row(schedules={"solar": {"event": "sunset", "latitude": Decimal("52.520000"),
                                          "longitude": Decimal("13.405000")}}))
    assert plan.definition.schedule.as_json() == {"solar": "sunset", "lat": 52.52,
                                                  "lon": 13.405}


def test_a_future_start_time_is_the_effective_time() -> None:
    start = NOW + timedelta(days=3)
    assert entry(row(start_time=start)).effective == start
    # an interval runs first at start_time: effective one interval before
    plan = entry(row(schedules={"interval": {"every": 1, "period": "hours"}},
                     start_time=start, last_run_at=NOW - timedelta(hours=5)))
    assert plan.effective == start - timedelta(hours=1) and plan.anchor is None
    # start_time within one interval: from the import on (its first run after start)
    soon = entry(row(schedules={"interval": {"every": 1, "period": "hours"}},
                     start_time=NOW + timedelta(minutes=10)))
    assert soon.effective is None and soon.anchor is None
    # a start_time in the past changes nothing
    assert entry(row(start_time=NOW - timedelta(days=3))).effective is None


def test_expires_ends_the_schedule_and_expires_the_messages() -> None:
    ends = NOW + timedelta(days=10)
    plan = entry(row(expires=ends))
    assert plan.ends == ends
    assert plan.definition.options["expires"] == "2026-12-12T10:20:00Z"
    gone = convert(row(expires=NOW - timedelta(seconds=1)), NOW, SETTINGS, APP)
    assert isinstance(gone, Skipped) and "expired at 2026-12-02T10:19:59Z" in gone.text()
    never = convert(row(start_time=NOW + timedelta(days=2), expires=NOW + timedelta(days=1)),
                    NOW, SETTINGS, APP)
    assert isinstance(never, Skipped) and "before it starts" in never.reason


def test_a_clocked_row_becomes_a_keyed_one_off() -> None:
    at = NOW + timedelta(hours=5)
    found = convert(row(schedules={"clocked": {"clocked_time": at}}, one_off=True,
                        args="[3]", queue="q"), NOW, SETTINGS, APP)
    assert isinstance(found, OneOffPlan)
    assert (found.task, found.args, found.eta, found.key, found.fixed) == (
        "dj.report", (3,), at, "django-celery-beat:nightly", True)
    assert found.options["queue"] == "q"
    held = convert(row(schedules={"clocked": {"clocked_time": at}}, one_off=True,
                       start_time=at + timedelta(hours=1)), NOW, SETTINGS, APP)
    assert isinstance(held, OneOffPlan) and held.eta == at + timedelta(hours=1)


def test_a_one_off_crontab_runs_once_at_its_next_slot() -> None:
    found = convert(row(one_off=True), NOW, SETTINGS, APP)  # 06:00 Berlin on weekdays
    assert isinstance(found, OneOffPlan) and found.fixed is False
    assert found.eta == datetime(2026, 12, 3, 5, 0, tzinfo=UTC)
    interval = convert(row(one_off=True, schedules={"interval": {"every": 1, "period": "hours"}},
                           last_run_at=None, date_changed=NOW - timedelta(minutes=45)),
                       NOW, SETTINGS, APP)
    assert isinstance(interval, OneOffPlan)
    assert interval.eta == NOW + timedelta(minutes=15)


@pytest.mark.parametrize("fields", [{"enabled": False}, {"total_run_count": 1}])
def test_a_one_off_that_ran_or_is_disabled_has_nothing_left(fields: dict[str, Any]) -> None:
    found = convert(row(one_off=True, **fields), NOW, SETTINGS, APP)
    assert isinstance(found, Skipped) and "nothing left to run" in found.reason


def test_a_long_name_gets_a_one_off_key_that_fits() -> None:
    key = one_off_key("x" * 200)
    assert len(key) <= 191 and key.startswith("django-celery-beat:sha256:")
    assert key == one_off_key("x" * 200) != one_off_key("y" * 200)


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"task": "other.thing"}, "task", "not allowed for database entries"),
    ({"args": "[1,"}, "args", "is not JSON"),
    ({"args": '{"a": 1}'}, "args", "is not a JSON list"),
    ({"kwargs": "[1]"}, "kwargs", "is not a JSON object"),
    ({"headers": "nope"}, "headers", "is not JSON"),
    ({"expires": NOW + timedelta(days=1), "expire_seconds": 60}, "expires", "both"),
    ({"priority": 300}, "priority", "0 to 255"),
    ({"schedules": {}}, "schedule", "no interval, crontab, solar or clocked"),
    ({"schedules": {"interval": {"every": 1, "period": "hours"},
                    "crontab": {"minute": "0"}}}, "crontab", "several schedules"),
    ({"schedules": {"crontab": {"minute": "61", "hour": "*", "day_of_month": "*",
                                "month_of_year": "*", "day_of_week": "*",
                                "timezone": ZoneInfo("UTC")}}}, "crontab", "61"),
    ({"schedules": {"interval": {"every": 1, "period": "fortnights"}}}, "interval",
     "fortnights"),
    ({"schedules": {"solar": {"event": "teatime", "latitude": 1, "longitude": 2}}}, "solar",
     "teatime"),
    ({"name": "x\x00y"}, "name", "NUL"),
    ({"schedules": {"interval": {"every": 400, "period": "days"}}}, "interval",
     "elarion_beat_claim_retention"),
])
def test_a_row_that_cannot_be_converted_is_refused_naming_the_field(
        fields: dict[str, Any], field: str, words: str) -> None:
    found = refused(row(**fields))
    assert found.field == field and words in found.reason, found
    assert found.text().startswith(f"PeriodicTask {found.row.name!r} (id 7): {field}: ")

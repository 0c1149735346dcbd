"""``celery -A proj elarion-beat schedule import-django`` against the real PostgreSQL, on
rows made with django-celery-beat's own models: each kind converted, the next
occurrences of each converted entry checked against django-celery-beat's own schedule
objects (a zoned crontab across a daylight-saving change included), the ledger seeded so
a beat started after the cut-over fires nothing extra, ``--dry-run`` writing nothing,
``--disable-source`` disabling exactly the converted rows in the same transaction,
unconvertible rows reported by row and field, and a second import changing nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from celery_elarion_beat import ClaimingScheduler, Settings
from celery_elarion_beat import live_schedules as live
from celery_elarion_beat.beat.recovery import IN_FLIGHT
from celery_elarion_beat.config.settings import DEFAULT_CLUSTER
from celery_elarion_beat.contrib.django import importer
from celery_elarion_beat.contrib.django.preview import entry_preview
from celery_elarion_beat.schedules.dst_marks import transitions
from celery_elarion_beat.testing._harness import clean_env, read_claims
from tests.integration.django_project import Project
from tests.operate.support import invoke

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("django")]

UTC = timezone.utc
ROOT = Path(__file__).parents[2]
APP = "tests.integration.django_celery"
#: the run's cluster (tests/conftest.py sets ELARION_BEAT_CLUSTER for every app)
CLUSTER = DEFAULT_CLUSTER
BERLIN = ZoneInfo("Europe/Berlin")


def run(*args: str) -> tuple[int, str]:
    return invoke("schedule", "import-django", *args, app=APP)


def report_of(*args: str) -> tuple[int, dict[str, Any]]:
    code, out = run("--json", *args)
    return code, json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def dcb(django_project: Project) -> Iterator[Any]:
    from django_celery_beat import models

    yield models


def crontab(dcb: Any, minute: str = "0", hour: str = "9", tz: str = "Europe/Berlin",
            alias: str = "default", **fields: str) -> Any:
    return dcb.CrontabSchedule.objects.using(alias).create(
        minute=minute, hour=hour, timezone=ZoneInfo(tz), **fields)


def periodic(dcb: Any, name: str, alias: str = "default", **fields: Any) -> Any:
    fields.setdefault("task", "dj.report")
    task = dcb.PeriodicTask(name=name, **fields)
    task.save(using=alias)
    return task


def dcb_occurrences(task: Any, start: datetime, count: int,
                    last: datetime | None = None) -> list[datetime]:
    """The instants django-celery-beat's own schedule object of *task* says are due from
    *start* on (as its beat asks it: ``is_due(last_run_at)``)."""
    sched = task.schedule
    clock = [start]
    zone = getattr(sched, "tz", None) or UTC
    sched.nowfun = lambda: clock[0].astimezone(zone)
    last_run = last or start
    out: list[datetime] = []
    while len(out) < count:
        due, wait = sched.is_due(last_run)
        if due:
            out.append(clock[0])
            last_run = clock[0]
        clock[0] = clock[0] + timedelta(seconds=max(wait, 0.001))
    return out


def ours(django_project: Project, name: str, start: datetime, count: int) -> list[datetime]:
    """Our next occurrences of entry *name* from *start*: what the admin shows (the
    preview beat's slot naming gives, intervals from their newest claim)."""
    settings = Settings.from_app(django_project.app)
    history = live.entry_history(django_project.app, name, 50, store=django_project.store)
    found = entry_preview(django_project.app, settings, django_project.store, name, history,
                          start, count)
    assert found.rows, found.note
    return [row.utc for row in found.rows]


def same(mine: list[datetime], theirs: list[datetime], within: float = 0.01) -> bool:
    """The same instants (django-celery-beat's are found by stepping a float clock)."""
    return len(mine) == len(theirs) and all(
        abs((a - b).total_seconds()) < within for a, b in zip(mine, theirs))


def next_dst_change(zone: ZoneInfo, after: datetime) -> datetime:
    return transitions(zone, after, after + timedelta(days=366))[0].at


def test_every_kind_converted_and_its_occurrences_match_django_celery_beats(
        dcb: Any, django_project: Project) -> None:
    now = datetime.now(UTC)
    daily = periodic(dcb, "daily-berlin", crontab=crontab(dcb), args='[1, "a"]',
                     kwargs='{"days": 7}', queue="reports", priority=5,
                     headers='{"team": "ops"}', expire_seconds=600)
    six = periodic(dcb, "six-hourly", crontab=crontab(dcb, hour="*/6", tz="America/New_York"))
    night = periodic(dcb, "night-berlin", crontab=crontab(dcb, minute="30", hour="2"))
    hourly = dcb.IntervalSchedule.objects.create(every=1, period="hours")
    interval = periodic(dcb, "hourly", interval=hourly, last_run_at=now - timedelta(minutes=20))
    sunset = dcb.SolarSchedule.objects.create(event="sunset", latitude=Decimal("52.520000"),
                                              longitude=Decimal("13.405000"))
    solar = periodic(dcb, "sunset", solar=sunset)
    at = (now + timedelta(hours=5)).replace(microsecond=0)
    clocked = periodic(dcb, "once", clocked=dcb.ClockedSchedule.objects.create(clocked_time=at),
                       one_off=True, args="[42]")
    once_cron = periodic(dcb, "once-cron", crontab=crontab(dcb, minute="15", hour="*"),
                         one_off=True)

    code, report = report_of()
    assert code == 0, report
    assert report["added"] == ["daily-berlin", "hourly", "night-berlin", "six-hourly", "sunset"]
    assert report["scheduled"] == ["once", "once-cron"] and report["ok"]
    assert report["one_transaction"] is True and report["seeded"] == ["hourly"]

    entry = live.get_entry(django_project.app, "daily-berlin", store=django_project.store)
    assert entry.definition is not None and entry.actor.endswith("(import-django)")
    assert entry.definition.as_json() == {
        "task": "dj.report", "schedule": {"crontab": "0 9 * * *", "tz": "Europe/Berlin"},
        "args": [1, "a"], "kwargs": {"days": 7}, "enabled": True,
        "options": {"queue": "reports", "priority": 5, "expires": 600,
                    "headers": {"team": "ops", "periodic_task_name": "daily-berlin"}}}

    # zoned crontabs across the next daylight-saving change, against django-celery-beat's
    for task, zone in ((daily, BERLIN), (six, ZoneInfo("America/New_York"))):
        start = next_dst_change(zone, now) - timedelta(days=1)
        expected = dcb_occurrences(task, start, 8)
        assert same(ours(django_project, task.name, start, 8), expected), task.name
        assert len({e.astimezone(zone).utcoffset() for e in expected}) == 2  # crosses it
    # 02:30 on the day the clocks skip 02:00-03:00: we run at 03:00 (the end of the gap),
    # django-celery-beat (Celery's crontab) at 03:30; every other day both at 02:30
    start = next_dst_change(BERLIN, now) - timedelta(days=1)
    theirs, mine = dcb_occurrences(night, start, 4), ours(django_project, "night-berlin", start, 4)
    assert [t.astimezone(BERLIN).strftime("%H:%M") for t in theirs] == \
        ["02:30", "03:30", "02:30", "02:30"]
    assert [t.astimezone(BERLIN).strftime("%H:%M") for t in mine] == \
        ["02:30", "03:00", "02:30", "02:30"]
    assert same([mine[0], *mine[2:]], [theirs[0], *theirs[2:]])
    # the interval keeps django-celery-beat's rhythm (its last run is in the ledger)
    assert same(ours(django_project, "hourly", now, 4),
                dcb_occurrences(interval, now, 4, last=interval.last_run_at))
    # sunset, to the second
    assert same(ours(django_project, "sunset", now, 3), dcb_occurrences(solar, now, 3), within=1.0)
    # the one-offs: at the clocked time, and at the crontab's next slot
    one = django_project.store.one_offs(id_or_key="django-celery-beat:once")[0]
    assert one.due == at and same([one.due], dcb_occurrences(clocked, now, 1))
    assert one.task == "dj.report" and one.options["headers"]["periodic_task_name"] == "once"
    cron_one = django_project.store.one_offs(id_or_key="django-celery-beat:once-cron")[0]
    assert same([cron_one.due], dcb_occurrences(once_cron, now, 1))


def test_dry_run_writes_nothing(dcb: Any, django_project: Project) -> None:
    periodic(dcb, "daily", crontab=crontab(dcb))
    hourly = dcb.IntervalSchedule.objects.create(every=1, period="hours")
    periodic(dcb, "hourly", interval=hourly,
             last_run_at=datetime.now(UTC) - timedelta(minutes=5))
    periodic(dcb, "once", one_off=True, clocked=dcb.ClockedSchedule.objects.create(
        clocked_time=datetime.now(UTC) + timedelta(hours=1)))
    before = dcb.PeriodicTasks.last_change()
    code, out = run("--dry-run", "--disable-source")
    assert code == 0, out
    assert "would add entry daily" in out and "would schedule one-off once" in out
    assert "dry run, nothing written" in out
    assert django_project.store.live_entries(CLUSTER).entries == []
    assert django_project.store.entries_version(CLUSTER) == 0
    assert django_project.store.one_offs() == []
    assert read_claims(django_project.dsn, django_project.table) == []
    assert sorted(dcb.PeriodicTask.objects.filter(enabled=True).values_list(
        "name", flat=True)) == ["daily", "hourly", "once"]
    assert dcb.PeriodicTasks.last_change() == before


def test_disable_source_disables_exactly_the_converted_rows_and_a_second_import_is_a_no_op(
        dcb: Any, django_project: Project) -> None:
    now = datetime.now(UTC)
    periodic(dcb, "daily", crontab=crontab(dcb))
    periodic(dcb, "once", one_off=True, clocked=dcb.ClockedSchedule.objects.create(
        clocked_time=now + timedelta(hours=1)))
    periodic(dcb, "not-allowed", task="other.task", crontab=crontab(dcb))
    periodic(dcb, "bad-args", args="[1,", crontab=crontab(dcb))
    periodic(dcb, "expired", crontab=crontab(dcb), expires=now - timedelta(days=1))
    periodic(dcb, "code-report", crontab=crontab(dcb, hour="*"))  # a code entry's name
    periodic(dcb, "off", crontab=crontab(dcb), enabled=False)
    before = dcb.PeriodicTasks.last_change()

    code, out = run("--disable-source")
    assert code == 1, out  # a row could not be converted; the others are imported
    assert ("NOT CONVERTED PeriodicTask 'not-allowed' (id "
            in out) and "): task: 'other.task' is not allowed for database entries" in out
    assert "NOT CONVERTED PeriodicTask 'bad-args'" in out and "): args: '[1,' is not JSON" in out
    assert "skipped PeriodicTask 'expired'" in out and "expired at" in out
    assert "skipped PeriodicTask 'code-report'" in out and "a code entry of this app" in out
    assert "one transaction with Django's database" in out
    enabled = set(dcb.PeriodicTask.objects.filter(enabled=True).values_list("name", flat=True))
    assert enabled == {"not-allowed", "bad-args", "expired", "code-report"}
    assert dcb.PeriodicTasks.last_change() > before  # a running django-celery-beat hears it
    held = {e.name: e for e in django_project.store.live_entries(CLUSTER).entries}
    assert sorted(held) == ["daily", "off"] and held["off"].definition.enabled is False
    version = django_project.store.entries_version(CLUSTER)

    code, report = report_of("--disable-source")
    assert code == 1 and report["added"] == [] and report["scheduled"] == []
    assert report["unchanged"] == ["daily", "off", "once"] and report["disabled"] == []
    assert django_project.store.entries_version(CLUSTER) == version
    assert len(django_project.store.one_offs()) == 1
    assert len(report["refused"]) == 2


def test_expires_ends_the_entry_by_a_revision_effective_then(dcb: Any,
                                                             django_project: Project) -> None:
    ends = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0)
    periodic(dcb, "until-friday", crontab=crontab(dcb), expires=ends)
    code, report = report_of()
    assert code == 0 and report["added"] == ["until-friday"], report
    revisions = live.entry_history(django_project.app, "until-friday",
                                   store=django_project.store)
    assert [(r.action, r.definition.enabled, r.effective_at == ends) for r in revisions] == [
        ("disable", False, True), ("add", True, False)]
    assert revisions[1].definition.options["expires"] == ends.isoformat().replace(
        "+00:00", "Z")
    # until then it runs (the preview stops at the end), and a second import is a no-op
    start = datetime.now(UTC)
    shown = ours(django_project, "until-friday", start, 10)
    assert shown and all(at < ends for at in shown) and len(shown) <= 3
    version = django_project.store.entries_version(CLUSTER)
    code, report = report_of()
    assert code == 0 and report["unchanged"] == ["until-friday"] and report["added"] == []
    assert django_project.store.entries_version(CLUSTER) == version


@pytest.mark.parametrize("alias", ["default", "other"])
def test_a_failure_rolls_back_the_entries_and_the_source_rows_together(
        dcb: Any, django_project: Project, monkeypatch: pytest.MonkeyPatch, alias: str) -> None:
    # default: one transaction; other: the claims database's, then Django's
    periodic(dcb, "daily", alias=alias, crontab=crontab(dcb, alias=alias))
    periodic(dcb, "once", alias=alias, one_off=True,
             clocked=dcb.ClockedSchedule.objects.using(alias).create(
                 clocked_time=datetime.now(UTC) + timedelta(hours=1)))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(importer, "schedule_once", broken)
    with pytest.raises(RuntimeError):
        run("--disable-source", "--database", alias)
    assert django_project.store.live_entries(CLUSTER).entries == []  # rolled back
    assert django_project.store.entries_version(CLUSTER) == 0
    assert dcb.PeriodicTask.objects.using(alias).filter(enabled=True).count() == 2


def test_from_another_database_two_transactions_claims_first(dcb: Any,
                                                               django_project: Project) -> None:
    periodic(dcb, "elsewhere", alias="other", crontab=crontab(dcb, alias="other"))
    code, report = report_of("--database", "other", "--disable-source")
    assert code == 0, report
    assert report["added"] == ["elsewhere"] and report["one_transaction"] is False
    assert report["disabled"] == ["elsewhere"]
    assert not dcb.PeriodicTask.objects.using("other").get(name="elsewhere").enabled
    code, out = run("--database", "nowhere")
    assert code == 2 and "--database: 'nowhere' is not in Django's DATABASES" in out


def test_a_beat_started_after_the_cut_over_fires_nothing_extra(dcb: Any,
                                                                django_project: Project) -> None:
    every = dcb.IntervalSchedule.objects.create(every=8, period="seconds")
    last = datetime.now(UTC) - timedelta(seconds=1)
    periodic(dcb, "fast", interval=every, last_run_at=last)
    periodic(dcb, "daily", crontab=crontab(dcb))
    code, report = report_of("--disable-source")
    assert code == 0 and report["seeded"] == ["fast"], report
    effective = live.get_entry(django_project.app, "fast", store=django_project.store).effective_at
    assert effective is not None
    # its first run: the first point of django-celery-beat's rhythm after the cut-over
    first = last + timedelta(seconds=8)
    while first <= effective:
        first += timedelta(seconds=8)

    started = datetime.now(UTC)
    beat = ClaimingScheduler(django_project.app)
    try:
        deadline = time.monotonic() + 20
        mine: list[Any] = []
        while not mine and time.monotonic() < deadline:
            wait = beat.tick()
            mine = [c for c in read_claims(django_project.dsn, django_project.table)
                    if c.node == "django-node" and c.job in ("fast", "daily")]
            time.sleep(min(max(wait, 0.05), 0.2))
    finally:
        beat.close()
    assert [c.job for c in mine] == ["fast"], mine
    # never before that point (no run fired by the cut-over); at it, or when the new
    # beat reads the ledger, IN_FLIGHT after its start, if that is later (without the
    # ledger's last run it would count 8 s from its start)
    assert first - timedelta(seconds=0.5) <= mine[0].occurrence \
        <= max(first, started + IN_FLIGHT) + timedelta(seconds=1), (mine[0], first, started)
    seeded = [c for c in read_claims(django_project.dsn, django_project.table)
              if c.node == "django-celery-beat"]
    assert [(c.job, c.occurrence) for c in seeded] == [("fast", last)]


# heavy: two real `celery` processes, each setting Django up (about 2 s of CPU each)
@pytest.mark.heavy
def test_the_real_celery_command_finds_import_django_and_runs_it(
        dcb: Any, django_project: Project) -> None:
    periodic(dcb, "daily", crontab=crontab(dcb))
    periodic(dcb, "not-allowed", task="other.task", crontab=crontab(dcb))
    env = clean_env({"DJANGO_SETTINGS_MODULE": "tests.integration.django_settings",
                     "ELARION_DJANGO_TEST_DSN": django_project.dsn,
                     "ELARION_DJANGO_TEST_OTHER_DSN": django_project.other_dsn,
                     "ELARION_DJANGO_TEST_TABLE": django_project.table})
    command = [sys.executable, "-m", "celery", "-A", APP, "elarion-beat", "schedule"]
    listed = subprocess.run([*command, "--help"], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0 and "import-django" in listed.stdout, listed.stderr
    done = subprocess.run([*command, "import-django", "--disable-source"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "  add entry daily" in done.stdout and "  disabled PeriodicTask daily" in done.stdout
    assert "NOT CONVERTED PeriodicTask 'not-allowed' (id " in done.stdout
    assert "one transaction with Django's database" in done.stdout
    assert [e.name for e in django_project.store.live_entries(CLUSTER).entries] == ["daily"]
    assert set(dcb.PeriodicTask.objects.filter(enabled=True).values_list(
        "name", flat=True)) == {"not-allowed"}

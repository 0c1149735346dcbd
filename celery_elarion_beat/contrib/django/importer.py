"""``import-django``: django-celery-beat's ``PeriodicTask`` rows into the live schedules.

:func:`import_django` reads the rows (with the Django ORM, from database *alias*),
converts each (:mod:`.convert`), compares them with what the claims database holds,
and writes what is new, in this order:

1. the new database entries, in one change (one version bump) through
   :func:`celery_elarion_beat.live_schedules.apply_changes`;
2. for the rows with ``expires``, the revisions that disable them from then on;
3. the durable one-offs (``schedule_once``, keyed: a second import finds them);
4. with *disable_source*, the converted rows are disabled in django-celery-beat (and its
   change marker bumped, so a django-celery-beat beat still running drops them at its
   next tick);
5. after the commit, each interval entry's last run under django-celery-beat is written
   into the ledger as its newest claim (node ``django-celery-beat``, never published),
   so a beat that starts from the ledger keeps the rhythm. Idempotent: a job whose
   ledger has that run, or a later one, is left alone.

**One transaction** when Django's database *alias* is the claims database on
PostgreSQL (psycopg 3): steps 1 to 4 commit together or not at all, and the rows read
are locked (``SELECT ... FOR UPDATE``) until then. Otherwise they are two: the claims
database's (1 to 3, one transaction) commits first, Django's (4) right after, the rows
locked meanwhile; if that last commit fails, the entries exist and the rows are still
enabled, and running the import again changes nothing in the claims database and
disables the rows.

**Idempotent**: an entry that exists is never written again; a row whose entry exists
with the same definition counts as converted (``unchanged``), one whose entry differs
is reported (``differing``) and left alone on both sides. Every row that cannot be
converted is reported with the field and why, and nothing of it is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from django.conf import settings as django_settings
from django.db import connections, router, transaction
from django.utils import timezone as dj_timezone

from ...config.entries import read_schedule
from ...config.live_entries import live_cluster
from ...config.settings import Settings
from ...exceptions import ConfigurationError
from ...live_schedules import api
from ...one_offs.api import schedule_once
from ...schedules.clock import as_utc
from ...schedules.slots import ClaimKind, slot_task_id
from ...store.control_records import os_actor, reason_text
from ...store.entry_records import EntryChange, StoredEntry
from ...store.interface import ClaimStore
from ...store.one_off_records import OneOffState
from ...store.records import ClaimRequest
from ...store.registry import app_store
from .binding import transaction_connection
from .convert import (
    EntryPlan,
    OneOffPlan,
    Refused,
    Skipped,
    SourceTask,
    convert,
    one_off_key,
)

__all__ = ["SEED_NODE", "DjangoImport", "import_django", "source_rows"]

#: The node named on the claims the import writes into the ledger.
SEED_NODE = "django-celery-beat"
#: Celery's own entry, which django-celery-beat keeps as a row and every beat installs.
_CELERY_OWN = "celery.backend_cleanup"


@dataclass
class DjangoImport:
    """What an import did (or, *dry_run*, would do), by row name."""

    dry_run: bool
    added: list[str] = field(default_factory=list)
    scheduled: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: rows left to a code entry of the same name, and rows with nothing to run: why
    skipped: list[str] = field(default_factory=list)
    #: rows that cannot be converted: the row, the field, why
    refused: list[str] = field(default_factory=list)
    #: rows whose entry (or one-off) exists with another definition
    differing: list[str] = field(default_factory=list)
    #: source rows disabled (``--disable-source``)
    disabled: list[str] = field(default_factory=list)
    #: interval entries whose last run was written into the ledger
    seeded: list[str] = field(default_factory=list)
    version: int | None = None
    #: whether the claims database and Django's wrote in one transaction
    one_transaction: bool | None = None
    rows: int = 0

    @property
    def ok(self) -> bool:
        """Every row was converted, or had nothing to convert."""
        return not self.refused and not self.differing

    @property
    def converted(self) -> list[str]:
        return sorted([*self.added, *self.scheduled, *self.unchanged])

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ok": self.ok}


def _dcb() -> Any:
    """django-celery-beat's models module, or the fix."""
    from django.apps import apps

    if not apps.is_installed("django_celery_beat"):
        raise ConfigurationError(
            "import-django reads django-celery-beat's tables: 'django_celery_beat' must be in "
            "INSTALLED_APPS (keep it there until the import is done)")
    from django_celery_beat import models

    return models


def _aware(value: datetime | None) -> datetime | None:
    """A time from Django as aware UTC (naive: UTC with USE_TZ, else Django's TIME_ZONE,
    as django-celery-beat reads it)."""
    if value is None:
        return None
    if dj_timezone.is_naive(value):
        zone = timezone.utc if getattr(django_settings, "USE_TZ", False) \
            else dj_timezone.get_default_timezone()
        value = dj_timezone.make_aware(value, zone)
    return as_utc(value)


def _source(task: Any) -> SourceTask:
    schedules: dict[str, dict[str, Any]] = {}
    if task.interval_id is not None:
        schedules["interval"] = {"every": task.interval.every, "period": task.interval.period}
    if task.crontab_id is not None:
        c = task.crontab
        schedules["crontab"] = {"minute": c.minute, "hour": c.hour,
                                "day_of_month": c.day_of_month,
                                "month_of_year": c.month_of_year,
                                "day_of_week": c.day_of_week, "timezone": c.timezone}
    if task.solar_id is not None:
        s = task.solar
        schedules["solar"] = {"event": s.event, "latitude": s.latitude,
                              "longitude": s.longitude}
    if task.clocked_id is not None:
        schedules["clocked"] = {"clocked_time": _aware(task.clocked.clocked_time)}
    return SourceTask(
        id=task.pk, name=task.name, task=task.task, schedules=schedules, args=task.args,
        kwargs=task.kwargs, queue=task.queue, exchange=task.exchange,
        routing_key=task.routing_key, headers=task.headers, priority=task.priority,
        expires=_aware(task.expires), expire_seconds=task.expire_seconds,
        one_off=task.one_off, start_time=_aware(task.start_time), enabled=task.enabled,
        last_run_at=_aware(task.last_run_at), total_run_count=task.total_run_count,
        date_changed=_aware(task.date_changed))


def source_rows(alias: str, lock: bool = False) -> list[SourceTask]:
    """The ``PeriodicTask`` rows of database *alias*, by name (*lock*: ``FOR UPDATE``,
    inside the caller's transaction)."""
    models = _dcb()
    query = models.PeriodicTask.objects.using(alias).order_by("name")
    features = connections[alias].features
    if lock and features.has_select_for_update_of:
        query = query.select_for_update(of=("self",))
    elif lock and features.has_select_for_update:
        list(models.PeriodicTask.objects.using(alias).select_for_update().values_list("pk"))
    query = query.select_related("interval", "crontab", "solar", "clocked")
    return [_source(task) for task in query]


@dataclass
class _Plan:
    entries: list[EntryPlan] = field(default_factory=list)
    one_offs: list[OneOffPlan] = field(default_factory=list)
    #: rows converted already (their entry or one-off is there): their ids
    done: list[SourceTask] = field(default_factory=list)
    seeds: list[EntryPlan] = field(default_factory=list)


def import_django(app: Any, *, alias: str | None = None, dry_run: bool = False,
                  disable_source: bool = False, reason: str = "imported from "
                  "django-celery-beat", actor: str | None = None,
                  store: ClaimStore | None = None) -> DjangoImport:
    """Import django-celery-beat's rows from Django database *alias* (default: where
    Django's router reads ``PeriodicTask``); see the module docstring."""
    models = _dcb()
    settings = Settings.from_app(app)
    if not settings.db_entries:
        raise ConfigurationError(
            "import-django writes database entries, which are off: set "
            "elarion_beat_db_entries = True (CELERY_ELARION_BEAT_DB_ENTRIES) for the app")
    alias = alias or router.db_for_read(models.PeriodicTask)
    if alias not in django_settings.DATABASES:
        raise ConfigurationError(f"--database: {alias!r} is not in Django's DATABASES (it "
                                 f"has {', '.join(sorted(django_settings.DATABASES))})")
    why = reason_text(reason, "--reason")
    who = actor or os_actor("import-django")
    store = store or app_store(app)
    report = DjangoImport(dry_run)
    with transaction.atomic(using=alias):
        rows = source_rows(alias, lock=not dry_run)
        report.rows = len(rows)
        plan = _plan(app, settings, store, rows, report,
                     getattr(django_settings, "DJANGO_CELERY_BEAT_TZ_AWARE", True))
        if dry_run:
            report.added = [p.name for p in plan.entries]
            report.scheduled = [p.name for p in plan.one_offs]
            return report
        connection = transaction_connection(alias, settings)
        report.one_transaction = connection is not None
        if connection is not None:
            _write(app, settings, store, plan, report, why, who, connection)
        else:  # the claims database's own transaction, committed before Django's
            with _claims_transaction(store) as claims:
                _write(app, settings, store, plan, report, why, who, claims)
        if disable_source:
            report.disabled = _disable(models, alias, [*plan.done,
                                                       *(p.row for p in plan.entries),
                                                       *(p.row for p in plan.one_offs)])
    report.seeded = _seed(store, plan.seeds)
    return report


def _plan(app: Any, settings: Settings, store: ClaimStore, rows: list[SourceTask],
          report: DjangoImport, tz_aware: bool) -> _Plan:
    """Each row converted and compared with what the claims database holds."""
    now = store.clock()
    schedule = read_schedule(app, settings)
    code = set(schedule.entries) | {bad.job for bad in schedule.invalid}
    held = {row.name: row for row in store.live_entries(live_cluster(settings, app)).entries}
    plan = _Plan()
    for row in rows:
        if row.name in code or (row.name == _CELERY_OWN and row.task == _CELERY_OWN):
            report.skipped.append(
                f"{row.label}: a code entry of this app has its name (beat_schedule"
                + (", or Celery's own result cleanup" if row.name == _CELERY_OWN else "")
                + "), and the code entry runs: not imported (to change it at runtime: "
                f"`schedule override {row.name}`)")
            continue
        converted = convert(row, now, settings, app, tz_aware=tz_aware)
        if isinstance(converted, Refused):
            report.refused.append(converted.text())
        elif isinstance(converted, Skipped):
            if ("clocked" in row.schedules or row.one_off) \
                    and store.one_offs(id_or_key=one_off_key(row.name), limit=1):
                # imported already (the row disabled since, by --disable-source)
                report.unchanged.append(row.name)
                plan.done.append(row)
            else:
                report.skipped.append(converted.text())
        elif isinstance(converted, EntryPlan):
            _compare_entry(converted, held.get(row.name), plan, report)
        else:
            _compare_one_off(converted, store, plan, report)
    return plan


def _compare_entry(wanted: EntryPlan, current: StoredEntry | None, plan: _Plan,
                   report: DjangoImport) -> None:
    if current is None:
        plan.entries.append(wanted)
        plan.seeds.append(wanted)
        return
    have = dataclasses.replace(current.definition, enabled=wanted.definition.enabled)
    if have.same(wanted.definition) and not current.overrides:
        # the same entry; its enabled flag is the live schedule's now (the source row
        # disabled by an earlier --disable-source, or the entry switched in the admin)
        report.unchanged.append(wanted.name)
        plan.done.append(wanted.row)
        plan.seeds.append(wanted)
        return
    report.differing.append(
        f"{wanted.row.label}: a database entry {wanted.name!r} exists with another definition "
        f"(revision {current.revision}, by {current.actor or '?'}): the import never writes "
        "over one; edit it (the admin, `schedule edit`) or remove it and import again")


def _compare_one_off(wanted: OneOffPlan, store: ClaimStore, plan: _Plan,
                     report: DjangoImport) -> None:
    found = store.one_offs(id_or_key=wanted.key, limit=1)
    if not found:
        plan.one_offs.append(wanted)
        return
    held = found[0]
    if wanted.fixed and held.state is OneOffState.SCHEDULED and as_utc(held.due) != wanted.eta:
        report.differing.append(
            f"{wanted.row.label}: the one-off {wanted.key!r} is scheduled for "
            f"{as_utc(held.due).isoformat()}, the row says {wanted.eta.isoformat()}: cancel "
            f"it (`one-offs cancel {wanted.key}`) and import again")
        return
    report.unchanged.append(wanted.name)
    plan.done.append(wanted.row)


def _write(app: Any, settings: Settings, store: ClaimStore, plan: _Plan,
           report: DjangoImport, reason: str, actor: str, connection: Any) -> None:
    if plan.entries:
        wrote = api.apply_changes(app, [
            api.Change("add", p.name, p.definition.task, p.definition.schedule.as_json(),
                       list(p.definition.args), dict(p.definition.kwargs),
                       dict(p.definition.options), p.definition.enabled,
                       effective=p.effective) for p in plan.entries],
            reason=reason, actor=actor, connection=connection, store=store)
        report.version = wrote.version
        report.added = [p.name for p in plan.entries]
    ending = [p for p in plan.entries if p.ends is not None and p.definition.enabled]
    if ending:
        # through the store seam: the API reads the entry on its own connection, which
        # does not see the add above before the caller's transaction commits
        cluster = live_cluster(settings, app)
        wrote = store.write_entries(cluster, [
            EntryChange("disable", p.name, dataclasses.replace(p.definition, enabled=False),
                        None, p.ends) for p in ending],
            actor, f"{reason} (expires)", connection=connection)
        report.version = wrote.version or report.version
    for p in plan.one_offs:
        schedule_once(app, p.task, p.args, p.kwargs, eta=p.eta, options=p.options, key=p.key,
                      connection=connection)
        report.scheduled.append(p.name)


@contextlib.contextmanager
def _claims_transaction(store: ClaimStore) -> Iterator[Any]:
    """A transaction on the claims database (a SQLAlchemy connection of the store's
    engine), committed when the block ends; None for a store without one (memory)."""
    engine = getattr(store, "engine", None)
    if engine is None:
        yield None
        return
    with engine.begin() as conn:
        yield conn


def _disable(models: Any, alias: str, rows: list[SourceTask]) -> list[str]:
    """Disable the converted rows still enabled (in the caller's transaction), and bump
    django-celery-beat's change marker as its own save would."""
    from django_celery_beat.utils import now as dcb_now

    names = {row.id: row.name for row in rows}
    enabled = list(models.PeriodicTask.objects.using(alias)
                   .filter(pk__in=list(names), enabled=True).values_list("pk", flat=True))
    if not enabled:
        return []
    at = dcb_now()
    models.PeriodicTask.objects.using(alias).filter(pk__in=enabled).update(
        enabled=False, date_changed=at)
    models.PeriodicTasks.objects.using(alias).update_or_create(
        ident=1, defaults={"last_update": at})
    return sorted(names[pk] for pk in enabled)


def _seed(store: ClaimStore, plans: list[EntryPlan]) -> list[str]:
    """Write each interval entry's last run under django-celery-beat as its newest claim
    (see the module docstring); the names written."""
    wanted = {p.name: p.anchor for p in plans if p.anchor is not None}
    if not wanted:
        return []
    newest = store.latest_claims(list(wanted))
    requests = [ClaimRequest(name, ClaimKind.SLOT, slot_task_id(name, at), slot=at,
                             tracked=False)
                for name, at in sorted(wanted.items())
                if name not in newest or newest[name].occurrence < at]
    if not requests:
        return []
    return sorted(r.request.job for r in store.claim(SEED_NODE, requests) if r.won)

"""A django-celery-beat ``PeriodicTask`` row as a database entry or a durable one-off.

Pure: the row comes in as plain values (:class:`SourceTask`, read by :mod:`.importer`),
with the claims database's clock *now*; nothing here touches Django or a database.
:func:`convert` says what the row becomes, or why it cannot:

* **crontab** -> ``{"crontab": "M H DOM MON DOW", "tz": ZONE}`` (the row's time zone;
  none, i.e. the app's ``timezone``, when ``DJANGO_CELERY_BEAT_TZ_AWARE = False``, as
  django-celery-beat reads it then); **interval** -> ``{"every": SECONDS}``; **solar** ->
  ``{"solar": EVENT, "lat": ..., "lon": ...}``;
* **clocked** (and any ``one_off`` row) -> a durable one-off
  (:func:`celery_elarion_beat.schedule_once`) keyed ``django-celery-beat:NAME``, so a
  second import finds it instead of adding another; a one-off that ran already, or is
  disabled, has nothing left to run and is skipped;
* ``queue``, ``exchange``, ``routing_key``, ``priority`` and ``headers`` (with
  ``periodic_task_name``, which django-celery-beat adds to every message) become the
  entry's options; ``expire_seconds`` becomes ``options["expires"]`` (seconds), and
  ``expires`` both ``options["expires"]`` (the instant, as django-celery-beat sends it)
  and the end of the schedule: a second revision, effective at ``expires``, disables
  the entry (a row expired already is skipped);
* ``start_time`` in the future becomes the effective time: a crontab or solar entry
  runs from its first slot at or after it; an interval entry's first run is at
  ``start_time`` (its effective time one interval earlier, when that is still to come);
* **no run fired by the cut-over, no catch-up**: an entry governs from the import on
  (its effective time), so no slot before it is run again; an interval entry keeps
  django-celery-beat's rhythm through its last run (``last_run_at``), which the import
  writes into the ledger as the entry's newest claim (:attr:`EntryPlan.anchor`).

Every refusal names the row, the field and why (:class:`Refused`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from ...config.live_entries import EntryDefinition, ScheduleSpec, check_definition, task_allowed
from ...config.names import KEY_LENGTH, job_name_problem
from ...config.settings import Settings
from ...exceptions import ConfigurationError
from ...schedules.clock import as_utc
from ...schedules.slots import is_slotted, next_slot

__all__ = ["KINDS", "PERIODS", "Converted", "EntryPlan", "OneOffPlan", "Refused", "Skipped",
           "SourceTask", "convert", "one_off_key"]

#: django-celery-beat's schedule kinds, in the order it checks them.
KINDS = ("interval", "crontab", "solar", "clocked")
#: An IntervalSchedule's period, in seconds.
PERIODS = {"days": 86400.0, "hours": 3600.0, "minutes": 60.0, "seconds": 1.0,
           "microseconds": 1e-6}
#: The key prefix of the one-offs the import schedules.
KEY_PREFIX = "django-celery-beat:"


@dataclass(frozen=True)
class SourceTask:
    """One ``PeriodicTask`` row as plain values. *schedules*: the kinds of schedule the
    row has set (``{"crontab": {"minute": ..., "timezone": ...}}``): one, normally."""

    id: int
    name: str
    task: str
    schedules: Mapping[str, Mapping[str, Any]]
    args: str | None = "[]"
    kwargs: str | None = "{}"
    queue: str | None = None
    exchange: str | None = None
    routing_key: str | None = None
    headers: str | None = "{}"
    priority: int | None = None
    expires: datetime | None = None
    expire_seconds: int | None = None
    one_off: bool = False
    start_time: datetime | None = None
    enabled: bool = True
    last_run_at: datetime | None = None
    total_run_count: int = 0
    date_changed: datetime | None = None

    @property
    def label(self) -> str:
        """How a message names the row: ``PeriodicTask 'nightly' (id 7)``."""
        return f"PeriodicTask {self.name!r} (id {self.id})"


@dataclass(frozen=True)
class EntryPlan:
    """The row as a database entry: *definition*, governing from *effective* (None: the
    import's commit), disabled from *ends* on (``expires``), its rhythm anchored at
    *anchor* (an interval's last run under django-celery-beat, for the ledger)."""

    row: SourceTask
    definition: EntryDefinition
    effective: datetime | None = None
    ends: datetime | None = None
    anchor: datetime | None = None

    @property
    def name(self) -> str:
        return self.row.name


@dataclass(frozen=True)
class OneOffPlan:
    """The row as a durable one-off: *task* at *eta* (aware UTC), keyed *key*."""

    row: SourceTask
    task: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    options: Mapping[str, Any]
    eta: datetime
    key: str
    #: the eta is the row's own time (clocked), not one computed at the import
    fixed: bool = True

    @property
    def name(self) -> str:
        return self.row.name


@dataclass(frozen=True)
class Skipped:
    """A row with nothing to import (a one-off that ran, a schedule that expired)."""

    row: SourceTask
    reason: str

    def text(self) -> str:
        return f"{self.row.label}: {self.reason}"


@dataclass(frozen=True)
class Refused:
    """A row that cannot be converted: *field* is the row's field at fault."""

    row: SourceTask
    field: str
    reason: str

    def text(self) -> str:
        return f"{self.row.label}: {self.field}: {self.reason}"


Converted = EntryPlan | OneOffPlan | Skipped | Refused


class _Refusal(Exception):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(field, reason)
        self.field, self.reason = field, reason


def one_off_key(name: str) -> str:
    """The one-off key of row *name*: ``django-celery-beat:NAME`` (a digest when too long)."""
    key = KEY_PREFIX + name
    if len(key) <= KEY_LENGTH:
        return key
    return KEY_PREFIX + "sha256:" + hashlib.sha256(name.encode("utf-8")).hexdigest()


def convert(row: SourceTask, now: datetime, settings: Settings, app: Any, *,
            tz_aware: bool = True) -> Converted:
    """What *row* becomes, on the claims database's clock *now* (see the module
    docstring). *tz_aware*: django-celery-beat's ``DJANGO_CELERY_BEAT_TZ_AWARE``."""
    now = as_utc(now)
    try:
        return _convert(row, now, settings, app, tz_aware)
    except _Refusal as refusal:
        return Refused(row, refusal.field, refusal.reason)


def _convert(row: SourceTask, now: datetime, settings: Settings, app: Any,
             tz_aware: bool) -> Converted:
    problem = job_name_problem(row.name)
    if problem is not None:
        raise _Refusal("name", f"cannot be an entry name: {problem}; rename the row")
    if not task_allowed(row.task, settings.db_entry_tasks):
        allowed = ", ".join(settings.db_entry_tasks) or "nothing"
        raise _Refusal("task", f"{row.task!r} is not allowed for database entries (allowed: "
                               f"{allowed}); add it, or a pattern such as 'proj.tasks.*', to "
                               "elarion_beat_db_entry_tasks")
    kinds = [kind for kind in KINDS if kind in row.schedules]
    if not kinds:
        raise _Refusal("schedule", "the row has no interval, crontab, solar or clocked "
                                   "schedule; give it one in django-celery-beat")
    if len(kinds) > 1:
        raise _Refusal(kinds[1], f"the row has several schedules ({', '.join(kinds)}); "
                                 "django-celery-beat allows one: clear the others")
    kind = kinds[0]
    args = _json(row.args, "args", list, "[]")
    kwargs = _json(row.kwargs, "kwargs", dict, "{}")
    options = _options(row)
    expires = as_utc(row.expires) if row.expires is not None else None
    start = as_utc(row.start_time) if row.start_time is not None else None
    if expires is not None and expires <= now:
        return Skipped(row, f"expired at {_iso(expires)} (expires): django-celery-beat runs "
                            "it no more; nothing to import")
    if kind == "clocked" or row.one_off:
        return _one_off(row, kind, now, start, expires, args, kwargs, options, settings, app,
                        tz_aware)
    spec = _spec(row, kind, tz_aware)
    definition = _definition(row, spec, args, kwargs, options, settings, app)
    effective, anchor = _timing(row, spec, now, start)
    if expires is not None and effective is not None and expires <= effective:
        return Skipped(row, f"expires ({_iso(expires)}) before it starts ({_iso(effective)}, "
                            "start_time): it would never run; nothing to import")
    return EntryPlan(row, definition, effective, expires, anchor)


def _iso(value: datetime) -> str:
    return as_utc(value).isoformat().replace("+00:00", "Z")


def _json(text: str | None, field: str, kind: type, empty: str) -> Any:
    try:
        value = json.loads(text) if text not in (None, "") else json.loads(empty)
    except (TypeError, ValueError) as exc:
        raise _Refusal(field, f"{text!r} is not JSON ({exc})") from None
    if not isinstance(value, kind):
        raise _Refusal(field, f"{text!r} is not a JSON {'list' if kind is list else 'object'}")
    return value


def _options(row: SourceTask) -> dict[str, Any]:
    """The send options, as django-celery-beat's ``ModelEntry`` passes them."""
    out: dict[str, Any] = {}
    for field in ("queue", "exchange", "routing_key"):
        value = getattr(row, field)
        if value:
            out[field] = value
    if row.priority is not None:
        if isinstance(row.priority, bool) or not 0 <= int(row.priority) <= 255:
            raise _Refusal("priority", f"{row.priority!r} is not a priority from 0 to 255")
        out["priority"] = int(row.priority)
    if row.expires is not None and row.expire_seconds is not None:
        raise _Refusal("expires", "both expires and expire_seconds are set (django-celery-beat "
                                  "refuses that too when the row is saved); clear one")
    if row.expire_seconds is not None:
        out["expires"] = int(row.expire_seconds)
    elif row.expires is not None:
        out["expires"] = _iso(row.expires)
    headers = _json(row.headers, "headers", dict, "{}")
    out["headers"] = {**headers, "periodic_task_name": row.name}
    return out


def _spec(row: SourceTask, kind: str, tz_aware: bool) -> ScheduleSpec:
    values = row.schedules[kind]
    try:
        if kind == "crontab":
            fields = [_cron_field(values.get(f)) for f in
                      ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")]
            zone = values.get("timezone")
            data: dict[str, Any] = {"crontab": " ".join(fields)}
            if tz_aware and zone is not None and str(zone):
                data["tz"] = str(zone)
            return ScheduleSpec.parse(data)
        if kind == "interval":
            period = str(values.get("period"))
            if period not in PERIODS:
                raise _Refusal("interval", f"period {period!r} is not one of "
                                           f"{', '.join(PERIODS)}")
            every = values.get("every")
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise _Refusal("interval", f"every {every!r} is not a whole number from 1")
            return ScheduleSpec.parse({"every": every * PERIODS[period]})
        return ScheduleSpec.parse({"solar": values.get("event"),
                                   "lat": _float(values.get("latitude")),
                                   "lon": _float(values.get("longitude"))})
    except ConfigurationError as exc:
        raise _Refusal(kind, _unprefixed(exc)) from None


def _cron_field(value: Any) -> str:
    """A crontab field as django-celery-beat shows it: blanks removed, empty is ``*``."""
    return str(value or "").replace(" ", "") or "*"


def _float(value: Any) -> Any:
    return float(value) if isinstance(value, (Decimal, int, float)) \
        and not isinstance(value, bool) else value


def _unprefixed(exc: ConfigurationError) -> str:
    text = " ".join(str(exc).split())
    return text.split(": ", 1)[1] if text.startswith(("schedule: ", "options: ")) else text


def _definition(row: SourceTask, spec: ScheduleSpec, args: list[Any], kwargs: dict[str, Any],
                options: dict[str, Any], settings: Settings, app: Any) -> EntryDefinition:
    try:
        definition = EntryDefinition.of(row.task, spec, args, kwargs, options, row.enabled)
        check_definition(row.name, definition, settings, app)
    except ConfigurationError as exc:
        text = " ".join(str(exc).split())
        field, _, rest = text.partition(": ")
        kind = "interval" if spec.kind == "every" else spec.kind
        if field == "options" and "elarion_beat_claim_retention" in rest:
            field = kind  # the interval is longer than the ledger keeps a claim
        if field in ("task", "args", "kwargs", "options", "name", kind):
            raise _Refusal(field, rest) from None
        raise _Refusal(kind, text) from None
    return definition


def _timing(row: SourceTask, spec: ScheduleSpec, now: datetime,
            start: datetime | None) -> tuple[datetime | None, datetime | None]:
    """The entry's effective time (None: the import's) and the last run to write into
    the ledger (interval entries; see the module docstring)."""
    if spec.kind != "every":
        return (start if start is not None and start > now else None), None
    every = timedelta(seconds=spec.every or 0.0)
    if start is not None and start > now:
        # the first run at start_time: effective one interval before, if still to come
        # (else from now: the first run is one interval after the import, past start_time)
        earlier = start - every
        return (earlier if earlier > now else None), None
    last = as_utc(row.last_run_at) if row.last_run_at is not None else None
    keep = last is not None and last <= now and row.enabled
    return None, (last if keep else None)


def _one_off(row: SourceTask, kind: str, now: datetime, start: datetime | None,
             expires: datetime | None, args: list[Any], kwargs: dict[str, Any],
             options: dict[str, Any], settings: Settings, app: Any,
             tz_aware: bool) -> Converted:
    if not row.enabled:
        return Skipped(row, "a one-off that is disabled (it ran already, or was switched off): "
                            "nothing left to run")
    if row.total_run_count > 0:
        return Skipped(row, f"a one-off that ran already ({row.total_run_count} run(s)): "
                            "nothing left to run")
    fixed = kind == "clocked"
    if fixed:
        clocked = row.schedules["clocked"].get("clocked_time")
        if not isinstance(clocked, datetime):
            raise _Refusal("clocked", f"clocked_time {clocked!r} is not a time")
        eta = as_utc(clocked)
        if start is not None and start > eta:
            eta = start  # django-celery-beat holds it until start_time
    else:
        eta = _first_run(row, _spec(row, kind, tz_aware), now, start, app)
    if expires is not None and expires <= eta:
        return Skipped(row, f"expires ({_iso(expires)}) before it would run ({_iso(eta)}): "
                            "nothing to import")
    try:  # the task and the arguments, as a database entry's (the same allow-list)
        EntryDefinition.of(row.task, {"every": 60}, args, kwargs, options)
    except ConfigurationError as exc:
        field, _, rest = " ".join(str(exc).split()).partition(": ")
        raise _Refusal(field, rest) from None
    return OneOffPlan(row, row.task, tuple(args), kwargs,
                      {k: v for k, v in options.items()}, eta, one_off_key(row.name), fixed)


def _first_run(row: SourceTask, spec: ScheduleSpec, now: datetime, start: datetime | None,
               app: Any) -> datetime:
    """When a one-off crontab, solar or interval row runs: its first occurrence from
    the import (or from ``start_time``) on."""
    sched = spec.build(app)
    since = max(now, start) if start is not None else now
    if is_slotted(sched):
        after = since - timedelta(microseconds=1)
        found = next_slot(row.name, sched, after, after)
        if found is None:
            raise _Refusal(spec.kind, "its schedule names no instant within a year")
        return found
    # as django-celery-beat: one interval after the last run; at start_time when it
    # never ran; else one interval after the row was saved
    every = timedelta(seconds=spec.every or 0.0)
    if row.last_run_at is not None:
        first = as_utc(row.last_run_at) + every
    elif start is not None or row.date_changed is None:
        first = since
    else:
        first = as_utc(row.date_changed) + every
    return max(first, since)

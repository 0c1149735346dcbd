"""Database entries (live schedules): what one is, how it is checked, how beat builds it.

A database entry is a row, not code, so everything in it is checked here, on write
and again when beat loads it, each error naming the field and the fix:

* its **schedule** is JSON, one of ``{"cron": "S M H DOM MON DOW", "tz": ZONE}`` (six
  fields, seconds first: :func:`celery_elarion_beat.cron`), ``{"crontab": "M H DOM MON
  DOW", "tz": ZONE}`` (Celery's ``crontab``, its fields all matching), ``{"every":
  SECONDS}`` or ``{"solar": EVENT, "lat": ..., "lon": ...}``; ``tz`` is optional (the
  app's ``timezone``) and an IANA name (:class:`ScheduleSpec`);
* its **task** must match ``elarion_beat_db_entry_tasks`` (names or glob patterns): a
  row may start any registered task with any arguments, so nothing is allowed until
  listed;
* its **args**, **kwargs** and **options** are JSON (a list, an object, an object), and
  the options this library reads are checked as for code entries
  (:func:`~.entries.check_entry`).

Beat runs each as a :class:`LiveEntry`: a ``ScheduleEntry`` that knows the revision
it runs under and the instants between which that revision governs its occurrences
(from its effective time until the next revision's): each claim carries the revision
and the claims database refuses a stale one.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.beat import ScheduleEntry
from celery.schedules import crontab, solar
from celery.schedules import schedule as interval_schedule

from ..exceptions import ConfigurationError
from ..schedules.clock import as_utc
from ..schedules.cron import cron, zone_name
from ..schedules.zoned_crontab import zoned_crontab
from .entries import check_entry, entry_problem
from .names import job_name_problem
from .settings import Settings

__all__ = ["SCHEDULE_KINDS", "EntryDefinition", "LiveEntry", "ScheduleSpec", "canonical",
           "check_definition", "live_cluster", "naming_time", "outside_revision",
           "phase_anchor", "spec_of_schedule", "task_allowed"]

#: The kinds of schedule a database entry may have.
SCHEDULE_KINDS = ("cron", "crontab", "every", "solar")
_SOLAR_EVENTS = tuple(sorted(solar._all_events))
#: A microsecond: the instant just before an effective time.
_TICK = timedelta(microseconds=1)


def live_cluster(settings: Settings, app: Any = None) -> str:
    """The cluster whose database entries this app runs: the app's cluster
    (``elarion_beat_cluster``, else the app's main name), the one its store writes
    every other row in; refused when there is none (:meth:`Settings.require_cluster`).
    *app* is unused: the settings were read from it."""
    return settings.require_cluster()


def canonical(value: Any) -> str:
    """*value* as JSON text, keys sorted and no blanks: one text for equal values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _zone(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(f"schedule: tz must be an IANA time zone name such as "
                                 f"'Europe/Berlin', not {value!r}")
    try:
        ZoneInfo(value.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(f"schedule: tz {value!r} is not a known time zone; use an "
                                 "IANA name such as 'Europe/Berlin' or 'UTC'") from None
    return value.strip()


def _number(what: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise ConfigurationError(f"schedule: {what} must be a number, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class ScheduleSpec:
    """A database entry's schedule, as JSON holds it (see the module docstring)."""

    kind: str
    expr: str | None = None
    tz: str | None = None
    every: float | None = None
    event: str | None = None
    lat: float | None = None
    lon: float | None = None

    @classmethod
    def parse(cls, data: Any) -> ScheduleSpec:
        """The spec of the JSON value *data*; :class:`ConfigurationError` naming what is
        wrong and how to write it instead."""
        if isinstance(data, ScheduleSpec):
            return data
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError:
                raise ConfigurationError(f"schedule: {data!r} is not JSON; write e.g. "
                                         '{"cron": "0 */5 * * * *"} or {"every": 30}') from None
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"schedule: {data!r} is not an object; write one of "
                                     '{"cron": ...}, {"crontab": ...}, {"every": ...}, '
                                     '{"solar": ...}')
        kinds = [k for k in SCHEDULE_KINDS if k in data]
        if len(kinds) != 1:
            raise ConfigurationError(
                f"schedule: {canonical(dict(data))} must have exactly one of "
                f"{', '.join(SCHEDULE_KINDS)} (found {', '.join(kinds) or 'none'})")
        kind = kinds[0]
        allowed = {"cron": {"cron", "tz"}, "crontab": {"crontab", "tz"}, "every": {"every"},
                   "solar": {"solar", "lat", "lon"}}[kind]
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ConfigurationError(f"schedule: {kind} takes {', '.join(sorted(allowed))}, "
                                     f"not {', '.join(unknown)}")
        if kind in ("cron", "crontab"):
            expr = data[kind]
            want = 6 if kind == "cron" else 5
            fields = expr.split() if isinstance(expr, str) else []
            if len(fields) != want:
                layout = ('six fields, seconds first: "S M H DOM MON DOW" (use crontab for '
                          'five)' if kind == "cron" else
                          'five fields: "M H DOM MON DOW" (use cron for six, seconds first)')
                raise ConfigurationError(f"schedule: {kind} {expr!r} has {len(fields)} "
                                         f"fields; {kind} takes {layout}")
            spec = cls(kind, expr=" ".join(fields), tz=_zone(data.get("tz")))
        elif kind == "every":
            seconds = _number("every", data["every"])
            if not seconds > 0:
                raise ConfigurationError(f"schedule: every must be more than 0 seconds, "
                                         f"not {data['every']!r}")
            spec = cls(kind, every=seconds)
        else:
            event = data["solar"]
            if event not in _SOLAR_EVENTS:
                raise ConfigurationError(f"schedule: solar event {event!r} is not one of "
                                         f"{', '.join(_SOLAR_EVENTS)}")
            lat, lon = _number("lat", data.get("lat")), _number("lon", data.get("lon"))
            if not (-90 <= lat <= 90 and -180 <= lon <= 180):
                raise ConfigurationError(f"schedule: solar needs -90 <= lat <= 90 and -180 <= "
                                         f"lon <= 180, not lat={lat:g}, lon={lon:g}")
            spec = cls(kind, event=event, lat=lat, lon=lon)
        spec.build(None)  # a field croniter or Celery refuses
        return spec

    def as_json(self) -> dict[str, Any]:
        if self.kind in ("cron", "crontab"):
            out: dict[str, Any] = {self.kind: self.expr}
            if self.tz is not None:
                out["tz"] = self.tz
            return out
        if self.kind == "every":
            every = self.every or 0.0
            return {"every": int(every) if every == int(every) else every}
        return {"solar": self.event, "lat": self.lat, "lon": self.lon}

    def text(self) -> str:
        """One line: ``cron 0 */2 * * * * Europe/Berlin``, ``every 30s``."""
        if self.kind in ("cron", "crontab"):
            return f"{self.kind} {self.expr}" + (f" {self.tz}" if self.tz else "")
        if self.kind == "every":
            return f"every {self.every:g}s"
        return f"solar {self.event} {self.lat:g} {self.lon:g}"

    def build(self, app: Any) -> Any:
        """The schedule object beat runs (bound to *app*, whose ``timezone`` a spec
        without ``tz`` is read in)."""
        try:
            if self.kind == "cron":
                return cron(self.expr or "", tz=self.tz, app=app)
            if self.kind == "crontab":
                minute, hour, dom, month, dow = (self.expr or "").split()
                if self.tz is None:
                    return crontab(minute, hour, dow, dom, month, app=app)
                return zoned_crontab(minute, hour, dow, dom, month, tz=self.tz, app=app)
            if self.kind == "every":
                return interval_schedule(timedelta(seconds=self.every or 0.0), app=app)
            return solar(self.event or "", self.lat or 0.0, self.lon or 0.0, app=app)
        except ConfigurationError as exc:
            raise ConfigurationError(f"schedule: {exc}") from None
        except Exception as exc:
            raise ConfigurationError(f"schedule: {self.text()} cannot be built: "
                                     f"{type(exc).__name__}: {exc}") from None


def spec_of_schedule(sched: Any) -> ScheduleSpec | None:
    """The spec of a code entry's schedule object (for ``schedule override``), or None
    when it has no JSON form (a custom schedule)."""
    if isinstance(sched, cron):
        fields = sched.expr.split()
        expr = " ".join(fields if len(fields) == 6 else ["0", *fields])
        return ScheduleSpec("cron", expr=expr,
                            tz=None if sched._zone is None else zone_name(sched._zone))
    if isinstance(sched, zoned_crontab) or isinstance(sched, crontab):
        expr = " ".join(str(x) for x in (sched._orig_minute, sched._orig_hour,
                                         sched._orig_day_of_month,
                                         sched._orig_month_of_year, sched._orig_day_of_week))
        return ScheduleSpec("crontab", expr=expr,
                            tz=sched.zone_name if isinstance(sched, zoned_crontab) else None)
    if isinstance(sched, interval_schedule):
        return ScheduleSpec("every", every=sched.run_every.total_seconds())
    if isinstance(sched, solar):
        return ScheduleSpec("solar", event=sched.event, lat=float(sched.lat),
                            lon=float(sched.lon))
    return None


def _json_value(what: str, value: Any, kind: type, example: str) -> Any:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigurationError(f"{what}: {value!r} is not JSON; write e.g. "
                                     f"{example}") from None
    if kind is list and isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, kind):
        raise ConfigurationError(f"{what}: {value!r} is not a JSON "
                                 f"{'list' if kind is list else 'object'}; write e.g. {example}")
    try:
        return json.loads(canonical(value))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{what}: {value!r} cannot be stored as JSON ({exc}); use "
                                 "text, numbers, true/false, null, lists and objects") from None


@dataclass(frozen=True)
class EntryDefinition:
    """What a database entry runs: its task, schedule, arguments, options, and whether
    it is enabled. Built with :meth:`of`, which checks the JSON shapes."""

    task: str
    schedule: ScheduleSpec
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    enabled: bool = True

    @classmethod
    def of(cls, task: Any, schedule: Any, args: Any = (), kwargs: Any = None,
           options: Any = None, enabled: Any = True) -> EntryDefinition:
        if not isinstance(task, str) or not task.strip():
            raise ConfigurationError(f"task: {task!r} is not a task name; give the name of a "
                                     "registered task, e.g. 'proj.tasks.report'")
        if not isinstance(enabled, bool):
            raise ConfigurationError(f"enabled: {enabled!r} is not true or false")
        return cls(task.strip(), ScheduleSpec.parse(schedule),
                   tuple(_json_value("args", list(args) if isinstance(args, tuple) else args,
                                     list, "[1, \"a\"]")),
                   _json_value("kwargs", {} if kwargs is None else kwargs, dict,
                               '{"days": 7}'),
                   _json_value("options", {} if options is None else options, dict,
                               '{"queue": "reports"}'),
                   enabled)

    def columns(self) -> dict[str, Any]:
        """The entries table's columns for this definition (JSON as text)."""
        return {"task": self.task, "schedule": canonical(self.schedule.as_json()),
                "args": canonical(list(self.args)), "kwargs": canonical(dict(self.kwargs)),
                "options": canonical(dict(self.options)), "enabled": self.enabled}

    @classmethod
    def from_columns(cls, row: Mapping[str, Any]) -> EntryDefinition:
        """A definition from the columns of a row (not checked: see :func:`check_definition`)."""
        def load(text: Any, empty: Any) -> Any:
            try:
                return json.loads(text) if isinstance(text, str) and text else empty
            except ValueError:
                return text  # the check names it
        schedule = load(row["schedule"], None)
        try:
            spec = ScheduleSpec.parse(schedule)
        except ConfigurationError:
            spec = ScheduleSpec("invalid", expr=str(row["schedule"]))
        args = load(row["args"], [])
        return cls(str(row["task"] or ""), spec, tuple(args) if isinstance(args, list) else args,
                   load(row["kwargs"], {}), load(row["options"], {}), bool(row["enabled"]))

    def as_json(self) -> dict[str, Any]:
        return {"task": self.task, "schedule": self.schedule.as_json(),
                "args": list(self.args), "kwargs": dict(self.kwargs),
                "options": dict(self.options), "enabled": self.enabled}

    def same(self, other: EntryDefinition) -> bool:
        """Whether *other* runs the same: the same columns."""
        return self.columns() == other.columns()


def task_allowed(task: str, allowed: Sequence[str]) -> bool:
    """Whether *task* matches one of the names or glob patterns *allowed*."""
    return any(fnmatch.fnmatchcase(task, pattern) for pattern in allowed)


def check_definition(name: Any, definition: EntryDefinition, settings: Settings,
                     app: Any) -> ScheduleEntry:
    """The entry *definition* builds for *app*, checked as beat checks it: the name,
    the task against ``elarion_beat_db_entry_tasks``, the schedule, the shapes, the
    options this library reads. :class:`ConfigurationError` names the field and the fix."""
    problem = job_name_problem(name)
    if problem is not None:
        raise ConfigurationError(f"name: {name!r} cannot be an entry name: {problem}; use at "
                                 "most 191 characters of text, no NUL")
    if definition.schedule.kind not in SCHEDULE_KINDS:
        ScheduleSpec.parse(definition.schedule.expr)  # raises, naming what is wrong
    if not task_allowed(definition.task, settings.db_entry_tasks):
        allowed = ", ".join(settings.db_entry_tasks) or "nothing"
        raise ConfigurationError(
            f"task: {definition.task!r} is not allowed for database entries (allowed: "
            f"{allowed}); add it, or a glob pattern such as 'proj.tasks.*', to "
            "elarion_beat_db_entry_tasks")
    for what, value, kind in (("args", definition.args, tuple), ("kwargs", definition.kwargs,
                                                                 Mapping),
                              ("options", definition.options, Mapping)):
        if not isinstance(value, kind):
            raise ConfigurationError(f"{what}: {value!r} is not a JSON "
                                     f"{'list' if kind is tuple else 'object'}")
    entry = ScheduleEntry(name=name, task=definition.task,
                          schedule=definition.schedule.build(app), args=definition.args,
                          kwargs=dict(definition.kwargs), options=dict(definition.options),
                          app=app)
    wrong = entry_problem(entry)
    if wrong is not None:
        raise ConfigurationError(f"entry {name!r}: {wrong}")
    try:
        check_entry(name, entry, settings)
    except ConfigurationError as exc:
        raise ConfigurationError(f"options: {exc}") from None
    return entry


class LiveEntry(ScheduleEntry):
    """A database entry as beat runs it: a ``ScheduleEntry`` that also knows its
    *revision*, the *cluster* whose entries table holds it, and the span its revision
    governs: occurrences from *effective_at* until *until* (the next revision's
    effective time; None: no next revision known)."""

    def __init__(self, *args: Any, revision: int = 0, cluster: str = "",
                 effective_at: datetime | None = None, until: datetime | None = None,
                 restart: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.revision = revision
        self.cluster = cluster
        self.effective_at = effective_at
        self.until = until
        #: an interval whose phase restarts at effective_at (else it keeps its phase)
        self.restart = restart

    def __reduce__(self) -> Any:  # the scheduler never pickles it; copies keep their fields
        return (_rebuild, (dict(vars(self)),))


def _rebuild(fields: dict[str, Any]) -> LiveEntry:
    return LiveEntry(**fields)


def naming_time(entry: Any, now: datetime) -> datetime:
    """The instant to name *entry*'s occurrence at: *now*, or for a revision whose span
    ended (a later revision took effect), the last instant of its span."""
    until = getattr(entry, "until", None)
    if until is not None and now >= until:
        return as_utc(until) - _TICK
    return now


def outside_revision(entry: Any, occurrence: datetime | None, window: bool,
                     now: datetime) -> bool:
    """Whether the occurrence named (a slot; for a window claim, *now*) lies outside
    the span *entry*'s revision governs: before its effective time, or from the next
    revision's on. Always False for a code entry."""
    if not isinstance(entry, LiveEntry):
        return False
    at = now if window or occurrence is None else occurrence
    if entry.effective_at is not None and at < entry.effective_at:
        return True
    return entry.until is not None and at >= entry.until


def phase_anchor(last: datetime, every: timedelta, effective: datetime,
                 restart: bool) -> datetime:
    """The last run an interval entry edited at *effective* counts from, given its last
    run *last* (under whatever revision): the point of its rhythm at or before the
    effective time (it keeps its phase, its length changed or not), or with *restart*
    the effective time itself. An edit never makes a run due by itself."""
    last, effective = as_utc(last), as_utc(effective)
    if last >= effective or every <= timedelta(0):
        return last
    if restart:
        return effective
    return last + ((effective - last) // every) * every

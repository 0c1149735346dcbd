"""Reading ``beat_schedule``, in one place: one broken entry is left out, never the whole schedule.

Stock beat builds every entry in one go, so an entry that is not a mapping, has
an unknown key or a schedule that is not a schedule stops beat at start with a
bare ``TypeError``/``AttributeError`` naming nothing; and an entry without a
``task``, with ``args`` that are not a list or with an interval of zero seconds
gets past the start and fails on every tick. :func:`build_entries` builds each
entry on its own and leaves out the ones that can never run, each with one ERROR
(``action=invalid-entry``) that names it, says what is wrong and how to fix it;
the good entries run. (Option values this library reads, such as ``placement``,
are checked by :func:`check_entry`, which refuses to start.)

Everything that reads the schedule reads it here: beat (:func:`build_entries`, with
its own entry class), and ``status``, ``pause``, ``trigger``, ``catch-up``,
``preview``, the Flower page and ``simulate`` (:func:`read_schedule`, which returns
the good entries and names each left-out one with its reason, so a command works on
the good entries and says in one line what is wrong with the others).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

from celery.beat import ScheduleEntry
from celery.schedules import schedule as interval_schedule

from ..exceptions import ConfigurationError
from ..schedules.slots import is_slotted
from .catch_up import entry_catch_up
from .delivery import entry_delivery
from .jitter import entry_jitter
from .names import check_job_name
from .overlap import entry_overlap
from .parsers import format_duration
from .placement import Placement, entry_placement
from .settings import Settings

__all__ = ["InvalidEntry", "Schedule", "build_entries", "check_entry", "entry_problem",
           "read_schedule", "schedule_entries"]

logger = logging.getLogger(__name__)

_SCHEDULES = ("a number of seconds, a timedelta, crontab(), solar() or "
              "celery_elarion_beat.cron()")


def entry_problem(entry: ScheduleEntry) -> str | None:
    """What makes a built *entry* unable to ever run, or None."""
    if not isinstance(entry.task, str) or not entry.task:
        return (f"it has no 'task' (found {entry.task!r}); add the name of the task to "
                "send, e.g. 'task': 'proj.tasks.report'")
    if not callable(getattr(entry.schedule, "is_due", None)):
        return f"its 'schedule' is {entry.schedule!r}, not a schedule; use {_SCHEDULES}"
    if isinstance(entry.schedule, interval_schedule):
        period = entry.schedule.run_every.total_seconds()
        if not period > 0:
            return (f"its 'schedule' is an interval of {format_duration(period)}; an interval "
                    "must be longer than 0 seconds")
    if entry.args is not None and not isinstance(entry.args, (list, tuple)):
        return f"its 'args' is {entry.args!r}; use a list (or tuple) of positional arguments"
    if entry.kwargs is not None and not isinstance(entry.kwargs, Mapping):
        return f"its 'kwargs' is {entry.kwargs!r}; use a dict of keyword arguments"
    if entry.options is not None and not isinstance(entry.options, Mapping):
        return f"its 'options' is {entry.options!r}; use a dict of options"
    return None


def _schedule_problem(raw: Any) -> str | None:
    """What is wrong with an entry's raw ``schedule`` value, before it is built."""
    if isinstance(raw, bool) or not (isinstance(raw, (int, float, timedelta))
                                     or callable(getattr(raw, "is_due", None))):
        return f"its 'schedule' is {raw!r}, not a schedule; use {_SCHEDULES}"
    return None


def build_entries(schedule: Mapping[str, Any],
                  build: Callable[[str, Mapping[str, Any]], ScheduleEntry],
                  node: str | None = None,
                  problems: dict[str, str] | None = None) -> dict[str, ScheduleEntry]:
    """Each entry of *schedule* built by *build* (name, fields), the broken ones left
    out with an ERROR naming them; or, given *problems*, with their name and what is
    wrong put there instead (``elarion-beat preview`` prints them)."""
    built: dict[str, ScheduleEntry] = {}
    for name, fields in schedule.items():
        problem: str | None
        entry: ScheduleEntry | None = None
        if isinstance(fields, ScheduleEntry):  # rebuilt for this app, as stock beat does
            fields = dict(fields)
        if not isinstance(fields, Mapping):
            problem = (f"it is a {type(fields).__name__}, not a mapping; give each entry a "
                       "dict with 'task' and 'schedule'")
        elif (problem := _schedule_problem(fields.get("schedule"))) is None:
            try:
                entry = build(name, fields)
            except Exception as exc:  # stock beat would stop here, naming nothing
                problem = (f"it cannot be read ({type(exc).__name__}: {exc}); an entry takes "
                           "'task', 'schedule' and optionally 'args', 'kwargs', 'options', "
                           "'relative'")
            else:
                problem = entry_problem(entry)
        if problem is None and entry is not None:
            built[name] = entry
            continue
        if problems is not None:
            problems[str(name)] = str(problem)
            continue
        shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
        logger.error("beat: beat_schedule entry %s is left out (it never runs until "
                     "fixed): %s", shown, problem,
                     extra={"action": "invalid-entry", "job": str(name), "node": node})
    return built


def check_entry(name: str, entry: ScheduleEntry, settings: Settings) -> None:
    """Refuse, naming the entry, what can never be claimed right: a bad placement,
    catch-up, delivery, overlap or jitter option, a name that cannot be a key, an interval
    the purge would outlive."""
    placement = entry_placement(name, entry.options)
    if placement is Placement.CLUSTER:
        check_job_name(name)
    entry_catch_up(name, entry.options, settings.catch_up_policy)
    entry_delivery(name, entry.options, settings.default_delivery)
    entry_overlap(name, entry.options, settings.overlap_timeout, settings.publish_timeout,
                  every_node=placement is Placement.EVERY_NODE)
    entry_jitter(name, entry.options, slotted=is_slotted(entry.schedule),
                 every_node=placement is Placement.EVERY_NODE)
    retention = settings.claim_retention
    if isinstance(entry.schedule, interval_schedule):
        period = entry.schedule.run_every.total_seconds()
        if period >= retention:
            raise ConfigurationError(
                f"beat_schedule entry {name!r} runs every {format_duration(period)}, which is "
                f"not shorter than elarion_beat_claim_retention ({format_duration(retention)}): "
                "a purged claim could no "
                "longer suppress a duplicate inside its window; raise "
                "elarion_beat_claim_retention above the entry's interval")


@dataclass(frozen=True)
class InvalidEntry:
    """An entry beat leaves out (or refuses to start with), and why."""

    job: str
    reason: str
    #: where the entry is kept: ``beat_schedule``, or ``database`` (live schedules)
    source: str = "beat_schedule"

    def line(self) -> str:
        """One line for an operator: ``beat_schedule entry 'x' is left out: ...``."""
        shown = repr(self.job) if len(repr(self.job)) <= 80 else repr(self.job)[:77] + "..."
        return f"{self.source} entry {shown} is left out (it never runs until fixed): " \
               f"{self.reason}"


class Schedule(NamedTuple):
    """The app's ``beat_schedule`` as beat builds it: the good entries by name, and
    the ones left out with their reason."""

    entries: dict[str, ScheduleEntry]
    invalid: list[InvalidEntry]


def read_schedule(app: Any, settings: Settings | None = None) -> Schedule:
    """The app's ``beat_schedule`` built entry by entry as beat builds it
    (:func:`build_entries`); with *settings*, an entry whose options beat refuses to
    start with (:func:`check_entry`) is left out too, with its reason."""
    problems: dict[str, str] = {}
    built = build_entries(getattr(app.conf, "beat_schedule", None) or {},
                          lambda name, fields: ScheduleEntry(**dict(fields, name=name, app=app)),
                          problems=problems)
    invalid = [InvalidEntry(job, reason) for job, reason in problems.items()]
    if settings is not None:
        for name, entry in list(built.items()):
            try:
                check_entry(name, entry, settings)
            except ConfigurationError as exc:
                invalid.append(InvalidEntry(name, str(exc)))
                del built[name]
    return Schedule(built, invalid)


def schedule_entries(app: Any, settings: Settings | None = None) -> dict[str, ScheduleEntry]:
    """The good entries of the app's ``beat_schedule`` (:func:`read_schedule`)."""
    return read_schedule(app, settings).entries

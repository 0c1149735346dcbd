"""Reading ``beat_schedule``: one broken entry is left out, never the whole schedule.

Stock beat builds every entry in one go, so an entry that is not a mapping, has
an unknown key or a schedule that is not a schedule stops beat at start with a
bare ``TypeError``/``AttributeError`` naming nothing; and an entry without a
``task``, with ``args`` that are not a list or with an interval of zero seconds
gets past the start and fails on every tick. :func:`build_entries` builds each
entry on its own and leaves out the ones that can never run, each with one ERROR
(``action=invalid-entry``) that names it, says what is wrong and how to fix it;
the good entries run. (Option values this library reads, such as ``placement``,
are checked by :func:`.dispatch.check_entry`, which refuses to start.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from celery.beat import ScheduleEntry
from celery.schedules import schedule as interval_schedule

__all__ = ["build_entries", "entry_problem"]

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
            return (f"its 'schedule' is an interval of {period:g} seconds; an interval must "
                    "be longer than 0 seconds")
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

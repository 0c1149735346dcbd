"""Live control: pause, resume and trigger (run now) a job for the whole cluster.

An operator acts from any machine that has the app (``celery -A proj elarion-beat
pause|resume|trigger|audit``) or from the Flower page; beat need not be running.
Everything goes through the claims database:

* a **pause** is a row of the pauses table, read inside every claim (no extra round
  trip): each occurrence of the job is stored ``skipped`` (``paused``) and every node
  records the skip. ``--until`` ends it by itself, on the database clock. Every-node
  entries honour it too (:mod:`..beat.pause_watch`). ``pause --all`` pauses every job;
* a **trigger** claims a run of kind ``manual`` (at the database clock) and
  publishes the entry once, with its own options and headers plus
  ``elarion_manual=1``; the workers follow the run like any other. A second trigger
  of the job within ``elarion_beat_trigger_window`` is refused as a duplicate unless
  forced, so two operators pressing "run now" together get one run;
* each action is a row of the audit table: who (:func:`os_actor`, or the Flower
  user), when, what, why.

Bad input raises :class:`~..exceptions.ConfigurationError` naming the value and the
fix, before anything is written.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery.beat import ScheduleEntry

from ..beat.plan import Plan, message
from ..config.names import job_name_problem
from ..config.parsers import duration
from ..config.placement import Placement, entry_placement
from ..config.settings import Settings
from ..exceptions import ConfigurationError
from ..live_schedules.listing import read_live_schedule
from ..observe.events import EventSender
from ..observe.outcome import Outcome, Record
from ..schedules.clock import as_utc
from ..schedules.slots import iso
from ..store.control_records import (
    ALL_JOBS,
    AuditEntry,
    Pause,
    os_actor,
    reason_text,
)
from ..store.interface import ClaimStore
from ..store.records import ClaimRow, PublishReport, storable

__all__ = ["ALL_JOBS", "AuditEntry", "Pause", "Triggered", "active_pauses", "actor_node",
           "audit_log", "job_label", "os_actor", "parse_until", "pause_job", "resume_job",
           "trigger_job"]

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class Triggered:
    """What became of a trigger: *sent* when the broker accepted the message (else
    *error* says why), or refused as a *duplicate* of a recent manual run."""

    job: str
    task_id: str | None
    occurrence: datetime | None
    sent: bool
    error: str | None = None
    duplicate: ClaimRow | None = None

    def as_dict(self) -> dict[str, Any]:
        dup = self.duplicate
        return {"job": self.job, "task_id": self.task_id,
                "occurrence": iso(self.occurrence) if self.occurrence else None,
                "sent": self.sent, "error": self.error,
                "duplicate": None if dup is None else {
                    "task_id": dup.task_id, "occurrence": dup.occurrence.isoformat(),
                    "by": dup.node, "state": dup.state}}


def actor_node(actor: str) -> str:
    """The holder a triggered run's claim names: the actor without its source,
    ``alice@host1`` for ``alice@host1 (cli)``."""
    head, sep, tail = actor.rpartition(" (")
    return head if sep and tail.endswith(")") and head else actor


def job_label(job: str) -> str:
    """How a job name is shown: ``(all jobs)`` for :data:`ALL_JOBS`."""
    return "(all jobs)" if job == ALL_JOBS else job


def parse_until(text: str, now: datetime, option: str = "--until") -> datetime:
    """An ISO time (``2026-12-01T06:00Z``; naive means UTC) or a duration from *now*
    (``2h``, ``30m``), which must lie after *now*."""
    raw = text.strip()
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
        until = as_utc(value)
    except ValueError:
        try:
            until = now + duration(option, raw)
        except ConfigurationError:
            raise ConfigurationError(
                f"{option} {text!r} is neither an ISO time (2026-12-01T06:00:00Z) nor a "
                "duration (90s, 30m, 2h, 7d)") from None
    if until <= now:
        raise ConfigurationError(
            f"{option} {text!r} ({iso(until)}) is not after now ({iso(now)}, the database "
            "clock); give a later time, or resume the job instead")
    return until


def _reason(reason: str) -> str:
    return reason_text(reason)


def _entry(app: Any, job: str, store: ClaimStore | None = None) -> ScheduleEntry:
    """The entry *job*: a code entry, or (with ``elarion_beat_db_entries``) a database
    entry as it governs now."""
    entries, invalid = read_live_schedule(app, None, store, checked=False)
    if job in entries:
        return entries[job]
    left_out = next((i for i in invalid if i.job == job), None)
    if left_out is not None:
        raise ConfigurationError(f"{left_out.line()}; fix the entry first")
    problem = job_name_problem(job)
    known = ", ".join(repr(name) for name in sorted(entries)[:20]) or "none"
    more = f" and {len(entries) - 20} more" if len(entries) > 20 else ""
    why = f" ({problem})" if problem else ""
    raise ConfigurationError(
        f"{job!r}{why} is not an entry of this app's beat_schedule; the entries are: "
        f"{known}{more} (run `elarion-beat status` to list them)")


def pause_job(app: Any, store: ClaimStore, job: str, *, actor: str,
              until: datetime | None = None, reason: str = "") -> Pause:
    """Pause *job* (:data:`ALL_JOBS`: every job) for the whole cluster."""
    if job != ALL_JOBS:
        _entry(app, job, store)
    text = _reason(reason)
    if until is not None and until <= store.clock():
        raise ConfigurationError(f"--until {iso(until)} is not in the future (database "
                                 "clock); give a later time")
    pause = store.pause(job, actor, text, until)
    logger.info("elarion: %s %s", job_label(job), pause.describe(),
                extra={"action": "paused", "job": job, "actor": actor})
    return pause


def resume_job(app: Any, store: ClaimStore, job: str, *, actor: str) -> Pause | None:
    """Lift the pause of *job*; the pause lifted, or None when it was not paused.
    A job no longer in the schedule may still be resumed (its pause row goes)."""
    pause = store.resume(job, actor)
    if pause is not None:
        logger.info("elarion: %s resumed by %s", job_label(job), actor,
                    extra={"action": "resumed", "job": job, "actor": actor})
    return pause


def active_pauses(store: ClaimStore) -> tuple[datetime, list[Pause]]:
    """The database clock and every pause in force."""
    return store.pauses()


def audit_log(store: ClaimStore, job: str | None = None, since: datetime | None = None,
              limit: int = 100) -> list[AuditEntry]:
    """The operator actions, newest first."""
    return store.audit(job=job, since=since, limit=limit)


def trigger_job(app: Any, store: ClaimStore, job: str, *, actor: str,
                args: list[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                force: bool = False, reason: str = "",
                settings: Settings | None = None) -> Triggered:
    """Run *job* now, once: claim a manual run, publish it, report the publish."""
    entry = _entry(app, job, store)
    if entry_placement(job, entry.options) is Placement.EVERY_NODE:
        raise ConfigurationError(
            f"{job!r} is an every-node entry (each node runs it from its own queue); a "
            "trigger publishes one message, so it cannot run it everywhere: trigger a "
            "cluster entry, or call the task on each node")
    if args is not None and not isinstance(args, list):
        raise ConfigurationError(f"--args-json must be a JSON array, not {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigurationError(
            f"--kwargs-json must be a JSON object, not {type(kwargs).__name__}")
    if args is not None:
        entry.args = tuple(args)
    if kwargs is not None:
        entry.kwargs = dict(kwargs)
    _check_arguments(app, entry)
    settings = settings or Settings.from_app(app)
    text = _reason(reason)
    window = None if force else timedelta(seconds=settings.trigger_window)
    task_id = str(uuid.uuid4())
    node = actor_node(actor)
    claim = store.claim_manual(job, node, task_id, actor, window, text)
    if claim.row is None or claim.token is None:
        return Triggered(job, None, None, False, duplicate=claim.duplicate)
    row = claim.row
    error = _publish(app, entry, task_id, row.occurrence, node)
    try:
        store.report([PublishReport(job, row.occurrence, claim.token, error)])
    except Exception as exc:  # the message is out: say so, the row stays pending
        logger.warning("elarion: the trigger of %s was published but its claim could not be "
                       "marked published: %s", job, exc)
    _announce(app, settings, entry, row, actor, error)
    return Triggered(job, task_id, row.occurrence, error is None, error)


def _check_arguments(app: Any, entry: ScheduleEntry) -> None:
    """Refuse arguments the task cannot take, before anything is written (Celery makes
    the same check when it sends a task registered in this process)."""
    task = app.tasks.get(entry.task)
    check = getattr(task, "__header__", None) if getattr(task, "typing", False) else None
    if check is None:
        return
    try:
        check(*(entry.args or ()), **(entry.kwargs or {}))
    except TypeError as exc:
        raise ConfigurationError(
            f"{entry.name!r} runs {entry.task}, which cannot take these arguments ({exc}); "
            "fix --args-json / --kwargs-json (or the entry's args and kwargs)") from None


def _publish(app: Any, entry: ScheduleEntry, task_id: str, occurrence: datetime,
             node: str) -> str | None:
    plan = Plan(entry, Placement.CLUSTER, task_id=task_id, manual=True)
    args, kwargs, options = message(plan, occurrence, node, None)
    try:
        with app.producer_or_acquire() as producer:
            task = app.tasks.get(entry.task)
            if task is not None:
                task.apply_async(args, kwargs, producer=producer, **options)
            else:
                app.send_task(entry.task, args, kwargs, producer=producer, **options)
    except Exception as exc:
        return storable(f"{type(exc).__name__}: {exc}")
    return None


def _announce(app: Any, settings: Settings, entry: ScheduleEntry, row: ClaimRow, actor: str,
              error: str | None) -> None:
    """The ``elarion-dispatched`` event of a triggered run (Flower shows it), best effort."""
    if not settings.events or error is not None:
        return
    sender = EventSender(app, settings.node, hostname=f"elarion-control@{settings.node}",
                         cluster=settings.cluster)
    try:
        sender.on_record(Record(job=entry.name, task=entry.task, node=actor_node(actor),
                                outcome=Outcome.DISPATCHED, placement=Placement.CLUSTER,
                                at=row.occurrence, occurrence=row.occurrence,
                                task_id=row.task_id, manual=True))
    finally:
        sender.close()


def json_arguments(args_json: str | None, kwargs_json: str | None) -> tuple[Any, Any]:
    """``--args-json`` and ``--kwargs-json`` read, or a ConfigurationError naming the one
    that is not JSON."""
    out: list[Any] = []
    for option, text in (("--args-json", args_json), ("--kwargs-json", kwargs_json)):
        if text is None:
            out.append(None)
            continue
        try:
            out.append(json.loads(text))
        except ValueError as exc:
            raise ConfigurationError(f"{option} is not valid JSON ({exc}): {text[:80]!r}") \
                from None
    return out[0], out[1]

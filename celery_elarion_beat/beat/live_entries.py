"""Beat's side of the database entries (live schedules): follow the changes, and put
each revision in place at its effective time.

:class:`LiveFollower`, driven by the scheduler's tick:

* **at start** it reads every entry of the cluster once (:meth:`~LiveFollower.start`),
  and puts in place what runs under each name (:mod:`..live_schedules.rules`: code and
  database entries share one name space);
* **each tick** it asks whether anything changed, without a query when it can: a
  NOTIFY on PostgreSQL (the LISTEN connection the one-offs use), else, and at least
  every ``elarion_beat_db_entries_poll`` seconds, the cluster's version (one key
  read). When the version moved, it reads only the revisions written since the
  version it holds (:meth:`~..store.interface.LiveEntries.entry_changes`), never the
  whole table. An idle tick does none of this: O(1);
* a revision **governs** the occurrences from its effective time on. Until then the
  entry in place keeps running under the revision before, its span ending there
  (``LiveEntry.until``: its slots are named before it); at the effective time
  (:meth:`~LiveFollower.promote`, after the tick's due entries were sent) the new one
  takes its place, with the heap edited, not rebuilt. A slotted entry runs from the
  first slot at or after its effective time (an edit or an enable fires nothing by
  itself); an interval keeps its phase unless the revision restarts it;
* when a claim is refused as stale (a node that had not heard of an edit yet), the
  pipeline asks :meth:`~LiveFollower.refresh` to load the change now and decides the
  same slot again under the revision that governs it.

A store error never breaks a tick: the follower keeps what it has and asks again at
the next poll.
"""

from __future__ import annotations

import heapq
import logging
import select
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery.beat import ScheduleEntry
from celery.schedules import schedule as interval_schedule

from ..config.catch_up import MAX_MISSED
from ..config.live_entries import LiveEntry, check_definition, phase_anchor
from ..config.settings import Settings
from ..exceptions import ConfigurationError, StoreError
from ..live_schedules.rules import CODE, DATABASE, code_digest, decide
from ..observe.fingerprint import entry_digests
from ..schedules.clock import Clock, as_utc
from ..schedules.slots import is_slotted, recent_slots
from ..store.entry_records import EntryRevision, StoredEntry
from ..store.interface import ClaimStore, Wakeups
from .watched_schedule import WatchedSchedule

__all__ = ["LATE_HORIZON", "LiveFollower", "Step"]

logger = logging.getLogger(__name__)

#: The instant just before an effective time.
_TICK = timedelta(microseconds=1)
#: How far back the slots of an entry heard of late are claimed as any slot.
LATE_HORIZON = timedelta(seconds=5)


@dataclass(frozen=True)
class Step:
    """One revision of an entry on this node's time line: from *effective* on, *row*
    (None: removed) governs it."""

    effective: datetime
    revision: int
    row: StoredEntry | None


class LiveFollower:
    """The database entries of one beat node (see the module docstring)."""

    def __init__(self, app: Any, settings: Settings, store: Callable[[], ClaimStore],
                 clock: Clock, cluster: str,
                 late: Callable[[str, list[datetime]], None] = lambda job, slots: None
                 ) -> None:
        self.app = app
        self.settings = settings
        self._store = store
        self._clock = clock
        self.cluster = cluster
        #: told the slots an entry put in place had due already (claimed as any slot)
        self._late = late
        #: the cluster's version this node runs (None: not read yet)
        self.version: int | None = None
        #: the latest row of each entry, as this node knows it
        self.rows: dict[str, StoredEntry] = {}
        #: per name, the step that governs now first, then the ones still to come
        self._steps: dict[str, list[Step]] = {}
        self._pending: list[tuple[datetime, int, str]] = []  # (effective, revision, name)
        #: the revision in place in the schedule per name (0: the code entry)
        self._installed: dict[str, int] = {}
        #: the code entries, as the schedule built them at start
        self.code: dict[str, ScheduleEntry] = {}
        #: the code entries as a schedule (the drift check's fingerprint)
        self.code_schedule: WatchedSchedule = WatchedSchedule()
        self._digests: dict[str, str] = {}
        #: what an operator must hear about, per name (:mod:`..live_schedules.rules`)
        self.problems: dict[str, str] = {}
        self._wakeups: Wakeups | None = None
        self._wakeups_made = False
        #: when the version is read next, on the scheduler's clock (a simulated cluster's
        #: clock moves by leaps); a clock set back polls at once
        self._next_poll: datetime | None = None
        self._last_poll: datetime | None = None
        self._force = False
        self._started: datetime | None = None
        self._failing = False
        self.loads = 0
        self.applied = 0

    # -- start ---------------------------------------------------------------------

    def start(self, schedule: MutableMapping[str, Any], now: datetime) -> None:
        """Beat has built its code entries into *schedule*: keep them, and put the
        database entries in place (a store error: they come at the next poll)."""
        self.code = dict(schedule)
        self.code_schedule = WatchedSchedule(self.code)
        self._digests = entry_digests(self.code)
        self._started = now
        self._force = True
        self.follow(schedule, now)

    # -- each tick -----------------------------------------------------------------

    def follow(self, schedule: MutableMapping[str, Any], now: datetime) -> bool:
        """Read what changed since the version this node holds, if anything may have;
        True when a change was read (it takes its place at its effective time)."""
        if not self._due(now):
            return False
        self._force = False
        self._last_poll = now
        self._next_poll = now + timedelta(seconds=self.settings.db_entries_poll)
        store = self._store()
        try:
            if self.version is None:
                self._load(store, schedule, now)
                return True
            version = store.entries_version(self.cluster)
            if version == self.version:
                self._recovered()
                return False
            changes = store.entry_changes(self.cluster, self.version)
            if changes.more:  # far behind: one read of every entry is cheaper
                self._load(store, schedule, now)
                return True
            for rev in changes.revisions:
                self._apply(schedule, rev)
            self.version = max(self.version, changes.version)
            self.applied += len(changes.revisions)
            self._recovered()
            if changes.revisions:
                logger.info("beat: database entries at version %d (%d change%s: %s)",
                            self.version, len(changes.revisions),
                            "" if len(changes.revisions) == 1 else "s",
                            _names(changes.revisions),
                            extra={"action": "live-entries-changed", "version": self.version,
                                   "changes": len(changes.revisions), "node": self.settings.node})
            return bool(changes.revisions)
        except StoreError as exc:
            if not self._failing:
                logger.warning("beat: could not read the database entries (the ones in "
                               "place keep running; asking again): %s", exc,
                               extra={"action": "live-entries-failed"})
            self._failing = True
            return False

    def refresh(self, schedule: MutableMapping[str, Any], now: datetime) -> bool:
        """Read the changes now (a claim was refused as stale) and put in place what
        governs *now*; True when something changed."""
        self._force = True
        changed = self.follow(schedule, now)
        return self.promote(schedule, now) or changed

    def promote(self, schedule: MutableMapping[str, Any], now: datetime) -> bool:
        """Put in place every revision whose effective time has come; True when any did."""
        changed = False
        while self._pending and self._pending[0][0] <= now:
            _, _, name = heapq.heappop(self._pending)
            steps = self._steps.get(name)
            if not steps:
                continue
            due = [i for i, step in enumerate(steps) if step.effective <= now]
            if not due:
                continue
            del steps[:due[-1]]
            if self._install(schedule, name, steps[0], now):
                changed = True
        return changed

    def wake_in(self, now: datetime) -> float | None:
        """Seconds until the follower must run again: the next effective time, the next
        poll of the version; None when neither is set."""
        waits = []
        if self._wakeups is None or not self._wakeups.reliable:
            waits.append(0.0 if self._next_poll is None
                         else max(0.0, (self._next_poll - now).total_seconds()))
        if self._pending:
            waits.append(max(0.0, (self._pending[0][0] - now).total_seconds()))
        return min(waits) if waits else None

    def wait(self, seconds: float) -> float:
        """Wait up to *seconds* for a notification on the LISTEN connection (beat's own
        sleep cannot be woken); the seconds beat may still sleep afterwards (0: tick
        now). Without a listener, nothing is waited for."""
        fd = self._wakeups.fileno() if self._wakeups is not None else None
        if fd is None or seconds <= 0:
            return seconds
        try:
            select.select([fd], [], [], seconds)
        except (OSError, ValueError):  # the connection went away meanwhile
            return 0.0
        return 0.0

    def close(self) -> None:
        if self._wakeups is not None:
            self._wakeups.close()
            self._wakeups = None

    # -- what changed ----------------------------------------------------------------

    def _due(self, now: datetime) -> bool:
        if not self._wakeups_made:
            self._wakeups_made = True
            try:
                self._wakeups = self._store().entry_wakeups(self.cluster)
            except Exception:  # no listener: poll the version
                self._wakeups = None
        woke = self._wakeups.poll() if self._wakeups is not None else None
        if woke or self._force or self._next_poll is None:
            return True
        if woke is False and self._wakeups is not None and self._wakeups.reliable:
            return False  # told of every change (in-process): nothing to poll
        return now >= self._next_poll or (self._last_poll is not None
                                          and now < self._last_poll)

    def _recovered(self) -> None:
        if self._failing:
            logger.info("beat: the database entries can be read again",
                        extra={"action": "live-entries-back"})
        self._failing = False

    def _load(self, store: ClaimStore, schedule: MutableMapping[str, Any],
              now: datetime) -> None:
        """Read every entry of the cluster; put in place what governs *now*."""
        snapshot = store.live_entries(self.cluster)
        known = set(self._steps) | set(self.rows)
        self.rows = {row.name: row for row in snapshot.entries}
        for name in known - set(self.rows):  # removed while this node was not listening
            self._steps[name] = [Step(snapshot.now, 0, None)]
            heapq.heappush(self._pending, (snapshot.now, 0, name))
        for row in snapshot.entries:
            if row.effective_at <= snapshot.now:
                steps = [Step(row.effective_at, row.revision, row)]
            else:  # a revision still to come: what governs until then is in its history
                steps = self._steps_from(store.entry_history(self.cluster, row.name, 50),
                                         snapshot.now)
            self._steps[row.name] = steps
            for step in steps:
                heapq.heappush(self._pending, (step.effective, step.revision, row.name))
        self.version = snapshot.version
        self.loads += 1
        self._recovered()
        logger.info("beat: %d database entries at version %d", len(snapshot.entries),
                    snapshot.version, extra={"action": "live-entries-loaded",
                                             "count": len(snapshot.entries),
                                             "version": snapshot.version})
        self.promote(schedule, now)

    @staticmethod
    def _steps_from(history: list[EntryRevision], now: datetime) -> list[Step]:
        steps: list[Step] = []
        for rev in sorted(history, key=lambda r: r.revision):
            steps = [s for s in steps if s.effective < rev.effective_at]
            steps.append(Step(rev.effective_at, rev.revision, rev.entry()))
        due = [i for i, step in enumerate(steps) if step.effective <= now]
        return steps[due[-1]:] if due else steps

    def _apply(self, schedule: MutableMapping[str, Any], rev: EntryRevision) -> None:
        """Put revision *rev* on its entry's time line: it governs from its effective
        time on, and every step it overtakes is dropped."""
        row = rev.entry()
        if row is None:
            self.rows.pop(rev.name, None)
        else:
            self.rows[rev.name] = row
        steps = self._steps.setdefault(rev.name, [])
        steps[:] = [s for s in steps if s.effective < rev.effective_at]
        steps.append(Step(rev.effective_at, rev.revision, row))
        heapq.heappush(self._pending, (rev.effective_at, rev.revision, rev.name))
        current = schedule.get(rev.name)
        if isinstance(current, LiveEntry):  # its span ends where the next revision begins
            later = [s.effective for s in steps if s.revision > current.revision]
            current.until = min(later) if later else None
        logger.debug("beat: database entry %s: revision %d (%s), effective %s", rev.name,
                     rev.revision, rev.action, rev.effective_at.isoformat())

    # -- what runs -------------------------------------------------------------------

    def _install(self, schedule: MutableMapping[str, Any], name: str, step: Step,
                 now: datetime) -> bool:
        """Put in place what runs under *name* from *step* on; True when the schedule
        changed."""
        if step.revision and self._installed.get(name) == step.revision and name in schedule:
            return False  # in place already
        code = self.code.get(name)
        decision = decide(name, code, step.row, self.settings.db_override_policy,
                          self._digests)
        current = schedule.get(name)
        entry: Any = None
        problem = decision.problem
        if decision.runs == DATABASE and step.row is not None:
            try:
                entry = self._live_entry(name, step, current, now)
            except ConfigurationError as exc:
                problem = (f"database entry {name!r} (revision {step.revision}) is left out "
                           f"(it never runs until fixed): {exc}")
                entry = None
        elif decision.runs == CODE and code is not None:
            if current is not None and not isinstance(current, LiveEntry):
                self._report(name, problem)
                self._installed[name] = 0
                return False  # the code entry runs already
            entry = self._code_entry(name, code, step, current, now)
        self._report(name, problem)
        if entry is None and current is None:
            self._installed.pop(name, None)
            return False
        _swap(schedule, name, entry)
        self._installed[name] = step.revision if isinstance(entry, LiveEntry) else 0
        if entry is not None:
            self._catch_late(entry, step.effective, now)
        return True

    def _catch_late(self, entry: Any, effective: datetime, now: datetime) -> None:
        """The slots of *entry* from its effective time (or this node's start) until
        *now*, but the latest (its first tick claims that one): heard of late, they are
        not missed, and are claimed as any slot (an edit loses no run). Only as far back
        as a node may take to hear of a change (:data:`LATE_HORIZON`, or three polls):
        older ones were missed (the database was out of reach), and the entry's catch-up
        policy is theirs."""
        if not is_slotted(entry.schedule):
            return
        horizon = max(LATE_HORIZON, timedelta(seconds=3 * self.settings.db_entries_poll))
        since = max(effective, self._started or effective, now - horizon)
        if since >= now:
            return
        try:
            found = recent_slots(entry.name, entry.schedule, now, since, MAX_MISSED)
        except Exception:  # a schedule that cannot name its slots: its tick says why
            return
        if len(found) > 1:
            self._late(entry.name, sorted(found[1:]))

    def _live_entry(self, name: str, step: Step, current: Any, now: datetime) -> LiveEntry:
        row = step.row
        assert row is not None
        built = check_definition(name, row.definition, self.settings, self.app)
        later = [s.effective for s in self._steps.get(name, ()) if s.revision > row.revision]
        return LiveEntry(name=name, task=built.task, schedule=built.schedule,
                         args=list(row.definition.args), kwargs=dict(row.definition.kwargs),
                         options=dict(row.definition.options), app=self.app,
                         last_run_at=self._last_run(built.schedule, row.effective_at,
                                                    row.restart, current),
                         revision=row.revision, cluster=self.cluster,
                         effective_at=row.effective_at, until=min(later) if later else None,
                         restart=row.restart)

    def _code_entry(self, name: str, code: ScheduleEntry, step: Step, current: Any,
                    now: datetime) -> ScheduleEntry:
        """The code entry again (an override removed), from the step's effective time."""
        fields = dict(code)
        fields["last_run_at"] = self._last_run(code.schedule, step.effective, False, current)
        return code.__class__(**fields)

    def _last_run(self, sched: Any, effective: datetime, restart: bool,
                  current: Any) -> datetime:
        """The last run an entry put in place at *effective* counts from: for an
        interval, the point of its rhythm before (or with *restart*, the effective time
        itself); for a slotted schedule, just before the effective time, so that its
        first slot is the first at or after it. Never before this node started (earlier
        slots are the catch-up's, by their policy)."""
        started = self._started or effective
        if isinstance(sched, interval_schedule):
            previous = getattr(current, "last_run_at", None)
            if previous is not None and isinstance(getattr(current, "schedule", None),
                                                   interval_schedule):
                return phase_anchor(as_utc(previous), sched.run_every, effective, restart)
            return max(effective, started)
        return max(effective - _TICK, started)

    def _report(self, name: str, problem: str | None) -> None:
        held = self.problems.get(name)
        if problem == held:
            return
        if problem is None:
            self.problems.pop(name, None)
            logger.info("beat: database entry %s: resolved", name,
                        extra={"action": "live-entry-resolved", "job": name})
            return
        self.problems[name] = problem
        logger.warning("beat: %s", problem, extra={"action": "live-entry-problem", "job": name,
                                                   "node": self.settings.node})

    def code_digest(self, name: str) -> str | None:
        code = self.code.get(name)
        return None if code is None else self._digests.get(name) or code_digest(name, code)


def _names(revisions: list[EntryRevision], most: int = 5) -> str:
    """``report (edit), nightly (remove)``, the first *most*, then how many more."""
    shown = ", ".join(f"{r.name} ({r.action})" for r in revisions[:most])
    return shown + (f" and {len(revisions) - most} more" if len(revisions) > most else "")


def _swap(schedule: MutableMapping[str, Any], name: str, entry: Any) -> None:
    if isinstance(schedule, WatchedSchedule):
        schedule.swap(name, entry)
    elif entry is None:
        schedule.pop(name, None)
    else:
        schedule[name] = entry

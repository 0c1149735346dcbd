"""Node heartbeats, drift and skew alarms, and the cluster-wide purge.

Run from the scheduler's tick on monotonic timers; every failure is logged and
never breaks the tick.

* **Heartbeat** (every ``elarion_beat_heartbeat_interval``): upsert this node's
  row (version, schedule fingerprint, entry digests, outcome counts; last seen on
  the database clock) and read every node's row.
* **Drift alarm**: a live node (seen within ``elarion_beat_node_timeout``) with
  another fingerprint is named in a WARNING with the differing entries, and an
  ``elarion-drift`` event is sent. Repeated while it lasts, every 10 heartbeats.
  The fingerprint covers the code entries: nodes that differ run different code (a
  deploy in progress). With database entries, a live node that holds an older
  version of them than this node for longer than it takes to hear of a change is
  named in a WARNING of its own (``action=entries-behind``): it has not caught up
  with the database schedule.
* **Skew measurement and alarm**: the node's own clock against the database clock,
  read in a round trip of its own right after the heartbeat (so only that one short
  statement's time is corrected for, by half). The measurement corrects the node's
  :class:`~..schedules.clock.ClusterClock` (:mod:`.clock_fence`): the node decides and
  sends on the database clock. Beyond ``elarion_beat_max_clock_skew`` a WARNING: the
  node is corrected, but an operator should fix its time sync.
* **Heartbeat event**: each heartbeat, failed or not, sends ``elarion-heartbeat``
  (node, the skew it measured or null), so monitors see a node that is alive but has
  nothing due, and its skew; :meth:`Maintenance.stopping` sends the last one.
* **Expiry**: each heartbeat deletes the rows of nodes not seen for
  ``elarion_beat_node_retention`` and reads only the nodes seen within
  ``elarion_beat_node_timeout`` (a dead pod's row costs nothing after that).
* **Purge** (every ``elarion_beat_purge_interval``): see :mod:`.purge`; the
  cluster purges once per interval. A pass that outlasts
  ``elarion_beat_purge_budget`` goes on at the next ticks, a budget per tick.
* **Partitions** (partitioned layout): with each heartbeat, the claims table's
  day partitions are made ahead, once per day (the store remembers the day).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from ..config.parsers import format_duration
from ..config.settings import Settings
from ..exceptions import StoreError
from ..observe.events import DRIFT, HEARTBEAT, EventSender
from ..observe.fingerprint import drift_from, entry_digests, fingerprint
from ..observe.outcome import Recorder
from ..schedules.clock import Clock, ClusterClock
from ..store.interface import ClaimStore
from ..store.records import NodeState, PurgeProgress
from .clock_fence import measure_offset, signed
from .purge import PURGE_JOB, continue_purge, purge_if_elected
from .watched_schedule import ScheduleMemo

__all__ = ["PURGE_JOB", "Maintenance"]  # PURGE_JOB: re-exported from .purge

logger = logging.getLogger(__name__)

_REPEAT_EVERY = 10
#: The share of the heartbeat interval a heartbeat may come early.
_EARLY = 0.2
#: Differing entries named in one drift WARNING; ``status`` lists them all.
DRIFT_NAMED = 10


def package_version() -> str:
    from .. import __version__

    return __version__


class Maintenance:
    """The periodic housekeeping of one beat node."""

    def __init__(self, settings: Settings, store: ClaimStore, recorder: Recorder, clock: Clock,
                 entries: Callable[[], Mapping[str, Any]], events: EventSender | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 entries_version: Callable[[], int | None] = lambda: None) -> None:
        self.settings = settings
        #: the version of the database entries this node runs (None: it runs none)
        self.entries_version = entries_version
        self.store = store
        self.recorder = recorder
        self.clock = clock
        self.entries = entries
        self.events = events
        self.monotonic = monotonic
        self.boot_id = str(uuid.uuid4())
        self._digests: ScheduleMemo[dict[str, str]] = ScheduleMemo(entry_digests)
        self.skew: float | None = None
        self.drift: dict[str, list[str]] = {}
        #: names of the nodes seen alive at the last heartbeat, sorted (this one included)
        self.live_nodes: list[str] = []
        self._next_heartbeat = 0.0
        self._next_purge = 0.0
        #: the purge pass this node won and has not finished (its budget ran out)
        self._purging: PurgeProgress | None = None
        self._heartbeats = 0
        #: the heartbeat whose skew ``skew`` is
        self._skew_of = 0
        #: live nodes holding an older version of the database entries: since when
        self._behind: dict[str, tuple[int | None, datetime]] = {}
        self.behind: list[str] = []
        self._skewed = False

    def run(self) -> None:
        """Do whatever is due now."""
        now = self.monotonic()
        # a tick that comes a little early still beats: waiting for the next tick
        # would stretch the interval by up to one tick
        if now >= self._next_heartbeat - self.settings.heartbeat_interval * _EARLY:
            self._next_heartbeat = now + self.settings.heartbeat_interval
            before = self._heartbeats
            self._guard("heartbeat", self.heartbeat)
            self._announce(measured=self._skew_of > before)
            self._guard("partitions", self.partitions)
        if self._purging is not None:  # the pass goes on, a budget per tick
            self._guard("purge", self.purge)
        elif now >= self._next_purge:
            self._next_purge = now + self.settings.purge_interval
            self._guard("purge", self.purge)

    @property
    def heartbeats(self) -> int:
        """Heartbeats that reached the store since start."""
        return self._heartbeats

    def purge(self) -> int | None:
        """Purge if this node wins this interval's election, or carry on with the pass
        it won (a stretch within ``elarion_beat_purge_budget``); rows deleted by this
        stretch, or None when another node purges. A failed stretch ends the pass
        (the next interval elects again)."""
        progress, self._purging = self._purging, None
        if progress is None:
            step = purge_if_elected(self.settings, self.store, monotonic=self.monotonic)
        else:
            step = continue_purge(self.settings, self.store, progress, monotonic=self.monotonic)
        if step is None:
            return None
        self._purging = None if step.done else step
        return step.deleted

    @property
    def purging(self) -> bool:
        """Whether a purge pass this node won is still going on."""
        return self._purging is not None

    def partitions(self) -> list[str]:
        """Create the claims table's day partitions the coming days need (partitioned
        layout; a no-op on a day they were made already)."""
        return self.store.ensure_partitions(self.clock())

    def _guard(self, what: str, step: Callable[[], object]) -> None:
        try:
            step()
        except StoreError as exc:
            logger.warning("beat: %s skipped, the claims database failed: %s", what, exc)
        except Exception:
            logger.exception("beat: %s failed", what)

    # -- heartbeat -----------------------------------------------------------

    def state(self) -> NodeState:
        digests = self._digests.get(self.entries())  # worked out again after an edit
        return NodeState(node=self.settings.node, boot_id=self.boot_id,
                         version=package_version(), fingerprint=fingerprint(digests),
                         entries=digests, counts=dict(self.recorder.counts),
                         host=socket.gethostname(), pid=os.getpid(),
                         entries_version=self.entries_version())

    def heartbeat(self) -> None:
        state = self.state()
        timeout = timedelta(seconds=self.settings.node_timeout)
        db_now, nodes = self.store.heartbeat(
            state, retention=timedelta(seconds=self.settings.node_retention),
            live_within=timeout)
        self._heartbeats += 1
        self.live_nodes = sorted(n.node for n in nodes if n.is_live(db_now, timeout))
        self._check_drift(state, db_now, nodes)
        self._check_behind(state, db_now, [n for n in nodes if n.is_live(db_now, timeout)])
        cluster = self.clock if isinstance(self.clock, ClusterClock) else None
        skew, trip = measure_offset(self.store, cluster.raw if cluster else self.clock,
                                    self.monotonic)
        if cluster is not None:
            cluster.measured(skew, trip)
        self._check_skew(skew)

    def _announce(self, measured: bool) -> None:
        """The ``elarion-heartbeat`` event: this node is alive (whether or not the
        database answered), with the skew this heartbeat measured, else null."""
        if self.events is not None:
            skew = round(self.skew, 6) if measured and self.skew is not None else None
            self.events.send(HEARTBEAT, node=self.settings.node, skew=skew)

    def stopping(self) -> None:
        """The last ``elarion-heartbeat`` event, ``stopping: true``: the node stops
        cleanly (a rollout), so monitors do not wait for it as for a node gone silent."""
        if self.events is not None:
            self.events.end_tick(force=True)  # the outcomes held back go before it
            self.events.send(HEARTBEAT, node=self.settings.node, skew=None, stopping=True)

    def _check_skew(self, skew: float) -> None:
        """*skew*: this node's own clock minus the database clock (s), just measured."""
        self.skew = skew
        self._skew_of = self._heartbeats
        limit = self.settings.max_clock_skew
        if abs(skew) > limit:
            if not self._skewed or self._heartbeats % _REPEAT_EVERY == 0:
                logger.warning("beat: clock skew: this node's clock is %s off the database "
                               "clock (limit elarion_beat_max_clock_skew = %s); %s, but fix "
                               "its time sync", signed(skew), format_duration(limit),
                               "the node decides and sends on the database clock"
                               if self.settings.clock == "database" else
                               "exact slots are unaffected (elarion_beat_clock = node: a "
                               "node ahead sends early)",
                               extra={"action": "clock-skew", "skew": skew})
            self._skewed = True
        elif self._skewed:
            logger.info("beat: clock skew back within %s (%s)", format_duration(limit),
                        signed(skew))
            self._skewed = False

    def _check_drift(self, mine: NodeState, db_now: datetime, nodes: list[NodeState]) -> None:
        timeout = timedelta(seconds=self.settings.node_timeout)
        drift = drift_from(mine, [n for n in nodes if n.is_live(db_now, timeout)])
        changed = drift != self.drift
        self.drift = drift
        if not drift:
            if changed:
                logger.info("beat: schedule drift resolved: every live node runs the same schedule")
            return
        if changed or self._heartbeats % _REPEAT_EVERY == 0:
            for node, entries in sorted(drift.items()):
                logger.warning("beat: schedule drift: node %s runs different code entries "
                               "than this node (%s: a deploy in progress?); differing "
                               "entries: %s", node, mine.node,
                               named_entries(entries),
                               extra={"action": "schedule-drift", "other": node,
                                      "differing": len(entries)})
            if self.events is not None:
                self.events.send(DRIFT, node=mine.node, fingerprint=mine.fingerprint,
                                 differing={node: entries[:DRIFT_NAMED]
                                            for node, entries in drift.items()},
                                 differing_counts={node: len(entries)
                                                   for node, entries in drift.items()})


    def _check_behind(self, mine: NodeState, db_now: datetime,
                      live: list[NodeState]) -> None:
        """Warn of the live nodes whose database entries stay behind this node's."""
        if mine.entries_version is None:
            return
        hear = timedelta(seconds=self.settings.db_entries_poll
                         + self.settings.heartbeat_interval + 1)
        lagging = {n.node: n.entries_version for n in live if n.node != mine.node
                   and (n.entries_version or 0) < mine.entries_version}
        for node in set(self._behind) - set(lagging):
            del self._behind[node]
            if node in self.behind:
                self.behind.remove(node)
                logger.info("beat: node %s caught up with the database entries", node,
                            extra={"action": "entries-caught-up", "other": node})
        for node, held in lagging.items():
            since = self._behind.setdefault(node, (held, db_now))[1]
            if db_now - since >= hear and node not in self.behind:
                self.behind.append(node)
                logger.warning("beat: node %s has not caught up with the database entries: "
                               "it runs version %s, this node %d (not a deploy: the nodes "
                               "read the entries table; is its database connection or "
                               "LISTEN healthy?)", node, held, mine.entries_version,
                               extra={"action": "entries-behind", "other": node,
                                      "held": held, "version": mine.entries_version})


def named_entries(entries: list[str], most: int = DRIFT_NAMED) -> str:
    """The first *most* entries, then how many more (``celery elarion-beat status`` lists
    them all)."""
    if not entries:
        return "(options only)"
    shown = ", ".join(entries[:most])
    if len(entries) > most:
        shown += f" and {len(entries) - most} more (see `celery elarion-beat status`)"
    return shown


"""Celery events from beat: every claim outcome, and schedule drift.

Events go out through Celery's own event exchange, so ``celery -A proj events
--dump`` and Flower receive them, from the hostname ``beat@<node>``:

* ``elarion-dispatched``: job, task, task_id, occurrence, node, placement, claim;
* ``elarion-skipped``: job, task, occurrence, node, placement, claim, reason, winner;
* ``elarion-drift``: node, fingerprint, differing (per other node, the entries);
* ``elarion-heartbeat``: node, skew (this node's clock minus the database clock, in
  seconds, as this heartbeat measured it; null when the heartbeat failed), one per
  ``elarion_beat_heartbeat_interval``; the last one a node sends when it stops cleanly
  carries ``stopping: true`` (monitors then stop waiting for it);
* ``elarion-orphaned``: job, occurrence, node, holder, task_id, claim, state,
  publish_error, age, takeovers, delivery, action (``reported`` or ``taken-over``);
* ``elarion-run``, from the workers (:mod:`celery_elarion_beat.worker.runs`), from the hostname
  ``worker@<node>``: job, occurrence, task_id, node (the beat node that sent it),
  worker, placement, state (``running``, ``succeeded``, ``failed``, ``retried``),
  runtime (seconds, once finished), exception (its type, when it failed);
* ``elarion-one-off``: node, count, published and failed (each a mapping task name ->
  how many of the batch's one-offs of that task were published or failed), failed_ids
  (the ids of at most :data:`~..one_offs.runner.FAILED_IDS` failed ones; the error of each
  is in its row: ``elarion-beat one-offs show ID``), one per batch of durable one-offs a
  node leased (:mod:`..one_offs.runner`). It carries counts, not ids: a batch of 500
  published one-offs is a small event, and monitors need no more (Flower's One-offs card
  reads the rows).
* ``elarion-foreign-beat``, from the workers (:mod:`celery_elarion_beat.worker.foreign_beats`),
  from the hostname ``worker@<node>``: origin (the sender, ``gen<pid>@<host>``), host,
  task_name, entry (the app's entry with that task, or null), count (messages of that
  sender and task since the worker's last event of it), worker. A beat that claims
  nothing sent them (Celery's stock scheduler beside the claiming beats): each of its
  occurrences is sent twice.

Every event carries ``cluster``: the app it is of (``elarion_beat_cluster``), so a
monitor of several apps on one broker tells them apart (the items of a batch take
their batch's). Dispatched events carry ``lateness``: seconds from the slot to the
broker accepting the message (exact slots only).

Dispatched and skipped events carry ``catch_up: true`` for a replayed missed slot
and ``takeover`` (a count) for an orphan published by a node that took it over.
A run an operator triggered (``elarion-beat trigger``) is an ``elarion-dispatched``
event with ``manual: true`` and claim ``manual``, from ``elarion-control@<node>``,
whose ``node`` is the operator (user@host). A jittered slot's dispatched event
carries ``jitter``: its delay, in seconds. A skip's ``reason`` may be ``paused``.

**Batches.** Beat sends its dispatched and skipped outcomes in ``elarion-batch``
events: node, count, and ``items``, the events of one tick, each a dict with its
``type`` (``elarion-dispatched`` or ``elarion-skipped``) and the fields above; at
most ``elarion_beat_event_batch`` items per event (a bigger tick is split). So a
tick costs one event per node, not one per occurrence and node; a batch of skips only
waits for more for up to ``SKIP_HOLD`` seconds (beat wakes to send it), so a node
that loses many small ticks sends one event per few seconds. :func:`expand`
turns a batch back into the events it carries (the Flower page and the metrics
read them through it); ``elarion_beat_event_batch = 0`` sends one event per
outcome instead, as 0.1 did.

Task arguments are never sent. The tick only puts events on a bounded queue; a
thread of their own publishes them, so the broker's speed never slows the tick. The
thread starts with the first event, stops at :meth:`EventSender.close`, and holds its
sender weakly: a sender nobody holds any more (a scheduler dropped unclosed) ends it.
Events are not buffered while the broker is away (memory stays flat): a failed
send drops the event, and for ``backoff`` seconds afterwards events are dropped
without trying, so a dead broker costs one connect timeout per backoff at most.
A send never raises into the tick.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from ..config.parsers import format_duration
from ..schedules.slots import iso
from ..store.states import MANUAL_KIND
from .outcome import Outcome, Record

__all__ = ["BATCH", "DISPATCHED", "DRIFT", "EVENT_TYPES", "FOREIGN_BEAT", "HEARTBEAT",
           "ONE_OFF", "ORPHANED", "RUN", "SKIPPED", "EventSender", "event_text", "event_time",
           "expand", "is_elarion", "record_fields"]

logger = logging.getLogger(__name__)

#: The event types beat sends; monitors (metrics, the Flower page) import these.
DISPATCHED = "elarion-dispatched"
SKIPPED = "elarion-skipped"
DRIFT = "elarion-drift"
ORPHANED = "elarion-orphaned"
RUN = "elarion-run"
HEARTBEAT = "elarion-heartbeat"
#: The outcomes of one batch of durable one-offs of one node (:mod:`..one_offs.runner`).
ONE_OFF = "elarion-one-off"
#: The outcomes of one tick of one node (``items``); see :func:`expand`.
BATCH = "elarion-batch"
#: Messages of a beat that claims nothing, as a worker saw them (``count`` of them).
FOREIGN_BEAT = "elarion-foreign-beat"
EVENT_TYPES = (DISPATCHED, SKIPPED, DRIFT, ORPHANED, RUN, BATCH, HEARTBEAT, ONE_OFF,
               FOREIGN_BEAT)
#: Seconds a batch of skips alone may wait for more (a batch with a dispatch goes at once).
SKIP_HOLD = 5.0
#: The item types a batch may carry; anything else in ``items`` is ignored.
_BATCHED = (DISPATCHED, SKIPPED)
#: The fields of a batch event its items inherit (who sent it, of which app, and when).
_INHERITED = ("hostname", "cluster", "timestamp", "local_received", "utcoffset", "pid",
              "clock")


def is_elarion(event: Mapping[str, Any]) -> bool:
    """Whether a received event is one of beat's (monitor side)."""
    return event.get("type") in EVENT_TYPES


def expand(event: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The events *event* stands for: the items of an ``elarion-batch`` (each with the
    batch's sender, times and node unless it names its own), else *event* itself.
    Malformed items are left out; a monitor never raises on one."""
    if event.get("type") != BATCH:
        return [event]
    items = event.get("items")
    if not isinstance(items, (list, tuple)):
        return []
    common = {key: event[key] for key in _INHERITED if key in event}
    if event.get("node") is not None:
        common["node"] = event["node"]
    return [{**common, **item} for item in items
            if isinstance(item, Mapping) and item.get("type") in _BATCHED]


def event_text(value: Any) -> str:
    """An event field as a label: ``""`` for a missing one."""
    return "" if value is None else str(value)


def event_time(event: Mapping[str, Any]) -> float:
    """When the monitor received *event* (its own clock), else when it was sent."""
    for key in ("local_received", "timestamp"):
        value = event.get(key)
        if isinstance(value, (int, float)):
            return float(value)
    return time.time()


def record_fields(record: Record) -> dict[str, Any]:
    """The event fields of an outcome record (never arguments)."""
    fields: dict[str, Any] = {
        "job": record.job,
        "task_name": record.task,
        "occurrence": iso(record.occurrence) if record.occurrence else None,
        "node": record.node,
        "placement": record.placement.value,
        "claim": MANUAL_KIND if record.manual else record.kind.value if record.kind else None,
    }
    if record.catch_up:
        fields["catch_up"] = True
    if record.takeover:
        fields["takeover"] = record.takeover
    if record.manual:
        fields["manual"] = True
    if record.jitter is not None:
        fields["jitter"] = round(record.jitter, 3)
    if record.outcome is Outcome.DISPATCHED:
        fields["task_id"] = record.task_id
        if record.lateness is not None:
            fields["lateness"] = round(record.lateness, 6)
    else:
        fields["reason"] = record.reason.value if record.reason else None
        fields["winner"] = record.winner
    return fields


class EventSender:
    """Sends beat's events from a thread of its own; safe to call from the tick.

    ``send`` only puts the event on a bounded queue (``maxsize``): the tick never
    waits for the broker. While the broker is away (a send failed less than
    ``backoff`` seconds ago) or the queue is full, events are dropped and counted
    (a batch counts as its items, a one-off event as its ``count``; the queue bound
    counts messages: a batch or a one-off event is one).

    With *batch* above 0, outcomes (:meth:`on_record`) are gathered and go out as
    ``elarion-batch`` events of at most *batch* items: when that many are waiting,
    and at :meth:`end_tick` (the scheduler calls it after each tick) or :meth:`close`.
    """

    def __init__(self, app: Any, node: str, enabled: bool = True, backoff: float = 30.0,
                 maxsize: int = 10_000, hostname: str | None = None, batch: int = 0,
                 cluster: str | None = None) -> None:
        self.app = app
        self.node = node
        #: the ``cluster`` field of every event (None: none, as before clusters)
        self.cluster = cluster
        self.batch = batch
        self._pending: list[dict[str, Any]] = []
        self._pending_since = 0.0
        self.hostname = hostname or f"beat@{node}"
        self.enabled = enabled
        self.backoff = backoff
        self.sent = 0
        self.dropped = 0
        #: event messages the broker accepted (a batch is one)
        self.messages = 0
        self._queue: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue(maxsize)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._dispatcher: Any = None
        self._connection: Any = None
        #: closes the connection of a sender dropped unclosed
        self._closer: weakref.finalize[Any, Any] | None = None
        self._quiet_until = 0.0

    def on_record(self, record: Record) -> None:
        """Recorder listener: one event per outcome, or one item of the next batch."""
        kind = DISPATCHED if record.outcome is Outcome.DISPATCHED else SKIPPED
        if self.batch <= 0:
            self.send(kind, **record_fields(record))
            return
        if not self.enabled:
            return
        item = record_fields(record)
        item["type"] = kind
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append(item)
        if len(self._pending) >= self.batch:
            self.end_tick(force=True)

    def end_tick(self, force: bool = False) -> None:
        """Send the outcomes gathered so far, as one batch event (or a few, at most
        ``batch`` items each). Skips alone wait up to :data:`SKIP_HOLD` seconds (the
        node that won sends its batch at once): a node that only lost small ticks
        sends one event per few seconds, not one per tick."""
        pending = self._pending
        if not pending:
            return
        if not force and len(pending) < self.batch \
                and time.monotonic() - self._pending_since < SKIP_HOLD \
                and all(item["type"] == SKIPPED for item in pending):
            return
        self._pending = []
        for start in range(0, len(pending), max(1, self.batch)):
            items = pending[start:start + max(1, self.batch)]
            self.send(BATCH, node=self.node, count=len(items), items=items)

    def held_for(self) -> float | None:
        """Seconds until the skips held back must go out (0 when overdue), or None when
        nothing is held: beat wakes by then, however far its next entry is."""
        if not self._pending:
            return None
        return max(0.0, self._pending_since + SKIP_HOLD - time.monotonic())

    def send(self, type_: str, **fields: Any) -> bool:
        """Queue one event; False when it was dropped (disabled, broker away, full)."""
        if not self.enabled:
            return False
        if self.cluster is not None:
            fields.setdefault("cluster", self.cluster)
        if time.monotonic() < self._quiet_until:
            self.dropped += _weight(type_, fields)
            return False
        self._start()
        try:
            self._queue.put_nowait((type_, fields))
        except queue.Full:
            self.dropped += _weight(type_, fields)
            return False
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued event was sent or dropped (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    # the thread holds the sender weakly, and ends with it
                    self._thread = threading.Thread(
                        target=_publish_queued, args=(weakref.ref(self), self._queue),
                        daemon=True, name="elarion-events")
                    self._thread.start()
                    weakref.finalize(self, _stop, self._queue).atexit = False

    def _deliver(self, type_: str, fields: dict[str, Any]) -> None:
        if time.monotonic() < self._quiet_until:
            self.dropped += _weight(type_, fields)
            return
        try:
            self._send(type_, fields)
        except Exception as exc:
            self.dropped += _weight(type_, fields)
            self._quiet_until = time.monotonic() + self.backoff
            self._reset()
            logger.warning("beat: could not send %s events (dropping them for %s): %s",
                           type_, format_duration(self.backoff), exc,
                           extra={"action": "events-dropped", "event": type_,
                                  "backoff": self.backoff})
            return
        self.sent += _weight(type_, fields)
        self.messages += 1

    def _send(self, type_: str, fields: dict[str, Any]) -> None:
        """Send on the open connection; if that fails, once more on a fresh one: a
        connection that broke while idle (the broker restarted since) says nothing
        about the broker now."""
        idle = self._dispatcher is not None
        try:
            self._ensure().send(type_, **fields)
        except Exception:
            if not idle:
                raise
            self._reset()
            self._ensure().send(type_, **fields)

    def _ensure(self) -> Any:
        if self._dispatcher is None:
            self._connection = self.app.connection_for_write()
            self._closer = weakref.finalize(self, _close_quietly, self._connection)
            self._closer.atexit = False
            self._connection.ensure_connection(max_retries=1)
            self._dispatcher = self.app.events.Dispatcher(
                self._connection, hostname=self.hostname, enabled=True,
                buffer_while_offline=False)
        return self._dispatcher

    def _reset(self) -> None:
        if self._closer is not None:
            self._closer.detach()
        for closing in (self._dispatcher, self._connection):
            _close_quietly(closing)
        self._dispatcher = self._connection = self._closer = None

    def close(self, timeout: float = 2.0) -> None:
        """Send what is gathered and queued (for up to *timeout* seconds), then stop."""
        self.end_tick(force=True)
        thread = self._thread
        if thread is not None:
            self.flush(timeout)
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
            thread.join(timeout)
        self._reset()


def _publish_queued(sender: weakref.ref[EventSender],
                    waiting: queue.Queue[tuple[str, dict[str, Any]] | None]) -> None:
    """A sender's thread: publish what is queued until ``None``, or until the sender is
    gone (its events go with it)."""
    while True:
        item = waiting.get()
        try:
            publisher = sender()
            if item is None or publisher is None:
                return
            publisher._deliver(*item)
            del publisher
        finally:
            waiting.task_done()


def _stop(waiting: queue.Queue[tuple[str, dict[str, Any]] | None]) -> None:
    """Stop the thread of a sender that is gone (a full queue: the thread is busy, and
    ends at its next event, finding its sender gone)."""
    try:
        waiting.put_nowait(None)
    except queue.Full:
        pass


def _close_quietly(closing: Any) -> None:
    try:
        if closing is not None:
            closing.close()
    except Exception:  # the connection is already broken
        pass


def _weight(type_: str, fields: Mapping[str, Any]) -> int:
    """How many outcomes an event carries: a batch its items, a one-off or foreign-beat
    event its ``count``, any other event one."""
    if type_ == BATCH:
        return len(fields.get("items") or ())
    count = fields.get("count") if type_ in (ONE_OFF, FOREIGN_BEAT) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1

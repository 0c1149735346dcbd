"""Celery events from beat: every claim outcome, and schedule drift.

Events go out through Celery's own event exchange, so ``celery -A proj events
--dump`` and Flower receive them, from the hostname ``beat@<node>``:

* ``elarion-dispatched``: job, task, task_id, occurrence, node, placement, claim;
* ``elarion-skipped``: job, task, occurrence, node, placement, claim, reason, winner;
* ``elarion-drift``: node, fingerprint, differing (per other node, the entries).

Task arguments are never sent. Events are not buffered while the broker is away
(memory stays flat): a failed send drops the event, and for ``backoff`` seconds
afterwards events are dropped without trying, so a dead broker costs one
connect timeout per backoff at most. A send never raises into the tick.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from .outcome import Outcome, Record
from .slots import iso

__all__ = ["EventSender", "record_fields"]

logger = logging.getLogger(__name__)


def record_fields(record: Record) -> dict[str, Any]:
    """The event fields of an outcome record (never arguments)."""
    fields: dict[str, Any] = {
        "job": record.job,
        "task_name": record.task,
        "occurrence": iso(record.occurrence) if record.occurrence else None,
        "node": record.node,
        "placement": record.placement.value,
        "claim": record.kind.value if record.kind else None,
    }
    if record.outcome is Outcome.DISPATCHED:
        fields["task_id"] = record.task_id
    else:
        fields["reason"] = record.reason.value if record.reason else None
        fields["winner"] = record.winner
    return fields


class EventSender:
    """Sends beat's events; safe to call from the tick."""

    def __init__(self, app: Any, node: str, enabled: bool = True, backoff: float = 30.0) -> None:
        self.app = app
        self.hostname = f"beat@{node}"
        self.enabled = enabled
        self.backoff = backoff
        self.sent = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._dispatcher: Any = None
        self._connection: Any = None
        self._quiet_until = 0.0

    def on_record(self, record: Record) -> None:
        """Recorder listener: one event per outcome."""
        kind = "elarion-dispatched" if record.outcome is Outcome.DISPATCHED else "elarion-skipped"
        self.send(kind, **record_fields(record))

    def send(self, type_: str, **fields: Any) -> bool:
        if not self.enabled:
            return False
        with self._lock:
            if time.monotonic() < self._quiet_until:
                self.dropped += 1
                return False
            try:
                self._ensure().send(type_, **fields)
            except Exception as exc:
                self.dropped += 1
                self._quiet_until = time.monotonic() + self.backoff
                self._reset()
                logger.warning("beat: could not send %s events (dropping them for %gs): %s",
                               type_, self.backoff, exc)
                return False
            self.sent += 1
            return True

    def _ensure(self) -> Any:
        if self._dispatcher is None:
            self._connection = self.app.connection_for_write()
            self._connection.ensure_connection(max_retries=1)
            self._dispatcher = self.app.events.Dispatcher(
                self._connection, hostname=self.hostname, enabled=True,
                buffer_while_offline=False)
        return self._dispatcher

    def _reset(self) -> None:
        for closing in (self._dispatcher, self._connection):
            try:
                if closing is not None:
                    closing.close()
            except Exception:  # the connection is already broken
                pass
        self._dispatcher = self._connection = None

    def close(self) -> None:
        with self._lock:
            self._reset()

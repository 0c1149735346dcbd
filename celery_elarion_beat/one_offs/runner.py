"""Beat's side of the durable one-offs (:mod:`.api`): lease, publish, record.

Called at every wake of :class:`~..beat.scheduler.ClaimingScheduler` (after the tick's
entries), it decides whether a one-off may be due, without a query when it can:

* PostgreSQL: a NOTIFY arrived on the listener (polled without blocking), or the
  earliest due time it last read has come;
* other databases, or while the listener is down: it reads the earliest due time
  (one cheap indexed query per wake);
* and, whatever it thinks, once per ``elarion_beat_heartbeat_interval`` (a missed
  notification, an expired lease).

Then it leases batches of ``elarion_beat_one_offs_batch`` (one statement each) until
fewer come back or :data:`BUDGET` seconds are spent, publishes each one-off with
``app.send_task(task, args, kwargs, task_id=<the one-off's id>, **options)`` and the
``elarion_one_off`` and ``elarion_node`` headers, records the batch's outcomes
in one call, and sends one ``elarion-one-off`` event (:data:`~..observe.events.ONE_OFF`: counts
per task, the first :data:`FAILED_IDS` failed ids). A task the app does not know is
recorded ``failed`` with one ERROR line; the others go on. When the broker is down
the rest of the batch is released (sent at a later wake). A database outage is left
to the claims' outage reports: the runner asks again once per heartbeat interval,
quietly, and at the next wake once the claims reach the database again. A database
that refuses the one-offs (a role without their grants, docs/howto/database-role.md)
gets one WARNING and is asked again once per heartbeat interval (grants take effect
without a restart).

Beat sleeps at most ``elarion_beat_one_offs_poll`` seconds while one-offs are on:
the pick-up delay of a one-off due now. (The memory store is one process's alone:
there beat sleeps until its next one-off is due, and sees one scheduled meanwhile at
its next wake.)
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any

from kombu.exceptions import OperationalError
from kombu.serialization import loads, prepare_accept_content

from ..config.headers import HEADER_NODE
from ..config.settings import Settings
from ..exceptions import SchemaMissing, StoreError, StoreRefused
from ..observe.events import ONE_OFF, EventSender
from ..schedules.clock import Clock
from ..store.interface import ClaimStore, OneOffWakeups
from ..store.one_off_records import LeasedOneOff

__all__ = ["BUDGET", "FAILED_IDS", "HEADER_ONE_OFF", "OneOffRunner"]

logger = logging.getLogger(__name__)

#: The header naming the one-off a message sends (its id, also the task id).
HEADER_ONE_OFF = "elarion_one_off"
#: The most failed ids an ``elarion-one-off`` event (:data:`~..observe.events.ONE_OFF`) names.
FAILED_IDS = 20
#: Seconds of one wake the runner may spend leasing and publishing.
BUDGET = 1.0


class OneOffRunner:
    """Leases and publishes the due one-offs of one beat node."""

    def __init__(self, app: Any, settings: Settings, store: Callable[[], ClaimStore],
                 clock: Clock, skew: Callable[[], float] = lambda: 0.0,
                 events: EventSender | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 guard: Callable[[], AbstractContextManager[Any]] = nullcontext) -> None:
        self.app = app
        #: held around each lease, its publish and its record: the scheduler passes
        #: its SIGTERM guard (:func:`celery_elarion_beat.beat.signals.deferred_signals`),
        #: so a lease is published and recorded, or not taken
        self._guard = guard
        self.settings = settings
        self._store = store
        self._clock = clock
        self._skew = skew
        self.events = events
        self._monotonic = monotonic
        self._wakeups: OneOffWakeups | None = None
        self._wakeups_made = False
        self._next_due: datetime | None = None
        self._next_safety = 0.0
        self._more = False
        self._imported = False
        self._off_until = 0.0  # monotonic: no one-offs table, look again then
        self._refused = False  # the database refuses the one-offs (a role without grants)
        #: monotonic: the database failed the runner; it asks again then (one probe per
        #: heartbeat interval of an outage, as the pauses: a hung server would otherwise
        #: hold every wake for the claim timeout and delay the every-node entries)
        self._retry_at = 0.0
        #: a test hook (:mod:`..testing.hooks`): called with each leased batch before it
        #: is published
        self.before_publish: Callable[[Sequence[LeasedOneOff]], None] | None = None
        self.published = 0
        self.failed = 0

    def run(self, producer: Any = None, store_failed: bool = False) -> float:
        """Send what is due; the seconds beat may sleep at most (inf: one-offs off).
        *store_failed*: the tick's claims failed, so the database is not asked again."""
        if not self.settings.one_offs:
            return math.inf
        poll = self.settings.one_offs_poll
        if store_failed or self._monotonic() < max(self._off_until, self._retry_at):
            return poll
        try:
            if self._may_be_due():
                self._drain(producer)
                self._next_due = self._store().next_one_off_due()
                self._refused = False  # granted meanwhile: warn again if revoked
        except SchemaMissing as exc:  # elarion_beat_create_table = False, not migrated yet
            if not self._off_until:
                logger.warning("beat: no one-offs are sent until their table exists: %s", exc,
                               extra={"action": "one-offs-missing"})
            self._off_until = self._monotonic() + self.settings.heartbeat_interval
            return poll
        except StoreRefused as exc:  # a least-privilege role without the one-offs grants
            if not self._refused:
                logger.warning("beat: no one-offs are sent, the database refuses them: %s", exc,
                               extra={"action": "one-offs-refused"})
            self._refused = True
            self._off_until = self._monotonic() + self.settings.heartbeat_interval
            return poll
        except StoreError as exc:
            logger.debug("beat: one-offs wait for the claims database: %s", exc)
            self._next_due = None
            self._retry_at = self._monotonic() + self.settings.heartbeat_interval
            return poll
        except Exception:
            logger.exception("beat: the one-offs failed")
            return poll
        if self._more:
            return 0.0
        if not self._store().shared:  # nobody else adds one-offs: sleep until the next
            if self._next_due is None:
                return math.inf
            wait = (self._next_due - self._clock()).total_seconds() + self._skew()
            return wait if wait > 0 else poll
        return poll

    def database_back(self) -> None:
        """The claims reached the database again: ask for one-offs at the next wake."""
        self._retry_at = 0.0

    def close(self) -> None:
        if self._wakeups is not None:
            self._wakeups.close()
            self._wakeups = None

    # -- when -------------------------------------------------------------------

    def _may_be_due(self) -> bool:
        if self._more:
            return True
        if not self._wakeups_made:
            self._wakeups_made = True
            self._wakeups = self._store().one_off_wakeups()
        woke = self._wakeups.poll() if self._wakeups is not None else None
        now = self._monotonic()
        if now >= self._next_safety:
            self._next_safety = now + self.settings.heartbeat_interval
            return True
        if woke:
            return True
        if woke is None:  # no listener (or it is down): ask the table
            self._next_due = self._store().next_one_off_due()
        db_now = self._clock() - timedelta(seconds=self._skew())
        return self._next_due is not None and self._next_due <= db_now

    # -- what ----------------------------------------------------------------------

    def _drain(self, producer: Any) -> None:
        self._more = False
        store, node = self._store(), self.settings.node
        size = self.settings.one_offs_batch
        lease = timedelta(seconds=self.settings.one_offs_lease)
        started = self._monotonic()
        while True:
            with self._guard():  # a lease is published and recorded, or not taken
                batch = store.lease_one_offs(node, limit=size, lease=lease)
                if not batch:
                    return
                if self.before_publish is not None:
                    self.before_publish(batch)
                published, failed, released = self._publish(batch, producer)
                store.finish_one_offs(node, published, failed, released)
            self.published += len(published)
            self.failed += len(failed)
            self._report(batch, published, failed)
            if released or len(batch) < size:
                return
            if self._monotonic() - started >= BUDGET:
                self._more = True  # beat wakes again at once
                return

    def _publish(self, batch: Sequence[LeasedOneOff], producer: Any) -> tuple[
            list[str], dict[str, str], list[str]]:
        published: list[str] = []
        failed: dict[str, str] = {}
        released: list[str] = []
        down: Exception | None = None
        accept = prepare_accept_content(  # type: ignore[no-untyped-call]
            self.app.conf.accept_content)
        for item in batch:
            error = self._refusal(item)
            if error is None:
                try:
                    args, kwargs = _arguments(item, accept)
                except Exception as exc:
                    error = f"its arguments cannot be loaded: {type(exc).__name__}: {exc}"
            if error is not None:
                failed[item.id] = error
                logger.error("beat: one-off %s (%s) failed: %s", item.id, item.task, error,
                             extra={"action": "one-off-failed", "one_off": item.id,
                                    "task": item.task})
                continue
            if down is not None:
                released.append(item.id)
                continue
            options = dict(item.options)
            headers = {**(options.pop("headers", None) or {}), HEADER_ONE_OFF: item.id,
                       HEADER_NODE: self.settings.node}
            try:
                self.app.send_task(item.task, args=args, kwargs=kwargs, task_id=item.id,
                                   producer=producer, headers=headers, **options)
            except OperationalError as exc:
                down = exc
                released.append(item.id)
                logger.warning("beat: one-offs not sent, the broker is unreachable (retried "
                               "at the next wake): %s", exc, extra={"action": "one-off-release"})
            except Exception as exc:
                failed[item.id] = f"publish failed: {type(exc).__name__}: {exc}"
                logger.error("beat: one-off %s (%s) failed: %s", item.id, item.task,
                             failed[item.id], extra={"action": "one-off-failed",
                                                     "one_off": item.id, "task": item.task})
            else:
                published.append(item.id)
                logger.debug("beat: one-off %s (%s) sent", item.id, item.task,
                             extra={"action": "one-off-sent", "one_off": item.id,
                                    "task": item.task, "attempts": item.one_off.attempts})
        return published, failed, released

    def _refusal(self, item: LeasedOneOff) -> str | None:
        """Why *item* cannot be sent by this app, or None."""
        if not self._imported:
            self._imported = True
            try:
                self.app.loader.import_default_modules()
            except Exception:  # beat imported them already, or will say why
                logger.debug("beat: importing the task modules failed", exc_info=True)
        if item.task not in self.app.tasks:
            return f"task {item.task!r} is not registered in app {self.app.main!r}"
        return None

    def _report(self, batch: Sequence[LeasedOneOff], published: list[str],
                failed: dict[str, str]) -> None:
        if published:
            logger.info("beat: sent %d one-off(s)", len(published),
                        extra={"action": "one-offs-sent", "count": len(published)})
        if self.events is not None and (published or failed):
            self.events.send(ONE_OFF, **_event_fields(self.settings.node, batch, published,
                                                      failed))


def _event_fields(node: str, batch: Sequence[LeasedOneOff], published: Sequence[str],
                  failed: Mapping[str, str]) -> dict[str, Any]:
    """The ``elarion-one-off`` event of one batch: counts per task, and the ids of at most
    :data:`FAILED_IDS` failed one-offs. Never their errors (exception text; the row has
    it) nor the published ids: a batch of 500 stays a small event."""
    task = {item.id: item.task for item in batch}
    return {"node": node, "count": len(published) + len(failed),
            "published": dict(Counter(task[one] for one in published)),
            "failed": dict(Counter(task[one] for one in failed)),
            "failed_ids": list(failed)[:FAILED_IDS]}


def _arguments(item: LeasedOneOff, accept: Any) -> tuple[list[Any], dict[str, Any]]:
    data = loads(item.body, item.content_type, item.content_encoding,  # type: ignore[no-untyped-call]
                 accept=accept)
    args, kwargs = data
    return list(args), dict(kwargs)

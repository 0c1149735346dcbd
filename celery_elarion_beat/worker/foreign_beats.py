"""Foreign beats: a beat among the replicas that claims nothing, named by the workers.

A replica that runs Celery's stock scheduler beside the claiming beats (one left
behind by a rollout, an image built before the library, ``celery worker -B -S
elarion``) sends every occurrence again, and nothing of the library runs there to
say so. Its messages say it instead: Celery 5.7's beat stamps each with the header
``celery_beat_task``, ours add ``elarion_job``
(:func:`~..config.headers.from_foreign_beat`). Every worker of an app that calls
``install_worker(app)`` looks at each message it receives (Celery's
``task_received`` signal, in the worker's main process, before the task runs) and,
for one of a foreign beat:

* logs ONE ERROR per sender and process (``action: foreign-beat``), naming the
  sender's ``origin`` (``gen<pid>@<host>``: the process and the host to stop), the
  task, and the entry of the app's ``beat_schedule`` that has this task, if any;
* counts it; a thread of its own then records the counts in the claims database
  (:meth:`~..store.interface.ForeignBeats.record_foreign_beats`, one row per sender
  and task: ``elarion-beat status`` lists them from any machine) and sends one
  ``elarion-foreign-beat`` event per sender and task with the count (the metric
  ``elarion_beat_foreign_beat_messages_total``, Flower's Beat page).

The writer writes at most once per ``interval`` seconds and never in the consumer's
path; counts it could not write (the database away) wait for the next try, at most
one per sender and task, with one WARNING until it answers again. Rows not seen for
``elarion_beat_claim_retention`` are deleted as it writes.

Celery 5.6.3 and earlier stamp nothing on beat messages: a stock beat of those
versions cannot be told from ``.delay()`` calls, and is not named (the start-up
guard, :mod:`..beat.scheduler_guard`, still stops one in an app that uses the library).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import signals

from ..config.entries import schedule_entries
from ..config.headers import HEADER_ORIGIN, from_foreign_beat, origin_host
from ..config.names import KEY_LENGTH
from ..config.settings import Settings
from ..observe.events import FOREIGN_BEAT, EventSender
from ..store.foreign_records import ForeignSighting
from ..store.interface import ClaimStore
from ..store.registry import open_store

__all__ = ["WATCH_ATTRIBUTE", "ForeignBeatWatch", "watch_foreign_beats"]

logger = logging.getLogger(__name__)

#: The app attribute that holds the app's watch (one per app object).
WATCH_ATTRIBUTE = "_elarion_foreign_beat_watch"

#: The watches with a writer, flushed at exit (held weakly: the app owns them).
_WRITING: weakref.WeakSet[ForeignBeatWatch] = weakref.WeakSet()


class ForeignBeatWatch:
    """Names the foreign beats whose messages the workers of *app* receive (see the
    module). *store* opens the claims store (default: from the app's settings);
    *interval* is the least time between two writes."""

    def __init__(self, app: Any, store: Any = None, interval: float = 1.0) -> None:
        self.app = getattr(app, "_get_current_object", lambda: app)()
        self._open = store
        self.interval = interval
        self.seen = 0
        self.written = 0
        #: (origin, task) -> [count, entry, worker] waiting to be written
        self._pending: dict[tuple[str, str], list[Any]] = {}
        self._named: set[str] = set()
        self._entries: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = -1
        self._store: ClaimStore | None = None
        self._events: EventSender | None = None
        self._settings: Settings | None = None
        self._failing = False

    # -- the signal ------------------------------------------------------------------

    @property
    def _uid(self) -> str:
        return f"celery_elarion_beat.foreign_beats.{id(self.app)}"

    def connect(self) -> None:
        """Make this the watch of its app: the app holds it, the signal weakly."""
        previous = getattr(self.app, WATCH_ATTRIBUTE, None)
        if isinstance(previous, ForeignBeatWatch) and previous is not self:
            previous.close()
        setattr(self.app, WATCH_ATTRIBUTE, self)
        signals.task_received.connect(self.on_received, weak=True, dispatch_uid=self._uid)

    def on_received(self, sender: Any = None, request: Any = None, **_: Any) -> None:
        """``task_received`` (the worker's main process): look at the message's headers."""
        try:
            if getattr(sender, "app", None) is not self.app or request is None:
                return
            headers: Mapping[str, Any] = getattr(request, "request_dict", None) or {}
            if not from_foreign_beat(headers):
                return
            task = str(getattr(request, "task_name", None) or headers.get("task") or "")
            self.saw(str(headers.get(HEADER_ORIGIN) or "unknown"), task,
                     str(getattr(sender, "hostname", "") or ""))
        except Exception:  # the task runs whatever happens here
            logger.exception("elarion: could not look at the headers of a received message")

    def saw(self, origin: str, task: str, worker: str, count: int = 1) -> None:
        """Count *count* messages of *task* from the foreign beat *origin* that *worker*
        received; the first one of a sender is logged (ERROR)."""
        origin, task = origin[:KEY_LENGTH], task[:KEY_LENGTH]
        entry = self._entry(task)
        with self._lock:
            self.seen += count
            held = self._pending.setdefault((origin, task), [0, entry, worker])
            held[0] += count
            held[1], held[2] = entry, worker
            first = origin not in self._named
            self._named.add(origin)
        if first:
            named = f"entry {entry!r}" if entry else "no entry of this app's beat_schedule"
            logger.error(
                "elarion: a beat that claims nothing sends %s (%s) from %s on host %s: "
                "beside the claiming beats, every occurrence it sends goes out twice. Stop "
                "it, or make it claim: `celery beat -S elarion`, `celery worker -B "
                "--scheduler elarion`, or beat_scheduler = \"elarion\" in its configuration "
                "(see docs/howto/embedded-beat.md)", task, named, origin, origin_host(origin),
                extra={"action": "foreign-beat", "origin": origin, "host": origin_host(origin),
                       "task": task, "entry": entry, "worker": worker})
        self._start()
        self._wake.set()

    def _entry(self, task: str) -> str | None:
        """The entries of the app's ``beat_schedule`` that send *task* (comma-separated),
        or None."""
        if task not in self._entries:
            try:
                names = sorted(name for name, entry in schedule_entries(self.app).items()
                               if entry.task == task)
            except Exception:  # a schedule that cannot be read names no entry
                names = []
            self._entries[task] = ", ".join(names) or None
        return self._entries[task]

    # -- the writer ------------------------------------------------------------------

    def _start(self) -> None:
        """Start this process's writer (again after a fork)."""
        if self._pid == os.getpid() or self._stopping.is_set():
            return
        with self._lock:
            if self._pid == os.getpid():
                return
            self._store, self._events, self._settings = None, None, None
            self._wake = threading.Event()
            self._thread = threading.Thread(target=_write_pending, args=(weakref.ref(self),),
                                            daemon=True, name="elarion-foreign-beats")
            self._pid = os.getpid()
            _WRITING.add(self)
            self._thread.start()

    def write(self) -> bool:
        """Write what is pending now; False when it could not (it stays pending)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return True
        sightings = [ForeignSighting(origin, task, count, entry, worker)
                     for (origin, task), (count, entry, worker) in sorted(pending.items())]
        try:
            settings = self._settings = self._settings or Settings.from_app(self.app)
            if self._store is None:
                self._store = self._open() if self._open else open_store(settings)
            self._store.record_foreign_beats(
                sightings, retention=timedelta(seconds=settings.claim_retention))
        except Exception as exc:
            with self._lock:  # back in line, added to what came meanwhile
                for seen in sightings:
                    held = self._pending.setdefault((seen.origin, seen.task),
                                                    [0, seen.entry, seen.worker])
                    held[0] += seen.count
            if not self._failing:
                self._failing = True
                logger.warning("elarion: could not record a beat that claims nothing in the "
                               "claims database (%s); it is still named in this log, and "
                               "its counts wait until the database answers",
                               exc, extra={"action": "foreign-beat-unrecorded"})
            return False
        self.written += sum(s.count for s in sightings)
        if self._failing:
            self._failing = False
            logger.info("elarion: recording beats that claim nothing again",
                        extra={"action": "foreign-beat-recorded"})
        self._send_events(settings, sightings)
        return True

    def _send_events(self, settings: Settings, sightings: list[ForeignSighting]) -> None:
        if not settings.events:
            return
        if self._events is None:
            self._events = EventSender(self.app, settings.node,
                                       hostname=f"worker@{settings.node}")
        for seen in sightings:
            self._events.send(FOREIGN_BEAT, origin=seen.origin, host=origin_host(seen.origin),
                              task_name=seen.task, entry=seen.entry, count=seen.count,
                              worker=seen.worker)

    def close(self, timeout: float = 2.0) -> None:
        """Disconnect, write what is pending (at most *timeout*) and stop the writer."""
        if getattr(self.app, WATCH_ATTRIBUTE, None) is self:
            delattr(self.app, WATCH_ATTRIBUTE)
        signals.task_received.disconnect(dispatch_uid=self._uid)
        self._stopping.set()
        _WRITING.discard(self)
        if self._pid != os.getpid():
            return
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._events is not None:
            self._events.close(timeout)
        if self._store is not None:
            self._store.close()
        self._store, self._events, self._pid = None, None, -1


def _write_pending(watch_ref: weakref.ref[ForeignBeatWatch]) -> None:
    """A watch's writer thread: write when woken, at most once per interval, until the
    watch stops (then once more) or is gone."""
    while True:
        watch = watch_ref()
        if watch is None:
            return
        wake, stopping, interval = watch._wake, watch._stopping, watch.interval
        del watch
        wake.wait(timeout=interval * 10)
        watch = watch_ref()
        if watch is None:
            return
        wake.clear()
        watch.write()
        if stopping.is_set():
            return
        del watch
        stopping.wait(interval)


@atexit.register
def _write_at_exit() -> None:
    for watch in list(_WRITING):
        if watch._pid == os.getpid():
            watch.write()


def watch_foreign_beats(app: Any) -> ForeignBeatWatch:
    """The foreign-beat watch of *app*, connected (once per app object)."""
    app = getattr(app, "_get_current_object", lambda: app)()
    watch = getattr(app, WATCH_ATTRIBUTE, None)
    if not isinstance(watch, ForeignBeatWatch):
        watch = ForeignBeatWatch(app)
        watch.connect()
    return watch

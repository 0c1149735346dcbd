"""Run tracking: each run of a beat occurrence, recorded on its claim row by the workers.

One line in the module that creates the app::

    app = Celery("proj")
    celery_elarion_beat.install_worker(app)

makes every worker of the app consume its node's queue
(:func:`~..config.node_queue.consume_node_queue`) and follow each run of a beat
occurrence through Celery's task signals (``task_prerun``, ``task_failure``,
``task_retry``, ``task_postrun``), in the process that runs the task:

* the start (``running``), then the finish (``succeeded``, ``failed`` with the
  exception, or ``retried``) with the runtime and the worker's host name, on the
  occurrence's claim row; an every-node run gets a row of its own (kind ``node``);
* an ``elarion-run`` event per transition (Flower's Beat page and the metrics read them).

Only messages that carry beat's headers (``elarion_job``) are followed. The
signal handlers only put a record on a bounded queue; a thread of the process
writes what is queued in one transaction, one statement per kind of transition.
The task never waits for the ledger: when the claims database is unreachable the
records are dropped, with one WARNING until it answers again (and one INFO then).

A tracker belongs to one app *object*, not to an app name: two apps of one process
with the same ``main`` (Celery's ``celery_app`` test fixture names every app
``celery.tests``) each record into their own store. The app holds its tracker;
Celery's signals hold it only weakly, so an app dropped by its owner goes with its
tracker. :meth:`RunTracker.close` disconnects it, writes what is queued and stops
its writer.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from celery import signals

from ..config.headers import (
    HEADER_JOB,
    HEADER_NODE,
    HEADER_OCCURRENCE,
    HEADER_PLACEMENT,
)
from ..config.placement import Placement
from ..config.settings import Settings
from ..exceptions import ConfigurationError
from ..observe.events import RUN, EventSender
from ..schedules.clock import utcnow
from ..schedules.slots import iso, parse_iso
from ..store.interface import ClaimStore
from ..store.records import RunReport
from ..store.registry import open_store
from ..store.states import RETRIED, RUN_FAILED, SUCCEEDED

__all__ = ["RunTracker"]

logger = logging.getLogger(__name__)

#: Celery's task states after a run, as run states: ``IGNORED`` (the task raised
#: ``Ignore``: it ended on purpose) counts as succeeded; any other (``REJECTED``) failed.
_FINISHED = {"SUCCESS": SUCCEEDED, "FAILURE": RUN_FAILED, "RETRY": RETRIED,
             "IGNORED": SUCCEEDED}

#: The app attribute that holds the app's tracker (one per app object).
TRACKER_ATTRIBUTE = "_elarion_run_tracker"

#: The task signals a tracker follows, by the name of its handler.
_SIGNALS = {"prerun": signals.task_prerun, "failure": signals.task_failure,
            "retry": signals.task_retry, "postrun": signals.task_postrun}

#: The trackers with a writer, flushed at exit (held weakly: the app owns them).
_WRITING: weakref.WeakSet[RunTracker] = weakref.WeakSet()


@dataclass
class _Run:
    """A run in progress in this process (from prerun to postrun)."""

    job: str
    occurrence: datetime
    node: str
    every_node: bool
    started: float
    error: str | None = None


class RunTracker:
    """Follows the runs of beat occurrences in one worker process (see the module).

    *store* opens the claims store (default: from the app's settings); *maxsize*
    bounds the records waiting to be written (more are dropped and counted).
    """

    def __init__(self, app: Any, store: Callable[[], ClaimStore] | None = None,
                 maxsize: int = 10_000, flush_timeout: float = 2.0) -> None:
        # a proxy such as ``current_app`` is resolved: tasks carry the app object
        self.app = getattr(app, "_get_current_object", lambda: app)()
        self._open = store
        self.maxsize = maxsize
        self.flush_timeout = flush_timeout
        self.written = 0
        self.dropped = 0
        self._runs: dict[str, _Run] = {}
        self._pid = -1
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[RunReport, float] | None] = queue.Queue(maxsize)
        self._thread: threading.Thread | None = None
        self._store: ClaimStore | None = None
        self._closer: weakref.finalize[[], RunTracker] | None = None
        self._events: EventSender | None = None
        self._settings: Settings | None = None
        self._failing = False
        self._disabled = False
        self._closed = False

    # -- signals ---------------------------------------------------------------

    def connect(self) -> None:
        """Make this the tracker of its app (however often it is called): the app holds
        it, the task signals weakly. Another tracker of the same app is closed first."""
        previous = getattr(self.app, TRACKER_ATTRIBUTE, None)
        if isinstance(previous, RunTracker) and previous is not self:
            previous.close()
        setattr(self.app, TRACKER_ATTRIBUTE, self)
        self._closed = False
        for name, signal in _SIGNALS.items():
            signal.connect(getattr(self, f"on_{name}"), weak=True,
                           dispatch_uid=f"{self._uid}.{name}")

    @property
    def _uid(self) -> str:
        # unique while the app lives; the receivers go with the app and its tracker
        return f"celery_elarion_beat.worker.{id(self.app)}"

    def close(self) -> None:
        """Stop following runs: disconnect, write what is queued (at most
        *flush_timeout*), stop the writer and close the store."""
        if getattr(self.app, TRACKER_ATTRIBUTE, None) is self:
            delattr(self.app, TRACKER_ATTRIBUTE)
            for name, signal in _SIGNALS.items():
                signal.disconnect(dispatch_uid=f"{self._uid}.{name}")
        self._closed = True
        _WRITING.discard(self)
        if self._pid != os.getpid():
            return
        self.flush()
        try:
            self._queue.put(None, timeout=self.flush_timeout)
        except queue.Full:
            pass
        if self._thread is not None:
            self._thread.join(self.flush_timeout)
        if self._closer is not None:
            self._closer()  # closes the store, once
        self._store, self._closer = None, None
        self._pid = -1

    def _mine(self, task: Any) -> bool:
        return getattr(task, "app", None) is self.app

    def on_prerun(self, sender: Any = None, task_id: str | None = None, task: Any = None,
                  **_: Any) -> None:
        try:
            if task is None or task_id is None or not self._mine(task):
                return
            request = task.request
            job = getattr(request, HEADER_JOB, None)
            if not job:
                return  # not sent by beat: not ours to follow
            every_node = getattr(request, HEADER_PLACEMENT, None) == Placement.EVERY_NODE.value
            raw = getattr(request, HEADER_OCCURRENCE, None)
            if every_node:
                occurrence = utcnow()  # no claim: the run's own row, keyed by its start
            elif raw:
                occurrence = parse_iso(str(raw))
            else:
                return
            run = _Run(str(job), occurrence, str(getattr(request, HEADER_NODE, "") or ""),
                       every_node, time.monotonic())
            self._runs[task_id] = run
            self._put(run, task_id, RunReport.STARTED, _hostname(request))
        except Exception:  # the task runs whatever happens to its record
            logger.exception("elarion: could not record the start of task %s", task_id)

    def on_failure(self, sender: Any = None, task_id: str | None = None,
                   exception: BaseException | None = None, **_: Any) -> None:
        run = self._runs.get(task_id or "")
        if run is not None and exception is not None:
            run.error = f"{type(exception).__name__}: {exception}"

    def on_retry(self, sender: Any = None, request: Any = None, reason: Any = None,
                 **_: Any) -> None:
        run = self._runs.get(getattr(request, "id", None) or "")
        if run is not None:
            run.error = f"Retry: {reason}"

    def on_postrun(self, sender: Any = None, task_id: str | None = None, task: Any = None,
                   state: str | None = None, **_: Any) -> None:
        try:
            run = self._runs.pop(task_id or "", None)
            if run is None or task_id is None:
                return
            event = _FINISHED.get(str(state), RUN_FAILED)
            error = run.error if event != SUCCEEDED else None
            if event == RUN_FAILED and error is None:
                error = f"state {state}"
            self._put(run, task_id, event, _hostname(getattr(task, "request", None)),
                      runtime=time.monotonic() - run.started, error=error)
        except Exception:
            logger.exception("elarion: could not record the end of task %s", task_id)

    # -- the writer ------------------------------------------------------------

    def _put(self, run: _Run, task_id: str, event: str, worker: str,
             runtime: float | None = None, error: str | None = None) -> None:
        report = RunReport(run.job, run.occurrence, task_id, event, worker, runtime=runtime,
                           error=error, node=run.node, every_node=run.every_node)
        if not self._start():
            return
        try:
            self._queue.put_nowait((report, time.monotonic()))
        except queue.Full:
            self.dropped += 1
        if self._events is not None:
            self._events.send(RUN, **run_fields(report))

    def _start(self) -> bool:
        """Start this process's writer (again after a fork); False when disabled."""
        if self._pid == os.getpid() or self._closed:
            return not (self._disabled or self._closed)
        with self._lock:
            if self._pid != os.getpid():
                self._queue = queue.Queue(self.maxsize)
                self._store, self._closer = None, None  # the parent's, if any, stays open
                self._events = None
                try:
                    self._settings = Settings.from_app(self.app)
                    cluster = self._settings.require_cluster()  # the rows it writes to
                    if self._settings.events:
                        self._events = EventSender(self.app, self._settings.node,
                                                   hostname=f"worker@{self._settings.node}",
                                                   cluster=cluster)
                    self._disabled = False
                except ConfigurationError as exc:
                    logger.warning("elarion: runs are not recorded on this worker: %s", exc)
                    self._disabled = True
                # the thread holds the tracker weakly, and ends with it
                self._thread = threading.Thread(target=_write_queued, daemon=True,
                                                args=(weakref.ref(self), self._queue),
                                                name="elarion-runs")
                self._thread.start()
                weakref.finalize(self, _stop, self._queue).atexit = False
                _WRITING.add(self)
                self._pid = os.getpid()
        return not self._disabled

    def _write(self, queued: Sequence[tuple[RunReport, float]]) -> None:
        """Write *queued* (each report with when it was queued, on the monotonic clock):
        each one's age is taken once the store is open, so opening it (the first
        batch of a process, the first after an outage) never dates a run late."""
        reports: Sequence[RunReport] = [r for r, _ in queued]
        try:
            if self._store is None:
                self._store = self._open() if self._open else open_store(
                    self._settings or Settings.from_app(self.app))
                # a tracker dropped with its app, unclosed, closes its store
                self._closer = weakref.finalize(self, self._store.close)
                self._closer.atexit = False
            now = time.monotonic()
            reports = [replace(r, age=max(0.0, now - at)) for r, at in queued]
            self._store.record_runs(reports)
        except Exception as exc:
            self.dropped += len(reports)
            if not self._failing:
                self._failing = True
                logger.warning("elarion: could not record runs in the claims ledger (%s); "
                               "the tasks run on, and their records are dropped until it "
                               "answers again", exc, extra={"action": "runs-dropped"})
            return
        self.written += len(reports)
        if self._failing:
            self._failing = False
            logger.info("elarion: recording runs in the claims ledger again",
                        extra={"action": "runs-recorded"})

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until what is queued was written or dropped (tests, exit)."""
        deadline = time.monotonic() + (self.flush_timeout if timeout is None else timeout)
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._events is not None:
            self._events.flush(max(0.0, deadline - time.monotonic()))
        return not self._queue.unfinished_tasks


_Queued = queue.Queue[tuple[RunReport, float] | None]


def _write_queued(tracker: weakref.ref[RunTracker], waiting: _Queued) -> None:
    """A tracker's writer thread: write what is queued, in batches, until ``None``."""
    while True:
        batch = [waiting.get()]
        while len(batch) < 1000:
            try:
                batch.append(waiting.get_nowait())
            except queue.Empty:
                break
        try:
            queued = [i for i in batch if i is not None]
            writer = tracker()
            if queued and writer is not None:
                writer._write(queued)
            del writer
        finally:
            for _ in batch:
                waiting.task_done()
        if None in batch:
            return


def _stop(waiting: _Queued) -> None:
    """Stop the writer of a tracker that is gone."""
    try:
        waiting.put_nowait(None)
    except queue.Full:
        pass


@atexit.register
def _flush_at_exit() -> None:
    for tracker in list(_WRITING):
        if tracker._pid == os.getpid():
            tracker.flush()


def run_fields(report: RunReport) -> dict[str, Any]:
    """The fields of an ``elarion-run`` event (never arguments, never the error text)."""
    fields: dict[str, Any] = {
        "job": report.job, "occurrence": iso(report.occurrence), "task_id": report.task_id,
        "node": report.node, "worker": report.worker, "state": report.run_state,
        "placement": (Placement.EVERY_NODE if report.every_node else Placement.CLUSTER).value,
    }
    if report.runtime is not None:
        fields["runtime"] = round(report.runtime, 6)
    if report.error:
        fields["exception"] = report.error.split(":", 1)[0]
    return fields


def _hostname(request: Any) -> str:
    return str(getattr(request, "hostname", None) or "")

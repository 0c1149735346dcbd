"""The Celery app of the broker-loss fault proof: a few hundred every-second slots.

Configured from environment variables that the test sets, so each run has its own
(private) broker, queue, claims table and runs table:

``ELARION_ACC_BROKER``        broker URL (the test's own redis-server or RabbitMQ node)
``ELARION_ACC_QUEUE``         the task queue (and exchange) of this run only; the event
                              exchange and the node queues are named after it
``ELARION_ACC_CLAIMS_DSN``    -> ``app.conf.elarion_beat_dsn``
``ELARION_ACC_CLAIMS_TABLE``  -> ``app.conf.elarion_beat_table``
``ELARION_ACC_NODE``          -> ``app.conf.elarion_beat_node`` (the worker's: the node
                              queue it consumes)
``ELARION_ACC_RUNS_DSN``      PostgreSQL DSN of the runs table
``ELARION_ACC_RUNS_TABLE``    the runs table (created by the test)
``ELARION_BL_ENTRIES``        how many cluster entries ``bl-000`` ... (default 200), each
                              ``cron("* * * * * *")``
``ELARION_BL_STATS``          beat only: a JSON file its stats thread rewrites twice a
                              second (events sent and dropped, the event queue, ticks)

Plus one every-node entry, :data:`EVERY_NODE_JOB`, every second on every node.

Beat runs :class:`TimedScheduler`: the library's scheduler, whose ``tick`` is timed
(nothing else changes), so the test can say how long a tick blocked while the
broker was away, even when a tick is still running.

The task records each run in the runs table on one connection per worker process
(a new connection per task would cap the worker far below a few hundred runs a
second).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import beat_init

from celery_elarion_beat import ClaimingScheduler, consume_node_queue, cron
from celery_elarion_beat.observe.logformat import connect_json_logging
from tests.acceptance.proj import configure_from_env, insert_run, runs_table_ddl

TASK = "elarion_broker_loss.record"
CLUSTER_PREFIX = "bl-"
EVERY_NODE_JOB = "bl-every-node"
#: ``redelivered``: the broker redelivered the message (its ``delivery_info``)
RUNS_TABLE_DDL = runs_table_ddl("redelivered boolean")
#: ticks longer than this are kept in the stats (the last :data:`_KEPT` of them)
SLOW_TICK = 0.5
_KEPT = 200
PREFETCH = 100


def cluster_jobs(n: int) -> list[str]:
    return [f"{CLUSTER_PREFIX}{i:03d}" for i in range(n)]


def beat_schedule(entries: int) -> dict[str, Any]:
    schedule: dict[str, Any] = {
        job: {"task": TASK, "schedule": cron("* * * * * *"), "kwargs": {"entry": job}}
        for job in cluster_jobs(entries)}
    schedule[EVERY_NODE_JOB] = {"task": TASK, "schedule": cron("* * * * * *"),
                                "kwargs": {"entry": EVERY_NODE_JOB},
                                "options": {"placement": "every_node"}}
    return schedule


def make_app(env: Any, main: str = "elarion_broker_loss") -> Celery:
    queue = env.get("ELARION_ACC_QUEUE", "elarion-broker-loss")
    app = configure_from_env(
        Celery(main, set_as_current=False), env,
        beat_schedule(int(env.get("ELARION_BL_ENTRIES", "200"))), queue,
        event_exchange=f"{queue}.ev",
        elarion_beat_node_queue=f"{queue}.node.{{node}}",
        # a few hundred runs a second: fetch ahead (one message at a time, a solo worker
        # on RabbitMQ idled 10 s after every few messages on this machine)
        worker_prefetch_multiplier=PREFETCH)
    connect_json_logging(app)
    return app


app = make_app(os.environ)
app.set_current()
consume_node_queue(app)


class TimedScheduler(ClaimingScheduler):
    """The library's scheduler, its ticks timed (wall clock start, duration)."""

    tick_started: float | None = None
    ticks = 0
    longest = 0.0
    slow: deque[tuple[float, float]]

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not hasattr(self, "slow"):
            self.slow = deque(maxlen=_KEPT)
        start, began = time.time(), time.monotonic()
        self.tick_started = start
        try:
            return float(super().tick(*args, **kwargs))
        finally:
            took = time.monotonic() - began
            self.tick_started = None
            self.ticks += 1
            self.longest = max(self.longest, took)
            if took > SLOW_TICK:
                self.slow.append((start, took))


def _stats(scheduler: Any) -> dict[str, Any]:
    events = scheduler.events
    dispatcher = getattr(events, "_dispatcher", None)
    started = scheduler.tick_started
    return {
        "ts": time.time(),
        "sent": getattr(events, "sent", None),
        "dropped": getattr(events, "dropped", None),
        "messages": getattr(events, "messages", None),
        "event_queue": events._queue.qsize() if events is not None else None,
        "pending_items": len(getattr(events, "_pending", ()) or ()),
        "outbound_buffer": len(getattr(dispatcher, "_outbound_buffer", ()) or ()),
        "ticks": scheduler.ticks,
        "longest_tick": scheduler.longest,
        "tick_running_for": time.time() - started if started is not None else 0.0,
        "slow_ticks": list(getattr(scheduler, "slow", ())),
    }


def _write_stats(scheduler: Any, path: Path) -> None:
    while True:
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(_stats(scheduler)))
            tmp.replace(path)
        except Exception:  # noqa: BLE001 - a stats hiccup must not end the thread
            pass
        time.sleep(0.5)


@beat_init.connect
def _start_stats(sender: Any = None, **_: Any) -> None:
    path = os.environ.get("ELARION_BL_STATS")
    if path and sender is not None:
        threading.Thread(target=_write_stats, args=(sender.scheduler, Path(path)),
                         daemon=True, name="elarion-test-stats").start()


@app.task(bind=True, name=TASK)
def record(self: Any, entry: str | None = None) -> None:
    """Record this execution and the headers it came with in the runs table."""
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    insert_run(self.request, entry, {"redelivered": redelivered}, keep=True)

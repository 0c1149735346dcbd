"""The Celery app of the claims-database fault proofs: a few hundred every-second slots.

Configured from environment variables that the test sets, so each run has its own
queue, claims database and runs table:

``ELARION_ACC_BROKER``        broker URL
``ELARION_ACC_QUEUE``         the task queue (and exchange) of this run only
``ELARION_ACC_CLAIMS_DSN``    -> ``app.conf.elarion_beat_dsn`` (the faulted database)
``ELARION_ACC_CLAIMS_TABLE``  -> ``app.conf.elarion_beat_table``
``ELARION_ACC_NODE``          -> ``app.conf.elarion_beat_node``
``ELARION_ACC_RUNS_DSN``      PostgreSQL DSN of the runs table (never the faulted database)
``ELARION_ACC_RUNS_TABLE``    the runs table (created by the test)
``ELARION_LOAD_ENTRIES``      how many cluster entries ``load-000`` ... (default 200), each
                              ``cron("* * * * * *")``: that many occurrences a second
``ELARION_LOAD_EVERY_NODE``   how many every-node entries ``local-0`` ... (default 2), each
                              every second on every node, claimed by nobody

and one interval entry, :data:`INTERVAL_JOB`, every 2 s: claimed as a window.

The library's own settings come from ``ELARION_BEAT_*`` variables (claim timeout,
heartbeat, JSON logs, node queue). The task records each run in the runs table on
one connection per worker process (a new connection per task would cap the worker
far below the few hundred runs a second the beats send).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_elarion_beat import cron
from celery_elarion_beat.observe.logformat import connect_json_logging
from tests.acceptance.proj import configure_from_env, insert_run, runs_table_ddl

TASK = "elarion_load.record"
#: an interval entry: its windows must fail closed through a fault and resume after it
INTERVAL_JOB = "window-2s"
CLUSTER_PREFIX = "load-"
LOCAL_PREFIX = "local-"

RUNS_TABLE_DDL = runs_table_ddl()


def cluster_jobs(n: int) -> list[str]:
    return [f"{CLUSTER_PREFIX}{i:03d}" for i in range(n)]


def local_jobs(n: int) -> list[str]:
    return [f"{LOCAL_PREFIX}{i}" for i in range(n)]


def beat_schedule(entries: int, every_node: int) -> dict[str, Any]:
    schedule: dict[str, Any] = {
        job: {"task": TASK, "schedule": cron("* * * * * *"), "kwargs": {"entry": job}}
        for job in cluster_jobs(entries)}
    schedule.update({
        job: {"task": TASK, "schedule": cron("* * * * * *"), "kwargs": {"entry": job},
              "options": {"placement": "every_node"}}
        for job in local_jobs(every_node)})
    schedule[INTERVAL_JOB] = {"task": TASK, "schedule": timedelta(seconds=2),
                              "kwargs": {"entry": INTERVAL_JOB}}
    return schedule


def make_app(env: Any, main: str = "elarion_load") -> Celery:
    app = configure_from_env(
        Celery(main, set_as_current=False),
        env,
        beat_schedule(int(env.get("ELARION_LOAD_ENTRIES", "200")),
                      int(env.get("ELARION_LOAD_EVERY_NODE", "2"))),
        "elarion-load")
    connect_json_logging(app)
    return app


app = make_app(os.environ)
app.set_current()

@app.task(bind=True, name=TASK)
def record(self: Any, entry: str | None = None) -> None:
    """Record this execution and the headers it came with in the runs table."""
    insert_run(self.request, entry, keep=True)

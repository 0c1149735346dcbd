"""The Celery app of the "never twice, even misconfigured" acceptance tests (issue #33).

An app that uses the library: its claims database comes from ``ELARION_ACC_CLAIMS_DSN``
(-> ``app.conf.elarion_beat_dsn``; unset: the app still calls ``install_worker``), and
it calls :func:`celery_elarion_beat.install_worker`. Like :mod:`tests.acceptance.proj`
(same ``ELARION_ACC_*`` variables: broker, queue, claims table, node, runs table),
plus:

``ELARION_ACC_SCHEDULER_CONF`` when set, ``app.conf.beat_scheduler`` (the way the
                               docs recommend: no flag to forget)

One entry, :data:`JOB` (``cron("*/2 * * * * *")``), runs :data:`TASK`, which records
each execution in the runs table: the elarion headers, Celery's ``celery_beat_task``
header and the message's ``origin`` (who sent it), and ``sent_at``, the sender's clock
when it published the message (a ``BeatLazyFunc`` argument: the sending beat calls it).
:mod:`tests.acceptance.proj_old_image` sends the same task from a stock beat.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from celery import Celery
from celery.beat import BeatLazyFunc

import celery_elarion_beat
from celery_elarion_beat import cron
from celery_elarion_beat.observe.logformat import connect_json_logging
from tests.acceptance.proj import QUICK_LIVENESS, configure_from_env, runs_table_ddl

TASK = "elarion_guard.record"
JOB = "guard-cron-2s"
PERIOD = 2.0

RUNS_TABLE_DDL = runs_table_ddl("origin text", "beat_header text", "sent_at double precision")


def beat_schedule() -> dict[str, Any]:
    return {JOB: {"task": TASK, "schedule": cron("*/2 * * * * *"),
                  "kwargs": {"entry": JOB, "sent_at": BeatLazyFunc(time.time)}}}


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    queue = env.get("ELARION_ACC_QUEUE", "elarion-guard-acceptance")
    # events on an exchange of this run's own: the test's listener hears only them
    configure_from_env(app, env, beat_schedule(), queue, event_exchange=f"{queue}-ev",
                       **QUICK_LIVENESS)
    if env.get("ELARION_ACC_SCHEDULER_CONF"):
        app.conf.beat_scheduler = env["ELARION_ACC_SCHEDULER_CONF"]
    return app


def make_app(env: Mapping[str, str], main: str = "elarion_guard") -> Celery:
    """A fresh app configured from *env* (the test process listens to its events)."""
    return configure(Celery(main, set_as_current=False), env)


app = configure(Celery("elarion_guard"), os.environ)
celery_elarion_beat.install_worker(app)
connect_json_logging(app)


@app.task(bind=True, name=TASK)
def record(self: Any, entry: str | None = None, sent_at: float | None = None) -> None:
    """Record this execution, who sent it and the headers it came with."""
    import psycopg
    from psycopg import sql

    request = self.request
    row = {"entry": entry, "job": getattr(request, "elarion_job", None),
           "occurrence": getattr(request, "elarion_occurrence", None),
           "node": getattr(request, "elarion_node", None), "task_id": request.id,
           "worker": request.hostname, "origin": getattr(request, "origin", None),
           "beat_header": str(getattr(request, "celery_beat_task", None)), "sent_at": sent_at}
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(os.environ["ELARION_ACC_RUNS_TABLE"]),
        sql.SQL(", ").join(map(sql.Identifier, row)),
        sql.SQL(", ").join(sql.Placeholder() * len(row)))
    with psycopg.connect(os.environ["ELARION_ACC_RUNS_DSN"], autocommit=True,
                         connect_timeout=10) as conn:
        conn.execute(query, list(row.values()))

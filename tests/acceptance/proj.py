"""The Celery app that the acceptance tests run as real beat and worker processes.

Configured entirely from environment variables that the test sets, so each
test run gets its own broker queue, claims table and runs table:

``ELARION_ACC_BROKER``       broker URL (Redis or RabbitMQ)
``ELARION_ACC_QUEUE``        the task queue (and exchange) of this test run only
``ELARION_ACC_CLAIMS_DSN``   -> ``app.conf.elarion_beat_dsn`` (unset: the library's
                             own ``ELARION_BEAT_DSN`` fallback applies)
``ELARION_ACC_CLAIMS_TABLE`` -> ``app.conf.elarion_beat_table``
``ELARION_ACC_NODE``         -> ``app.conf.elarion_beat_node``
``ELARION_ACC_RUNS_DSN``     PostgreSQL DSN where the task records its runs
``ELARION_ACC_RUNS_TABLE``   the runs table (created by the test)

The one task records every execution, with the elarion message headers it was
sent with, into the runs table. Celery (5.x, message protocol 2) copies custom
message headers into the task's request context: each header is an attribute
of ``self.request`` (the task reads them so; they are also collected in
``self.request.headers``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.schedules import crontab
from celery.signals import celeryd_after_setup

from celery_elarion_beat import cron
from celery_elarion_beat.settings import Settings

try:
    from celery_elarion_beat.config.headers import HEADERS
    from celery_elarion_beat.config.node_queue import node_queue
    from celery_elarion_beat.testing._harness import conf_from_env, isolated_conf
except ModuleNotFoundError:  # the release 0.2, one flat folder: tests/upgrade runs this app on it
    from celery_elarion_beat.dispatch import HEADERS  # type: ignore[no-redef]
    from celery_elarion_beat.node_queue import node_queue  # type: ignore[no-redef]
    from celery_elarion_beat.testing.conf import (  # type: ignore[no-redef]
        conf_from_env,
        isolated_conf,
    )

TASK = "elarion_acceptance.record"

#: beat_schedule entry names (the job names in the claims table)
CRON_JOB = "every-2s-cron"
INTERVAL_JOB = "interval-2s"
MINUTE_JOB = "minutely-crontab"


def runs_table_ddl(*columns: str, task_id: str = "task_id text",
                   end: str = "executed_at timestamptz NOT NULL DEFAULT clock_timestamp()") -> str:
    """The runs table of an acceptance app: what every run records of its headers, then
    the app's own *columns*, then *end* (a ``{table}`` placeholder for its name)."""
    lines = ["id bigserial PRIMARY KEY", "entry text", "job text", "occurrence text",
             "node text", "placement text", "claim text", task_id, "worker text", *columns,
             end]
    return "\nCREATE TABLE {table} (\n    " + ",\n    ".join(lines) + "\n)\n"


RUNS_TABLE_DDL = runs_table_ddl()


def beat_schedule() -> dict[str, Any]:
    return {
        CRON_JOB: {"task": TASK, "schedule": cron("*/2 * * * * *"),
                   "kwargs": {"entry": CRON_JOB}},
        INTERVAL_JOB: {"task": TASK, "schedule": timedelta(seconds=2),
                       "kwargs": {"entry": INTERVAL_JOB}},
        MINUTE_JOB: {"task": TASK, "schedule": crontab(),
                     "kwargs": {"entry": MINUTE_JOB}},
    }


#: environment variables of the test -> the claims settings of the app
CLAIMS_ENV = {"ELARION_ACC_CLAIMS_DSN": "elarion_beat_dsn",
              "ELARION_ACC_CLAIMS_TABLE": "elarion_beat_table",
              "ELARION_ACC_NODE": "elarion_beat_node"}


#: the settings that make orphans and node liveness quick (the apps of proj_missed
#: and proj_runs)
PUBLISH_TIMEOUT = 3.0
HEARTBEAT = 1.0
QUICK_LIVENESS = {"elarion_beat_heartbeat_interval": HEARTBEAT,
                  "elarion_beat_node_timeout": 3.0,
                  "elarion_beat_publish_timeout": PUBLISH_TIMEOUT}


def configure_from_env(app: Celery, env: Mapping[str, str], schedule: dict[str, Any],
                       default_queue: str, **conf: Any) -> Celery:
    """Configure an acceptance app: the test's broker and queue (``ELARION_ACC_*``),
    *schedule*, no remote control or task events, the claims settings from *env*."""
    app.conf.update(isolated_conf(
        env.get("ELARION_ACC_BROKER", "redis://127.0.0.1:6379/0"),
        env.get("ELARION_ACC_QUEUE", default_queue),
        beat_schedule=schedule,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        **conf,
    ))
    conf_from_env(app, env, CLAIMS_ENV)
    return app


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    return configure_from_env(app, env, beat_schedule(), "elarion-acceptance")


def make_app(env: Mapping[str, str], main: str = "elarion_acceptance") -> Celery:
    """A fresh app configured from *env* (the test process uses it to purge queues)."""
    return configure(Celery(main, set_as_current=False), env)


app = configure(Celery("elarion_acceptance"), os.environ)


def _header(request: Any, name: str) -> Any:
    # celery.worker.request.Request starts its request dict from message.headers, and
    # celery.app.task.Context.update() sets every key as an attribute: a custom header
    # is an attribute of self.request (and listed in self.request.headers).
    return getattr(request, name, None)


def consume_beat_node_queues(app: Celery, uid: str) -> None:
    """Let a worker of *app* also consume the node queue of each node named in
    ``ELARION_ACC_CONSUME_NODES`` (one worker standing in for one per node)."""

    def add_queues(sender: Any = None, instance: Any = None, **_: Any) -> None:
        worker_app = getattr(instance, "app", None)
        if worker_app is None or worker_app.main != app.main:
            return
        own = Settings.from_app(worker_app)
        # the queue name template (ELARION_BEAT_NODE_QUEUE) applied to another node's name
        template = own.node_queue.replace(own.node, "{node}")
        for node in filter(None, os.environ.get("ELARION_ACC_CONSUME_NODES", "").split(",")):
            settings = dataclasses.replace(own, node=node, node_queue=template.format(node=node))
            worker_app.amqp.queues.select_add(node_queue(settings))

    celeryd_after_setup.connect(add_queues, weak=False, dispatch_uid=uid)


#: the connection insert_run(..., keep=True) reuses (one per worker process)
_kept: Any = None


def insert_run(request: Any, entry: str | None, extra: Mapping[str, Any] | None = None,
               keep: bool = False) -> None:
    """Write one execution and the elarion headers it came with into the runs table
    (*extra*: more columns of a runs table that has them). With *keep*, on one
    connection kept for the process (a load of hundreds of runs a second), reopened
    once when it fails."""
    global _kept
    import psycopg
    from psycopg import sql

    values = {name: _header(request, name) for name in HEADERS}
    row = {"entry": entry, "job": values["elarion_job"],
           "occurrence": values["elarion_occurrence"], "node": values["elarion_node"],
           "placement": values["elarion_placement"], "claim": values["elarion_claim"],
           "task_id": request.id, "worker": request.hostname, **(extra or {})}
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(os.environ["ELARION_ACC_RUNS_TABLE"]),
        sql.SQL(", ").join(map(sql.Identifier, row)),
        sql.SQL(", ").join(sql.Placeholder() * len(row)))

    def connect() -> Any:
        return psycopg.connect(os.environ["ELARION_ACC_RUNS_DSN"], autocommit=True,
                               connect_timeout=10)

    if not keep:
        with connect() as conn:
            conn.execute(query, list(row.values()))
        return
    for attempt in (1, 2):
        if _kept is None or _kept.closed:
            _kept = connect()
        try:
            _kept.execute(query, list(row.values()))
            return
        except psycopg.OperationalError:
            _kept.close()
            _kept = None
            if attempt == 2:
                raise


@app.task(bind=True, name=TASK)
def record(self: Any, entry: str | None = None) -> None:
    """Record this execution and the headers it came with in the runs table."""
    insert_run(self.request, entry)

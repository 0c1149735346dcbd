"""The Celery app of the every-node acceptance tests (real beat and worker processes).

Like :mod:`tests.acceptance.proj`, configured entirely from environment variables
that the test sets, so each run has its own queues and tables:

``ELARION_ACC_BROKER``        broker URL (Redis or RabbitMQ)
``ELARION_ACC_QUEUE``         the default task queue (and exchange) of this run only
``ELARION_ACC_CLAIMS_DSN``    -> ``app.conf.elarion_beat_dsn``
``ELARION_ACC_CLAIMS_TABLE``  -> ``app.conf.elarion_beat_table``
``ELARION_ACC_NODE``          -> ``app.conf.elarion_beat_node`` (unset: the library's own
                              ``ELARION_BEAT_NODE`` fallback applies; the tests use both)
``ELARION_ACC_RUNS_DSN``      PostgreSQL DSN where the task records its runs
``ELARION_ACC_RUNS_TABLE``    the runs table (created by the test)
``ELARION_ACC_SCHEDULE``      which beat_schedule: ``three`` (default), ``single`` or ``bad``
``ELARION_ACC_REMOTE_CONTROL`` ``1``: the worker answers ``celery inspect``

The app calls the worker one-liner :func:`celery_elarion_beat.consume_node_queue`,
so every worker of this app also consumes its node's queue, with or without ``-Q``,
and :func:`celery_elarion_beat.logformat.connect_json_logging`: started with
``ELARION_BEAT_LOG_FORMAT=json`` (the tests do), its beats and workers log JSON lines.

Every entry passes ``sent_at`` as a :class:`celery.beat.BeatLazyFunc`: beat calls it
when it publishes the message, so the task knows when its message was sent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.beat import BeatLazyFunc

import celery_elarion_beat
from celery_elarion_beat import cron
from celery_elarion_beat.observe.logformat import connect_json_logging
from celery_elarion_beat.testing._harness import conf_from_env, isolated_conf
from tests.acceptance.proj import CLAIMS_ENV, runs_table_ddl

TASK = "elarion_every_node.record"

#: beat_schedule entry names
EN_INTERVAL = "en-interval-2s"    # every node, timedelta(seconds=2)
EN_CRON = "en-cron-2s"            # every node, cron("*/2 * * * * *")
CLUSTER_CRON = "cluster-cron-2s"  # claimed: once per slot for the whole cluster
EN_BAD = "en-with-own-queue"      # every node AND queue=...: a configuration error
PERIOD = 2.0

HEADERS = ("elarion_job", "elarion_occurrence", "elarion_node", "elarion_placement",
           "elarion_claim")

RUNS_TABLE_DDL = runs_table_ddl("worker_node text", "sent_at double precision", "expires text",
                                "exchange text", "routing_key text")


def _entry(name: str, schedule: Any, **options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"task": TASK, "schedule": schedule,
                             "kwargs": {"entry": name, "sent_at": BeatLazyFunc(time.time)}}
    if options:
        entry["options"] = options
    return entry


def beat_schedule(kind: str) -> dict[str, Any]:
    every_node = {"placement": "every_node"}
    if kind == "three":
        return {
            EN_INTERVAL: _entry(EN_INTERVAL, timedelta(seconds=PERIOD), **every_node),
            EN_CRON: _entry(EN_CRON, cron("*/2 * * * * *"), **every_node),
            CLUSTER_CRON: _entry(CLUSTER_CRON, cron("*/2 * * * * *")),
        }
    if kind == "single":
        return {EN_INTERVAL: _entry(EN_INTERVAL, timedelta(seconds=PERIOD), **every_node)}
    if kind == "bad":
        return {
            EN_INTERVAL: _entry(EN_INTERVAL, timedelta(seconds=PERIOD), **every_node),
            EN_BAD: _entry(EN_BAD, timedelta(seconds=PERIOD), queue="somewhere-else",
                           **every_node),
        }
    raise ValueError(f"unknown ELARION_ACC_SCHEDULE {kind!r}")


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    queue = env.get("ELARION_ACC_QUEUE", "elarion-every-node-acceptance")
    app.conf.update(isolated_conf(
        env.get("ELARION_ACC_BROKER", "redis://127.0.0.1:6379/0"), queue,
        beat_schedule=beat_schedule(env.get("ELARION_ACC_SCHEDULE", "three")),
        # on RabbitMQ the worker's event loop sleeps up to 10 s between timers, and a warm
        # shutdown waits for it to wake: a heartbeat tick every second (60 s / 60) keeps
        # SIGTERM -> exit near one second (the heartbeat timeout stays 60 s)
        broker_heartbeat=60,
        broker_heartbeat_checkrate=60,
        worker_enable_remote_control=env.get("ELARION_ACC_REMOTE_CONTROL") == "1",
        worker_send_task_events=False,
    ))
    conf_from_env(app, env, CLAIMS_ENV)
    return app


def make_app(env: Mapping[str, str], main: str = "elarion_every_node") -> Celery:
    """A fresh app configured from *env* (the test process uses it to inspect and purge)."""
    return configure(Celery(main, set_as_current=False), env)


app = configure(Celery("elarion_every_node"), os.environ)
celery_elarion_beat.consume_node_queue(app)  # the worker one-liner under test
connect_json_logging(app)


def own_node(app_: Any) -> str | None:
    """This worker's node, read from its own configuration (never from a message)."""
    return app_.conf.get("elarion_beat_node") or os.environ.get("ELARION_BEAT_NODE")


@app.task(bind=True, name=TASK)
def record(self: Any, entry: str | None = None, sent_at: float | None = None) -> None:
    """Record this execution, the headers it came with and the worker's own node."""
    import psycopg
    from psycopg import sql

    request = self.request
    # custom message headers are attributes of the request (see tests.acceptance.proj)
    values = {name: getattr(request, name, None) for name in HEADERS}
    delivery = request.delivery_info or {}
    expires = request.expires
    dsn = os.environ["ELARION_ACC_RUNS_DSN"]
    table = os.environ["ELARION_ACC_RUNS_TABLE"]
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {} (entry, job, occurrence, node, placement, claim, task_id, "
                    "worker, worker_node, sent_at, expires, exchange, routing_key) VALUES "
                    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)").format(
                sql.Identifier(table)),
            (entry, values["elarion_job"], values["elarion_occurrence"], values["elarion_node"],
             values["elarion_placement"], values["elarion_claim"], request.id,
             request.hostname, own_node(self.app), sent_at,
             None if expires is None else str(expires),
             delivery.get("exchange"), delivery.get("routing_key")))

"""Two services on one database: the apps of :mod:`.test_two_apps`.

``svc_a`` (:mod:`.proj_svc_a`) and ``svc_b`` (:mod:`.proj_svc_b`) are two different
Celery apps, ``Celery("svc_a")`` and ``Celery("svc_b")``, each with its own tasks
and broker queue, and each with entries of the same names: ``cleanup`` (a slot every
2 s) and ``poll`` (every 2 s: window claims). Both claim in ONE claims table (the
same ``ELARION_TWO_TABLE``); neither sets ``elarion_beat_cluster``, so each app's
cluster is its main name. Every run is recorded in the runs table with the app that
ran it.

``ELARION_TWO_BROKER``, ``ELARION_TWO_QUEUE`` (a prefix: each app's queue is
``<prefix>-<main>``), ``ELARION_TWO_DSN``, ``ELARION_TWO_TABLE``, ``ELARION_TWO_NODE``,
``ELARION_ACC_RUNS_DSN``, ``ELARION_ACC_RUNS_TABLE``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_elarion_beat import cron, install_worker
from celery_elarion_beat.testing._harness import conf_from_env, isolated_conf
from tests.acceptance.proj import insert_run, runs_table_ddl

#: the runs table: what every run recorded, and the app that ran it
RUNS_TABLE_DDL = runs_table_ddl("app text")
ENTRIES = ("cleanup", "poll")

CLAIMS_ENV = {"ELARION_TWO_DSN": "elarion_beat_dsn", "ELARION_TWO_TABLE": "elarion_beat_table",
              "ELARION_TWO_NODE": "elarion_beat_node"}


def make_app(main: str, env: Mapping[str, str]) -> Celery:
    app = Celery(main, set_as_current=False)
    app.conf.update(isolated_conf(
        env.get("ELARION_TWO_BROKER", "redis://127.0.0.1:6379/0"),
        f"{env.get('ELARION_TWO_QUEUE', 'elarion-two')}-{main}",
        worker_enable_remote_control=False, worker_send_task_events=False,
        elarion_beat_log_format="json",
        elarion_beat_heartbeat_interval=1.0, elarion_beat_node_timeout=5.0,
        beat_schedule={
            "cleanup": {"task": f"{main}.cleanup", "schedule": cron("*/2 * * * * *")},
            "poll": {"task": f"{main}.poll", "schedule": timedelta(seconds=2)},
        }))
    conf_from_env(app, env, CLAIMS_ENV)

    def task(entry: str) -> Any:
        def run(self: Any) -> None:
            insert_run(self.request, entry, {"app": main})

        run.__name__ = entry
        return app.task(bind=True, name=f"{main}.{entry}")(run)

    for entry in ENTRIES:
        task(entry)
    install_worker(app)  # the workers record each run on its claim row
    return app

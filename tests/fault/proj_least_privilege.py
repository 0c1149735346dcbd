"""The Celery app of tests/fault/test_least_privilege.py: the acceptance cluster's app
(:mod:`tests.acceptance.proj`, same ``ELARION_ACC_*`` variables and runs table) plus
what a production app has that it lacks:

* ``install_worker(app)``: the workers record every run on its claim row (and insert
  the rows of every-node runs) through ``elarion_beat_dsn``, the workers' role;
* :data:`EVERY_NODE_JOB`, an every-node entry (each beat sends it to its node queue);
* :data:`CONTROL_JOB`, a 2 s cron entry the test pauses, resumes and runs by hand;
* ``elarion_beat_create_table = False`` (as the least-privilege page says), heartbeats
  every second and a purge every 5 s (so both happen within the test).

The task records each execution in the runs table (:func:`tests.acceptance.proj.insert_run`:
the test's own instrumentation, written with the test's superuser DSN, not the roles').
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery import Celery

from celery_elarion_beat import cron, install_worker
from tests.acceptance import proj

TASK = proj.TASK
EVERY_NODE_JOB = "lp-every-node-2s"
CONTROL_JOB = "lp-control-2s"
#: the claims the purge may delete are older than this (the test back-dates some)
RETENTION = 24 * 3600.0


def beat_schedule() -> dict[str, Any]:
    schedule = proj.beat_schedule()
    schedule[EVERY_NODE_JOB] = {"task": TASK, "schedule": cron("*/2 * * * * *"),
                                "kwargs": {"entry": EVERY_NODE_JOB},
                                "options": {"placement": "every_node"}}
    schedule[CONTROL_JOB] = {"task": TASK, "schedule": cron("*/2 * * * * *"),
                             "kwargs": {"entry": CONTROL_JOB}}
    return schedule


def node_queue_template(env: Mapping[str, str]) -> str:
    return env.get("ELARION_ACC_QUEUE", "elarion-lp") + ".node.{node}"


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    return proj.configure_from_env(
        app, env, beat_schedule(), "elarion-lp",
        elarion_beat_create_table=False,
        elarion_beat_node_queue=node_queue_template(env),
        elarion_beat_heartbeat_interval=1.0,
        elarion_beat_purge_interval=5.0,
        elarion_beat_claim_retention=RETENTION)


app = configure(Celery("elarion_least_privilege"), os.environ)
install_worker(app)


@app.task(bind=True, name=TASK, shared=False)  # the name of tests.acceptance.proj's task
def record(self: Any, entry: str | None = None) -> None:
    """Record this execution and the headers it came with in the runs table."""
    proj.insert_run(self.request, entry)

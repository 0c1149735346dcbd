"""The Celery app of tests/fault/test_security.py: beat, a worker, Flower, the exporter
and every ``elarion-beat`` command run it.

Configured from environment variables, so each run has its own queue, event and
control exchanges, claims table and runs file:

``ELARION_SEC_BROKER``  broker URL (the test puts a password in it)
``ELARION_SEC_RUN``     run id: names the queue and the exchanges
``ELARION_SEC_DSN``     -> ``app.conf.elarion_beat_dsn`` (passwords in it, both forms)
``ELARION_SEC_TABLE``   -> ``app.conf.elarion_beat_table``
``ELARION_SEC_NODE``    -> ``app.conf.elarion_beat_node``
``ELARION_SEC_RUNS``    a file the task appends one JSON line to per run: the
                        arguments it was called with (the proof that they reached it)

Four entries: :data:`ARGS_JOB` passes marker strings as ``args`` and ``kwargs`` (they
must reach the task and no event); :data:`FAIL_JOB`'s task raises an error quoting its
marker argument (the error text is kept in the claims table; an event carries only
its type); :data:`SCRIPT_JOB` and :data:`IMG_JOB` are named
with HTML that runs script if a page inserts it as markup (the Flower page must show
them as text). The worker records its runs (:func:`celery_elarion_beat.install_worker`),
so Flower's page has worker states and every ``elarion-run`` event is seen.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import Celery, Task

from celery_elarion_beat import cron, install_worker
from celery_elarion_beat.config.headers import HEADER_JOB, HEADER_OCCURRENCE
from celery_elarion_beat.testing._harness import conf_from_env, isolated_conf

TASK = "elarion_security.record"

#: an entry whose arguments carry markers: they reach the task, never an event
ARGS_JOB = "security-args"
MARKER_ARG = "MARKERARG7f3a"
MARKER_KWARG = "MARKERKWARG9c1e"
#: entry names that run script when a page inserts them as HTML
SCRIPT_JOB = "<script>window.__pwned=1</script>"
IMG_JOB = '<img src=x onerror="window.__pwned=2">'
JOBS = (ARGS_JOB, SCRIPT_JOB, IMG_JOB)
#: an entry whose task raises an error that quotes its argument: the run's error text
#: (kept in the claims table) must not reach an event either, only its type
FAIL_JOB = "security-fails"


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    run = env.get("ELARION_SEC_RUN", "local")
    app.conf.update(isolated_conf(
        env.get("ELARION_SEC_BROKER", "redis://127.0.0.1:6379/0"), f"elarion-sec-{run}",
        event_exchange=f"elarion-sec-ev-{run}",
        control_exchange=f"elarion-sec-ctl-{run}",
        beat_schedule={
            ARGS_JOB: {"task": TASK, "schedule": cron("* * * * * *"),
                       "args": [MARKER_ARG], "kwargs": {"token": MARKER_KWARG}},
            SCRIPT_JOB: {"task": TASK, "schedule": cron("*/2 * * * * *")},
            IMG_JOB: {"task": TASK, "schedule": timedelta(seconds=2)},
            FAIL_JOB: {"task": TASK, "schedule": cron("*/2 * * * * *"),
                       "args": [MARKER_ARG], "kwargs": {"fail": True}},
        },
        elarion_beat_node_queue=f"elarion-sec-{run}.node.{{node}}",
        elarion_beat_heartbeat_interval=1.0,
    ))
    conf_from_env(app, env, {"ELARION_SEC_DSN": "elarion_beat_dsn",
                             "ELARION_SEC_TABLE": "elarion_beat_table",
                             "ELARION_SEC_NODE": "elarion_beat_node"})
    return app


def make_app(env: Mapping[str, str]) -> Celery:
    """A fresh app for the test process (its event receiver)."""
    return configure(Celery("elarion_security", set_as_current=False), env)


app = configure(Celery("elarion_security"), os.environ)
install_worker(app)


@app.task(name=TASK, bind=True)
def record(self: Task, *args: Any, **kwargs: Any) -> None:
    """Append the job, occurrence and arguments of this run to ``ELARION_SEC_RUNS``;
    with ``fail=True``, then raise an error that quotes the first argument."""
    path = os.environ.get("ELARION_SEC_RUNS")
    if path:
        line = json.dumps({"job": getattr(self.request, HEADER_JOB, None),
                           "occurrence": getattr(self.request, HEADER_OCCURRENCE, None),
                           "task_id": self.request.id, "args": list(args), "kwargs": kwargs})
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
    if kwargs.get("fail"):
        raise ValueError(f"refused {args[0]!r}")

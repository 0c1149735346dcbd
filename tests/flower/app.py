"""The Celery app of the Flower tests: beats, a worker, Flower and the exporter run it.

Configured from environment variables, so each test run has its own queue, its
own event and control exchanges (a Flower or an exporter of another test run on
the same broker sees none of these events) and its own claims table:

``ELARION_FL_BROKER``  broker URL          ``ELARION_FL_RUN``    run id (names)
``ELARION_FL_DSN``     claims database     ``ELARION_FL_TABLE``  claims table
``ELARION_FL_NODE``    beat node name      ``ELARION_FL_STATS``  beat stats file (optional)

With ``ELARION_FL_STATS`` set, beat writes its EventSender's counters and its
RSS to that JSON file twice a second (the broker-outage test reads it).

Started with ``ELARION_BEAT_LOG_FORMAT=json`` (the tests do), its beats and workers
log JSON lines (:mod:`celery_elarion_beat.logformat`): the tests read the records'
fields (``action``, ``job``, ``reason``), never the text.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import beat_init

from celery_elarion_beat import cron
from celery_elarion_beat.logformat import connect_json_logging
from celery_elarion_beat.testing import conf_from_env, isolated_conf

TASK = "elarion_flower.work"
CRON_JOB = "flower-cron-2s"
INTERVAL_JOB = "flower-interval-2s"
JOBS = (CRON_JOB, INTERVAL_JOB)
#: arguments that must never leave beat in an event
SECRET_ARG = "s3cret-arg"
SECRET_KWARG = "s3cret-kwarg"


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    run = env.get("ELARION_FL_RUN", "local")
    queue = f"elarion-flower-{run}"
    app.conf.update(isolated_conf(
        env.get("ELARION_FL_BROKER", "redis://127.0.0.1:6379/0"), queue,
        event_exchange=f"elarion-flower-ev-{run}",
        control_exchange=f"elarion-flower-ctl-{run}",
        beat_schedule={
            CRON_JOB: {"task": TASK, "schedule": cron("*/2 * * * * *"), "args": [SECRET_ARG]},
            INTERVAL_JOB: {"task": TASK, "schedule": timedelta(seconds=2),
                           "kwargs": {"token": SECRET_KWARG}},
        },
        elarion_beat_node_queue=f"{queue}.node.{{node}}",
    ))
    conf_from_env(app, env, {"ELARION_FL_DSN": "elarion_beat_dsn",
                             "ELARION_FL_TABLE": "elarion_beat_table",
                             "ELARION_FL_NODE": "elarion_beat_node"})
    return app


def make_app(env: Mapping[str, str]) -> Celery:
    """A fresh app for the test process (probes, event capture, queue cleanup)."""
    return configure(Celery("elarion_flower", set_as_current=False), env)


app = configure(Celery("elarion_flower"), os.environ)
connect_json_logging(app)  # the cluster sets ELARION_BEAT_LOG_FORMAT=json for its processes


@app.task(name=TASK)
def work(*args: Any, **kwargs: Any) -> None:
    """Does nothing: the tests look at events, claims and Flower, not at results."""


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _write_stats(scheduler: Any, path: Path) -> None:
    while True:
        events = scheduler.events
        dispatcher = getattr(events, "_dispatcher", None)
        stats = {
            "ts": time.time(),
            "sent": getattr(events, "sent", None),
            "dropped": getattr(events, "dropped", None),
            "outbound_buffer": len(getattr(dispatcher, "_outbound_buffer", ()) or ()),
            "recent_records": len(scheduler.recorder.recent),
            "rss_kb": _rss_kb(),
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(stats))
        tmp.replace(path)
        time.sleep(0.5)


@beat_init.connect
def _start_stats(sender: Any = None, **_: Any) -> None:
    path = os.environ.get("ELARION_FL_STATS")
    if path and sender is not None:
        threading.Thread(target=_write_stats, args=(sender.scheduler, Path(path)),
                         daemon=True, name="elarion-test-stats").start()

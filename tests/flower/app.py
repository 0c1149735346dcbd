"""The Celery app of the Flower tests: beats, a worker, Flower and the exporter run it.

Its workers record their runs (:func:`celery_elarion_beat.install_worker`), so the
page and the metrics show states, runtimes and lateness. Three jobs, every 2 s:
:data:`CRON_JOB` (a slot: its runtime varies with the slot's second, and the slots
at a multiple of :data:`FAIL_EVERY` seconds fail), :data:`INTERVAL_JOB` (a window:
no lateness) and :data:`OVERLAP_JOB` (``overlap: skip``, a :data:`SLOW` s task: every
other slot is skipped ``still-running``). A fourth, :data:`CONTROL_JOB`, is due once a
year: the beats never reach it in a test run, and the control tests pause, resume and
run it by hand; its task goes to a queue no worker consumes, so a run of it by hand
never reaches Flower's tasks or the runtime metrics.

Configured from environment variables, so each test run has its own queue, its
own event and control exchanges (a Flower or an exporter of another test run on
the same broker sees none of these events) and its own claims table:

``ELARION_FL_BROKER``  broker URL          ``ELARION_FL_RUN``    run id (names)
``ELARION_FL_DSN``     claims database     ``ELARION_FL_TABLE``  claims table
``ELARION_FL_NODE``    beat node name      ``ELARION_FL_STATS``  beat stats file (optional)
``ELARION_FL_FLOWER_ACTIONS``  ``elarion_beat_flower_actions`` (``0``: a read-only Flower)

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

from celery import Celery, Task
from celery.schedules import crontab
from celery.signals import beat_init

from celery_elarion_beat import cron, install_worker
from celery_elarion_beat.config.headers import HEADER_JOB, HEADER_OCCURRENCE
from celery_elarion_beat.observe.logformat import connect_json_logging
from celery_elarion_beat.testing._harness import conf_from_env, isolated_conf

TASK = "elarion_flower.work"
SLOW_TASK = "elarion_flower.slow"
CRON_JOB = "flower-cron-2s"
INTERVAL_JOB = "flower-interval-2s"
OVERLAP_JOB = "flower-backup-2s"  # overlap: skip; sorts first on the page
JOBS = (CRON_JOB, INTERVAL_JOB, OVERLAP_JOB)
#: due at midnight on 1 January only: paused, resumed and run by hand by the tests
CONTROL_JOB = "flower-yearly"
#: the cron job's slots at a multiple of this many seconds fail
FAIL_EVERY = 10
#: the overlap job's task runs this long: longer than its period
SLOW = 3.0
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
            OVERLAP_JOB: {"task": SLOW_TASK, "schedule": cron("*/2 * * * * *"),
                          "options": {"overlap": "skip"}},
            CONTROL_JOB: {"task": TASK, "schedule": crontab(0, 0, day_of_month=1,
                                                            month_of_year=1),
                          "options": {"queue": f"{queue}.by-hand"}},
        },
        elarion_beat_node_queue=f"{queue}.node.{{node}}",
    ))
    conf_from_env(app, env, {"ELARION_FL_DSN": "elarion_beat_dsn",
                             "ELARION_FL_TABLE": "elarion_beat_table",
                             "ELARION_FL_NODE": "elarion_beat_node",
                             "ELARION_FL_FLOWER_ACTIONS": "elarion_beat_flower_actions"})
    return app


def make_app(env: Mapping[str, str]) -> Celery:
    """A fresh app for the test process (probes, event capture, queue cleanup)."""
    return configure(Celery("elarion_flower", set_as_current=False), env)


app = configure(Celery("elarion_flower"), os.environ)
install_worker(app)
connect_json_logging(app)  # the cluster sets ELARION_BEAT_LOG_FORMAT=json for its processes


@app.task(name=TASK, bind=True)
def work(self: Task, *args: Any, **kwargs: Any) -> None:
    """Sleeps 50 to 410 ms, by the occurrence's second; the cron job's slots at a
    multiple of :data:`FAIL_EVERY` seconds raise ValueError."""
    occurrence = str(getattr(self.request, HEADER_OCCURRENCE, None) or "")
    second = int(occurrence[17:19]) if len(occurrence) >= 19 else 0
    time.sleep(0.05 + (second % 10) * 0.04)
    if getattr(self.request, HEADER_JOB, None) == CRON_JOB and second % FAIL_EVERY == 0:
        raise ValueError(f"elarion flower test: the slot {occurrence} fails")


@app.task(name=SLOW_TASK)
def slow() -> None:
    """Runs longer than the overlap job's period."""
    time.sleep(SLOW)


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

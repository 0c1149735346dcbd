"""The demo's Celery app, its schedule and its one task."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import Celery
from celery.schedules import crontab

from ..config.node_queue import consume_node_queue
from ..schedules.cron import cron
from ..testing._harness.conf import isolated_conf

NODES = ("node-a", "node-b", "node-c")
TASK = "elarion_demo.record"

#: beat_schedule entry names, which are the job names in the claims table
CRON_JOB = "report-every-2s"
INTERVAL_JOB = "poll-every-3s"
CRONTAB_JOB = "minutely-crontab"
EVERY_NODE_JOB = "refresh-cache-every-5s"

ENV_DIR = "ELARION_DEMO_DIR"        # work directory: broker folders, results, logs
ENV_BROKER = "ELARION_DEMO_BROKER"  # broker URL (default filesystem://)
ENV_RUN = "ELARION_DEMO_RUN"        # run id: queue names of this run only

RESULTS = "results.jsonl"
#: The demo's cluster (``elarion_beat_cluster``), pinned for its processes and its store.
DEMO_CLUSTER = "elarion_demo"


# -- the demo's Celery app (imported by every beat and worker subprocess) -----


def beat_schedule() -> dict[str, Any]:
    return {
        # exact slots: every node names the same instant, one node wins it
        CRON_JOB: {"task": TASK, "schedule": cron("*/2 * * * * *"),
                   "kwargs": {"entry": CRON_JOB}},
        CRONTAB_JOB: {"task": TASK, "schedule": crontab(), "kwargs": {"entry": CRONTAB_JOB}},
        # interval: a window claim, "nobody ran this within the last 3 seconds"
        INTERVAL_JOB: {"task": TASK, "schedule": timedelta(seconds=3),
                       "kwargs": {"entry": INTERVAL_JOB}},
        # never claimed: every node sends it to its own node queue
        EVERY_NODE_JOB: {"task": TASK, "schedule": cron("*/5 * * * * *"),
                         "kwargs": {"entry": EVERY_NODE_JOB},
                         "options": {"placement": "every_node"}},
    }


def filesystem_options(workdir: Path) -> dict[str, Any]:
    """kombu filesystem transport options: every process shares one folder."""
    messages = workdir / "broker" / "messages"
    return {
        "data_folder_in": str(messages),
        "data_folder_out": str(messages),
        # processed messages are moved (an atomic rename: only one worker gets each)
        # into a folder on the same file system, not the system temp dir
        "store_processed": True,
        "processed_folder": str(workdir / "broker" / "processed"),
        "control_folder": str(workdir / "broker" / "control"),
        "polling_interval": 0.25,
    }


def declare_filesystem_queues(workdir: Path, run: str) -> None:
    """Declare every queue and binding of the run once, before any worker starts.

    kombu's filesystem transport creates an exchange's binding file with
    ``open("wb")`` before it locks it: workers that start together and bind to the
    same exchange can truncate each other's bindings or read an empty file and
    crash (``JSONDecodeError``). Once the file exists, every binding takes the
    locked read-modify-write path, which is safe.
    """
    from ..config.node_queue import node_queue
    from ..config.settings import Settings

    demo_app = make_app({ENV_DIR: str(workdir), ENV_RUN: run})
    queues = [demo_app.amqp.queues[demo_app.conf.task_default_queue]]
    for node in NODES:
        queues.append(node_queue(Settings.from_mapping({
            "elarion_beat_node": node,
            "elarion_beat_node_queue": demo_app.conf.elarion_beat_node_queue})))
    with demo_app.connection_for_write() as conn:
        for queue in queues:
            queue(conn.default_channel).declare()


def make_app(env: Mapping[str, str]) -> Celery:
    """The demo app, configured from the ``ELARION_DEMO_*`` variables of *env*."""
    workdir = Path(env.get(ENV_DIR) or tempfile.gettempdir())
    broker = env.get(ENV_BROKER) or "filesystem://"
    run = env.get(ENV_RUN) or "local"
    queue = f"elarion-demo-{run}"
    # not the current app, and its task not shared with other apps: importing this module
    # (a test does) must not change the Celery apps of the importing process
    app = Celery("elarion_demo", set_as_current=False)
    app.conf.update(isolated_conf(
        broker, queue,
        beat_schedule=beat_schedule(),
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        # this run's node queues only, so a shared Redis/RabbitMQ is not polluted
        elarion_beat_node_queue=f"{queue}.node.{{node}}",
        # the verdict reads the beats' JSON log records (action, job, occurrence, ...)
        elarion_beat_log_format="json",
    ))
    if broker.startswith("filesystem"):
        # kombu's filesystem transport, but messages are written atomically (see .transport)
        app.conf.broker_transport = "celery_elarion_beat.demo.transport:Transport"
        app.conf.broker_transport_options = filesystem_options(workdir)
        # Celery events go to a topic exchange nobody consumes here; on the
        # filesystem transport they would pile up as undeliverable files
        app.conf.elarion_beat_events = False
    # the claims settings (elarion_beat_dsn, _node, _table) come from ELARION_BEAT_*
    return app


app = make_app(os.environ)
consume_node_queue(app)


@app.task(bind=True, name=TASK, shared=False)  # type: ignore[untyped-decorator]
def record(self: Any, entry: str | None = None) -> None:
    """Append this execution, with the headers beat sent it with, to the results file."""
    request = self.request
    line = json.dumps({
        "entry": entry,
        "job": getattr(request, "elarion_job", None),
        "occurrence": getattr(request, "elarion_occurrence", None),
        "sent_by": getattr(request, "elarion_node", None),
        "placement": getattr(request, "elarion_placement", None),
        "claim": getattr(request, "elarion_claim", None),
        "task_id": request.id,
        "ran_on": os.environ.get("ELARION_BEAT_NODE"),
        "worker": request.hostname,
        "at": time.time(),
    }) + "\n"
    path = Path(os.environ.get(ENV_DIR) or tempfile.gettempdir()) / RESULTS
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one short O_APPEND write: lines never interleave
    finally:
        os.close(fd)

"""The Celery app: one beat_schedule that every node runs.

Run on EVERY node (or pod), next to each other:

    celery -A proj beat -S elarion -l INFO
    celery -A proj worker -l INFO

(``beat_scheduler = "elarion"`` below makes ``-S elarion`` optional, and lets beat run
embedded in the worker instead: ``celery -A proj worker -B -l INFO``.)

Configuration comes from the environment:

    ELARION_BEAT_DSN    postgresql://user:password@host:5432/db (the claims database;
                        the workers record what ran in it too)
    ELARION_BEAT_NODE   this node's name, shared by its beat and its workers
                        (default: the host name)
    CELERY_BROKER_URL   the broker (default: RabbitMQ on localhost)
"""

import os
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat import cron, install_worker

app = Celery("proj", include=["proj.tasks"])
app.conf.update(
    broker_url=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@localhost:5672//"),
    result_backend=os.environ.get("CELERY_RESULT_BACKEND"),
    # crontab() entries below are wall-clock times in this zone; DST is handled
    timezone="Europe/Berlin",
    # Flower (examples/flowerconfig.py) shows task and beat events
    worker_send_task_events=True,
    task_send_sent_event=True,
    # every beat of this app claims: celery beat and celery worker -B alike
    beat_scheduler="elarion",
    beat_schedule={
        # exact slot: every node computes 03:00 Europe/Berlin, one node wins it
        "nightly-report": {
            "task": "proj.tasks.nightly_report",
            "schedule": crontab(minute=0, hour=3),
        },
        # exact slot with seconds: celery_elarion_beat.cron takes a 6-field expression
        "sync-orders": {
            "task": "proj.tasks.sync_orders",
            "schedule": cron("*/15 * * * * *"),
        },
        # interval: a window claim, nobody ran it within the last minute
        "poll-partner-api": {
            "task": "proj.tasks.poll_partner_api",
            "schedule": timedelta(minutes=1),
            "args": ("https://partner.example.com/feed",),
        },
        # process-local work: never claimed, every node's own worker runs it
        "refresh-local-cache": {
            "task": "proj.tasks.refresh_local_cache",
            "schedule": timedelta(seconds=30),
            "options": {"placement": "every_node"},
        },
    },
)
# elarion_beat_dsn and elarion_beat_node are read from ELARION_BEAT_DSN and
# ELARION_BEAT_NODE; set them here instead if you prefer, e.g.
# app.conf.elarion_beat_dsn = "postgresql://beat:secret@db:5432/app"

# the workers of this node also consume its node queue (the every-node entries)
# and record each run of a beat occurrence in the claims table (docs/runs.md)
install_worker(app)

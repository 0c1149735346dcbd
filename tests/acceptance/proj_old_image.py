"""An "old image": the app module of a replica built before the project used
celery-elarion-beat. It never imports the library and configures none of it, so a
``celery beat`` started from it runs Celery's stock scheduler and sends
:data:`TASK` every :data:`PERIOD` seconds, beside the claiming beats of
:mod:`tests.acceptance.proj_guard` (same broker, queue and task).

Configured from ``ELARION_ACC_BROKER`` and ``ELARION_ACC_QUEUE`` only. (The package
is installed in the test's environment, so the ``celery`` command still loads its
``celery.commands`` entry point; nothing of it acts on an app that does not use it.)
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from celery import Celery
from celery.beat import BeatLazyFunc

TASK = "elarion_guard.record"
JOB = "guard-cron-2s"
PERIOD = 2.0

_queue = os.environ.get("ELARION_ACC_QUEUE", "elarion-guard-acceptance")
app = Celery("elarion_old_image")
app.conf.update(
    broker_url=os.environ.get("ELARION_ACC_BROKER", "redis://127.0.0.1:6379/0"),
    broker_connection_retry_on_startup=True,
    result_backend=None,
    task_ignore_result=True,
    task_default_queue=_queue,
    task_default_exchange=_queue,
    task_default_routing_key=_queue,
    timezone="UTC",
    enable_utc=True,
    beat_max_loop_interval=1,
    beat_schedule={JOB: {"task": TASK, "schedule": timedelta(seconds=PERIOD),
                         "kwargs": {"entry": JOB, "sent_at": BeatLazyFunc(time.time)}}},
)

"""The Celery app of the start-up error tests (tests/operate/test_startup_errors.py).

Configured from environment variables the test sets: ``ELARION_STARTUP_BROKER``
(broker URL), ``ELARION_STARTUP_RUN`` (names its queue and exchanges) and
``ELARION_STARTUP_SCHEDULE`` (a key of :data:`SCHEDULES`). The claims settings come
straight from the ``ELARION_BEAT_*`` variables, so a test can hand beat any raw value.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_elarion_beat.testing._harness import isolated_conf

TASK = "elarion_startup.tick"
#: an entry whose placement option has a value no version knows
BAD_OPTION = "placed-everywhere"

SCHEDULES = {
    "good": {"tick": {"task": TASK, "schedule": 1.0}},
    "bad-option": {"tick": {"task": TASK, "schedule": 1.0},
                   BAD_OPTION: {"task": TASK, "schedule": 1.0,
                                "options": {"placement": "everywhere"}}},
    # FailingTickScheduler with ELARION_TEST_FAIL_JOB=boom: every tick with boom due
    # fails; tick is due alone every other time
    "failing-tick": {"tick": {"task": TASK, "schedule": 1.5},
                     "boom": {"task": TASK, "schedule": 1.0}},
}

_run = os.environ.get("ELARION_STARTUP_RUN", "local")
app = Celery("elarion_startup")
app.conf.update(isolated_conf(
    os.environ.get("ELARION_STARTUP_BROKER", "redis://127.0.0.1:6379/0"),
    f"elarion-startup-{_run}", event_exchange=f"elarion-startup-ev-{_run}",
    control_exchange=f"elarion-startup-ctl-{_run}",
    beat_schedule=SCHEDULES[os.environ.get("ELARION_STARTUP_SCHEDULE", "good")]))


@app.task(name=TASK, shared=False)
def tick() -> str:
    return "tick"

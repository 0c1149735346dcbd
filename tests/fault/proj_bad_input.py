"""The Celery app of the bad-input fault proofs (tests/fault/test_bad_input.py).

Configured from environment variables the test sets, so each run has its own
queue and event exchange:

``ELARION_BAD_BROKER``    broker URL
``ELARION_BAD_RUN``       run id: names the task queue and the exchanges
``ELARION_BAD_SCHEDULE``  which ``beat_schedule`` (a key of :data:`SCHEDULES`)

The claims settings come straight from the ``ELARION_BEAT_*`` environment
variables (beat's own fallback for every setting), so a test can hand beat any
raw value, bad ones included.

Every schedule holds :data:`GOOD`, a unicode-named entry claimed every second,
beside the bad input of its scenario.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery import Celery

from celery_elarion_beat import cron
from celery_elarion_beat.testing._harness import isolated_conf

TASK = "elarion_bad_input.ok"
UNREGISTERED = "elarion_bad_input.not_registered"
#: the good entry of every scenario: a name outside ASCII is a valid claim key
GOOD = "rapport-été-✓-日本-🚀"
#: the entries of the "mixed" scenario that beat leaves out at start, each named in an ERROR
LEFT_OUT = ("not-a-mapping", "schedule-is-text", "no-task", "args-not-a-list",
            "zero-interval")
#: a cron that can never fire (30 February): kept, Celery's ERROR at each wake-up
NEVER = "february-30"
#: an entry whose task no process registered: beat sends it by name
STRANGER = "unregistered-task"
LONG_NAME = "j" * 500
NUL_NAME = "nul\x00name"


def _schedules() -> dict[str, dict[str, Any]]:
    good = {GOOD: {"task": TASK, "schedule": 1.0}}
    return {
        "good": good,
        "mixed": {
            **good,
            "not-a-mapping": 5,
            "schedule-is-text": {"task": TASK, "schedule": "every minute"},
            "no-task": {"schedule": 1.0},
            "args-not-a-list": {"task": TASK, "schedule": 1.0, "args": 5},
            "zero-interval": {"task": TASK, "schedule": 0},
            NEVER: {"task": TASK, "schedule": cron("0 0 30 2 *")},
            STRANGER: {"task": UNREGISTERED, "schedule": 2.0},
        },
        "placement": {**good, "everywhere": {"task": TASK, "schedule": 1.0,
                                             "options": {"placement": "everywhere"}}},
        "long-name": {**good, LONG_NAME: {"task": TASK, "schedule": 1.0}},
        "nul-name": {**good, NUL_NAME: {"task": TASK, "schedule": 1.0}},
    }


SCHEDULES = _schedules()


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    run = env.get("ELARION_BAD_RUN", "local")
    app.conf.update(isolated_conf(
        env.get("ELARION_BAD_BROKER", "redis://127.0.0.1:6379/0"), f"elarion-bad-{run}",
        event_exchange=f"elarion-bad-ev-{run}", control_exchange=f"elarion-bad-ctl-{run}",
        beat_schedule=SCHEDULES[env.get("ELARION_BAD_SCHEDULE", "good")],
    ))
    return app


app = configure(Celery("elarion_bad_input"), os.environ)


@app.task(name=TASK)
def ok(*args: Any, **kwargs: Any) -> str:
    """The good entries' task: the worker's success line is the proof it ran."""
    return "ok"

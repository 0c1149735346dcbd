"""The Celery app of the clock-skew fault proof (real beats on faked clocks).

:mod:`tests.acceptance.proj`'s app (same ``ELARION_ACC_*`` variables, same
schedule: ``cron("*/2 * * * * *")``, a 2 s interval, a minutely ``crontab``, same
task and runs table), plus what makes the skew alarm quick to observe: a heartbeat
(and so a skew measurement) every second, ``elarion_beat_max_clock_skew`` of
:data:`MAX_CLOCK_SKEW` s, and JSON log lines (the test sets ``ELARION_BEAT_LOG_FORMAT=json``
for its children only: pytest imports this module too), so the test reads the alarm as a
record (``action="clock-skew"``), not by matching text.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery import Celery

from celery_elarion_beat.observe.logformat import connect_json_logging
from tests.acceptance.proj import (
    TASK,
    beat_schedule,
    configure_from_env,
    insert_run,
)

#: a heartbeat, so a skew measurement, every second (the alarm shows within seconds)
HEARTBEAT = 1.0
#: the alarm threshold: far below the ±20 s the test injects, far above the few
#: milliseconds a real node's clock is off on this machine
MAX_CLOCK_SKEW = 5.0


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    return configure_from_env(app, env, beat_schedule(), "elarion-skew-fault",
                              elarion_beat_max_clock_skew=MAX_CLOCK_SKEW,
                              elarion_beat_heartbeat_interval=HEARTBEAT,
                              elarion_beat_node_timeout=5.0)


def make_app(env: Mapping[str, str], main: str = "elarion_skew") -> Celery:
    """A fresh app configured from *env* (the test process uses it to purge queues)."""
    return configure(Celery(main, set_as_current=False), env)


app = configure(Celery("elarion_skew"), os.environ)
connect_json_logging(app)


@app.task(bind=True, name=TASK, shared=False)  # the name of tests.acceptance.proj's task
def record(self: Any, entry: str | None = None) -> None:
    """Record this execution and the headers it came with in the runs table."""
    insert_run(self.request, entry)

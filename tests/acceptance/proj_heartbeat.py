"""The Celery app of tests/acceptance/test_heartbeat_metrics.py.

Configured from the environment like :mod:`tests.acceptance.proj_secrets`
(``ELARION_ACC_BROKER``, ``ELARION_ACC_RUN``, ``ELARION_ACC_CLAIMS_DSN``,
``ELARION_ACC_CLAIMS_TABLE``, ``ELARION_ACC_NODE``), with a heartbeat every second.
One entry, claimed every second; no worker is needed (the test reads beat's events).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery import Celery

from celery_elarion_beat import cron
from celery_elarion_beat.testing._harness import conf_from_env, isolated_conf
from tests.acceptance.proj import CLAIMS_ENV

TASK = "elarion_heartbeat.noop"
JOB = "heartbeat-every-second"
HEARTBEAT = 1.0


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    run = env.get("ELARION_ACC_RUN", "local")
    app.conf.update(isolated_conf(
        env.get("ELARION_ACC_BROKER", "redis://127.0.0.1:6379/0"), f"elarion-hb-{run}",
        event_exchange=f"elarion-hb-ev-{run}", control_exchange=f"elarion-hb-ctl-{run}",
        beat_schedule={JOB: {"task": TASK, "schedule": cron("* * * * * *")}},
        elarion_beat_heartbeat_interval=HEARTBEAT, elarion_beat_node_timeout=3 * HEARTBEAT,
    ))
    conf_from_env(app, env, CLAIMS_ENV)
    return app


def make_app(env: Mapping[str, str]) -> Celery:
    """A fresh app for the test process (its event listener)."""
    return configure(Celery("elarion_heartbeat", set_as_current=False), env)


app = configure(Celery("elarion_heartbeat"), os.environ)


@app.task(name=TASK)
def noop(*args: Any, **kwargs: Any) -> None:
    """Never runs in this test (no worker); beat only publishes it."""

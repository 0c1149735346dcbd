"""The Celery app of the secrets acceptance test (tests/acceptance/test_secrets.py).

Like :mod:`tests.acceptance.proj`, configured entirely from environment variables
that the test sets, so each run has its own queue, event exchange and claims table:

``ELARION_ACC_BROKER``        broker URL
``ELARION_ACC_RUN``           run id: names the task queue and the event exchange
``ELARION_ACC_CLAIMS_DSN``    -> ``app.conf.elarion_beat_dsn`` (the test puts passwords in it)
``ELARION_ACC_CLAIMS_TABLE``  -> ``app.conf.elarion_beat_table``
``ELARION_ACC_NODE``          -> ``app.conf.elarion_beat_node``

One entry, claimed every second; its task does nothing (no worker is needed: the
test looks at beat's output, its events and the CLI, not at task results).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery import Celery

from celery_elarion_beat import cron
from celery_elarion_beat.testing._harness import conf_from_env, isolated_conf
from tests.acceptance.proj import CLAIMS_ENV

TASK = "elarion_secrets.noop"
JOB = "secrets-every-second"


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    run = env.get("ELARION_ACC_RUN", "local")
    app.conf.update(isolated_conf(
        env.get("ELARION_ACC_BROKER", "redis://127.0.0.1:6379/0"), f"elarion-secrets-{run}",
        event_exchange=f"elarion-secrets-ev-{run}",
        control_exchange=f"elarion-secrets-ctl-{run}",
        beat_schedule={JOB: {"task": TASK, "schedule": cron("* * * * * *")}},
    ))
    conf_from_env(app, env, CLAIMS_ENV)
    return app


def make_app(env: Mapping[str, str]) -> Celery:
    """A fresh app for the test process (its event receiver)."""
    return configure(Celery("elarion_secrets", set_as_current=False), env)


app = configure(Celery("elarion_secrets"), os.environ)


@app.task(name=TASK)
def noop(*args: Any, **kwargs: Any) -> None:
    """Never runs in this test (no worker); beat only publishes it."""

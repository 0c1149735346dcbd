"""The Celery app of the daylight-saving fault proof (real beats on faked clocks).

Like :mod:`tests.acceptance.proj` (same ``ELARION_ACC_*`` variables for broker,
queue, claims and runs tables, node; same task, which records every run with its
elarion headers), with the schedule of one transition:

``ELARION_ACC_ZONE``   the zone (``app.conf.timezone`` and the ``cron`` zone)
``ELARION_ACC_HOUR``   the local hour the transition skips or repeats
``ELARION_ACC_LABEL``  prefix of the job names (one per transition: the runs
                       table is shared)

The four entries (:data:`ENTRIES`): Celery ``crontab(minute='*', hour=<hour>)``,
an hourly ``crontab(minute=0)``, our ``cron("*/10 * <hour> * * *")`` and our
``cron("*/10 * * * * *")``. A process without ``ELARION_ACC_ZONE`` (the worker)
has no schedule. Heartbeats every 5 s; the skew alarm fires (the beats think it
is 2027, the database does not) and is expected.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat import cron
from celery_elarion_beat.observe.logformat import connect_json_logging
from tests.acceptance.proj import TASK, configure_from_env, insert_run

#: entry kind -> the job-name suffix
CRONTAB_HOUR = "crontab-hour"      # crontab(minute='*', hour=H)
CRONTAB_HOURLY = "crontab-hourly"  # crontab(minute=0)
CRON_HOUR = "cron-hour"            # cron("*/10 * H * * *")
CRON_EVERY_HOUR = "cron-10s"       # cron("*/10 * * * * *")
ENTRIES = (CRONTAB_HOUR, CRONTAB_HOURLY, CRON_HOUR, CRON_EVERY_HOUR)


def job_name(label: str, kind: str) -> str:
    return f"{label}:{kind}"


def beat_schedule(label: str, zone: str, hour: int) -> dict[str, Any]:
    schedules: dict[str, Any] = {
        CRONTAB_HOUR: crontab(minute="*", hour=hour),
        CRONTAB_HOURLY: crontab(minute=0),
        CRON_HOUR: cron(f"*/10 * {hour} * * *", tz=zone),
        CRON_EVERY_HOUR: cron("*/10 * * * * *", tz=zone),
    }
    return {job_name(label, kind): {"task": TASK, "schedule": sched,
                                    "kwargs": {"entry": job_name(label, kind)}}
            for kind, sched in schedules.items()}


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    zone = env.get("ELARION_ACC_ZONE")
    schedule = {} if not zone else beat_schedule(
        env["ELARION_ACC_LABEL"], zone, int(env["ELARION_ACC_HOUR"]))
    return configure_from_env(app, env, schedule, "elarion-dst-fault",
                              timezone=zone or "UTC",
                              elarion_beat_heartbeat_interval=5.0,
                              elarion_beat_node_timeout=20.0,
                              # eight beats start at once on a loaded CI machine: a first
                              # claim once took over the default 5 s and skipped its slot
                              # (claim-error, at most once); this test is about DST
                              elarion_beat_claim_timeout=20.0)


def make_app(env: Mapping[str, str], main: str = "elarion_dst") -> Celery:
    """A fresh app configured from *env* (the test process uses it to purge queues)."""
    return configure(Celery(main, set_as_current=False), env)


app = configure(Celery("elarion_dst"), os.environ)
connect_json_logging(app)


@app.task(bind=True, name=TASK, shared=False)  # the name of tests.acceptance.proj's task
def record(self: Any, entry: str | None = None) -> None:
    """Record this execution and the headers it came with in the runs table."""
    insert_run(self.request, entry)

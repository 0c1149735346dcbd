"""The Celery app that the failover benchmark runs as real ``celery beat`` processes.

Configured from the environment that :mod:`benchmarks.failover` sets, so that
every run has its own queue, claims table and RedBeat key prefix:

``ELARION_BENCH_MODE``          ``elarion`` (ClaimingScheduler) or ``redbeat``
``ELARION_BENCH_BROKER``        broker URL (Redis)
``ELARION_BENCH_QUEUE``         the queue (and exchange) of this run
``ELARION_BENCH_PG_DSN``        claims database (elarion)
``ELARION_BENCH_TABLE``         claims table (elarion)
``ELARION_BENCH_NODE``          this beat's node name (elarion)
``ELARION_BENCH_REDBEAT_PREFIX`` RedBeat's key prefix (its lock is ``<prefix>:lock``)
``ELARION_BENCH_LOAD``          number of load entries
``ELARION_BENCH_LOAD_PERIOD``   seconds between two runs of a load entry
``ELARION_BENCH_MAX_INTERVAL``  ``beat_max_loop_interval`` (RedBeat's default lock
                                timeout is five times this)

The 1 s job is ``cron("* * * * * *")`` for ClaimingScheduler. RedBeat stores its
schedules as JSON and cannot store a ``cron``; it gets the same rates as Celery
intervals (``timedelta(seconds=1)`` and ``timedelta(seconds=LOAD_PERIOD)``).
Nothing consumes the queue but the benchmark itself: no task ever runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_elarion_beat.testing._harness import conf_from_env, isolated_conf

HEARTBEAT_TASK = "bench.every_second"
LOAD_TASK = "bench.load"
HEARTBEAT_JOB = "every-second"


def beat_schedule(env: Mapping[str, str]) -> dict[str, Any]:
    mode = env.get("ELARION_BENCH_MODE", "elarion")
    load = int(env.get("ELARION_BENCH_LOAD", "0"))
    period = int(env.get("ELARION_BENCH_LOAD_PERIOD", "5"))
    if mode == "elarion":
        from celery_elarion_beat import cron

        every_second: Any = cron("* * * * * *")
        load_schedule: Any = cron(f"*/{period} * * * * *")
    else:
        every_second = timedelta(seconds=1)
        load_schedule = timedelta(seconds=period)
    entries: dict[str, Any] = {
        HEARTBEAT_JOB: {"task": HEARTBEAT_TASK, "schedule": every_second},
    }
    for i in range(load):
        entries[f"load-{i:04}"] = {"task": LOAD_TASK, "schedule": load_schedule, "args": (i,)}
    return entries


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    broker = env.get("ELARION_BENCH_BROKER", "redis://127.0.0.1:6379/0")
    app.conf.update(isolated_conf(
        broker, env.get("ELARION_BENCH_QUEUE", "elbench.failover"),
        beat_max_loop_interval=float(env.get("ELARION_BENCH_MAX_INTERVAL", "5")),
        beat_schedule=beat_schedule(env)))
    if env.get("ELARION_BENCH_MODE", "elarion") == "elarion":
        conf_from_env(app, env, {"ELARION_BENCH_PG_DSN": "elarion_beat_dsn",
                                 "ELARION_BENCH_TABLE": "elarion_beat_table",
                                 "ELARION_BENCH_NODE": "elarion_beat_node"})
    else:
        app.conf.update(
            redbeat_redis_url=broker,
            redbeat_key_prefix=env.get("ELARION_BENCH_REDBEAT_PREFIX", "elbench.redbeat:"),
        )
    return app


app = configure(Celery("elarion_bench_failover"), os.environ)

"""The Celery app that the live-schedules benchmark runs as real ``celery beat`` processes.

Configured from the environment that :mod:`benchmarks.live_schedules` sets:

``ELARION_BENCH_BROKER``   broker URL (Redis)
``ELARION_BENCH_QUEUE``    the queue (and exchange) of this run
``ELARION_BENCH_DSN``      claims database (PostgreSQL, or MariaDB for the poll mode)
``ELARION_BENCH_TABLE``    claims table (the entries tables are named after it)
``ELARION_BENCH_NODE``     this beat's node name

Database entries on, :data:`TASK` allowed, JSON log lines (the benchmark reads when
each node read each version); no code entry. Nothing consumes the queue but the
benchmark: no task runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from celery import Celery

from celery_elarion_beat.testing._harness import conf_from_env, isolated_conf

TASK = "bench.live"
#: the main name: the cluster whose entries the beats run (the benchmark writes them)
MAIN = "elbench_live"

ENV = {"ELARION_BENCH_DSN": "elarion_beat_dsn", "ELARION_BENCH_TABLE": "elarion_beat_table",
       "ELARION_BENCH_NODE": "elarion_beat_node"}


def make_app(env: Mapping[str, str], main: str = MAIN) -> Celery:
    queue = env.get("ELARION_BENCH_QUEUE", "elbench.live")
    app = Celery(main, set_as_current=False)
    app.conf.update(isolated_conf(env.get("ELARION_BENCH_BROKER", "redis://127.0.0.1:6379/0"),
                                  queue, beat_schedule={}, worker_enable_remote_control=False,
                                  elarion_beat_db_entries=True,
                                  elarion_beat_db_entry_tasks=TASK,
                                  elarion_beat_log_format="json",
                                  elarion_beat_events=False,
                                  elarion_beat_one_offs=False))
    conf_from_env(app, env, ENV)
    app.task(name=TASK, shared=False)(_job)
    return app


def _job(*args: object, **kwargs: object) -> None:
    """Never runs: the benchmark reads the queue."""


app = make_app(os.environ)

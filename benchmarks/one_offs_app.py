"""The Celery app that the one-offs benchmark runs as real ``celery beat`` processes.

Configured from the environment that :mod:`benchmarks.one_offs` sets:

``ELARION_BENCH_BROKER``   broker URL (Redis)
``ELARION_BENCH_QUEUE``    the queue (and exchange) of this run
``ELARION_BENCH_PG_DSN``   claims database
``ELARION_BENCH_TABLE``    claims table (the one-offs table is named after it)
``ELARION_BENCH_NODE``     this beat's node name
``ELARION_BENCH_POLL``     ``elarion_beat_one_offs_poll``
``ELARION_BENCH_BATCH``    ``elarion_beat_one_offs_batch``

No beat entries: beat only publishes one-offs of :data:`TASK`, registered here so
that beat sends them. Nothing consumes the queue but the benchmark: no task runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from celery import Celery

from celery_elarion_beat.testing._harness import conf_from_env, isolated_conf

TASK = "bench.one_off"

ENV = {"ELARION_BENCH_PG_DSN": "elarion_beat_dsn", "ELARION_BENCH_TABLE": "elarion_beat_table",
       "ELARION_BENCH_NODE": "elarion_beat_node",
       "ELARION_BENCH_POLL": "elarion_beat_one_offs_poll",
       "ELARION_BENCH_BATCH": "elarion_beat_one_offs_batch"}


def configure(app: Celery, env: Mapping[str, str]) -> Celery:
    queue = env.get("ELARION_BENCH_QUEUE", "elbench.oneoffs")
    app.conf.update(isolated_conf(env.get("ELARION_BENCH_BROKER", "redis://127.0.0.1:6379/0"),
                                  queue, beat_schedule={}, worker_enable_remote_control=False))
    conf_from_env(app, env, ENV)
    return app


def make_app(env: Mapping[str, str], main: str = "elbench_one_offs") -> Celery:
    app = configure(Celery(main, set_as_current=False), env)
    app.task(name=TASK, shared=False)(_one_off)
    return app


def _one_off(*args: object) -> None:
    """Never runs: the benchmark counts the messages in the queue."""


app = make_app(os.environ)

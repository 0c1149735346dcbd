"""``python -m celery_elarion_beat.demo``: three real beat replicas share one schedule.

The demo starts three nodes, ``node-a``, ``node-b`` and ``node-c``, each one a real
``celery beat -S celery_elarion_beat.ClaimingScheduler`` process and a real
``celery worker --pool solo`` process that consumes the shared queue and its own
node queue. It prints a line per executed occurrence as the workers run them,
stops after ``--seconds`` (60), and ends with a table: per occurrence, which node
won its claim, which nodes skipped it and where it ran; the every-node runs per
node; and the number of duplicates. It exits 0 when there are none.

Without configuration it needs no servers: claims live in a SQLite file and the
broker is kombu's filesystem transport, both in a temporary directory that is
removed at the end. Point ``ELARION_BEAT_DSN`` at PostgreSQL (and
``CELERY_BROKER_URL`` at Redis or RabbitMQ) to run the same demo there.

This package is also the demo's Celery app: the six subprocesses run
``python -m celery -A celery_elarion_beat.demo ...`` and are configured by the
``ELARION_DEMO_*`` environment variables the demo sets for them.
"""

from __future__ import annotations

from .app import (
    CRON_JOB,
    CRONTAB_JOB,
    ENV_BROKER,
    ENV_DIR,
    ENV_RUN,
    EVERY_NODE_JOB,
    INTERVAL_JOB,
    NODES,
    RESULTS,
    TASK,
    app,
    beat_schedule,
    declare_filesystem_queues,
    filesystem_options,
    make_app,
    record,
)
from .processes import Progress
from .runner import main, run
from .verdict import (
    Decision,
    Row,
    Verdict,
    build_verdict,
    parse_beat_log,
    print_verdict,
)

__all__ = [
    "CRONTAB_JOB",
    "CRON_JOB",
    "Decision",
    "ENV_BROKER",
    "ENV_DIR",
    "ENV_RUN",
    "EVERY_NODE_JOB",
    "INTERVAL_JOB",
    "NODES",
    "Progress",
    "RESULTS",
    "Row",
    "TASK",
    "Verdict",
    "app",
    "beat_schedule",
    "build_verdict",
    "declare_filesystem_queues",
    "filesystem_options",
    "main",
    "make_app",
    "parse_beat_log",
    "print_verdict",
    "record",
    "run",
]

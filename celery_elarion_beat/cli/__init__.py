"""``celery -A proj elarion-beat ...``: operate the claims tables.

Commands: ``status`` (a health check: exits 1 on schedule drift between live
nodes, a missed slot or an orphan; with ``--since 24h`` also a reconciliation of
each entry's occurrences over the period, see :mod:`..operate.reconcile`, exiting 1 on
failed runs and duplicates too; ``--fail-on`` chooses which findings fail),
``claims`` (query the ledger: each occurrence's state, start, runtime, lateness,
worker and error), ``pause``, ``resume``, ``trigger`` and ``audit`` (live control,
see :mod:`.control`), ``catch-up --dry-run``, ``init-db``, ``purge`` and ``exporter``
(Prometheus counters of beat's events, see :mod:`.exporter`), ``health`` (a
probe of one node's heartbeat, see :mod:`.health`), ``preview`` (the
schedule's next occurrences, DST changes marked, see :mod:`.preview`),
``one-offs list|show|cancel`` (durable one-offs, see :mod:`.one_offs`), ``schedule
list|show|add|edit|override|remove|enable|disable|history|export|import`` (live
schedules: database entries edited while the cluster runs, see :mod:`.schedule`).
Installed as a Celery sub-command through the ``celery.commands`` entry point.

One module per command group; this one only builds the group.
"""

from __future__ import annotations

import sys

import click

from .control import (
    audit_command,
    pause_command,
    resume_command,
    trigger_command,
)
from .database import init_db_command, purge_command
from .exporter import exporter_command
from .health import health_command
from .ledger import catch_up_command, claims_command
from .one_offs import one_offs_group
from .preview import preview_command
from .schedule import schedule_group
from .status import parse_fail_on, status_command

__all__ = ["elarion_beat", "parse_fail_on"]


@click.group("elarion-beat")
@click.pass_context
def elarion_beat(ctx: click.Context) -> None:
    """celery-elarion-beat: claims, nodes and health of the beat cluster."""


for _command in (status_command, catch_up_command, claims_command, init_db_command,
                 purge_command, exporter_command, pause_command, resume_command,
                 trigger_command, audit_command, health_command, preview_command,
                 one_offs_group, schedule_group):
    elarion_beat.add_command(_command)


def main() -> None:  # pragma: no cover - convenience for `python -m celery_elarion_beat.cli`
    sys.exit("run it as: celery -A proj elarion-beat --help")

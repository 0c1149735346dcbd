"""Harness of the "never twice, even misconfigured" acceptance tests (issue #33).

One run id names everything a test touches: the queue and event exchange, the claims
table and the tables named after it (``g<id>_claims``, ``g<id>_nodes``, ...), the runs
table (``g<id>_runs``), and the beat nodes; :meth:`GuardRun.close` stops every
process and removes them again. Processes of the app that uses the library
(:mod:`tests.acceptance.proj_guard`) start from :attr:`GuardRun.pm`, the stock beat
of an old image (:mod:`tests.acceptance.proj_old_image`) from :attr:`GuardRun.old`.
All of them log JSON lines but the old image (it does not import the library).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from kombu import Connection, Exchange, Queue
from psycopg import sql

from celery_elarion_beat.testing._harness import ChildProcess, ProcessManager, drop_tables
from tests.acceptance import proj_guard

APP = "tests.acceptance.proj_guard"
OLD_IMAGE = "tests.acceptance.proj_old_image"
#: generous: several celery processes importing at once on a loaded 2-core machine
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class Run:
    """One execution of the task, as it recorded itself."""

    entry: str | None
    job: str | None          # header elarion_job: None when a stock beat sent it
    occurrence: str | None   # header elarion_occurrence
    node: str | None         # header elarion_node: the claiming beat that sent it
    task_id: str
    worker: str | None
    origin: str | None       # the message's origin: who sent it (gen<pid>@<host>)
    beat_header: str | None  # Celery's celery_beat_task header
    sent_at: float | None    # the sender's time.time() when it published the message


class GuardRun:
    """The processes, tables and queue of one test."""

    def __init__(self, workdir: Path, pg_dsn: str, broker_url: str) -> None:
        self.run_id = uuid.uuid4().hex[:8]
        self.pg_dsn = pg_dsn
        self.broker_url = broker_url
        self.queue = f"elarion-guard-{self.run_id}"
        self.claims_table = f"g{self.run_id}_claims"
        self.runs_table = f"g{self.run_id}_runs"
        self.env = {
            "ELARION_ACC_BROKER": broker_url,
            "ELARION_ACC_QUEUE": self.queue,
            "ELARION_ACC_CLAIMS_TABLE": self.claims_table,
            "ELARION_ACC_RUNS_DSN": pg_dsn,
            "ELARION_ACC_RUNS_TABLE": self.runs_table,
            "ELARION_BEAT_LOG_FORMAT": "json",
        }
        #: the claims database, for the processes that are told it
        self.claims = {"ELARION_ACC_CLAIMS_DSN": pg_dsn}
        self.pm = ProcessManager(workdir, APP, self.env)
        self.old = ProcessManager(workdir, OLD_IMAGE, {
            "ELARION_ACC_BROKER": broker_url, "ELARION_ACC_QUEUE": self.queue})
        with psycopg.connect(pg_dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL(proj_guard.RUNS_TABLE_DDL).format(
                table=sql.Identifier(self.runs_table)))

    def node(self, name: str) -> dict[str, str]:
        """The environment of a claiming process on node *name* (of this run)."""
        return {**self.claims, "ELARION_ACC_NODE": f"{name}-{self.run_id}"}

    def close(self) -> None:
        try:
            self.old.stop_all()
            self.pm.stop_all()
        finally:
            drop_tables(self.pg_dsn, prefix=f"g{self.run_id}_")
            try:
                with Connection(self.broker_url, connect_timeout=5) as conn:
                    bound = Queue(self.queue, Exchange(self.queue, type="direct"),
                                  routing_key=self.queue)(conn.default_channel)
                    bound.declare()
                    bound.delete()
            except Exception:  # noqa: BLE001 - cleanup must never fail a test
                pass

    def runs(self) -> list[Run]:
        query = sql.SQL("SELECT entry, job, occurrence, node, task_id, worker, origin, "
                        "beat_header, sent_at FROM {} ORDER BY id").format(
            sql.Identifier(self.runs_table))
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            return [Run(*row) for row in conn.execute(query)]

    def live_nodes(self) -> set[str]:
        """The beat nodes with a heartbeat row (each runs ClaimingScheduler)."""
        table = f"g{self.run_id}_nodes"
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            found = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
            if not found or found[0] is None:
                return set()
            return {row[0] for row in conn.execute(
                sql.SQL("SELECT node FROM {}").format(sql.Identifier(table)))}

    def tails(self) -> str:
        return self.pm.tails() + "\n" + self.old.tails()


def json_output(process: ChildProcess) -> dict[str, Any]:
    """The JSON document a finished command printed (its log holds nothing else)."""
    text = process.log()
    return dict(json.loads(text[text.index("{"):]))

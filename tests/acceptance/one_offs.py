"""A real cluster for the one-off tests: beats and a worker of :mod:`.proj_one_offs`.

Everything is named after one run id (queue, claims table and the tables named after
it, among them the one-offs table, and the runs table) and removed by
:meth:`OneOffCluster.close`. One-offs are scheduled from the test process
(:meth:`OneOffCluster.schedule`, ``schedule_once`` on an app configured like the
children) or from a separate short-lived process (:meth:`OneOffCluster.schedule_in_child`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from celery_elarion_beat import OneOff, schedule_once
from celery_elarion_beat.config.names import TABLE_MAX
from celery_elarion_beat.config.settings import Settings, related_table
from celery_elarion_beat.store import ClaimStore, open_store
from celery_elarion_beat.testing._harness import (
    ChildProcess,
    ProcessManager,
    claims_tables,
    clean_env,
    drop_tables,
)
from tests.acceptance import proj_one_offs as proj
from tests.acceptance.cluster import READY, START_TIMEOUT, delete_queue

APP = "tests.acceptance.proj_one_offs"


@dataclass(frozen=True)
class Run:
    task_id: str
    args: list[Any]
    kwargs: dict[str, Any]
    one_off: str | None
    node: str | None
    worker: str | None
    executed_at: datetime


class OneOffCluster:
    """Beats (``node-1`` ...) and one worker of :mod:`.proj_one_offs` on *broker_url*."""

    def __init__(self, workdir: Path, *, pg_dsn: str, broker_url: str,
                 **one_off_env: str) -> None:
        self.run_id = uuid.uuid4().hex[:10]
        self.pg_dsn = pg_dsn
        self.queue = f"elarion-oo-{self.run_id}"
        self.claims_table = f"oo_claims_{self.run_id}"
        self.runs_table = f"oo_runs_{self.run_id}"
        self.env = {
            "ELARION_ACC_BROKER": broker_url,
            "ELARION_ACC_QUEUE": self.queue,
            "ELARION_ACC_CLAIMS_DSN": pg_dsn,
            "ELARION_ACC_CLAIMS_TABLE": self.claims_table,
            "ELARION_ACC_RUNS_DSN": pg_dsn,
            "ELARION_ACC_RUNS_TABLE": self.runs_table,
            **one_off_env,
        }
        self.pm = ProcessManager(workdir, APP, self.env)
        self.workdir = workdir
        self.beats: dict[str, ChildProcess] = {}
        self.worker: ChildProcess | None = None
        self.app = proj.make_app(self.env, main=f"elarion-oo-test-{self.run_id}")
        self._store: ClaimStore | None = None

    @property
    def one_offs_table(self) -> str:
        return related_table(self.claims_table, "oneoffs", TABLE_MAX)

    # -- setup / teardown ------------------------------------------------------

    def prepare(self) -> None:
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL(proj.RUNS_TABLE_DDL).format(
                table=sql.Identifier(self.runs_table)))
        with self.app.connection_for_write() as conn:
            self.app.amqp.TaskConsumer(conn).purge()  # declares the queue, then empties it
        self.store.ensure_schema()

    @property
    def store(self) -> ClaimStore:
        """The claim store of the test process (the cluster's tables)."""
        if self._store is None:
            self._store = open_store(Settings.from_app(self.app))
        return self._store

    def close(self) -> None:
        try:
            self.pm.stop_all()
        finally:
            if self._store is not None:
                self._store.close()
            drop_tables(self.pg_dsn, self.runs_table, self.one_offs_table,
                        *claims_tables(self.claims_table))
            delete_queue(self.env)
            self.app.close()

    # -- processes ---------------------------------------------------------------

    def start_worker(self) -> ChildProcess:
        self.worker = self.pm.worker(f"oo-worker-{self.run_id}-{len(self.pm.processes)}")
        self.worker.wait_for_log(r"\bready\.", START_TIMEOUT)
        return self.worker

    def start_beat(self, node: str, *, scheduler: str = "celery_elarion_beat.ClaimingScheduler",
                   env: dict[str, str] | None = None, wait: bool = True) -> ChildProcess:
        name = f"beat-{node}-{len(self.pm.processes)}"
        beat = self.pm.beat(name, env={"ELARION_ACC_NODE": node, **(env or {})},
                            scheduler=scheduler)
        self.beats[node] = beat
        if wait:
            beat.wait_for_log(READY, START_TIMEOUT)
        return beat

    # -- one-offs ------------------------------------------------------------------

    def schedule(self, task: str = proj.TASK, *args: Any, **kw: Any) -> OneOff:
        return schedule_once(self.app, task, args, **kw)

    def schedule_in_child(self, *, countdown: float, args: list[Any],
                          key: str | None = None) -> dict[str, Any]:
        """``schedule_once`` from a separate Python process that then exits; its
        ``as_dict()``."""
        code = (
            "import json, sys\n"
            "from celery_elarion_beat import schedule_once\n"
            "from tests.acceptance.proj_one_offs import TASK, app\n"
            "one = schedule_once(app, TASK, json.loads(sys.argv[1]), "
            "countdown=float(sys.argv[2]), key=sys.argv[3] or None)\n"
            "print(json.dumps(one.as_dict()))\n")
        done = subprocess.run(
            [sys.executable, "-c", code, json.dumps(args), str(countdown), key or ""],
            env=clean_env(self.env), capture_output=True, text=True, timeout=120,
            cwd=self.workdir)
        assert done.returncode == 0, f"scheduling process failed:\n{done.stderr}"
        answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return answer

    def one_off(self, id_or_key: str) -> OneOff:
        (one,) = self.store.one_offs(id_or_key=id_or_key, limit=1)
        return one

    # -- what ran ----------------------------------------------------------------

    def runs(self) -> list[Run]:
        query = sql.SQL("SELECT task_id, args, kwargs, one_off, node, worker, executed_at "
                        "FROM {} ORDER BY id").format(sql.Identifier(self.runs_table))
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            return [Run(r[0], json.loads(r[1]), json.loads(r[2]), r[3], r[4], r[5], r[6])
                    for r in conn.execute(query)]

    def runs_of(self, task_id: str) -> list[Run]:
        return [r for r in self.runs() if r.task_id == task_id]

    def tails(self, n: int = 40) -> str:
        return self.pm.tails(n)


def settle(seconds: float = 1.5) -> None:
    """Give a duplicate that is still in flight a moment to land."""
    time.sleep(seconds)

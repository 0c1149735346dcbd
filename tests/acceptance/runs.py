"""Harness of the "know what ran" acceptance tests (issue #13): the cluster of
:mod:`~.missed` on the app :mod:`tests.acceptance.proj_runs`, with workers that
record their runs in the claims ledger.

What differs from :class:`~.missed.MissedCluster`: any number of workers, each
``prefork`` with a concurrency of its own (or ``solo``) and an environment of its
own (a ledger DSN that leads nowhere); every process logs JSON lines; the claims
are read with the run columns (``run_state``, ``started_at``, ``finished_at``,
``worker``, ``runtime``, ``run_error``), straight from the table; and the runs
table holds each task's own record of its execution (start, end, outcome), which
the tests hold against the ledger.
"""

from __future__ import annotations

import socket
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType

import psycopg
from psycopg import sql

from celery_elarion_beat.beat.purge import PURGE_JOB
from celery_elarion_beat.schedules.clock import as_utc
from celery_elarion_beat.store.records import ClaimRow
from celery_elarion_beat.testing._harness import ChildProcess, ProcessManager
from tests.acceptance import proj_runs
from tests.acceptance.cluster import (
    START_TIMEOUT,
    Analysis,
    delete_node_queues,
    header_problems,
    unclaimed_run,
)
from tests.acceptance.missed import MissedCluster

APP = "tests.acceptance.proj_runs"

#: the claims columns read, in ClaimRow's order
_CLAIM_COLUMNS = ("job_name", "occurrence_utc", "node", "task_id", "kind", "claimed_at",
                  "state", "published_at", "publish_error", "takeovers", "run_state",
                  "started_at", "finished_at", "worker", "runtime", "run_error")
_TIMES = {"occurrence_utc", "claimed_at", "published_at", "started_at", "finished_at"}


@dataclass(frozen=True)
class Run:
    """One execution, as the task recorded it (DB clock; ``outcome`` and
    ``finished_at`` are None while the body runs, or when it never ended)."""

    entry: str | None
    job: str | None
    occurrence: str | None
    node: str | None
    placement: str | None
    claim: str | None
    task_id: str
    worker: str | None
    pid: int | None
    outcome: str | None
    started_at: datetime
    finished_at: datetime | None


class RunsCluster(MissedCluster):
    """Beats ``node-1`` .. ``node-N`` and any workers of :mod:`tests.acceptance.proj_runs`."""

    proj = proj_runs

    def __init__(self, workdir: Path, *, pg_dsn: str, broker_url: str, schedule: str,
                 beats: int = 1, env: Mapping[str, str] | None = None) -> None:
        super().__init__(workdir, pg_dsn=pg_dsn, broker_url=broker_url, schedule=schedule,
                         beats=beats, env=env)
        #: the node of every worker: its node queue is this run's own
        self.worker_node = f"wk-{self.run_id}"
        # the node queues of this run only (beats are node-1 .. node-N in every run)
        self.env["ELARION_BEAT_NODE_QUEUE"] = f"elarion-runs-{self.run_id}.node.{{node}}"
        self.pm = ProcessManager(workdir, APP, self.env)
        self.workers: dict[str, ChildProcess] = {}

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._delete_node_queue()

    def _delete_node_queue(self) -> None:
        delete_node_queues(proj_runs.make_app, self.env, [self.worker_node, *self.lives],
                           main="elarion-runs-cleanup")

    # -- processes -----------------------------------------------------------

    def start_worker(self, label: str = "w1", concurrency: int | None = None,
                     env: Mapping[str, str] | None = None, wait: bool = True) -> ChildProcess:
        """A worker ``acc-<label>-<run id>@<host>``: ``prefork`` with *concurrency*
        children, or ``solo`` (the harness's default) without."""
        pool = ["--pool", "prefork", "--concurrency", str(concurrency)] if concurrency else []
        worker = self.pm.worker(f"acc-{label}-{self.run_id}", *pool,
                                env={"ELARION_ACC_NODE": self.worker_node, **(env or {})})
        self.workers[label] = self.worker = worker
        if wait:
            worker.wait_for_log(r"\bready\.", START_TIMEOUT)
        return worker

    def hostname(self, label: str) -> str:
        """The worker's host name (``<name>@<host>``), as it logged it."""
        record = self.workers[label].wait_for_record({"action": "node-queue"}, START_TIMEOUT)
        return str(record["worker"])

    def stop_worker(self) -> None:
        for worker in self.workers.values():
            worker.terminate()

    # -- data ----------------------------------------------------------------

    def claims(self) -> list[ClaimRow]:
        """Every claim row but the purge election's, with its run columns."""
        query = sql.SQL("SELECT {} FROM {} WHERE job_name <> %s ORDER BY occurrence_utc, "
                        "job_name").format(sql.SQL(", ").join(map(sql.Identifier,
                                                                   _CLAIM_COLUMNS)),
                                           sql.Identifier(self.claims_table))
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT to_regclass(%s)", [self.claims_table]).fetchone()
            if not exists or exists[0] is None:
                return []
            rows = conn.execute(query, [PURGE_JOB]).fetchall()
        out = []
        for row in rows:
            values = [as_utc(v) if name in _TIMES and v is not None else v
                      for name, v in zip(_CLAIM_COLUMNS, row, strict=True)]
            values[9] = int(values[9] or 0)
            out.append(ClaimRow(*values))
        return out

    def runs(self) -> list[Run]:  # type: ignore[override]
        query = sql.SQL("SELECT entry, job, occurrence, node, placement, claim, task_id, worker, "
                        "pid, outcome, started_at, finished_at FROM {} ORDER BY started_at, id"
                        ).format(sql.Identifier(self.runs_table))
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            return [Run(*row) for row in conn.execute(query)]

    def worker_records(self, label: str, **match: object) -> list[dict[str, object]]:
        return self.workers[label].records(**match)


# -- analysis ----------------------------------------------------------------


def check_executions(a: Analysis) -> None:
    """Each execution came with the headers of the claim it was sent for, and no task
    id ran twice (the runs table against the ledger)."""
    claim_by_task = {c.task_id: c for c in a.claims}
    for run in a.runs:
        claim = claim_by_task.get(run.task_id)
        if claim is None:
            a.fail(unclaimed_run(run))
            continue
        wrong = header_problems(run, claim)
        if wrong:
            a.fail(f"run {run.task_id} of {run.entry}: wrong headers: {', '.join(wrong)}")
    twice = {t: n for t, n in Counter(r.task_id for r in a.runs).items() if n > 1}
    if twice:
        a.fail(f"task ids executed more than once: {twice}")
    a.counts.update(claims=len(a.claims), runs=len(a.runs), duplicates=len(twice))


# -- a ledger that does not answer -------------------------------------------------


class DeadPort:
    """A PostgreSQL DSN on 127.0.0.1 where no database answers.

    ``refused``: a port nothing listens on (connections are refused at once);
    ``silent``: a socket that listens but never accepts, so a connection is
    established (or, once the backlog is full, left waiting) and never hears a
    word: the client waits for its connect timeout.
    """

    def __init__(self, mode: str) -> None:
        if mode not in ("refused", "silent"):
            raise ValueError(f"DeadPort mode {mode!r}: use 'refused' or 'silent'")
        self.mode = mode
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        if mode == "silent":
            self._sock.listen(1)
        else:
            self._sock.close()  # bound and released: nobody listens there

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/elarion_{uuid.uuid4().hex[:6]}"

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> DeadPort:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

"""Harness of the every-node acceptance tests: node pairs (beat + worker) on one broker.

Each node of a run has its own name (``en<i>-<run id>``, so leftover queues of
other runs never mix), its own ``celery beat`` and its own ``celery worker``,
both told the node through ``ELARION_ACC_NODE`` (-> ``app.conf``) or the
library's ``ELARION_BEAT_NODE`` fallback. The worker consumes the node queue
through the one-liner in :mod:`tests.acceptance.proj_every_node`.

Everything is named after one run id (default queue, claims / nodes / runs
tables, node names) and removed again by :meth:`EveryNodeRun.close`.

Beats and workers log JSON lines (``ELARION_BEAT_LOG_FORMAT=json``): what a beat
sent, and which node queue a worker consumes, are read from the records' fields
(``action``, ``job``, ``queue``, ``ts``), never from the text of a log line.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psycopg
from kombu import Connection, Exchange, Queue
from psycopg import sql

from celery_elarion_beat.observe.logformat import record_time
from tests.acceptance import proj_every_node as proj
from tests.helpers.processes import CeleryProcess, ProcessManager, wait_until

APP = "tests.acceptance.proj_every_node"

#: generous: a loaded 2-core machine may take long to import celery
START_TIMEOUT = 90.0

#: the documented defaults: queue name format and exchange of the node queues
NODE_QUEUE_FORMAT = "elarion.node.{node}"
NODE_EXCHANGE = "elarion.node"
DEFAULT_QUEUE_EXPIRES = 3600.0

#: celery's own "<hostname> ready." (its text is all celery offers)
READY_WORKER = r"\bready\."
#: celery 5.7 (celery/worker/request.py) for a message whose `expires` has passed
DISCARDED = "Discarding revoked task: " + proj.TASK + "["


def node_queue_name(node: str) -> str:
    return NODE_QUEUE_FORMAT.format(node=node)


def sends(beat: CeleryProcess, job: str) -> list[float]:
    """When *beat* sent *job*: its dispatched records (every-node sends are never claimed)."""
    return [record_time(r) for r in beat.records(action="dispatched", job=job)]


def wait_beat_ready(beat: CeleryProcess) -> dict[str, Any]:
    """Wait until *beat* has set up its schedule and claims store (its ``started`` record)."""
    return beat.wait_for_record({"action": "started"}, START_TIMEOUT)


def discarded(worker: CeleryProcess) -> list[dict[str, Any]]:
    """The worker's records of messages it dropped unexecuted (celery's own message)."""
    return [r for r in worker.records() if str(r["message"]).startswith(DISCARDED)]


def is_rabbitmq(broker_url: str) -> bool:
    return urlparse(broker_url).scheme.startswith(("amqp", "pyamqp"))


@dataclass(frozen=True)
class Run:
    entry: str | None
    job: str | None
    occurrence: str | None
    node: str | None          # header elarion_node (the sending beat's node)
    placement: str | None     # header elarion_placement
    claim: str | None         # header elarion_claim
    task_id: str
    worker: str | None        # the executing worker's hostname
    worker_node: str | None   # the executing worker's own node (its conf / environment)
    sent_at: float | None     # beat's time.time() when it published the message
    expires: str | None
    exchange: str | None
    routing_key: str | None
    executed_at: datetime


@dataclass
class Node:
    name: str
    via_conf: bool  # node set through app.conf (ELARION_ACC_NODE) or ELARION_BEAT_NODE
    beat: CeleryProcess | None = None
    worker: CeleryProcess | None = None

    @property
    def queue(self) -> str:
        return node_queue_name(self.name)

    @property
    def env(self) -> dict[str, str]:
        return {"ELARION_ACC_NODE" if self.via_conf else "ELARION_BEAT_NODE": self.name}

    def worker_prefix(self) -> str:
        return f"w-{self.name}"


class EveryNodeRun:
    """Node pairs of one test run on *broker_url*, claiming through *pg_dsn*."""

    def __init__(self, workdir: Path, *, pg_dsn: str, broker_url: str, schedule: str = "three",
                 env: Mapping[str, str] | None = None) -> None:
        self.run_id = uuid.uuid4().hex[:8]
        self.pg_dsn = pg_dsn
        self.broker_url = broker_url
        self.queue = f"elarion-en-{self.run_id}"
        self.claims_table = f"en_claims_{self.run_id}"
        self.nodes_table = f"en_nodes_{self.run_id}"
        self.runs_table = f"en_runs_{self.run_id}"
        self.env = {
            "ELARION_ACC_BROKER": broker_url,
            "ELARION_ACC_QUEUE": self.queue,
            "ELARION_ACC_CLAIMS_DSN": pg_dsn,
            "ELARION_ACC_CLAIMS_TABLE": self.claims_table,
            "ELARION_BEAT_NODES_TABLE": self.nodes_table,
            "ELARION_ACC_RUNS_DSN": pg_dsn,
            "ELARION_ACC_RUNS_TABLE": self.runs_table,
            "ELARION_ACC_SCHEDULE": schedule,
            "ELARION_BEAT_LOG_FORMAT": "json",
            **(env or {}),
        }
        self.pm = ProcessManager(workdir, APP, self.env)
        self.nodes: dict[str, Node] = {}
        self._tables_made = False

    # -- setup / teardown ----------------------------------------------------

    def node(self, i: int, via_conf: bool = False) -> Node:
        node = Node(f"en{i}-{self.run_id}", via_conf)
        self.nodes[node.name] = node
        return node

    def prepare(self) -> None:
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL(proj.RUNS_TABLE_DDL).format(table=sql.Identifier(self.runs_table)))
        self._tables_made = True

    def close(self) -> None:
        """Stop every process, then drop the tables and the queues (best effort)."""
        try:
            self.pm.stop_all()
        finally:
            if self._tables_made:
                with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
                    for table in (self.runs_table, self.claims_table, self.nodes_table):
                        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                            sql.Identifier(table)))
            delete_queues(self.broker_url, [self.queue], [n.queue for n in self.nodes.values()])

    # -- processes -----------------------------------------------------------

    def start_worker(self, node: Node, *args: str, suffix: str = "",
                     env: Mapping[str, str] | None = None) -> CeleryProcess:
        node.worker = self.pm.worker(node.worker_prefix() + suffix, *args,
                                     env={**node.env, **(env or {})})
        return node.worker

    def start_beat(self, node: Node, env: Mapping[str, str] | None = None) -> CeleryProcess:
        node.beat = self.pm.beat(f"beat-{node.name}", env={**node.env, **(env or {})})
        return node.beat

    @staticmethod
    def wait_worker_ready(node: Node) -> str:
        """Wait for the worker to say it consumes the node queue and to be ready; its name."""
        assert node.worker is not None
        found = node.worker.wait_for_record({"action": "node-queue", "queue": node.queue},
                                            START_TIMEOUT)
        node.worker.wait_for_log(READY_WORKER, START_TIMEOUT)
        return str(found["worker"])

    # -- data ----------------------------------------------------------------

    def runs(self) -> list[Run]:
        query = sql.SQL("SELECT entry, job, occurrence, node, placement, claim, task_id, worker, "
                        "worker_node, sent_at, expires, exchange, routing_key, executed_at "
                        "FROM {} ORDER BY id").format(sql.Identifier(self.runs_table))
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            return [Run(*row) for row in conn.execute(query)]

    def claimed_jobs(self) -> dict[str, int]:
        """Job name -> number of claim rows (every-node entries must have none)."""
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute("SELECT to_regclass(%s)", (self.claims_table,)).fetchone()
            if not exists or exists[0] is None:
                return {}
            query = sql.SQL("SELECT job_name, count(*) FROM {} GROUP BY job_name").format(
                sql.Identifier(self.claims_table))
            return {job: n for job, n in conn.execute(query)}

    def wait_runs(self, predicate: Callable[[list[Run]], object], timeout: float,
                  what: str) -> list[Run]:
        """Poll the runs table until *predicate(runs)* holds."""
        last: list[Run] = []

        def check() -> bool:
            nonlocal last
            last = self.runs()
            return bool(predicate(last))

        wait_until(check, timeout, interval=0.5,
                   message=lambda: f"{what} ({len(last)} runs so far)\n{self.tails()}")
        return last

    def wait_quiet(self, quiet: float = 2.5, timeout: float = 30.0) -> list[Run]:
        """Wait until no new run has landed for *quiet* seconds (the workers drained)."""
        deadline = time.monotonic() + timeout
        count, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            runs = self.runs()
            if len(runs) != count:
                count, since = len(runs), time.monotonic()
            elif time.monotonic() - since >= quiet:
                return runs
            time.sleep(0.5)
        return self.runs()

    def tails(self, n: int = 30) -> str:
        return self.pm.tails(n)


# -- the broker --------------------------------------------------------------


def kombu_node_queue(name: str, expires: float = DEFAULT_QUEUE_EXPIRES) -> Queue:
    """A node queue as the documentation describes it (for cleanup and probes)."""
    return Queue(name, Exchange(NODE_EXCHANGE, type="direct", durable=True), routing_key=name,
                 durable=True, auto_delete=False,
                 queue_arguments={"x-expires": int(expires * 1000)})


def delete_queues(broker_url: str, queues: Iterable[str], node_queues: Iterable[str]) -> None:
    """Delete a run's queues (never the shared ``elarion.node`` exchange); best effort."""
    names = [*queues, *node_queues]
    try:
        with Connection(broker_url, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=2)
            if is_rabbitmq(broker_url):
                for name in names:
                    try:
                        conn.default_channel.queue_delete(name)
                    except Exception:  # noqa: BLE001 - cleanup must never fail a test
                        conn.close()
                        conn.ensure_connection(max_retries=2)
                for name in queues:  # the run's own default exchange
                    try:
                        conn.default_channel.exchange_delete(name)
                    except Exception:  # noqa: BLE001
                        conn.close()
                        conn.ensure_connection(max_retries=2)
                return
            channel = conn.default_channel
            # the virtual transport deletes the bindings it knows: declare, then delete
            for name in queues:
                bound = Queue(name, Exchange(name, type="direct"), routing_key=name)(channel)
                bound.declare()
                bound.delete()
            for name in node_queues:
                bound = kombu_node_queue(name)(channel)
                bound.declare()
                bound.delete()
    except Exception:  # noqa: BLE001
        pass

"""A real cluster for the live-schedules tests: beats and a worker of :mod:`.proj_live`,
and the check of what they did against the revision history.

Everything is named after one run id (queue, claims table and its neighbours, among
them the entries tables, and the runs table) and removed by :meth:`LiveCluster.close`.
Entries are written from the test process (the API, on an app of the beats' main name,
so the same cluster) or with the real CLI (:meth:`LiveCluster.cli`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from celery_elarion_beat.config.live_entries import live_cluster
from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.schedules.slots import recent_slots
from celery_elarion_beat.store import ClaimStore, open_store
from celery_elarion_beat.store.entry_records import EntryRevision, governing
from celery_elarion_beat.store.records import ClaimRow
from celery_elarion_beat.testing._harness import (
    ChildProcess,
    ProcessManager,
    claims_tables,
    clean_env,
    drop_tables,
    read_claims,
    wait_until,
)
from tests.acceptance import proj_live as proj
from tests.acceptance.cluster import READY, START_TIMEOUT, delete_queue

APP = "tests.acceptance.proj_live"
UTC = timezone.utc
ROOT = Path(__file__).parents[2]


@dataclass(frozen=True)
class Run:
    entry: str | None
    occurrence: str | None
    node: str | None
    task_id: str
    args: list[Any]
    executed_at: datetime


class LiveCluster:
    """*beats* beat nodes (``node-1`` ...) and one worker of :mod:`.proj_live`."""

    def __init__(self, workdir: Path, *, pg_dsn: str, broker_url: str,
                 claims_dsn: str | None = None, beats: int = 3,
                 beat_claims_dsn: str | None = None) -> None:
        self.run_id = uuid.uuid4().hex[:10]
        self.pg_dsn = pg_dsn
        self.claims_dsn = claims_dsn or pg_dsn
        self.queue = f"elarion-live-{self.run_id}"
        self.claims_table = f"live_claims_{self.run_id}"
        self.runs_table = f"live_runs_{self.run_id}"
        self.env = {
            "ELARION_ACC_BROKER": broker_url,
            "ELARION_ACC_QUEUE": self.queue,
            "ELARION_ACC_CLAIMS_DSN": self.claims_dsn,
            "ELARION_ACC_CLAIMS_TABLE": self.claims_table,
            "ELARION_ACC_RUNS_DSN": pg_dsn,
            "ELARION_ACC_RUNS_TABLE": self.runs_table,
        }
        #: the beats' own DSN (a proxy in front of the database, say)
        self.beat_env = {"ELARION_ACC_CLAIMS_DSN": beat_claims_dsn} if beat_claims_dsn else {}
        self.n_beats = beats
        self.workdir = workdir
        self.pm = ProcessManager(workdir, APP, self.env)
        self.beats: dict[str, ChildProcess] = {}
        self.worker: ChildProcess | None = None
        self.app = proj.make_app(self.env)  # the beats' main name: the same cluster
        self.settings = Settings.from_app(self.app)
        self.cluster = live_cluster(self.settings, self.app)
        self.store: ClaimStore = open_store(self.settings)
        self._made = False

    # -- setup / teardown ---------------------------------------------------------

    def start(self) -> None:
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL(proj.RUNS_TABLE_DDL).format(
                table=sql.Identifier(self.runs_table)))
        self._made = True
        self.store.ensure_schema()  # the entries tables, as init-db makes them
        with self.app.connection_for_write() as conn:
            self.app.amqp.TaskConsumer(conn).purge()
        self.worker = self.pm.worker(f"live-worker-{self.run_id}")
        self.worker.wait_for_log(r"\bready\.", START_TIMEOUT)
        for i in range(1, self.n_beats + 1):
            node = f"node-{i}"
            self.beats[node] = self.pm.beat(f"beat-{node}",
                                            env={"ELARION_ACC_NODE": node, **self.beat_env})
        for beat in self.beats.values():
            beat.wait_for_log(READY, START_TIMEOUT)
            beat.wait_for_log(r"beat: \d+ database entries at version", START_TIMEOUT)

    def close(self) -> None:
        try:
            self.pm.stop_all()
        finally:
            self.store.close()
            self.app.close()
            if self._made:
                drop_tables(self.pg_dsn, self.runs_table)
                drop_tables(self.claims_dsn, *claims_tables(self.claims_table))
            delete_queue(self.env)

    def stop_beats(self) -> float:
        mark = time.time()
        for beat in self.beats.values():
            beat.sigterm()
        for beat in self.beats.values():
            beat.terminate(20.0, sigterm=False)
        return mark

    def tails(self, n: int = 40) -> str:
        return self.pm.tails(n)

    # -- writes -------------------------------------------------------------------

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """``celery -A tests.acceptance.proj_live elarion-beat schedule ...`` as a process."""
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "elarion-beat", "schedule", *args],
            env=clean_env({**self.env, **(env or {}), "PYTHONPATH": str(ROOT)}), cwd=ROOT,
            capture_output=True, text=True, timeout=120)

    # -- what happened ------------------------------------------------------------

    def claims(self, job: str | None = None) -> list[ClaimRow]:
        return [c for c in read_claims(self.claims_dsn, self.claims_table)
                if job is None or c.job == job]

    def runs(self, entry: str | None = None) -> list[Run]:
        query = sql.SQL("SELECT entry, occurrence, node, task_id, args, executed_at FROM {} "
                        "ORDER BY id").format(sql.Identifier(self.runs_table))
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            rows = [Run(e, o, n, t, json.loads(a or "[]"), x)
                    for e, o, n, t, a, x in conn.execute(query)]
        return [r for r in rows if entry is None or r.entry == entry]

    def history(self, name: str) -> list[EntryRevision]:
        return sorted(self.store.entry_history(self.cluster, name, 10_000),
                      key=lambda r: r.revision)

    def drain(self, seconds: float = 20.0) -> None:
        """Wait until every claim has run (or *seconds* passed), then a moment more."""
        def done() -> bool:
            ran = {r.task_id for r in self.runs()}
            return {c.task_id for c in self.claims() if c.state != "skipped"} <= ran
        try:
            wait_until(done, seconds, interval=0.5, message="the worker to drain")
        except AssertionError:
            pass  # the check names what is missing
        time.sleep(1.0)


@dataclass
class Verdict:
    """Every occurrence of an entry over a span, against the revision that governs it."""

    expected: dict[datetime, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"{len(self.expected)} slots expected; problems: {self.problems or 'none'}"


def check(c: LiveCluster, name: str, start: datetime, end: datetime) -> Verdict:
    """Each slot in ``[start, end)`` of the revision that governs it (the latest written
    of those effective at or before it) claimed exactly once, under that revision, and
    run exactly once with its arguments; no other slot claimed, none run twice."""
    history = c.history(name)
    verdict = Verdict()
    for rev in history:
        if rev.removed or not rev.definition.enabled:
            continue
        sched = rev.definition.schedule.build(c.app)
        later = [r.effective_at for r in history if r.revision > rev.revision]
        span_end = min([end, *later])
        span_start = max(start, rev.effective_at)
        if span_start >= span_end:
            continue
        for slot in recent_slots(name, sched, span_end - timedelta(microseconds=1),
                                 span_start, 10_000):
            found = governing(history, slot)
            if found is not None and found.revision == rev.revision:
                verdict.expected[slot] = rev.revision
    claims = {cl.occurrence: cl for cl in c.claims(name) if start <= cl.occurrence < end}
    runs = Counter(r.task_id for r in c.runs(name))
    args = {r.task_id: r.args for r in c.runs(name)}
    by_rev = {r.revision: r for r in history}
    for slot, revision in sorted(verdict.expected.items()):
        claim = claims.get(slot)
        if claim is None:
            verdict.problems.append(f"{slot:%H:%M:%S} lost (revision {revision})")
            continue
        if claim.revision != revision:
            verdict.problems.append(f"{slot:%H:%M:%S} claimed under revision "
                                    f"{claim.revision}, governed by {revision}")
        if runs[claim.task_id] != 1:
            verdict.problems.append(f"{slot:%H:%M:%S} ran {runs[claim.task_id]} times")
        elif args[claim.task_id] != list(by_rev[revision].definition.args):
            verdict.problems.append(f"{slot:%H:%M:%S} ran with {args[claim.task_id]}, "
                                    f"revision {revision} says "
                                    f"{list(by_rev[revision].definition.args)}")
    for slot, claim in sorted(claims.items()):
        if slot not in verdict.expected:
            verdict.problems.append(f"{slot:%H:%M:%S} claimed (revision {claim.revision}) "
                                    "though no revision governs a slot there")
    return verdict

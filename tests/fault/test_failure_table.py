"""Fault proofs for the rows of the failure-mode table (docs/design.md) that had no test
with real processes: real ``celery beat``, ``celery worker`` and ``celery elarion-beat``
processes of :mod:`tests.fault.proj_table` on the real PostgreSQL and Redis.

One cluster serves most rows (:class:`TableCluster`): five beats (two of them under
one node name, ``twin``; ``cut``, whose claims DSN goes through a TCP proxy; ``spare``;
``victim``) and one worker that runs every beat's every-node entries too.

* two nodes start at once: the five beats are launched together on an empty database
  while the test holds the DDL advisory lock, so all five wait on it at the same time
  and are released together: the tables are made once, no beat fails, every beat
  claims;
* dead nodes pile up: thousands of node rows not seen for two days go at the next
  heartbeats, the dead ones inside the retention stay;
* two nodes share a node name / the reply is lost: the server connections of both
  ``twin`` beats are terminated again and again; no slot runs twice;
* a node reaches the broker but not the database: the proxy of ``cut`` is cut; ``cut``
  keeps sending its every-node runs and skips every cluster slot as ``claim-error``,
  which the other nodes claim and run once; in the same outage, a pause read before it
  holds on ``cut``, a pause written during it applies on ``cut`` once the database is
  back, and the operator's ``pause`` and ``trigger`` through the cut DSN fail (exit 1)
  and change nothing;
* the broker is down when an operator triggers: ``trigger`` exits 1, the manual claim
  is ``failed`` with the error, the audit keeps the attempt, no beat takes it over (the
  job is ``at_least_once``), and a new trigger runs it once;
* a node stops while a jittered slot waits for its offset: ``spare`` gets SIGTERM
  after the slot and before its offset; another node claims the slot at the offset,
  and it runs once;
* a node crashes: ``kill -9`` of ``victim``; ``status --json`` shows it dead after
  elarion_beat_node_timeout and the others run its slots once.

Three rows run processes of their own: a beat started (on a faked wall clock) inside
the repeated daylight-saving hour of Europe/Berlin does not busy-loop and handles each
slot once; beats SIGTERMed while their server connection runs a statement exit
cleanly, without a traceback and without losing a claim they won; a real Flower
answers 503 without the claims database and 502 without the broker.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from zoneinfo import ZoneInfo

import celery
import psycopg
import pytest
from celery import Celery
from celery.schedules import crontab
from packaging.version import Version
from psycopg import sql

from celery_elarion_beat.config.jitter import jitter_offset
from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.observe.logformat import record_time
from celery_elarion_beat.store.pg_claim import lock_namespace
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.testing._harness import (
    ChildProcess,
    ProcessManager,
    claims_tables,
    drop_tables,
    read_claims,
    sleep_until,
    wait_until,
)
from tests.acceptance.cluster import START_TIMEOUT, delete_node_queues, delete_queue, iso, utc
from tests.acceptance.proj import PUBLISH_TIMEOUT, QUICK_LIVENESS
from tests.acceptance.runs import RunsCluster
from tests.fault import proj_table
from tests.fault.faketime import faked_env
from tests.fault.proj_table import (
    DST_MINUTE_JOB,
    DST_REPEATED_JOB,
    EVERY_NODE_JOB,
    JITTER,
    JITTER_JOB,
    LATE_PAUSE_JOB,
    MANUAL_JOB,
    STEADY_JOB,
)
from tests.helpers.ports import free_port
from tests.helpers.tcpproxy import TcpProxy

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# a module cluster of five beats, a worker and a proxy
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("failure-table")]

APP = "tests.fault.proj_table"
UTC = timezone.utc

#: node names of this run: the tests find and kill the beats' server connections by
#: ``application_name``, which must never reach another run's (or another worker's)
_RUN = uuid.uuid4().hex[:6]
TWIN, CUT, SPARE, VICTIM = (f"{name}-{_RUN}" for name in ("twin", "cut", "spare", "victim"))
#: beat process label -> its node name (two processes share ``twin``)
BEATS = {"twin.a": TWIN, "twin.b": TWIN, CUT: CUT, SPARE: SPARE, VICTIM: VICTIM}
SLOT = 2.0
#: the edges of a cut or a kill where a claim may still (or already) go through
EDGE = 1.0
#: a pause is read at the next tick: a slot up to this long after it may still be sent
SLACK = 2 * SLOT + 0.5
#: the start race holds the DDL lock until every beat waits on it; the beats' lock
#: timeout (= elarion_beat_claim_timeout) must outlast a slow start of the last one
RACE_CLAIM_TIMEOUT = 150.0
#: generous: a command is a Python process importing Celery on a loaded 2-core machine
CLI_TIMEOUT = 120.0



def through(proxy: TcpProxy, dsn: str) -> str:
    """*dsn* with its host and port replaced by the proxy's."""
    url = urlparse(dsn)
    netloc = f"{url.username}@" if url.username else ""
    return url._replace(netloc=f"{netloc}{proxy.host}:{proxy.port}").geturl()


def table_exists(dsn: str, name: str) -> bool:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT to_regclass(%s)", [name]).fetchone()
    return bool(row and row[0])


def kill_backends(dsn: str, node: str) -> int:
    """Terminate the server connections of the beats named *node* (a failover)."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = %s AND datname = current_database()",
                            [f"celery-elarion-beat {node}"]).fetchall()
    return sum(1 for (done,) in rows if done)


def kill_mid_claim(dsn: str, node: str, timeout: float) -> bool:
    """Terminate a server connection of the beats named *node* while it runs a claim
    statement (its reply is lost); False if none was caught running within *timeout*."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE state = "
                "'active' AND application_name = %s AND datname = current_database() "
                "AND query LIKE %s LIMIT 1",
                [f"celery-elarion-beat {node}", "%input AS%"]).fetchone()
            if row and row[0]:
                return True
            time.sleep(0.002)
    return False


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of *pid* (from /proc; Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Cli:
    """One ``celery elarion-beat`` command, run to its end."""

    args: tuple[str, ...]
    rc: int | None
    output: str
    started: float
    returned: float

    def __str__(self) -> str:
        return f"`elarion-beat {' '.join(self.args)}` rc {self.rc}:\n{self.output[-3000:]}"


# -- the cluster ---------------------------------------------------------------------


class TableCluster(RunsCluster):
    """The beats of :data:`BEATS` and one worker of :mod:`tests.fault.proj_table`."""

    proj = proj_table

    def __init__(self, workdir: Path, *, pg_dsn: str, broker_url: str,
                 proxy: TcpProxy) -> None:
        super().__init__(workdir, pg_dsn=pg_dsn, broker_url=broker_url, schedule="cluster",
                         beats=0, env={"ELARION_TABLE_CLAIM_TIMEOUT": str(RACE_CLAIM_TIMEOUT)})
        self.pm = ProcessManager(workdir, APP, self.env)
        self.proxy = proxy
        self.proxy_dsn = through(proxy, pg_dsn)
        settings = Settings.from_mapping({"elarion_beat_table": self.claims_table})
        self.nodes_table = settings.nodes_table
        self.pauses_table = settings.pauses_table
        self.audit_table = settings.audit_table
        #: what the start race observed: beats waiting on the DDL lock when released
        self.race_waiters = 0
        self.released_at = 0.0
        #: beats a test stopped on purpose
        self.stopped: set[str] = set()
        self._clis = 0

    def _delete_node_queue(self) -> None:
        delete_node_queues(proj_table.make_app, self.env, [self.worker_node, *self.lives],
                           main="elarion-table-cleanup")

    def launch(self) -> None:
        """Start every beat of :data:`BEATS` at once, without waiting."""
        for label, node in BEATS.items():
            env = {"ELARION_ACC_NODE": node}
            if label == CUT:
                env["ELARION_ACC_CLAIMS_DSN"] = self.proxy_dsn
            self.lives[node] = 1
            self.beats[label] = self.pm.beat(f"beat-{label}", env=env)

    def beat_records(self, label: str, **match: Any) -> list[dict[str, Any]]:
        return self.beats[label].records(**match)

    def cli(self, *commands: Sequence[str], env: Mapping[str, str] | None = None,
            envs: Sequence[Mapping[str, str] | None] | None = None) -> list[Cli]:
        """Run each of *commands* (``elarion-beat`` arguments) as its own process, all at
        once (with *env*, or each with its own of *envs*); what each printed and when it
        returned."""
        processes = []
        for i, args in enumerate(commands):
            self._clis += 1
            own = envs[i] if envs is not None else env
            processes.append(self.pm.celery(f"cli-{self._clis}-{args[0]}",
                                            ["elarion-beat", *args], env=own))
        started = time.time()
        returned: dict[str, float] = {}
        deadline = time.monotonic() + CLI_TIMEOUT
        while len(returned) < len(processes) and time.monotonic() < deadline:
            for process in processes:
                if process.name not in returned and not process.alive():
                    returned[process.name] = time.time()
            time.sleep(0.05)
        out = []
        for args, process in zip(commands, processes, strict=True):
            rc = process.returncode if process.name in returned else process.terminate(1.0)
            out.append(Cli(tuple(args), rc, process.log(), started,
                           returned.get(process.name, time.time())))
        return out

    def rows(self, table: str, order: str = "1") -> list[dict[str, Any]]:
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            if not conn.execute("SELECT to_regclass(%s)", [table]).fetchone()[0]:  # type: ignore[index]
                return []
            cursor = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY " + order).format(
                sql.Identifier(table)))
            names = [c.name for c in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor]

    def settle(self, before: float) -> None:
        """Wait until every claim published before *before* has run (or 30 s), and a
        moment more: a duplicate has time to land."""
        def done() -> bool:
            ran = self.run_counts()
            return all(ran[c.task_id] for c in self.claims()
                       if c.state == "published" and c.claimed_at.timestamp() < before)

        try:
            wait_until(done, 30, interval=0.5)
        except AssertionError:
            pass  # the assertions name what did not run
        time.sleep(1.0)

    def run_counts(self) -> Counter[str]:
        return Counter(r.task_id for r in self.runs())

    def wait_for(self, what: str, check: Any, timeout: float = 30.0) -> Any:
        return wait_until(check, timeout, interval=0.3,
                          message=lambda: f"{what}\n{self.tails(40)}")


def ddl_waiters(dsn: str) -> int:
    """This module's beats whose connections wait on an advisory lock right now."""
    names = [f"celery-elarion-beat {node}" for node in set(BEATS.values())]
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND wait_event = 'advisory' AND application_name = ANY(%s) "
            "AND datname = current_database()", [names]).fetchone()
    return int(row[0]) if row else 0


def first_claims(cluster: TableCluster) -> bool:
    """Every beat has been through a claim of the cluster entry (won or lost)."""
    for label in BEATS:
        seen = [r for r in cluster.beat_records(label, job=STEADY_JOB)
                if r.get("action") in ("dispatched", "skipped")]
        if not seen:
            return False
    return True


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Where a test's own child processes write their logs."""
    path = tmp_path / "procs"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str,
          redis_url: str) -> Iterator[TableCluster]:
    """The module's cluster, started as a race: four beats launched at once on an empty
    database, each held on the DDL lock until all four wait there, then released."""
    workdir = tmp_path_factory.mktemp("table") / "procs"
    workdir.mkdir()
    target = urlparse(pg_dsn)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    cluster = TableCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, proxy=proxy)
    try:
        cluster.prepare()
        assert not table_exists(pg_dsn, cluster.claims_table)
        with psycopg.connect(pg_dsn, autocommit=True, connect_timeout=10) as gate:
            key = lock_namespace(cluster.claims_table)
            gate.execute("SELECT pg_advisory_lock(%s, 0)", [key])
            cluster.launch()
            cluster.race_waiters = wait_until(
                lambda: (n := ddl_waiters(pg_dsn)) >= len(BEATS) and n,
                RACE_CLAIM_TIMEOUT - 30, interval=0.2,
                message=lambda: f"{len(BEATS)} beats waiting on the DDL lock "
                                f"({ddl_waiters(pg_dsn)} do)\n{cluster.tails(20)}")
            cluster.released_at = time.time()
            gate.execute("SELECT pg_advisory_unlock(%s, 0)", [key])
        cluster.start_worker("w1", env={"ELARION_ACC_CONSUME_NODES": ",".join(set(BEATS.values()))})
        cluster.wait_for("every beat's first claim", lambda: first_claims(cluster),
                         START_TIMEOUT)
        yield cluster
    finally:
        try:
            cluster.close()
        finally:
            proxy.stop()


# -- two nodes start at once ---------------------------------------------------------


def test_nodes_started_together_on_an_empty_database_make_the_tables_once_and_claim(
        table: TableCluster) -> None:
    """All four beats were waiting on the DDL lock at the same instant (observed in
    pg_stat_activity) and were released together: each made or found the tables without
    an error, each is alive and claims, and the cluster entry runs once per slot."""
    assert table.race_waiters >= len(BEATS), table.race_waiters
    entries = ("_entries", "_revisions", "_versions")  # with elarion_beat_db_entries only
    for name in claims_tables(table.claims_table):
        assert table_exists(table.pg_dsn, name) != name.endswith(entries), \
            f"{name}: made without database entries" if name.endswith(entries) \
            else f"{name} was not created"
    for label, beat in table.beats.items():
        assert beat.alive() or label in table.stopped, beat.tail()
        errors = beat.records(level="ERROR") + beat.records(level="CRITICAL")
        assert not errors and not beat.lines("Traceback"), beat.tail(60)
        assert beat.records(action="started"), label
    time.sleep(3 * SLOT)  # a few slots after every beat's first claim
    table.settle(time.time() - SLOT)
    steady = [c for c in table.claims() if c.job == STEADY_JOB
              and c.claimed_at.timestamp() > table.released_at]
    counts = table.run_counts()
    assert steady, "no slot of the cluster entry was claimed after the race"
    assert {c.node for c in steady} <= set(BEATS.values())
    twice = [t for t, n in counts.items() if n > 1]
    assert not twice, f"task ids run more than once: {twice}"
    unrun = [iso(c.occurrence) for c in steady if c.state == "published"
             and c.claimed_at.timestamp() < time.time() - 2 * SLOT and counts[c.task_id] != 1]
    assert not unrun, f"claimed slots that did not run once: {unrun}"


# -- dead nodes pile up --------------------------------------------------------------


def test_dead_nodes_are_deleted_by_the_heartbeats_of_the_live_ones(
        table: TableCluster) -> None:
    """3,000 node rows last seen two days ago (older than elarion_beat_node_retention,
    24 h) are deleted by the live beats' heartbeats; 50 rows seen an hour ago (dead, but
    inside the retention) and the live nodes stay."""
    old, recent = 3000, 50
    with psycopg.connect(table.pg_dsn, autocommit=True, connect_timeout=10) as conn:
        columns = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "AND column_name NOT IN ('node', 'last_seen') ORDER BY ordinal_position",
            [table.nodes_table])]
        cols = sql.SQL(", ").join(map(sql.Identifier, columns))
        insert = sql.SQL(
            "INSERT INTO {t} (node, last_seen, {cols}) SELECT %s::text || g::text, "
            "now() - %s::interval, "
            "{cols} FROM {t}, generate_series(1, %s) g WHERE node = %s").format(
                t=sql.Identifier(table.nodes_table), cols=cols)
        try:
            conn.execute(insert, ["pod-old-", "2 days", old, SPARE])
            conn.execute(insert, ["pod-recent-", "1 hour", recent, SPARE])

            def counts() -> tuple[int, int]:
                row = conn.execute(sql.SQL(
                    "SELECT count(*) FILTER (WHERE node LIKE 'pod-old-%%'), "
                    "count(*) FILTER (WHERE node LIKE 'pod-recent-%%') FROM {}").format(
                        sql.Identifier(table.nodes_table))).fetchone()
                return int(row[0]), int(row[1])  # type: ignore[index]

            inserted = counts()
            assert inserted == (old, recent), f"the dead rows were not written: {inserted}"
            started = time.monotonic()
            table.wait_for("the heartbeats to delete the nodes dead for two days",
                           lambda: counts()[0] == 0, 60)
            took = time.monotonic() - started
            assert counts() == (0, recent)
            live = {r["node"] for r in table.rows(table.nodes_table)}
            assert {TWIN, CUT, SPARE} <= live, live
            print(f"\n{old} dead node rows deleted {took:.1f}s after they were written")
        finally:
            conn.execute(sql.SQL("DELETE FROM {} WHERE node LIKE 'pod-%%'").format(
                sql.Identifier(table.nodes_table)))
    for label, beat in table.beats.items():
        if beat.alive():
            assert not beat.records(level="ERROR"), (label, beat.tail(40))


def logged_within(records: list[dict[str, Any]], lo: float, hi: float) -> list[dict[str, Any]]:
    """The records logged within [lo, hi] (epoch seconds): every-node runs have no
    occurrence, only the time they were sent."""
    return [r for r in records if lo <= record_time(r) <= hi]


# -- two nodes share a node name; the reply is lost ----------------------------------


def test_two_beats_under_one_node_name_send_each_slot_once_while_their_connections_die(
        table: TableCluster) -> None:
    """Both ``twin`` beats lose their server connections again and again: eight times
    every pooled connection (the next claim of each twin finds its connection dead and is
    retried on a fresh one), and three times the connection of a twin caught running a
    claim statement (its reply is lost; the retry counts as won only the rows of its own
    claim token). No task id and no slot runs twice, and both twins keep claiming."""
    kills, mid_claim = [], []
    first = time.time()
    for i in range(8):
        if i % 3 == 0:
            mid_claim.append(kill_mid_claim(table.pg_dsn, TWIN, 10))
        kills.append(kill_backends(table.pg_dsn, TWIN))
        time.sleep(1.3)
    last = time.time()
    def claiming_again(label: str) -> list[dict[str, Any]]:
        return [r for r in table.beat_records(label, job=STEADY_JOB)
                if r.get("action") in ("dispatched", "skipped") and record_time(r) > last]

    for label in ("twin.a", "twin.b"):
        table.wait_for(f"{label} to claim again after the kills",
                       partial(claiming_again, label), 60)
    time.sleep(2 * SLOT)
    table.settle(time.time() - SLOT)
    # a kill right after another may find no connection to end (the pool reconnects lazily)
    assert sum(kills) >= 6, f"the twins' connections were not terminated: {kills}"
    assert any(mid_claim), f"no claim of a twin was caught running: {mid_claim}"
    claims = [c for c in table.claims() if c.job == STEADY_JOB
              and first - EDGE < c.claimed_at.timestamp()]
    runs = [r for r in table.runs() if r.entry == STEADY_JOB]
    by_task = Counter(r.task_id for r in runs)
    by_slot = Counter(r.occurrence for r in runs)
    assert not [t for t, n in by_task.items() if n > 1], by_task.most_common(3)
    assert not [s for s, n in by_slot.items() if n > 1], by_slot.most_common(3)
    twin_won = [c for c in claims if c.node == TWIN]
    for label in ("twin.a", "twin.b"):
        during = logged_within(table.beat_records(label, job=STEADY_JOB), first, last)
        assert during, f"{label} claimed nothing while its connections died"
    unrun = [iso(c.occurrence) for c in claims if c.state == "published"
             and by_task[c.task_id] != 1 and c.claimed_at.timestamp() < time.time() - 3]
    assert not unrun, f"published slots that did not run once: {unrun}"
    for label in ("twin.a", "twin.b"):
        assert table.beats[label].alive(), table.beats[label].tail()
        assert not table.beats[label].lines("Traceback"), table.beats[label].tail(60)
    print(f"\nkills: {kills}, mid-claim: {mid_claim}; {len(claims)} slots claimed, "
          f"{len(twin_won)} by the twins")


# -- a node reaches the broker but not the database ------------------------------------


def occurrences(records: list[dict[str, Any]], lo: float, hi: float) -> list[str]:
    """The ``occurrence`` of each record whose slot is within [lo, hi] (epoch seconds)."""
    out = []
    for r in records:
        occ = r.get("occurrence")
        if occ and lo <= datetime.fromisoformat(occ.replace("Z", "+00:00")).timestamp() <= hi:
            out.append(occ)
    return sorted(out)


def grid(lo: float, hi: float) -> list[str]:
    return [iso(utc(t)) for t in range(int(math.ceil(lo / SLOT) * SLOT), int(hi) + 1, 2)]


def test_a_node_cut_from_the_database_sends_its_every_node_entries_and_skips_the_rest(
        table: TableCluster) -> None:
    """``cut`` loses the claims database (its proxy resets every connection) while the
    broker stays: it keeps sending its every-node runs (the worker runs them) and skips
    every cluster slot as ``claim-error``, which the other nodes claim, once each. Inside
    the same outage: ``tbl-every-node-2s``, paused before it, stays paused on ``cut``;
    ``tbl-every-node-late-2s``, paused during it, is still sent by ``cut`` (it cannot
    read the pause) and stops once the database is back; ``pause`` and ``trigger``
    through the cut DSN exit 1 and change nothing."""
    cut_beat = table.beats[CUT]
    try:
        table.cli(("pause", EVERY_NODE_JOB, "--reason", "before-outage"))
        table.wait_for("cut to skip the paused every-node entry", lambda: table.beat_records(
            CUT, action="skipped", job=EVERY_NODE_JOB, reason="paused"))
        reset = table.proxy.cut()
        cut_at = time.time()
        table.wait_for("cut to report the outage", lambda: table.beat_records(
            CUT, action="claims-unavailable"))
        down = {"ELARION_ACC_CLAIMS_DSN": table.proxy_dsn}
        late, db_pause, db_trigger = table.cli(
            ("pause", LATE_PAUSE_JOB, "--reason", "during-outage"),
            ("pause", STEADY_JOB, "--reason", "db-down"),
            ("trigger", MANUAL_JOB, "--reason", "db-down"),
            envs=[None, down, down])
        assert late.rc == 0, str(late)
        sleep_until(max(cut_at + 12, late.returned + 3 * SLOT + SLACK))
        table.proxy.restore()
        restored = time.time()
        table.wait_for("cut to recover", lambda: table.beat_records(
            CUT, action="claims-recovered"), 60)
        stopped = table.wait_for("cut to skip the late pause after the outage", lambda: [
            r for r in table.beat_records(CUT, action="skipped", job=LATE_PAUSE_JOB,
                                          reason="paused")
            if record_time(r) > restored], 60)
        after_pause_read = record_time(stopped[0])
        time.sleep(2 * SLOT)
        table.settle(time.time() - SLOT)
    finally:
        table.proxy.restore()
        resumed = time.time()
        table.cli(("resume", EVERY_NODE_JOB), ("resume", LATE_PAUSE_JOB))

    lo, hi = cut_at + EDGE, restored - EDGE
    slots = grid(lo, hi)
    assert len(slots) >= 5, f"the cut covered only {slots}"
    assert cut_beat.alive(), cut_beat.tail()
    assert len(table.beat_records(CUT, action="claims-unavailable")) == 1
    assert len(table.beat_records(CUT, action="claims-recovered")) == 1
    # the cut node skipped every cluster slot of the outage as claim-error ...
    errors = occurrences(table.beat_records(CUT, action="skipped", job=STEADY_JOB,
                                            reason="claim-error"), lo, hi)
    missing = sorted(set(slots) - set(errors))
    assert not missing, f"cut did not skip these slots as claim-error: {missing}"
    # ... which the other nodes claimed and ran once each
    claims = {iso(c.occurrence): c for c in table.claims() if c.job == STEADY_JOB}
    runs = Counter(r.task_id for r in table.runs())
    wrong = [(s, claims[s].node if s in claims else None,
              runs[claims[s].task_id] if s in claims else 0) for s in slots
             if s not in claims or claims[s].node == CUT or runs[claims[s].task_id] != 1]
    assert not wrong, f"slots of the outage not run once by another node: {wrong}"
    # the every-node entries: the one paused before stays paused on cut, the one paused
    # during the outage is sent by cut until the database is back
    before = logged_within(table.beat_records(CUT, action="dispatched", job=EVERY_NODE_JOB),
                           cut_at, restored)
    assert not before, f"cut sent the entry paused before the outage: {before}"
    held = logged_within(table.beat_records(CUT, action="skipped", job=EVERY_NODE_JOB,
                                            reason="paused"), lo, hi)
    assert len(held) >= len(slots) - 1, f"cut did not skip the paused entry: {held}"
    sent_late = logged_within(table.beat_records(CUT, action="dispatched", job=LATE_PAUSE_JOB),
                              late.returned + SLACK, hi)
    assert len(sent_late) >= 2, ("cut did not go on sending its every-node entry during the "
                                 f"outage: {sent_late}")
    late_runs = {r.task_id for r in table.runs() if r.entry == LATE_PAUSE_JOB and r.node == CUT}
    unrun = [r["task_id"] for r in sent_late if r["task_id"] not in late_runs]
    assert not unrun, f"every-node runs sent by cut during the outage never ran: {unrun}"
    others_late = [r for label in BEATS if label not in (CUT, *table.stopped)
                   for r in logged_within(table.beat_records(
                       label, action="dispatched", job=LATE_PAUSE_JOB), late.returned + SLACK, hi)]
    assert not others_late, f"nodes that read the pause still sent it: {others_late}"
    after = logged_within(table.beat_records(CUT, action="dispatched", job=LATE_PAUSE_JOB),
                          after_pause_read + SLOT, resumed)
    assert not after, f"cut still sent the paused entry after the outage: {after}"
    # the operator's commands through the cut DSN: exit 1, nothing written
    for run in (db_pause, db_trigger):
        assert run.rc == 1 and "claims database" in run.output, str(run)
    pauses = [p for p in table.rows(table.pauses_table) if p.get("job_name") == STEADY_JOB]
    assert not pauses, pauses
    audit = [a for a in table.rows(table.audit_table) if "db-down" in str(a.values())]
    assert not audit, audit
    manual = [c for c in table.claims() if c.job == MANUAL_JOB and c.kind == "manual"
              and db_trigger.started - EDGE <= c.claimed_at.timestamp() <= db_trigger.returned]
    assert not manual, manual
    print(f"\ncut {utc(cut_at).time()} ({reset} connections reset), restored "
          f"{utc(restored).time()}: {len(slots)} slots skipped by cut and run elsewhere, "
          f"{len(sent_late)} every-node runs sent by cut after a pause it could not read")


# -- the broker is down when an operator triggers a job --------------------------------


def test_a_trigger_while_the_broker_is_down_fails_and_is_never_taken_over(
        table: TableCluster) -> None:
    """``trigger`` with the broker unreachable exits 1; its manual claim is ``failed``
    with the error and the audit keeps the attempt; the beats, which take over orphans of
    this ``at_least_once`` job, leave it alone for three publish timeouts; a new trigger
    then runs the job once."""
    dead_broker = f"redis://127.0.0.1:{free_port()}/0"
    failed = table.cli(("trigger", MANUAL_JOB, "--reason", "broker-down"),
                       env={"ELARION_ACC_BROKER": dead_broker})[0]
    assert failed.rc == 1, str(failed)
    rows = [c for c in table.claims() if c.job == MANUAL_JOB and c.kind == "manual"
            and failed.started - EDGE <= c.claimed_at.timestamp() <= failed.returned + EDGE]
    assert len(rows) == 1, rows
    row = rows[0]
    assert row.state == "failed" and row.publish_error, row
    audit = [a for a in table.rows(table.audit_table) if "broker-down" in str(a.values())]
    assert audit, "the audit lost the failed trigger"
    time.sleep(3 * PUBLISH_TIMEOUT + 3)
    again = {c.task_id: c for c in table.claims()}[row.task_id]
    assert again.state == "failed" and again.takeovers == 0, again
    assert table.run_counts()[row.task_id] == 0
    assert all(table.beats[b].alive() for b in ("twin.a", CUT)), table.tails(20)
    ok = table.cli(("trigger", MANUAL_JOB, "--reason", "broker-back"))[0]
    assert ok.rc == 0, str(ok)
    new = table.wait_for("the new trigger's run", lambda: [
        c for c in table.claims() if c.job == MANUAL_JOB and c.kind == "manual"
        and c.task_id != row.task_id and table.run_counts()[c.task_id] == 1])
    time.sleep(SLOT)
    assert len(new) == 1 and table.run_counts()[new[0].task_id] == 1, new
    print(f"\nfailed trigger: {row.publish_error[:200]}")


# -- a node stops while a jittered slot waits for its offset ---------------------------


def test_a_node_stopped_while_a_jittered_slot_waits_leaves_it_to_the_others(
        table: TableCluster) -> None:
    """``spare`` gets SIGTERM after a slot of the jittered entry and before its offset
    (at least 7 s): another node claims the slot at slot + offset (the same instant every
    node computes), and it runs once."""
    now = time.time()
    step = 20
    slot = next(s for s in (math.ceil((now + 3) / step) * step + i * step for i in range(30))
                if jitter_offset(JITTER_JOB, utc(s), JITTER) >= timedelta(seconds=7))
    offset = jitter_offset(JITTER_JOB, utc(slot), JITTER).total_seconds()
    spare = table.beats[SPARE]
    assert spare.alive(), spare.tail()
    sleep_until(slot + 0.5)
    table.stopped.add(SPARE)
    spare.sigterm()
    stopped = wait_until(lambda: not spare.alive() and time.time(), 30,
                         message=lambda: spare.tail())
    claim = table.wait_for("the jittered slot's claim", lambda: [
        c for c in table.claims() if c.job == JITTER_JOB and c.occurrence == utc(slot)],
        offset + 30)[0]
    time.sleep(SLOT)
    table.settle(time.time())
    assert stopped < slot + offset, (
        f"spare took {stopped - slot:.1f}s to stop: the slot did not wait for it")
    assert claim.node != SPARE, claim
    late = claim.claimed_at.timestamp() - slot
    # the claim waits for the offset, never less; 2.5 s of slack for a loaded machine
    assert offset - 0.05 <= late <= offset + 2.5, (offset, late)
    assert table.run_counts()[claim.task_id] == 1
    sent = [r for label in BEATS if label != SPARE for r in
            table.beat_records(label, action="dispatched", job=JITTER_JOB)
            if r.get("occurrence") == iso(utc(slot))]
    assert len(sent) == 1, sent
    assert not [r for r in spare.records(job=JITTER_JOB)
                if r.get("occurrence") == iso(utc(slot))]
    print(f"\nslot {iso(utc(slot))}: offset {offset:.3f}s, spare stopped after "
          f"{stopped - slot:.1f}s, claimed by {claim.node} {late:.3f}s after the slot")


# -- a node crashes ---------------------------------------------------------------------


def test_a_crashed_node_is_reported_dead_and_the_others_run_its_slots(
        table: TableCluster) -> None:
    """``kill -9`` of ``victim``: the slots after the kill are claimed by the other nodes
    and run once each, without a wait, and ``status --json`` shows ``victim`` not alive
    once elarion_beat_node_timeout (3 s here) has passed, the others alive."""
    victim = table.beats[VICTIM]
    victim.kill9()
    table.stopped.add(VICTIM)
    killed = victim.killed_at or time.time()
    sleep_until(killed + QUICK_LIVENESS["elarion_beat_node_timeout"] + 2 * SLOT)
    status = table.status()
    sleep_until(killed + 6 * SLOT)  # a few slots after the kill, whatever status took
    table.settle(time.time() - SLOT)
    nodes = {str(n.get("node")): n for n in status.get("nodes", [])}
    assert VICTIM in nodes and not nodes[VICTIM].get("alive"), status.get("nodes")
    assert all(nodes[n].get("alive") for n in (TWIN, CUT)), status.get("nodes")
    slots = grid(killed + EDGE, time.time() - 2 * SLOT)
    claims = {iso(c.occurrence): c for c in table.claims() if c.job == STEADY_JOB}
    runs = table.run_counts()
    wrong = [s for s in slots if s not in claims or claims[s].node == VICTIM
             or runs[claims[s].task_id] != 1]
    assert len(slots) >= 3 and not wrong, (slots, wrong)


# -- beats of their own ------------------------------------------------------------------


class SoloRun:
    """Beats of :mod:`tests.fault.proj_table` on a claims table and queue of their own."""

    def __init__(self, workdir: Path, pg_dsn: str, broker_url: str, schedule: str,
                 **env: str) -> None:
        self.run_id = uuid.uuid4().hex[:10]
        self.pg_dsn = pg_dsn
        self.claims_table = f"tbl_claims_{self.run_id}"
        self.env = {"ELARION_ACC_BROKER": broker_url,
                    "ELARION_ACC_QUEUE": f"elarion-table-{self.run_id}",
                    "ELARION_ACC_CLAIMS_DSN": pg_dsn,
                    "ELARION_ACC_CLAIMS_TABLE": self.claims_table,
                    "ELARION_ACC_SCHEDULE": schedule,
                    "ELARION_BEAT_LOG_FORMAT": "json",
                    "ELARION_BEAT_NODE_QUEUE": f"elarion-table-{self.run_id}.node.{{node}}",
                    **env}
        self.pm = ProcessManager(workdir, APP, self.env)

    def beat(self, node: str, env: Mapping[str, str] | None = None,
             loglevel: str = "INFO") -> ChildProcess:
        return self.pm.beat(f"beat-{node}", env={"ELARION_ACC_NODE": node, **(env or {})},
                            loglevel=loglevel)

    def close(self) -> None:
        try:
            self.pm.stop_all()
        finally:
            drop_tables(self.pg_dsn, *claims_tables(self.claims_table))
            delete_queue(self.env)


#: 02:10:30 CET on 2027-10-31, the second pass of the repeated hour in Europe/Berlin
REPEATED_HOUR_START = "2027-10-31 01:10:30"


def celery_says_due_now(wall: datetime) -> bool:
    """What Celery's crontab(minute=30, hour=2) says at the Berlin wall time *wall*, having
    last run at *wall*: "due, next in 0 s" is the trap of the repeated hour."""
    app = Celery(set_as_current=False)
    app.conf.timezone = "Europe/Berlin"
    later = (wall.astimezone(UTC) + timedelta(seconds=30)).astimezone(wall.tzinfo)  # fold kept
    state = crontab(minute=30, hour=2, app=app, nowfun=lambda: later).is_due(wall)
    return bool(state.is_due and state.next == 0)


def test_a_beat_started_inside_the_repeated_hour_sleeps_and_sends_each_slot_once(
        workdir: Path, pg_dsn: str, redis_url: str) -> None:
    """A beat in Europe/Berlin starts on a wall clock faked to 2027-10-31 01:10:30 UTC,
    02:10:30 CET: inside the repeated hour, where Celery's crontab(minute=30, hour=2)
    says "due, next in 0 s" on every tick from Celery 5.5.2 on (checked here too; before,
    it waits for the second-pass 02:30). Over 20 s its CPU time stays low (a busy loop
    would take a core), the 02:30 job is handled at most once, and the minutely crontab
    (hour ``*``) sends the next slot of the repeated hour once."""
    berlin = ZoneInfo("Europe/Berlin")
    start = datetime.fromisoformat(REPEATED_HOUR_START).replace(tzinfo=UTC)
    assert start.astimezone(berlin).fold == 1, "not the second pass of the repeated hour"
    armed = celery_says_due_now(start.astimezone(berlin))
    assert armed == (Version(celery.__version__) >= Version("5.5.2")), (
        f"Celery {celery.__version__} {'loops' if armed else 'does not loop'} in the "
        "repeated hour: docs/design.md#celery-versions-and-daylight-saving-time says otherwise")
    next_minute = iso(start.replace(second=0) + timedelta(minutes=1))
    run = SoloRun(workdir, pg_dsn, redis_url, "dst")
    try:
        # a year ahead of the database on purpose: the node trusts its own clock
        beat = run.beat("dst", env={**faked_env(f"@{REPEATED_HOUR_START}"),
                                    "ELARION_BEAT_CLOCK": "node"})
        beat.wait_for_record({"action": "dispatched"}, START_TIMEOUT)
        time.sleep(3)  # the start-up's last work (connections, first heartbeat) is done
        cpu0, t0 = cpu_seconds(beat.pid), time.monotonic()
        time.sleep(20)
        cpu1, t1 = cpu_seconds(beat.pid), time.monotonic()
        assert beat.alive(), beat.tail()
        share = (cpu1 - cpu0) / (t1 - t0)
        # measured: an idle beat (a heartbeat a second) uses ~1 % of a core on the real
        # clock and 0.5-20 % under libfaketime (its own overhead, the same on an ordinary
        # day); a busy loop takes what a core can give. The loop's other sign, the same
        # slot claimed again and again, is checked exactly below.
        assert share < 0.5, f"beat used {share:.0%} of a core over {t1 - t0:.0f}s"
        beat.wait_ready(lambda: [r for r in beat.records(action="dispatched",
                                                         job=DST_MINUTE_JOB)
                                 if r.get("occurrence") == next_minute],
                        START_TIMEOUT, f"sending the minutely slot {next_minute}")
        time.sleep(SLOT)
        handled = [(r["job"], r["occurrence"]) for r in beat.records()
                   if r.get("action") in ("dispatched", "skipped") and r.get("occurrence")]
        twice = [k for k, n in Counter(handled).items() if n > 1]
        assert not twice, f"slots handled more than once: {twice}"
        repeated = [k for k in handled if k[0] == DST_REPEATED_JOB]
        assert len(repeated) <= 1, repeated
        rows = read_claims(pg_dsn, run.claims_table)
        assert (DST_MINUTE_JOB, next_minute) in {(r.job, iso(r.occurrence)) for r in rows}
        assert not beat.lines("Traceback"), beat.tail(60)
        print(f"\nrepeated hour (Celery {celery.__version__}, loops: {armed}): CPU "
              f"{share:.1%} of a core over {t1 - t0:.0f}s; handled {handled}")
    finally:
        run.close()


def claimed_by(dsn: str, table: str, node: str) -> bool:
    """The beat *node* has written a claim row (the table may not exist yet)."""
    if not table_exists(dsn, table):
        return False
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(sql.SQL("SELECT 1 FROM {} WHERE node = %s LIMIT 1").format(
            sql.Identifier(table)), [node]).fetchone()
    return row is not None


def active_statement(dsn: str, node: str) -> str | None:
    """The statement the beat *node*'s server connection is running now, if any."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute("SELECT left(query, 80) FROM pg_stat_activity WHERE state = "
                           "'active' AND application_name = %s AND datname = current_database()",
                           [f"celery-elarion-beat {node}"]).fetchone()
    return str(row[0]) if row else None


def pending_of(dsn: str, table: str, nodes: Sequence[str]) -> list[tuple[str, str, str]]:
    """Claims of *nodes* won and never published (``pending``): occurrences a shutdown
    would have lost for the whole cluster."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT node, job_name, occurrence_utc::text FROM {} WHERE state = 'pending' "
            "AND node = ANY(%s)").format(sql.Identifier(table)), [list(nodes)]).fetchall()
    return [(str(n), str(j), str(o)) for n, j, o in rows]


def test_beats_stopped_by_sigterm_during_database_io_exit_cleanly(
        workdir: Path, pg_dsn: str, redis_url: str) -> None:
    """Two rounds of three beats claim and publish 200 every-second entries. Each beat gets
    SIGTERM at an instant its server connection is seen running a statement (a claim, its
    COMMIT, a heartbeat): each exits with status 0, logs no traceback and no error, and
    leaves no claim it won unpublished (``pending``).

    One SIGTERM each: a second one may reach the interpreter while it finalizes, after
    beat has closed, where Python's default action ends it (status -15)."""
    run = SoloRun(workdir, pg_dsn, redis_url, "heavy", ELARION_TABLE_HEAVY="200")
    hits: dict[str, str] = {}
    codes: dict[str, int | None] = {}
    nodes: list[str] = []
    try:
        for round_ in (1, 2):
            batch = [f"heavy-{_RUN}-{round_}-{i}" for i in (1, 2, 3)]
            nodes += batch
            # WARNING: 200 outcomes a second would flood an INFO log
            beats = {node: run.beat(node, loglevel="WARNING") for node in batch}
            for node, beat in beats.items():
                beat.wait_ready(partial(claimed_by, pg_dsn, run.claims_table, node),
                                START_TIMEOUT, "claiming")
            for node, beat in beats.items():
                hits[node] = wait_until(partial(active_statement, pg_dsn, node), 30,
                                        interval=0.005, message=f"{node} running a statement")
                beat.sigterm()
            for node, beat in beats.items():
                codes[node] = beat.wait(60)
                assert codes[node] == 0, (node, codes[node], beat.tail(60))
                assert not beat.lines("Traceback"), beat.tail(80)
                assert not beat.records(level="ERROR"), beat.tail(60)
        lost = pending_of(pg_dsn, run.claims_table, nodes)
        assert not lost, f"claims won and never published: {lost}"
        print(f"\nSIGTERM while running: {hits}; exit codes {codes}")
    finally:
        run.close()


# -- Flower's answers while the claims database or the broker is away ------------------


def test_flower_answers_503_without_the_database_and_502_without_the_broker(
        workdir: Path, pg_dsn: str, redis_url: str) -> None:
    """A real Flower (examples/flowerconfig.py) of :mod:`tests.flower.app` reaches the
    claims database and the broker through TCP proxies. With the database cut, ``pause``
    and ``trigger`` answer 503 and change nothing; with the broker cut, ``trigger``
    answers 502, its manual claim is ``failed`` with the error and the audit keeps it."""
    from tests.flower.app import CONTROL_JOB
    from tests.flower.support import FLOWERCONFIG, Session

    run_id = uuid.uuid4().hex[:10]
    table_name = f"fl_{run_id}_claims"
    db = urlparse(pg_dsn)
    broker = urlparse(redis_url)
    db_proxy = TcpProxy(db.hostname or "127.0.0.1", db.port or 5432).start()
    broker_proxy = TcpProxy(broker.hostname or "127.0.0.1", broker.port or 6379).start()
    broker_url = broker._replace(netloc=f"{broker_proxy.host}:{broker_proxy.port}").geturl()
    env = {"ELARION_FL_BROKER": broker_url, "ELARION_FL_RUN": run_id,
           "ELARION_FL_DSN": through(db_proxy, pg_dsn), "ELARION_FL_TABLE": table_name,
           "FLOWER_UNAUTHENTICATED_API": "1"}
    settings = Settings.from_mapping({"elarion_beat_dsn": pg_dsn,
                                      "elarion_beat_table": table_name})
    store = PostgresClaimStore(settings)
    pm = ProcessManager(workdir, "tests.flower.app", env)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        store.ensure_schema()
        flower = pm.celery("flower", ["flower", f"--conf={FLOWERCONFIG}", f"--port={port}",
                                      "--address=127.0.0.1"])

        def page() -> Session | None:
            try:
                return Session.open(base, None)
            except (OSError, AssertionError):
                return None

        session = flower.wait_ready(page, START_TIMEOUT, "serving /elarion")
        audit_before = store.audit()
        db_proxy.cut()
        try:
            paused = session.post("pause", job=CONTROL_JOB, reason="db-down")
            triggered = session.post("trigger", job=CONTROL_JOB, reason="db-down")
        finally:
            db_proxy.restore()
        assert (paused.status, triggered.status) == (503, 503), (paused, triggered)
        assert not store.pauses()[1] and store.audit() == audit_before
        assert not [c for c in read_claims(pg_dsn, table_name) if c.kind == "manual"]
        broker_proxy.cut()
        try:
            refused = session.post("trigger", job=CONTROL_JOB, reason="broker-down")
        finally:
            broker_proxy.restore()
        assert refused.status == 502, refused
        manual = [c for c in read_claims(pg_dsn, table_name) if c.kind == "manual"]
        assert len(manual) == 1 and manual[0].state == "failed" and manual[0].publish_error, \
            manual
        assert len(store.audit()) == len(audit_before) + 1
        print(f"\nFlower: pause/trigger without the database {paused.status}/"
              f"{triggered.status}; trigger without the broker {refused.status}: "
              f"{refused.body[:160]}")
    finally:
        try:
            pm.stop_all()
        finally:
            store.close()
            db_proxy.stop()
            broker_proxy.stop()
            drop_tables(pg_dsn, *claims_tables(table_name))

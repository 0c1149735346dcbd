"""The claims database restarts or stalls while three beats claim 200 occurrences a second.

Three real ``celery beat`` nodes and one worker run :mod:`tests.fault.proj_load`: 200
cluster entries due every second (``cron("* * * * * *")``: 200 claims a second for
the cluster) and 2 every-node entries (each node sends them every second without a
claim: the tick's heartbeat we measure gaps on). The worker records every run in a
runs table in the shared ``test`` database; the claims live in a database of their
own, ``elarion_fault_<run id>``, created and dropped by the test, so the faults hit
that database only and never the shared server the other tests use. One run (the
module's fixture) goes through the three faults in turn, each followed by
:data:`AFTER` seconds of claiming; each test reads its fault's window of the run.

* **Restart** (:func:`test_restart_loses_nothing_twice_and_recovers`). The server
  is not ours to restart, so a restart is emulated on our database only: every
  backend of it is terminated (``pg_terminate_backend``: each beat's pooled
  connection dies as in a restart) and ``ALTER DATABASE ... ALLOW_CONNECTIONS
  false`` refuses every new connection for :data:`OUTAGE` seconds (the server
  being down: a connect fails at once, as against a refusing port), then
  ``true``. A TCP proxy cut would do the same to the sockets, but it leaves the
  server-side backends running; terminating them also proves a claim cut
  mid-transaction is decided by the server alone.
* **Stall, lock** (:func:`test_lock_stall_bounds_the_tick`). A test connection
  holds ``LOCK TABLE <claims> IN ACCESS EXCLUSIVE MODE`` in an open transaction for
  :data:`STALL` seconds: the server is up and answers, but every claim waits on
  the lock; ``lock_timeout`` (= ``elarion_beat_claim_timeout``) must end it.
* **Stall, paused proxy** (:func:`test_paused_proxy_bounds_the_tick`). The beats
  reach the database through a proxy that stops forwarding bytes without closing
  anything (a hung middlebox): the server never sees the claim, so only a
  client-side bound can end the wait.

What is proved, from outcomes only (the runs table, the claims table, each beat's
JSON log records):

* no occurrence runs twice, no run lacks a claim, no (job, occurrence) is claimed twice;
* the faulted occurrences are skipped with reason ``claim-error`` (the fault was seen);
* each node logs one ERROR line per outage (``claims-unavailable``) and one INFO line
  when it is over (``claims-recovered``), per :mod:`celery_elarion_beat.beat.fail_closed`;
* every node claims again within :func:`recovery_bound` after the database is back;
* every-node entries keep going out during the fault;
* in a stall, no tick waits for its claims beyond ``elarion_beat_claim_timeout`` plus
  :data:`WAIT_MARGIN`, and ticks stay within ``TICK`` + claim timeout +
  :data:`TICK_MARGIN` of each other.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psycopg
import pytest
from psycopg import sql

from celery_elarion_beat.beat.purge import PURGE_JOB
from celery_elarion_beat.store.records import ClaimRow
from celery_elarion_beat.testing._harness import (
    ChildProcess,
    ProcessManager,
    claims_tables,
    drop_tables,
    read_claims,
    stop_all,
    wait_until,
)
from tests.acceptance.cluster import delete_queue
from tests.fault import proj_load
from tests.helpers.tcpproxy import TcpProxy

pytestmark = [pytest.mark.postgres]
# three beats claim 200 occurrences a second each, and the tick bounds (1.0 s, 1.5 s) were
# measured on a quiet machine
pytestmark += [pytest.mark.alone]

APP = "tests.fault.proj_load"
ENTRIES = 200            # cluster entries, each due every second
EVERY_NODE = 2           # every-node entries, each sent every second by every node
NODES = ("node-1", "node-2", "node-3")
CLAIM_TIMEOUT = 2.0      # elarion_beat_claim_timeout of the beats
HEARTBEAT = 5.0          # elarion_beat_heartbeat_interval
TICK = 1.0               # beat_max_loop_interval (isolated_conf): beat wakes at least this often
START_TIMEOUT = 120.0    # a loaded 2-core machine may take a minute to import celery
WARM_UP = 6.0            # seconds of normal claiming before the first fault
OUTAGE = 8.0             # seconds the restart emulation refuses connections
STALL = 8.0              # seconds the lock or the paused proxy stalls every claim
AFTER = 13.0             # seconds of claiming after each fault (> recovery_bound())
DRAIN_TIMEOUT = 90.0     # the worker runs a backlog of up to 200 tasks a second
#: Two measures of "the tick is never blocked beyond claim_timeout + a margin", both on
#: the every-node entry ``local-0``, which every node sends once per tick without a claim:
#:
#: * the claim wait of a tick: from its every-node send to its first claim-error skip
#:   (the claims come right after the every-node sends) <= claim_timeout + WAIT_MARGIN.
#:   WAIT_MARGIN (1 s) covers the client-side cut (0.5 s past the timeout, for a server
#:   that never got the statement) and a loaded machine; a claim retried after its
#:   timeout waits 2 x claim_timeout (4 s) and fails it;
#: * the gap between two ticks <= TICK + claim_timeout + TICK_MARGIN: a wait that
#:   comes before the every-node send (the pauses read of a tick, when the database
#:   hangs) adds to the usual 1 s between two sends. TICK_MARGIN (1.5 s): on this
#:   2-core machine, shared by six test sessions, a tick with no fault was seen 0.8 s
#:   late, and logging 200 skips takes up to 0.3 s.
WAIT_MARGIN = 1.0
TICK_MARGIN = 1.5


def recovery_bound() -> float:
    """Seconds after connections are allowed again within which every node claims.

    The next tick comes within ``TICK`` (every entry is due each second). Its claim
    may first meet the connection the outage killed (an error at once) and retry on a
    fresh one, whose connect is bounded by ``elarion_beat_claim_timeout``; should that
    tick fail, the next one tries again. So: 2 ticks + 2 claim timeouts, plus 3 s for
    a loaded machine (JSON logging of 200 records a second per beat, six test sessions).
    """
    return 2 * TICK + 2 * CLAIM_TIMEOUT + 3.0


# -- the claims database of one run ---------------------------------------------------


def _admin(pg_dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(pg_dsn, autocommit=True, connect_timeout=10)


def dsn_for(pg_dsn: str, database: str, port: int | None = None) -> str:
    url = urlparse(pg_dsn)
    netloc = url.netloc if port is None else f"{url.netloc.rsplit(':', 1)[0]}:{port}"
    return url._replace(netloc=netloc, path=f"/{database}").geturl()


@contextmanager
def fault_database(pg_dsn: str, run_id: str) -> Iterator[str]:
    """``elarion_fault_<run_id>``: created, yielded as a DSN, dropped (even on failure)."""
    name = f"elarion_fault_{run_id}"
    with _admin(pg_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield dsn_for(pg_dsn, name)
    finally:
        with _admin(pg_dsn) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(
                sql.Identifier(name)))
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


def terminate_backends(pg_dsn: str, database: str) -> int:
    """Terminate every backend of *database* (this connection is to another one)."""
    with _admin(pg_dsn) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = %s AND pid <> pg_backend_pid()",
                            [database]).fetchall()
    return len(rows)


def backends(pg_dsn: str, database: str) -> int:
    with _admin(pg_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                           [database]).fetchone()
    return int(row[0]) if row else 0


def allow_connections(pg_dsn: str, database: str, allowed: bool) -> None:
    with _admin(pg_dsn) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
            sql.Identifier(database), sql.SQL("true" if allowed else "false")))


# -- a proxy that can stop forwarding without closing -----------------------------------


# -- the cluster --------------------------------------------------------------------


def ts_of(record: dict[str, Any]) -> float:
    return datetime.strptime(record["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=timezone.utc).timestamp()


@dataclass
class LoadCluster:
    """One worker and three beats of :mod:`tests.fault.proj_load` for one run."""

    workdir: Path
    run_id: str
    pg_dsn: str        # the shared database: the runs table
    claims_dsn: str    # what the beats use: the run's database, directly or via a proxy
    read_dsn: str      # the run's database, directly (to read the claims)
    broker: str
    env: dict[str, str] = field(default_factory=dict)
    beats: dict[str, ChildProcess] = field(default_factory=dict)
    worker: ChildProcess | None = None

    def __post_init__(self) -> None:
        self.claims_table = f"fault_claims_{self.run_id}"
        self.runs_table = f"fault_runs_{self.run_id}"
        self.node_queue = f"elarion-fault-{self.run_id}.{{node}}"
        self.env = {
            "ELARION_ACC_BROKER": self.broker,
            "ELARION_ACC_QUEUE": f"elarion-fault-{self.run_id}",
            "ELARION_ACC_CLAIMS_DSN": self.claims_dsn,
            "ELARION_ACC_CLAIMS_TABLE": self.claims_table,
            "ELARION_ACC_RUNS_DSN": self.pg_dsn,
            "ELARION_ACC_RUNS_TABLE": self.runs_table,
            "ELARION_LOAD_ENTRIES": str(ENTRIES),
            "ELARION_LOAD_EVERY_NODE": str(EVERY_NODE),
            "ELARION_BEAT_LOG_FORMAT": "json",
            "ELARION_BEAT_CLAIM_TIMEOUT": str(CLAIM_TIMEOUT),
            "ELARION_BEAT_HEARTBEAT_INTERVAL": str(HEARTBEAT),
            "ELARION_BEAT_NODE_TIMEOUT": str(HEARTBEAT * 3),
            "ELARION_BEAT_NODE_QUEUE": self.node_queue,
            "ELARION_BEAT_NODE_QUEUE_EXPIRES": "300",
        }
        self.pm = ProcessManager(self.workdir, APP, self.env)

    def start(self) -> float:
        """Start the worker and the beats; return when every beat has claimed once."""
        with _admin(self.pg_dsn) as conn:
            conn.execute(sql.SQL(proj_load.RUNS_TABLE_DDL).format(
                table=sql.Identifier(self.runs_table)))
        self.worker = self.pm.worker(f"fault-worker-{self.run_id}")
        for node in NODES:
            self.beats[node] = self.pm.beat(f"beat-{node}", env={"ELARION_ACC_NODE": node})
        self.worker.wait_for_log(r"\bready\.", START_TIMEOUT)
        for beat in self.beats.values():
            beat.wait_ready(partial(first_answer, beat), START_TIMEOUT, "a first claim answered")
        return time.time()

    def close(self) -> None:
        try:
            self.pm.stop_all()
        finally:
            drop_tables(self.pg_dsn, self.runs_table)
            delete_queue(self.env)
            delete_node_queues(self.env, [self.node_queue.format(node=n) for n in NODES])

    def stop_beats(self) -> float:
        mark = time.time()
        stop_all(self.beats.values())
        return mark

    def drain(self, before: float) -> None:
        """Wait until the worker ran every claim made before *before* (or time out)."""
        def done() -> bool:
            ran = {r["task_id"] for r in self.runs()}
            return {c.task_id for c in self.claims()
                    if c.claimed_at.timestamp() < before} <= ran
        try:
            wait_until(done, DRAIN_TIMEOUT, interval=1.0, message="the worker to drain")
        except AssertionError:
            pass  # the assertions name what is missing
        time.sleep(1.0)  # a duplicate still in flight has a moment to land

    def claims(self) -> list[ClaimRow]:
        return [c for c in read_claims(self.read_dsn, self.claims_table) if c.job != PURGE_JOB]

    def runs(self) -> list[dict[str, Any]]:
        query = sql.SQL("SELECT entry, occurrence, node, placement, task_id, "
                        "extract(epoch FROM executed_at) AS at FROM {} ORDER BY id").format(
            sql.Identifier(self.runs_table))
        with _admin(self.pg_dsn) as conn:
            cur = conn.execute(query)
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, row)) for row in cur]

    def tails(self, n: int = 25) -> str:
        return self.pm.tails(n)


def delete_node_queues(env: dict[str, str], names: list[str]) -> None:
    """Delete the beats' node queues (nobody consumes them: the every-node messages are
    counted from the beats' logs) from the broker (best effort)."""
    from kombu.connection import Connection
    from kombu.entity import Queue

    try:
        with Connection(env["ELARION_ACC_BROKER"],  # type: ignore[no-untyped-call]
                        connect_timeout=5) as conn:
            channel = conn.default_channel
            for name in names:
                try:
                    # Redis: a virtual queue_delete forgets only declared bindings; the
                    # purge empties the list, which deletes its key
                    channel.queue_purge(name)
                    Queue(name, channel=channel).delete()  # type: ignore[no-untyped-call]
                except Exception:  # noqa: BLE001 - cleanup never fails a test
                    channel = conn.channel()
    except Exception:  # noqa: BLE001
        pass


def first_answer(beat: ChildProcess) -> bool:
    """Whether *beat* has logged the answer (won or lost) to a cluster claim."""
    return any(is_claim_answer(r) for r in beat.records())


def is_claim_answer(r: dict[str, Any]) -> bool:
    return r.get("placement") == "cluster" and (
        r.get("action") == "dispatched"
        or (r.get("action") == "skipped" and r.get("reason") == "claimed-elsewhere"))


@contextmanager
def load_cluster(tmp_path: Path, pg_dsn: str, redis_url: str, *,
                 proxy: TcpProxy | None = None) -> Iterator[LoadCluster]:
    run_id = uuid.uuid4().hex[:10]
    with fault_database(pg_dsn, run_id) as claims_dsn:
        beats_dsn = claims_dsn if proxy is None else dsn_for(
            pg_dsn, urlparse(claims_dsn).path.lstrip("/"), proxy.port)
        cluster = LoadCluster(tmp_path / "procs", run_id, pg_dsn, beats_dsn, claims_dsn,
                              redis_url)
        try:
            yield cluster
        finally:
            cluster.close()
            drop_tables(claims_dsn, *claims_tables(cluster.claims_table))


# -- what the runs say --------------------------------------------------------------


@dataclass
class Verdict:
    """Duplicates and unclaimed runs over a whole scenario."""

    duplicate_runs: list[str]
    duplicate_claims: list[str]
    unclaimed_runs: list[str]
    unrun_claims: list[ClaimRow]
    runs: int
    claims: int


def verdict(cluster: LoadCluster, stop_mark: float) -> Verdict:
    claims = cluster.claims()
    runs = [r for r in cluster.runs() if r["placement"] == "cluster"]
    by_task: dict[str, int] = {}
    by_slot: dict[tuple[str, str], int] = {}
    for run in runs:
        by_task[run["task_id"]] = by_task.get(run["task_id"], 0) + 1
        key = (run["entry"], run["occurrence"])
        by_slot[key] = by_slot.get(key, 0) + 1
    dup_runs = [f"task {t} ran {n} times" for t, n in by_task.items() if n > 1]
    dup_runs += [f"{job}@{occ} ran {n} times" for (job, occ), n in by_slot.items() if n > 1]
    seen: dict[tuple[str, datetime], int] = {}
    for c in claims:
        seen[(c.job, c.occurrence)] = seen.get((c.job, c.occurrence), 0) + 1
    dup_claims = [f"{job}@{occ} claimed {n} times" for (job, occ), n in seen.items() if n > 1]
    claim_ids = {c.task_id for c in claims}
    unclaimed = [f"{r['entry']}@{r['occurrence']} ({r['task_id']})" for r in runs
                 if r["task_id"] not in claim_ids]
    ran = set(by_task)
    unrun = [c for c in claims if c.task_id not in ran and c.claimed_at.timestamp() < stop_mark - 2]
    return Verdict(dup_runs, dup_claims, unclaimed, unrun, len(runs), len(claims))


def claims_per_second(claims: list[ClaimRow], start: float, end: float) -> float:
    n = sum(1 for c in claims if start <= c.claimed_at.timestamp() < end)
    return n / max(end - start, 1e-9)


def records_between(beat: ChildProcess, start: float, end: float,
                    **match: Any) -> list[dict[str, Any]]:
    return [r for r in beat.records(**match) if start <= ts_of(r) < end]


def local_gaps(beat: ChildProcess, start: float, end: float) -> list[float]:
    """Seconds between consecutive sends of the every-node entry ``local-0`` whose later
    send falls in [start, end]: one send per tick, so each gap is one tick's length."""
    sends = sorted(ts_of(r) for r in beat.records(action="dispatched", job="local-0"))
    return [b - a for a, b in zip(sends, sends[1:]) if start <= b <= end]


def claim_waits(beat: ChildProcess, start: float, end: float) -> list[float]:
    """For each tick whose every-node send falls in [start, end] and whose claims failed:
    seconds from that send to the tick's first claim-error skip."""
    sends = sorted(ts_of(r) for r in beat.records(action="dispatched", job="local-0"))
    errors = sorted(ts_of(r) for r in beat.records(action="skipped", reason="claim-error"))
    waits = []
    for sent, following in zip(sends, [*sends[1:], float("inf")]):
        if start <= sent <= end:
            first = next((t for t in errors if sent <= t < following), None)
            if first is not None:
                waits.append(first - sent)
    return waits


def summary(workdir: Path, name: str, lines: list[str]) -> None:
    text = "\n".join(lines)
    print(f"\n===== {name} =====\n{text}", flush=True)
    (workdir / "summary.txt").write_text(f"{name}\n{text}\n")


def assert_clean(v: Verdict, cluster: LoadCluster, faults: list[tuple[float, float]]) -> None:
    """No duplicate, no run without a claim, and every claim ran except the few a fault
    cut between commit and answer (a claim the server committed whose answer the beat
    never read: at-most-once, reported as an orphan, never sent)."""
    assert not v.duplicate_runs, v.duplicate_runs[:20]
    assert not v.duplicate_claims, v.duplicate_claims[:20]
    assert not v.unclaimed_runs, v.unclaimed_runs[:20]
    unexplained = [c for c in v.unrun_claims
                   if not any(start - 1 <= c.claimed_at.timestamp() <= end + 1
                              for start, end in faults)]
    assert not unexplained, (
        f"{len(unexplained)} claims won but never run: "
        f"{[(c.job, c.occurrence.isoformat(), c.node) for c in unexplained[:10]]}\n"
        + cluster.tails())


# -- one run, three faults -------------------------------------------------------------


@dataclass
class Run:
    """One cluster through the three faults, one after the other, and what each test
    reads of it: each fault's window, and the verdict over the whole run."""

    cluster: LoadCluster
    ready: float
    proxy: TcpProxy
    #: fault name -> (start, end): the restart's cut and its connections allowed again;
    #: a stall's start and its release
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)
    killed: int = 0
    locked: bool = False
    stop_mark: float = 0.0
    verdict: Verdict | None = None

    def quiet_before(self, name: str) -> float:
        """When the calm before fault *name* began: the start, or the end of the previous
        fault plus its recovery."""
        names = list(self.windows)
        at = names.index(name)
        return self.ready + 2 if at == 0 else self.windows[names[at - 1]][1] + recovery_bound()


def restart(run: Run, pg_dsn: str) -> None:
    """Kill every backend of the claims database and refuse connections for OUTAGE s."""
    database = urlparse(run.cluster.read_dsn).path.lstrip("/")
    cut = time.time()
    allow_connections(pg_dsn, database, False)
    run.killed = terminate_backends(pg_dsn, database)
    wait_until(lambda: backends(pg_dsn, database) == 0, 10,
               message="every backend of the claims database to go")
    time.sleep(max(0.0, cut + OUTAGE - time.time()))
    allowed = time.time()
    allow_connections(pg_dsn, database, True)
    run.windows["restart"] = (cut, allowed)


def stall(run: Run, name: str, start_stall: Any, end_stall: Any) -> None:
    """Stall every claim for STALL s."""
    stalled = time.time()
    start_stall()
    try:
        time.sleep(STALL)
    finally:
        released = time.time()
        end_stall()
    run.windows[name] = (stalled, released)


def lock_stall(run: Run) -> None:
    """An ACCESS EXCLUSIVE lock on the claims table held for STALL s."""
    holder: list[psycopg.Connection[Any]] = []

    def lock() -> None:
        conn = psycopg.connect(run.cluster.read_dsn, connect_timeout=10)
        holder.append(conn)
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
            sql.Identifier(run.cluster.claims_table)))

    def release() -> None:
        for conn in holder:
            conn.rollback()
            conn.close()

    stall(run, "lock stall", lock, release)
    run.locked = bool(holder)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str,
        redis_url: str) -> Iterator[Run]:
    """Three beats at full load through a proxy: warm up, then the restart, the lock
    stall and the paused proxy, each followed by AFTER s of claiming."""
    url = urlparse(pg_dsn)
    proxy = TcpProxy(url.hostname or "127.0.0.1", url.port or 5432)
    proxy.start()
    try:
        with load_cluster(tmp_path_factory.mktemp("faults"), pg_dsn, redis_url,
                          proxy=proxy) as cluster:
            current = Run(cluster, cluster.start(), proxy)
            time.sleep(WARM_UP)  # normal claiming at full load
            restart(current, pg_dsn)
            time.sleep(AFTER)
            lock_stall(current)
            time.sleep(AFTER)
            stall(current, "paused proxy", proxy.pause, proxy.unpause)
            time.sleep(AFTER)
            current.stop_mark = cluster.stop_beats()
            cluster.drain(current.stop_mark)
            current.verdict = verdict(cluster, current.stop_mark)
            yield current
    finally:
        proxy.unpause()
        proxy.stop()


# -- the tests ----------------------------------------------------------------------


def test_restart_loses_nothing_twice_and_recovers(run: Run) -> None:
    """Every backend of the claims database killed, connections refused for OUTAGE s."""
    cluster, (cut, allowed) = run.cluster, run.windows["restart"]
    claims = cluster.claims()
    lines = [f"entries={ENTRIES}/s nodes={len(NODES)} claim_timeout={CLAIM_TIMEOUT}s "
             f"outage={allowed - cut:.1f}s backends killed={run.killed} "
             f"recovery bound={recovery_bound():.1f}s",
             f"claims/s before={claims_per_second(claims, run.ready, cut):.1f} "
             f"after={claims_per_second(claims, allowed + recovery_bound(), allowed + AFTER):.1f}"]
    problems = []
    for node, beat in cluster.beats.items():
        errors = records_between(beat, cut - 1, allowed + recovery_bound(), level="ERROR")
        warnings = records_between(beat, cut - 1, allowed + recovery_bound(),
                                   level="WARNING")
        skips = records_between(beat, cut, allowed, action="skipped", reason="claim-error")
        local = records_between(beat, cut + 1, allowed, action="dispatched",
                                placement="every_node")
        answers = sorted(ts_of(r) for r in beat.records() if is_claim_answer(r)
                         and ts_of(r) >= allowed)
        recovered = records_between(beat, allowed, allowed + AFTER,
                                    action="claims-recovered")
        back = answers[0] - allowed if answers else float("inf")
        lines.append(f"{node}: ERROR lines in outage={len(errors)}, WARNING lines="
                     f"{len(warnings)}, claim-error skips={len(skips)}, every-node "
                     f"sends in outage={len(local)}, first claim answered "
                     f"{back:.2f}s after connections allowed, recovered INFO="
                     f"{len(recovered)}")
        if not skips:
            problems.append(f"{node}: no claim-error skip during the outage")
        if len(errors) != 1 or errors[0].get("action") != "claims-unavailable":
            problems.append(f"{node}: {len(errors)} ERROR lines for one outage: "
                            f"{[e['message'][:160] for e in errors[:5]]}")
        if not recovered:
            problems.append(f"{node}: no claims-recovered INFO line")
        if back > recovery_bound():
            problems.append(f"{node}: claimed again {back:.1f}s after the database came "
                            f"back (bound {recovery_bound():.1f}s)")
        # every-node entries go on: EVERY_NODE sends a second, one tick in two at least
        if len(local) < EVERY_NODE * (allowed - cut - 1) / 2:
            problems.append(f"{node}: only {len(local)} every-node sends in the outage")
    summary(cluster.workdir, "restart", lines + problems)
    assert run.killed >= len(NODES), f"the outage killed {run.killed} backends"
    assert not problems, "\n".join(problems) + "\n" + cluster.tails()


def check_stall(run: Run, name: str) -> None:
    """The tick bound, the claim wait bound, one ERROR, the recovery, of stall *name*."""
    cluster, (stalled, released) = run.cluster, run.windows[name]
    claims = cluster.claims()
    bound = TICK + CLAIM_TIMEOUT + TICK_MARGIN
    wait_bound = CLAIM_TIMEOUT + WAIT_MARGIN
    lines = [f"entries={ENTRIES}/s nodes={len(NODES)} claim_timeout={CLAIM_TIMEOUT}s "
             f"stall={released - stalled:.1f}s tick gap bound={bound:.1f}s claim wait bound="
             f"{wait_bound:.1f}s",
             f"claims/s before={claims_per_second(claims, run.quiet_before(name), stalled):.1f}"
             f" during={claims_per_second(claims, stalled + 1, released):.1f} after="
             f"{claims_per_second(claims, released + recovery_bound(), released + AFTER):.1f}"]
    problems = []
    for node, beat in cluster.beats.items():
        normal = local_gaps(beat, run.quiet_before(name), stalled)
        # the stalled ticks: up to the one whose claim succeeds again (claims-recovered);
        # that tick, which publishes a whole tick's winners after waiting for the lock, is
        # the first tick after the stall, not a stalled one (reported, not bounded). A beat
        # that never noticed the stall (no outage logged) is measured until released + bound.
        back_at = [ts_of(r) for r in beat.records(action="claims-recovered")
                   if ts_of(r) > stalled]
        end = back_at[0] if back_at else released + bound
        gaps = local_gaps(beat, stalled, end)
        waits = claim_waits(beat, stalled - TICK, end)
        recovery_tick = local_gaps(beat, end, end + 2 * bound)[:1]
        skips = records_between(beat, stalled, released + bound, action="skipped",
                                reason="claim-error")
        errors = records_between(beat, stalled - 1, released + recovery_bound(), level="ERROR")
        warnings = records_between(beat, stalled - 1, released + recovery_bound(),
                                   level="WARNING")
        answers = sorted(ts_of(r) for r in beat.records() if is_claim_answer(r)
                         and ts_of(r) >= released)
        back = answers[0] - released if answers else float("inf")
        worst = max(gaps, default=float("inf"))
        longest = max(waits, default=float("inf"))
        lines.append(f"{node}: tick gap before median={statistics.median(normal or [0]):.2f}s "
                     f"max={max(normal, default=0):.2f}s; during stall max={worst:.2f}s "
                     f"(ticks={len(gaps)}); longest claim wait={longest:.2f}s; "
                     f"claim-error skips={len(skips)}; ERROR lines="
                     f"{len(errors)}; WARNING lines={len(warnings)}; first claim answered "
                     f"{back:.2f}s after release; the recovering tick took "
                     f"{recovery_tick[0] if recovery_tick else float('nan'):.2f}s")
        if worst > bound:
            problems.append(f"{node}: ticks {worst:.1f}s apart during the stall (bound "
                            f"{TICK:g}s + claim_timeout {CLAIM_TIMEOUT:g}s + {TICK_MARGIN:g}s); "
                            f"gaps {[round(g, 1) for g in gaps]}")
        if longest > wait_bound:
            problems.append(f"{node}: a tick waited {longest:.1f}s for its claims (bound "
                            f"claim_timeout {CLAIM_TIMEOUT:g}s + {WAIT_MARGIN:g}s); waits "
                            f"{[round(w, 1) for w in waits]}")
        if not skips:
            problems.append(f"{node}: no claim-error skip during the stall")
        if len(errors) != 1:
            problems.append(f"{node}: {len(errors)} ERROR lines for one stall: "
                            f"{[e['message'][:160] for e in errors[:5]]}")
        if back > recovery_bound():
            problems.append(f"{node}: claimed again {back:.1f}s after the release "
                            f"(bound {recovery_bound():.1f}s)")
    summary(cluster.workdir, name, lines + problems)
    assert not problems, "\n".join(problems) + "\n" + cluster.tails()


def test_lock_stall_bounds_the_tick(run: Run) -> None:
    """An ACCESS EXCLUSIVE lock on the claims table held for STALL s."""
    assert run.locked, "the lock was never taken"
    check_stall(run, "lock stall")


def test_paused_proxy_bounds_the_tick(run: Run) -> None:
    """The beats' proxy to the claims database forwards nothing for STALL s."""
    assert run.proxy.accepted >= len(NODES), "the beats never went through the proxy"
    check_stall(run, "paused proxy")


def test_no_occurrence_runs_twice_through_the_three_faults(run: Run) -> None:
    """Over the whole run: no duplicate run or claim, no run without a claim, and every
    claim ran except the few a fault cut between commit and answer (at most once: such a
    claim is reported as an orphan, never sent)."""
    v = run.verdict
    assert v is not None
    lines = [f"runs={v.runs} claims={v.claims} duplicates={len(v.duplicate_runs)} "
             f"duplicate claims={len(v.duplicate_claims)} unrun claims={len(v.unrun_claims)}"]
    summary(run.cluster.workdir, "whole run", lines)
    assert_clean(v, run.cluster, [(start, end + recovery_bound())
                                  for start, end in run.windows.values()])
    # the interval entry fails closed through each fault (no window claimed inside it)
    # and resumes after it (a window claimed once the database is back)
    windows = [c.claimed_at.timestamp() for c in run.cluster.claims()
               if c.job == proj_load.INTERVAL_JOB]
    for name, (start, end) in run.windows.items():
        inside = [t for t in windows if start + 1 < t < end - 1]
        assert not inside, f"{name}: interval windows claimed inside the fault: {inside}"
        after = [t for t in windows if end < t <= end + AFTER]
        assert after, f"{name}: the interval entry did not resume after the fault"

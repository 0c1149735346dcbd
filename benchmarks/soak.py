"""Soak: replicas under kill -9 and cut database connections, checked slot by slot.

Not part of ``python -m benchmarks`` nor of CI (a smoke of it is:
``tests/test_soak_smoke.py``). Run from the repository root::

    python -m benchmarks.soak                  # 15 minutes, 3 beats, 300 entries
    python -m benchmarks.soak --minutes 3 --entries 120 --seed 7

What it runs: R real ``celery beat`` processes (``ClaimingScheduler``, JSON logs)
and ``--workers`` (2) solo workers of :mod:`benchmarks.soak_app` on a real broker
(Redis by default, ``--broker``), claiming in PostgreSQL (``ELARION_BENCH_PG_DSN``:
a claims table and a runs table named after the run id, dropped at the end unless
``--keep``). Each worker consumes the run's queue and every beat's node queue, and
records every execution (task id, job, occurrence, node, headers, sent_at,
executed_at) into the runs table.

Faults, from the moment every beat has claimed once:

* once in every ``--kill-every`` seconds (60), at a random instant of the period
  moved onto a 5-second boundary (+0-300 ms, when a batch of slots is being
  claimed and published), a random beat that is up gets ``kill -9`` and is
  started again 5 s later (a fresh log file per incarnation);
* every ``--db-kill-every`` seconds (180; the first at 180 + half a kill period,
  on a 5-second boundary), every PostgreSQL backend of the beats is terminated
  (``pg_terminate_backend`` on this database's backends whose
  ``application_name`` is ``celery-elarion-beat <node>`` for one of this run's
  nodes; the node names carry the run id, so no other process is touched).
  15 s later the soak checks that each node cut has a new backend and notes
  when it claimed again.

No fault is injected in the last 20 s. Then the beats get SIGTERM, the worker
drains the queues and stops, and the ledger (claims table), the runs table and
the beats' JSON log records are read.

The verdict (exit 1 on any duplicate or unexplained miss), for the slots due in
[every beat ready + 5 s, stop - 30 s]:

* exact slots (``crontab``, ``cron``): each slot of each cluster entry must have
  run once. A slot with no run is a miss, classified from the ledger and the
  logs: ``orphan-killed`` (its claim is ``pending``, held by a node killed right
  after the claim: at-most-once), ``claim-error`` (no claim row; the nodes
  skipped it with reason ``claim-error`` while their connections were cut, and
  the entry's ``catch_up`` did not replay it), ``claim-unanswered`` (the claim
  committed but the winner's connection was cut before the answer: the winner
  skipped it as ``claim-error``; an orphan), ``overlap-skip`` (stored
  ``skipped``: the previous run had not finished), or ``unexplained``.
* intervals (windows): two window claims closer than the interval less the
  window tolerance are a duplicate; a gap of 1.5 intervals or more between two
  executed windows is a missed window, explained by an unexecuted claim in the
  gap (orphan, overlap skip) or ``claim-error`` skips of the job in the gap.
* any task id executed twice is a duplicate, unless it is an ``at_least_once``
  takeover of a claim (the documented redelivery with the same task id, which
  the task can recognise): those are counted apart.
* every-node entries are counted per node, from when beat sent each run
  (``sent_at``): slots while the node was up (run, lost because the node was
  killed within 5 s after the slot, or missing), slots while it was down, and
  interval gaps matched with its kills. Reported, not part of the verdict: a
  node's own every-node runs are meant to stop while it is down.

Results: a summary on stdout and JSON in ``benchmarks/results/soak-<date>-<commit>.json``
(``--out DIR`` to write elsewhere).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from celery_elarion_beat.beat.purge import PURGE_JOB
from celery_elarion_beat.observe.logformat import record_time
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

from . import soak_app
from .common import (
    PG_DSN,
    PREFIX,
    REDIS_URL,
    ROOT,
    UTC,
    Table,
    commit,
    machine,
    run_id,
    uncommitted,
)

APP = "benchmarks.soak_app"
START_TIMEOUT = 120.0     # a loaded 2-core machine may take a minute to import celery
RESTART_DELAY = 5.0
QUIET_END = 20.0          # no fault in the last seconds
SETTLE = soak_app.PUBLISH_TIMEOUT + soak_app.HEARTBEAT + 10.0  # slots younger are not checked
WARM = 5.0                # slots checked from every beat ready + this
#: the log records the analysis reads (claimed-elsewhere skips and dispatches are only counted)
KEPT = {"started", "claims-unavailable", "claims-recovered", "orphaned", "orphan-taken-over",
        "catch-up", "publish-error"}


def log(text: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {text}", flush=True)


# -- the beats' logs, read as they grow ----------------------------------------


@dataclass
class Incarnation:
    """One beat process: a node's life from its start to its kill or stop."""

    node: str
    number: int
    proc: ChildProcess
    started: float
    ready: float | None = None        # its first claim outcome
    killed: float | None = None
    stopped: float | None = None
    offset: int = 0
    partial: bytes = b""
    records: list[dict[str, Any]] = field(default_factory=list)
    skips: Counter[str] = field(default_factory=Counter)
    dispatched: int = 0
    levels: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    #: connection cut (time) -> this incarnation's first claim outcome after it
    after_cut: dict[float, float | None] = field(default_factory=dict)
    rss_kb: list[tuple[float, int]] = field(default_factory=list)

    def read(self) -> None:
        """Parse what the log gained since the last call."""
        try:
            with open(self.proc.log_path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for raw in lines:
            if not raw.startswith(b"{"):
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            action = rec.get("action")
            level = rec.get("level") or "?"
            self.levels[level] += 1
            if level in ("WARNING", "ERROR", "CRITICAL") and len(self.warnings) < 100:
                self.warnings.append(f"{rec.get('ts')} {level} {str(rec.get('message'))[:300]}")
            if action == "skipped":
                self.skips[rec.get("reason") or "?"] += 1
                if rec.get("reason") != "claimed-elsewhere":
                    self.records.append(rec)
            elif action == "dispatched":
                self.dispatched += 1
            elif action in KEPT:
                self.records.append(rec)
            if action in ("skipped", "dispatched") and rec.get("placement") == "cluster":
                if self.ready is None:
                    self.ready = record_time(rec)
                for cut, seen in self.after_cut.items():
                    if seen is None and record_time(rec) >= cut:
                        self.after_cut[cut] = record_time(rec)

    def end(self) -> float | None:
        return self.killed or self.stopped


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


# -- the soak --------------------------------------------------------------------


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rid = run_id()
        self.queue = f"{PREFIX}.soak.{self.rid}"
        self.table = f"{PREFIX}_soak_{self.rid}_claims"
        self.runs_table = f"{PREFIX}_soak_{self.rid}_runs"
        self.nodes = [f"soak-{self.rid}-b{i}" for i in range(1, args.replicas + 1)]
        self.broker = args.broker
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-soak-{self.rid}-"))
        self.env = {
            "ELARION_SOAK_BROKER": self.broker, "ELARION_SOAK_QUEUE": self.queue,
            "ELARION_SOAK_DSN": PG_DSN, "ELARION_SOAK_TABLE": self.table,
            "ELARION_SOAK_RUNS_TABLE": self.runs_table,
            "ELARION_SOAK_ENTRIES": str(args.entries), "ELARION_SOAK_SEED": str(args.seed),
            "ELARION_BEAT_LOG_FORMAT": "json",
        }
        self.pm = ProcessManager(self.workdir, APP, self.env)
        self.rng = random.Random(args.seed)
        self.specs = soak_app.build_specs(args.entries, args.seed)
        self.incarnations: dict[str, list[Incarnation]] = {n: [] for n in self.nodes}
        self.workers: list[ChildProcess] = []
        self.kills: list[dict[str, Any]] = []
        self.db_kills: list[dict[str, Any]] = []
        self.worker_rss: list[tuple[float, int]] = []
        self.ready_at = 0.0
        self.stop_mark = 0.0
        self.made_tables = False

    # -- processes ---------------------------------------------------------------

    def node_queues(self) -> list[str]:
        fmt = soak_app.node_queue_format(self.queue)
        return [fmt.format(node=n) for n in self.nodes]

    def start_beat(self, node: str) -> Incarnation:
        number = len(self.incarnations[node]) + 1
        proc = self.pm.beat(f"beat-{node}-{number}", env={"ELARION_SOAK_NODE": node})
        inc = Incarnation(node, number, proc, proc.started_at or time.time())
        self.incarnations[node].append(inc)
        return inc

    def current(self, node: str) -> Incarnation:
        return self.incarnations[node][-1]

    def prepare(self) -> None:
        with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL(soak_app.RUNS_TABLE_DDL).format(
                table=sql.Identifier(self.runs_table)))
        self.made_tables = True

    def start(self) -> None:
        self.prepare()
        for i in range(1, self.args.workers + 1):
            # the run queue, its own node queue (install_worker) and every beat's node queue,
            # declared as the beats declare them (soak_app.consume_beat_node_queues)
            self.workers.append(self.pm.worker(
                f"worker-{i}", "-Q", self.queue,
                env={"ELARION_SOAK_NODE": f"soak-{self.rid}-w{i}",
                     "ELARION_SOAK_BEAT_NODES": ",".join(self.nodes)}))
        for w in self.workers:
            w.wait_for_log(r"\bready\.", START_TIMEOUT)
        log(f"workers ready; starting {len(self.nodes)} beats")
        for node in self.nodes:
            self.start_beat(node)

        def all_ready() -> bool:
            for node in self.nodes:
                inc = self.current(node)
                inc.read()
                if not inc.proc.alive():
                    raise RuntimeError(f"{node} exited before it was ready\n{inc.proc.tail()}")
            return all(self.current(n).ready for n in self.nodes)

        wait_until(all_ready, START_TIMEOUT, interval=0.5, message="every beat to claim once")
        self.ready_at = time.time()
        log("every beat has claimed once: the soak starts")

    # -- faults ------------------------------------------------------------------

    def kill_one(self) -> None:
        up = [n for n in self.nodes if self.current(n).proc.alive() and self.current(n).ready]
        if not up:
            up = [n for n in self.nodes if self.current(n).proc.alive()]
        if not up:
            log("kill: no beat alive, skipped")
            return
        node = self.rng.choice(up)
        inc = self.current(node)
        inc.read()
        inc.proc.kill9()
        inc.killed = inc.proc.killed_at
        self.kills.append({"node": node, "incarnation": inc.number, "at": inc.killed,
                           "restart_at": None, "ready_at": None,
                           "alive_others": len(up) - 1 if inc.ready else len(up)})
        log(f"kill -9 {node} (incarnation {inc.number}, pid {inc.proc.pid})")

    def restart(self, kill: dict[str, Any]) -> None:
        inc = self.start_beat(kill["node"])
        kill["restart_at"] = inc.started
        log(f"restarted {kill['node']} (incarnation {inc.number})")

    def beat_backends(self) -> list[tuple[int, str]]:
        """(pid, node) of every backend of this run's beats in this database."""
        names = [f"celery-elarion-beat {n}"[:63] for n in self.nodes]
        with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=10) as conn:
            rows = conn.execute("SELECT pid, application_name FROM pg_stat_activity "
                                "WHERE datname = current_database() "
                                "AND application_name = ANY(%s)", (names,)).fetchall()
        return [(int(pid), str(name).rsplit(" ", 1)[-1]) for pid, name in rows]

    def kill_db_connections(self) -> None:
        """Terminate every backend of the beats (and only theirs: the application names
        carry the run id)."""
        names = [f"celery-elarion-beat {n}"[:63] for n in self.nodes]
        query = ("SELECT pid, application_name, pg_terminate_backend(pid) FROM pg_stat_activity "
                 "WHERE datname = current_database() AND application_name = ANY(%s) "
                 "AND pid <> pg_backend_pid()")
        with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=10) as conn:
            at = time.time()
            rows = conn.execute(query, (names,)).fetchall()
        killed = [(int(r[0]), str(r[1]).rsplit(" ", 1)[-1]) for r in rows if r[2]]
        nodes = sorted({n for _, n in killed})
        for node in nodes:
            self.current(node).after_cut[at] = None
        self.db_kills.append({"at": at, "backends": len(killed), "pids": [p for p, _ in killed],
                              "nodes": nodes, "reconnected": None, "claimed_after_s": {}})
        log(f"terminated {len(killed)} backends of {nodes}")

    def check_reconnected(self, cut: dict[str, Any]) -> None:
        """A while after a cut: which nodes have a new backend, and when each claimed again."""
        old = set(cut["pids"])
        fresh = sorted({n for pid, n in self.beat_backends() if pid not in old})
        cut["reconnected"] = [n for n in cut["nodes"] if n in fresh]
        for node in cut["nodes"]:
            inc = next((i for i in self.incarnations[node] if cut["at"] in i.after_cut), None)
            seen = inc.after_cut.get(cut["at"]) if inc else None
            cut["claimed_after_s"][node] = None if seen is None else round(seen - cut["at"], 3)
        log(f"after the cut: new backends for {cut['reconnected']}, claimed again after "
            f"{cut['claimed_after_s']}")

    # -- the loop ----------------------------------------------------------------

    def busy_instant(self, around: float, spread: float) -> float:
        """A 5-second boundary near *around* plus up to *spread* seconds: when a batch
        of slots (every ``*/5``, ``*/10``, ``*/15`` and minute entry due then) is being
        claimed and published, so that a fault lands in flight as often as it can."""
        return round(around / 5.0) * 5.0 + self.rng.uniform(0.0, spread)

    def sample_rss(self) -> None:
        now = time.time()
        for node in self.nodes:
            inc = self.current(node)
            if inc.proc.alive() and inc.ready:  # not while it still imports
                kb = rss_kb(inc.proc.pid)
                if kb:
                    inc.rss_kb.append((now, kb))
        for w in self.workers:
            if w.alive():
                kb = rss_kb(w.pid)
                if kb:
                    self.worker_rss.append((now, kb))

    def read_logs(self) -> None:
        for node in self.nodes:
            for inc in self.incarnations[node]:
                inc.read()
            inc = self.current(node)
            for kill in self.kills:
                if (kill["node"] == node and kill["ready_at"] is None and inc.ready
                        and kill["restart_at"] and inc.started >= kill["restart_at"]):
                    kill["ready_at"] = inc.ready
                    log(f"{node} claims again, {inc.ready - kill['at']:.1f}s after its kill")
            if not inc.proc.alive() and inc.end() is None:
                inc.stopped = time.time()
                log(f"WARNING: {node} exited by itself (rc {inc.proc.returncode})\n"
                    f"{inc.proc.tail(15)}")

    def run(self) -> None:
        duration = self.args.minutes * 60.0
        t0 = self.ready_at
        end = t0 + duration
        events: list[tuple[float, str, Any]] = []
        k = 1
        while self.args.kill_every > 0 and k * self.args.kill_every <= duration - QUIET_END:
            # anywhere in the middle of its period, so that kills land on every phase of
            # the minute (a minute boundary's big batch included)
            half = max(0.0, self.args.kill_every / 2 - 5.0)
            nominal = min(t0 + k * self.args.kill_every + self.rng.uniform(-half, half),
                          t0 + duration - QUIET_END)
            events.append((self.busy_instant(nominal, 0.3), "kill", None))
            k += 1
        k = 1
        offset = self.args.kill_every / 2 if self.args.kill_every > 0 else 0.0
        while (self.args.db_kill_every > 0
               and k * self.args.db_kill_every + offset <= duration - QUIET_END):
            events.append((self.busy_instant(t0 + k * self.args.db_kill_every + offset, 0.1),
                           "db", None))
            k += 1
        events.sort(key=lambda e: e[0])
        next_rss = 0.0
        next_progress = t0 + 60
        self.sample_rss()
        while True:
            now = time.time()
            if now >= end:
                break
            while events and events[0][0] <= now:
                _, what, data = events.pop(0)
                if what == "kill":
                    self.kill_one()
                    if self.kills and self.kills[-1]["restart_at"] is None:
                        events.append((time.time() + RESTART_DELAY, "restart", self.kills[-1]))
                        events.sort(key=lambda e: e[0])
                elif what == "restart":
                    self.restart(data)
                elif what == "db":
                    self.kill_db_connections()
                    events.append((time.time() + 15.0, "db-check", self.db_kills[-1]))
                    events.sort(key=lambda e: e[0])
                elif what == "db-check":
                    self.read_logs()
                    self.check_reconnected(data)
            self.read_logs()
            if now >= next_rss:
                self.sample_rss()
                next_rss = now + 30
            if now >= next_progress:
                up = sum(1 for n in self.nodes if self.current(n).proc.alive())
                log(f"{(now - t0) / 60:.0f} min: {up} beats up, {len(self.kills)} kills, "
                    f"{len(self.db_kills)} db kills, {self.count_runs()} runs")
                next_progress = now + 60
            upcoming = min([e[0] for e in events] + [end])
            time.sleep(min(0.5, max(0.005, upcoming - time.time())))
        # restarts still pending are done, so that every node is up at the stop
        for _, what, data in events:
            if what == "restart":
                self.restart(data)
            elif what == "db-check":
                self.read_logs()
                self.check_reconnected(data)
        self.sample_rss()

    def count_runs(self) -> int:
        try:
            with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=10) as conn:
                row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                    sql.Identifier(self.runs_table))).fetchone()
            return int(row[0]) if row else 0
        except psycopg.Error:
            return -1

    def stop(self) -> None:
        self.stop_mark = time.time()
        beats = [self.current(n) for n in self.nodes]
        stop_all([b.proc for b in beats if b.proc.alive()], 30)
        for b in beats:
            if b.end() is None:
                b.stopped = self.stop_mark
        log("beats stopped; draining the worker")
        last = -2

        def drained() -> bool:
            nonlocal last
            n = self.count_runs()
            steady, last = n == last, n
            return steady and self.queue_depth() == 0

        try:
            wait_until(drained, 120, interval=3.0, message="the worker to drain")
        except AssertionError:
            log(f"WARNING: the worker did not drain in 120 s (queue depth {self.queue_depth()})")
        stop_all(self.workers, 30)
        self.read_logs()
        for node in self.nodes:
            for inc in self.incarnations[node]:
                inc.read()

    def queue_depth(self) -> int:
        if not self.broker.startswith("redis"):
            return 0
        import redis

        with redis.Redis.from_url(self.broker) as r:
            return sum(int(r.llen(q)) for q in [self.queue, *self.node_queues()])

    # -- data --------------------------------------------------------------------

    def claims(self) -> list[ClaimRow]:
        return [c for c in read_claims(PG_DSN, self.table) if c.job != PURGE_JOB]

    def runs(self) -> list[dict[str, Any]]:
        cols = ["entry", "job", "occurrence", "node", "placement", "claim", "catch_up",
                "takeover", "task_id", "worker", "sent_at", "executed_at"]
        query = sql.SQL("SELECT {} FROM {} ORDER BY id").format(
            sql.SQL(", ").join(map(sql.Identifier, cols)), sql.Identifier(self.runs_table))
        with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=10) as conn:
            return [dict(zip(cols, row)) for row in conn.execute(query)]

    def cleanup(self) -> None:
        try:
            self.pm.stop_all(10)
        finally:
            if self.made_tables and not self.args.keep:
                drop_tables(PG_DSN, self.runs_table, *claims_tables(self.table))
            self.delete_queues()

    def delete_queues(self) -> None:
        if self.broker.startswith("redis"):
            import redis

            with redis.Redis.from_url(self.broker) as r:
                keys = list(r.scan_iter(match=f"*{self.queue}*", count=1000))
                if keys:
                    r.delete(*keys)
            return
        from kombu import Connection, Queue  # type: ignore[attr-defined]

        try:
            with Connection(self.broker, connect_timeout=5) as conn:
                channel = conn.channel()
                fmt = soak_app.node_queue_format(self.queue)
                workers = [fmt.format(node=f"soak-{self.rid}-w{i}")
                           for i in range(1, self.args.workers + 1)]
                for name in [self.queue, *self.node_queues(), *workers]:
                    try:
                        Queue(name, channel=channel).delete()
                    except Exception:  # noqa: BLE001 - best effort
                        channel = conn.channel()
        except Exception:  # noqa: BLE001
            pass


# -- the analysis ------------------------------------------------------------------


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def slots(spec: soak_app.Spec, start: float, end: float) -> list[float]:
    """The exact slots of *spec* in [start, end] (every period divides a minute)."""
    first = math.ceil(start / spec.period) * spec.period
    return [float(t) for t in range(int(first), int(math.floor(end)) + 1, spec.period)]


@dataclass
class Verdict:
    counts: Counter[str] = field(default_factory=Counter)
    misses: list[dict[str, Any]] = field(default_factory=list)
    duplicates: list[dict[str, Any]] = field(default_factory=list)
    redeliveries: list[dict[str, Any]] = field(default_factory=list)
    every_node: dict[str, Any] = field(default_factory=dict)

    def miss(self, reason: str, **detail: Any) -> None:
        self.misses.append({"reason": reason, **detail})


class Analysis:
    """The verdict over the claims, the runs and the beats' log records."""

    def __init__(self, soak: Soak, claims: list[ClaimRow], runs: list[dict[str, Any]]) -> None:
        self.soak = soak
        self.claims = claims
        self.runs = runs
        self.start = soak.ready_at + WARM
        self.end = soak.stop_mark - SETTLE
        self.v = Verdict()
        self.claim_by_slot = {(c.job, c.occurrence.timestamp()): c for c in claims
                              if c.kind == "slot"}
        self.claim_by_task = {c.task_id: c for c in claims}
        self.runs_by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.runs_by_slot: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for r in runs:
            self.runs_by_task[r["task_id"]].append(r)
            if r["placement"] == "cluster":
                self.runs_by_slot[(r["entry"], r["occurrence"])].append(r)
        self.records = [(inc, rec) for incs in soak.incarnations.values() for inc in incs
                        for rec in inc.records]
        self.claim_errors: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.claim_error_times: dict[str, list[float]] = defaultdict(list)
        self.skip_reasons: dict[tuple[str, str], str] = {}
        for inc, rec in self.records:
            if rec.get("action") != "skipped":
                continue
            key = (rec.get("job") or "", rec.get("occurrence") or "")
            if rec.get("reason") == "claim-error":
                self.claim_errors[key].append(inc.node)
                self.claim_error_times[key[0]].append(record_time(rec))
            else:
                self.skip_reasons[key] = rec.get("reason") or "?"

    def killed_after(self, node: str, ts: float, within: float) -> dict[str, Any] | None:
        """The kill of *node* within *within* seconds after *ts*."""
        for k in self.soak.kills:
            if k["node"] == node and ts - 1.0 <= k["at"] <= ts + within:
                return k
        return None

    def run(self) -> Verdict:
        for spec in self.soak.specs:
            if spec.placement != "cluster":
                continue
            if spec.exact:
                self.exact(spec)
            else:
                self.interval(spec)
        self.task_duplicates()
        self.every_node()
        return self.v

    # -- exact slots -------------------------------------------------------------

    def exact(self, spec: soak_app.Spec) -> None:
        for slot in slots(spec, self.start, self.end):
            key = iso(slot)
            ran = self.runs_by_slot.get((spec.name, key), [])
            self.v.counts["slots"] += 1
            tasks = {r["task_id"] for r in ran}
            if len(tasks) > 1:
                self.v.duplicates.append({"job": spec.name, "slot": key, "kind": "slot",
                                          "tasks": sorted(tasks),
                                          "nodes": [r["node"] for r in ran]})
            if ran:
                self.v.counts["slots run"] += 1
                if any(r["catch_up"] == "1" for r in ran):
                    self.v.counts["slots caught up"] += 1
                if any((r["takeover"] or "0") != "0" for r in ran):
                    self.v.counts["slots taken over"] += 1
                continue
            self.classify_slot(spec, slot, key)

    def classify_slot(self, spec: soak_app.Spec, slot: float, key: str) -> None:
        claim = self.claim_by_slot.get((spec.name, slot))
        base: dict[str, Any] = {"job": spec.name, "slot": key, "catch_up": spec.catch_up,
                                "delivery": spec.delivery}
        if claim is not None:
            base.update(state=claim.state, holder=claim.node, takeovers=claim.takeovers,
                        claimed_at=claim.claimed_at.isoformat())
            if claim.state == "skipped":
                self.v.miss("overlap-skip", why=self.skip_reasons.get((spec.name, key),
                                                                      "skipped in the ledger"),
                            **base)
                return
            if claim.state in ("pending", "failed"):
                claimed = claim.claimed_at.timestamp()
                kill = self.killed_after(claim.node, claimed, 10.0)
                if kill is not None:
                    self.v.miss("orphan-killed", killed_at=iso(kill["at"]),
                                why=f"{claim.node} won the claim and was killed "
                                    f"{kill['at'] - claimed:.2f}s later, before publishing",
                                **base)
                    return
                if claim.node in self.claim_errors.get((spec.name, key), []):
                    self.v.miss("claim-unanswered",
                                why=f"the claim committed but {claim.node}'s connection was "
                                    "cut before the answer: it skipped as claim-error", **base)
                    return
            self.v.miss("unexplained", why="a claim exists but nothing ran", **base)
            return
        errors = self.claim_errors.get((spec.name, key), [])
        if errors:
            self.v.miss("claim-error", nodes=sorted(set(errors)),
                        why=f"no claim: {', '.join(sorted(set(errors)))} skipped it as "
                            f"claim-error (connections cut); catch_up {spec.catch_up} did not "
                            "replay it", **base)
            return
        up = [n for n, incs in self.soak.incarnations.items()
              if any(i.ready and i.ready <= slot and (i.end() or math.inf) > slot for i in incs)]
        if not up:
            self.v.miss("no-node-up", why="no beat was up at the slot", **base)
            return
        self.v.miss("unexplained", why=f"no claim, no claim-error skip; up: {up}", **base)

    # -- interval windows ----------------------------------------------------------

    def interval(self, spec: soak_app.Spec) -> None:
        period = float(spec.period)
        window = period - min(soak_app.WINDOW_TOLERANCE, period * 0.1)
        mine = sorted((c for c in self.claims if c.job == spec.name and c.kind == "window"),
                      key=lambda c: c.occurrence)
        for a, b in zip(mine, mine[1:]):
            gap = (b.occurrence - a.occurrence).total_seconds()
            if gap < window and b.occurrence.timestamp() >= self.start:
                self.v.duplicates.append({"job": spec.name, "kind": "window",
                                          "first": a.occurrence.isoformat(),
                                          "second": b.occurrence.isoformat(), "gap_s": gap,
                                          "nodes": [a.node, b.node]})
        ran = [c for c in mine if self.runs_by_task.get(c.task_id)]
        in_window = [c for c in ran if self.start <= c.occurrence.timestamp() <= self.end]
        self.v.counts["windows run"] += len(in_window)
        self.v.counts["windows"] += len(in_window)
        for a, b in zip(ran, ran[1:]):
            t_a, t_b = a.occurrence.timestamp(), b.occurrence.timestamp()
            if t_b < self.start or t_a > self.end:
                continue
            gap = t_b - t_a
            missed = max(0, math.floor(gap / period + 0.5) - 1)
            if missed == 0:
                self.v.counts["window max late s"] = max(
                    self.v.counts["window max late s"], round(gap - period))
                continue
            self.v.counts["windows"] += missed
            base = {"job": spec.name, "from": iso(t_a), "to": iso(t_b), "gap_s": round(gap, 2),
                    "missed": missed, "catch_up": spec.catch_up, "delivery": spec.delivery}
            between = [c for c in mine if t_a < c.occurrence.timestamp() < t_b]
            reason, why = None, ""
            for c in between:
                if c.state == "skipped":
                    reason, why = "overlap-skip", f"window at {c.occurrence.isoformat()} skipped"
                    break
                kill = self.killed_after(c.node, c.claimed_at.timestamp(), 10.0)
                if kill is not None:
                    reason = "orphan-killed"
                    why = (f"{c.node} won the window at {c.occurrence.isoformat()} and was "
                           f"killed {kill['at'] - c.claimed_at.timestamp():.2f}s later")
                    break
                if c.state in ("pending", "failed"):
                    reason, why = "claim-unanswered", (f"window at {c.occurrence.isoformat()} "
                                                       f"{c.state}, never published")
            if reason is None:
                errs = [t for t in self.claim_error_times.get(spec.name, []) if t_a < t < t_b]
                if errs:
                    reason = "claim-error"
                    why = (f"{len(errs)} claim-error skip(s) in the gap (connections cut); "
                           f"catch_up {spec.catch_up}")
            for _ in range(missed):
                self.v.miss(reason or "unexplained", why=why or "no claim, no skip in the gap",
                            **base)

    # -- task ids --------------------------------------------------------------------

    def task_duplicates(self) -> None:
        for task_id, ran in self.runs_by_task.items():
            if len(ran) < 2 or ran[0]["placement"] != "cluster":
                continue
            claim = self.claim_by_task.get(task_id)
            entry = {"job": ran[0]["entry"], "task_id": task_id, "runs": len(ran),
                     "occurrence": ran[0]["occurrence"],
                     "takeovers": claim.takeovers if claim else None}
            if claim is not None and claim.takeovers > 0:
                self.v.redeliveries.append(entry)
            else:
                self.v.duplicates.append({"kind": "task id", **entry})
        unclaimed = [r for r in self.runs if r["placement"] == "cluster"
                     and r["task_id"] not in self.claim_by_task]
        for r in unclaimed:
            self.v.duplicates.append({"kind": "run without a claim", "job": r["entry"],
                                      "task_id": r["task_id"], "node": r["node"]})

    # -- every node ------------------------------------------------------------------

    def up_at(self, node: str, ts: float) -> bool:
        """Whether an incarnation of *node* was up (claiming) at *ts*."""
        return any(i.ready is not None and i.ready <= ts < (i.end() or math.inf)
                   for i in self.soak.incarnations[node])

    def every_node(self) -> None:
        """Per node: its own runs of the every-node entries, from the time beat sent
        them (``sent_at``). Exact entries: each slot while the node was up, once;
        intervals: gaps of 1.5 periods or more, and whether the node was down then."""
        specs = [s for s in self.soak.specs if s.placement == "every_node"]
        per_node: dict[str, Counter[str]] = {n: Counter() for n in self.soak.nodes}
        gaps: list[dict[str, Any]] = []
        missing: list[dict[str, Any]] = []
        by: dict[tuple[str, str], list[float]] = defaultdict(list)
        for r in self.runs:
            if r["placement"] == "every_node" and r["sent_at"] is not None:
                by[(r["entry"], r["node"])].append(float(r["sent_at"]))
        for spec in specs:
            for node in self.soak.nodes:
                sent = sorted(by.get((spec.name, node), []))
                c = per_node[node]
                c["runs"] += len(sent)
                if spec.exact:
                    got = Counter(math.floor(t / spec.period) * spec.period for t in sent)
                    c["duplicate slots"] += sum(1 for n in got.values() if n > 1)
                    for slot in slots(spec, self.start, self.end):
                        if not self.up_at(node, slot):
                            c["slots while down"] += 1
                            c["slots run while down"] += 1 if got.get(int(slot)) else 0
                            continue
                        c["slots while up"] += 1
                        if got.get(int(slot)):
                            c["slots run while up"] += 1
                        elif any(i.killed and slot <= i.killed <= slot + 5.0
                                 for i in self.soak.incarnations[node]):
                            # killed while it was sending that slot's batch: its own
                            # occurrences die with it
                            c["slots lost to a kill at the slot"] += 1
                        else:
                            missing.append({"job": spec.name, "node": node, "slot": iso(slot)})
                    continue
                inside = [t for t in sent if self.start <= t <= self.end]
                for a, b in zip(inside, inside[1:]):
                    if b - a < spec.period - soak_app.WINDOW_TOLERANCE:
                        c["runs closer than the interval"] += 1
                    if b - a < 1.5 * spec.period:
                        continue
                    down = any(i.killed and a - 1 <= i.killed <= b
                               for i in self.soak.incarnations[node])
                    gaps.append({"job": spec.name, "node": node, "from": iso(a), "to": iso(b),
                                 "gap_s": round(b - a, 1), "node_killed": down})
        self.v.every_node = {
            "entries": len(specs),
            "per_node": {n: dict(c) for n, c in per_node.items()},
            "slots_missing_while_up": missing,
            "interval_gaps": len(gaps),
            "interval_gaps_around_kills": sum(1 for g in gaps if g["node_killed"]),
            "interval_gaps_other": [g for g in gaps if not g["node_killed"]],
        }


# -- the report ----------------------------------------------------------------------


def summarise(soak: Soak, claims: list[ClaimRow], runs: list[dict[str, Any]],
              v: Verdict) -> dict[str, Any]:
    reasons = Counter(m["reason"] for m in v.misses)
    explained = sum(n for r, n in reasons.items() if r != "unexplained")
    kills = []
    for k in soak.kills:
        kills.append({**k, "recovery_s": (k["ready_at"] - k["at"]) if k["ready_at"] else None})
    db = []
    for d in soak.db_kills:
        per_node = {}
        for node in soak.nodes:
            recs = [(rec, inc) for inc in soak.incarnations[node] for rec in inc.records
                    if record_time(rec) >= d["at"] - 0.5]
            down = next((record_time(r) for r, _ in recs
                         if r.get("action") == "claims-unavailable"), None)
            back = next((record_time(r) for r, _ in recs
                         if r.get("action") == "claims-recovered"), None)
            per_node[node] = {"unavailable_after_s": None if down is None else down - d["at"],
                              "recovered_after_s": None if back is None else back - d["at"]}
        db.append({**d, "per_node": per_node})
    skips: Counter[str] = Counter()
    records: Counter[str] = Counter()
    levels: Counter[str] = Counter()
    warnings: dict[str, list[str]] = {}
    dispatched = 0
    rss = {}
    for node, incs in soak.incarnations.items():
        for inc in incs:
            skips.update(inc.skips)
            dispatched += inc.dispatched
            records.update(str(r.get("action")) for r in inc.records)
            levels.update(inc.levels)
            if inc.warnings:
                warnings[f"{node}#{inc.number}"] = inc.warnings
        first, last = incs[0], incs[-1]
        longest = max(incs, key=lambda i: (i.end() or soak.stop_mark) - i.started)
        rss[node] = {
            "start_kb": first.rss_kb[0][1] if first.rss_kb else None,
            "end_kb": last.rss_kb[-1][1] if last.rss_kb else None,
            "incarnations": len(incs),
            "longest_life_s": round((longest.end() or soak.stop_mark) - longest.started),
            "longest_first_kb": longest.rss_kb[0][1] if longest.rss_kb else None,
            "longest_last_kb": longest.rss_kb[-1][1] if longest.rss_kb else None,
        }
    recoveries = [k["recovery_s"] for k in kills if k["recovery_s"] is not None]
    kinds = Counter((s.placement, s.kind) for s in soak.specs)
    return {
        "run_id": soak.rid,
        "args": {k: v_ for k, v_ in vars(soak.args).items() if k != "out"},
        "mix": {f"{p}/{k}": n for (p, k), n in sorted(kinds.items())},
        "options": {
            "catch_up": dict(Counter(s.catch_up for s in soak.specs if s.placement == "cluster")),
            "delivery": dict(Counter(s.delivery for s in soak.specs if s.placement == "cluster")),
            "overlap": dict(Counter(s.overlap for s in soak.specs if s.placement == "cluster")),
        },
        "checked": {"from": iso(soak.ready_at + WARM), "to": iso(soak.stop_mark - SETTLE),
                    "seconds": round(soak.stop_mark - SETTLE - soak.ready_at - WARM)},
        "counts": dict(v.counts),
        "claims": sum(1 for c in claims if c.kind != "node"), "runs": len(runs),
        "claims_by_kind": dict(Counter(c.kind for c in claims)),
        "cluster_runs": sum(1 for r in runs if r["placement"] == "cluster"),
        "duplicates": len(v.duplicates),
        "at_least_once_redeliveries": len(v.redeliveries),
        "misses": len(v.misses), "misses_explained": explained,
        "misses_by_reason": dict(reasons),
        "unexplained": [m for m in v.misses if m["reason"] == "unexplained"],
        "kills": len(kills), "db_kills": len(db),
        "recovery_s": {"min": min(recoveries) if recoveries else None,
                       "median": sorted(recoveries)[len(recoveries) // 2] if recoveries else None,
                       "max": max(recoveries) if recoveries else None},
        "skips_by_reason": dict(skips), "dispatched": dispatched,
        "log_records": dict(records),
        "log_levels": dict(levels), "warnings": warnings,
        "claim_states": dict(Counter(c.state for c in claims)),
        "takeovers": sum(1 for c in claims if c.takeovers),
        "every_node": v.every_node,
        "rss_kb": rss,
        "worker_rss_kb": {"start": soak.worker_rss[0][1] if soak.worker_rss else None,
                          "end": soak.worker_rss[-1][1] if soak.worker_rss else None},
        "kill_log": kills, "db_kill_log": db,
        "miss_log": v.misses, "duplicate_log": v.duplicates, "redelivery_log": v.redeliveries,
        "verdict": "pass" if not v.duplicates and reasons.get("unexplained", 0) == 0 else "fail",
    }


def tables(result: dict[str, Any]) -> list[Table]:
    a = result["args"]
    t = Table(f"Soak: {a['replicas']} beats, {a['entries']} entries, {a['minutes']:g} min, "
              f"kill -9 every {a['kill_every']:g} s, connections cut every "
              f"{a['db_kill_every']:g} s", ["what", "count"])
    c = result["counts"]

    def en_sum(key: str) -> int:
        return sum(x.get(key, 0) for x in result["every_node"].get("per_node", {}).values())

    for label, value in [
        ("exact slots checked", c.get("slots", 0)), ("  run", c.get("slots run", 0)),
        ("  of which caught up", c.get("slots caught up", 0)),
        ("  of which taken over", c.get("slots taken over", 0)),
        ("interval windows checked", c.get("windows", 0)),
        ("  run", c.get("windows run", 0)),
        ("runs recorded (cluster / all)", f"{result['cluster_runs']} / {result['runs']}"),
        ("claims (slots and windows)", result["claims"]),
        ("beats' log lines WARNING / ERROR",
         f"{result['log_levels'].get('WARNING', 0)} / {result['log_levels'].get('ERROR', 0)}"),
        ("duplicates", result["duplicates"]),
        ("at-least-once redeliveries (same task id)", result["at_least_once_redeliveries"]),
        ("misses", result["misses"]),
        *[(f"  {r}", n) for r, n in sorted(result["misses_by_reason"].items())],
        ("kills -9 done", result["kills"]), ("db connection kills done", result["db_kills"]),
        ("  backends terminated", sum(d["backends"] for d in result["db_kill_log"])),
        ("  nodes cut / reconnected",
         f"{sum(len(d['nodes']) for d in result['db_kill_log'])} / "
         f"{sum(len(d['reconnected'] or []) for d in result['db_kill_log'])}"),
        ("  claim-error skips / claims-unavailable lines",
         f"{result['skips_by_reason'].get('claim-error', 0)} / "
         f"{result['log_records'].get('claims-unavailable', 0)}"),
        ("  cut -> node claims again s, max",
         max([x for d in result["db_kill_log"] for x in d["claimed_after_s"].values()
              if x is not None], default=math.nan)),
        ("beat recovery s (kill -> claims again) min/median/max",
         " / ".join("-" if x is None else f"{x:.1f}" for x in result["recovery_s"].values())),
        ("every-node slots while up: expected / run / lost to a kill at the slot / missing",
         f"{en_sum('slots while up')} / {en_sum('slots run while up')} / "
         f"{en_sum('slots lost to a kill at the slot')} / "
         f"{len(result['every_node'].get('slots_missing_while_up', []))}"),
        ("every-node slots while down (kill -> claims again): expected / run",
         f"{en_sum('slots while down')} / {en_sum('slots run while down')}"),
        ("every-node interval gaps (node killed / other)",
         f"{result['every_node'].get('interval_gaps_around_kills', 0)} / "
         f"{len(result['every_node'].get('interval_gaps_other', []))}"),
        ("verdict", result["verdict"].upper()),
    ]:
        t.add(label, value)
    t.notes = [f"checked slots: {result['checked']['from']} .. {result['checked']['to']}",
               f"mix: {result['mix']}", f"options: {result['options']}"]
    r = Table("Beats' RSS (KiB)", ["node", "first start", "at the end", "incarnations",
                                   "longest life s", "longest: first", "longest: last"])
    for node, x in result["rss_kb"].items():
        r.add(node, x["start_kb"], x["end_kb"], x["incarnations"], x["longest_life_s"],
              x["longest_first_kb"], x["longest_last_kb"])
    return [t, r]


def result_path(out: Path | None) -> Path:
    date = datetime.now(UTC).strftime("%Y-%m-%d")
    name = f"soak-{date}-{commit() or 'nogit'}.json"
    return (out or ROOT / "benchmarks" / "results") / name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--entries", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2,
                        help="solo-pool workers (each consumes every queue of the run)")
    parser.add_argument("--kill-every", type=float, default=60.0,
                        help="seconds between two kill -9 of a random beat (0: none)")
    parser.add_argument("--db-kill-every", type=float, default=180.0,
                        help="seconds between two cuts of the beats' connections (0: none)")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--broker", default=REDIS_URL)
    parser.add_argument("--keep", action="store_true",
                        help="keep the tables and the logs (their paths are printed)")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory of the JSON result (default benchmarks/results/)")
    args = parser.parse_args(argv)
    soak = Soak(args)
    log(f"soak {soak.rid}: {args.replicas} beats, {args.entries} entries, {args.minutes:g} min; "
        f"tables {soak.table}, {soak.runs_table}; logs {soak.workdir}")
    info = machine()
    ok = False
    try:
        soak.start()
        soak.run()
        soak.stop()
        claims, runs = soak.claims(), soak.runs()
        verdict = Analysis(soak, claims, runs).run()
        result = summarise(soak, claims, runs, verdict)
        result["machine"] = info
        result["commit"] = info.get("commit")
        result["dirty"] = bool(uncommitted())
        for table in tables(result):
            print("\n" + table.text(), flush=True)
        for m in result["unexplained"][:20]:
            print(f"UNEXPLAINED: {m}", flush=True)
        for d in verdict.duplicates[:20]:
            print(f"DUPLICATE: {d}", flush=True)
        path = result_path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, default=str))
        print(f"\nresult: {path}\nVERDICT: {result['verdict'].upper()}", flush=True)
        ok = result["verdict"] == "pass"
    finally:
        soak.cleanup()
        if ok and not args.keep:
            shutil.rmtree(soak.workdir, ignore_errors=True)
        else:
            log(f"logs kept in {soak.workdir}")
    return 0 if ok else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())

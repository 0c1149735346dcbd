"""9. Capacity: what one PostgreSQL primary spends per claim (constants for docs/capacity.md).

**Ticks.** *n* beat nodes (separate processes, each with its own store and pool,
node names ``<table>-<i>``) are released together, round after round, by a
barrier: each claims the same ``entries`` due entries at a new slot (a minute
later each round), in chunks of ``chunk`` requests, starting at its own rank's
chunk and walking all the chunks as the scheduler does; the winners' publish
marks ride along with the node's next claim and the last chunk's are flushed at
the end of the round (what a minutely tick does). Kinds: ``slot`` (cron
entries, exact slots) and ``window`` (interval entries of a ``window_s`` window,
longer than a round: each round starts a window after the previous one ended, so
each round opens a new window). One untimed warm-up round first (connections
made, statements prepared).
The ``unprepared`` row is the slot tick again with ``elarion_beat_pgbouncer =
True`` on a direct connection: no server-side prepares and ``SET LOCAL``
timeouts, what PgBouncer mode costs the database.

**Database-side cost**, per round: the CPU time of the nodes' PostgreSQL backends
(``/proc/<pid>/schedstat``; needs the server on this host, else "-"), and the WAL
the round wrote for the claims table (``pg_walinspect``: the records that touch
the table or its indexes, and every record of those transactions, commits
included; full-page images counted and shown apart). Without ``pg_walinspect``
the WAL column is the whole server's LSN advance (other sessions included).

**Saturation.** ``k`` processes each claim chunks of fresh jobs (all won, marks
riding along) in a loop for ``seconds``: claims per second in all, the cores the
backends used, and how busy the machine was (``/proc/stat``).

**Run tracking.** A worker's ``record_runs`` for ``runs`` won claims: a start and a
finish per run, in batches of 1 (a worker process running one task at a time)
and of more (a busy writer thread); backend CPU and WAL per run.

Every node and worker uses one pooled connection: the table's "connections per
node" is the most backends one node held at once, from ``pg_stat_activity``.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any

import psycopg

from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.store import ClaimRequest
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.store.records import PublishReport, RunReport
from celery_elarion_beat.testing._harness import claims_tables, drop_tables

from .common import PG_DSN, UTC, Table, median, names

_FORK = multiprocessing.get_context("fork")
BASE = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
APP = "celery-elarion-beat "  # the application_name prefix of the store's connections


def _store(table: str, node: str, **extra: Any) -> PostgresClaimStore:
    return PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": PG_DSN, "elarion_beat_table": table, "elarion_beat_node": node,
        "elarion_beat_claim_timeout": 60.0, **extra}))


def _requests(kind: str, jobs: Sequence[str], round_: int,
              window: timedelta = timedelta(seconds=1)) -> list[ClaimRequest]:
    if kind == "window":
        return [ClaimRequest.for_window(job, window, f"{round_}-{job}") for job in jobs]
    slot = BASE + timedelta(minutes=round_)
    return [ClaimRequest.for_slot(job, slot, f"{round_}-{job}") for job in jobs]


def _claim_chunk(store: PostgresClaimStore, node: str, requests: list[ClaimRequest]) -> int:
    results = store.claim(node, requests)
    won = [r for r in results if r.won and r.occurrence is not None and r.token]
    store.defer_report([PublishReport(r.request.job, r.occurrence, r.token)  # type: ignore[arg-type]
                        for r in won])
    return len(won)


# -- what the database spent --------------------------------------------------


def _schedstat(pid: int) -> float | None:
    """Seconds on CPU of process *pid* (this host only)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


class Probe:
    """A monitor connection: the backends of our nodes, their CPU, and the WAL."""

    def __init__(self) -> None:
        self.conn = psycopg.connect(PG_DSN, autocommit=True)
        self.walinspect = self._walinspect()

    def _walinspect(self) -> str:
        """'present', 'created' (dropped again at close) or 'missing'."""
        if self.conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_walinspect'"
                             ).fetchone():
            return "present"
        try:
            self.conn.execute("CREATE EXTENSION pg_walinspect")
            return "created"
        except psycopg.Error:
            return "missing"

    def close(self) -> None:
        if self.walinspect == "created":
            with suppress(psycopg.Error):
                self.conn.execute("DROP EXTENSION IF EXISTS pg_walinspect")
        self.conn.close()

    def backends(self, prefix: str) -> dict[int, str]:
        rows = self.conn.execute("SELECT pid, application_name FROM pg_stat_activity "
                                 "WHERE application_name LIKE %s", (APP + prefix + "%",))
        return {int(pid): name for pid, name in rows.fetchall()}

    def cpu(self, pids: Sequence[int]) -> dict[int, float | None]:
        return {pid: _schedstat(pid) for pid in pids}

    def lsn(self) -> str:
        """The flushed WAL position: records inserted before it are not ours."""
        row = self.conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        return str(row[0]) if row else "0/0"

    def wal(self, table: str, start: str) -> tuple[int, int, str]:
        """WAL bytes since *start* for *table* (and its transactions): (bytes, full-page
        image bytes, how it was measured)."""
        end = self.conn.execute("SELECT pg_current_wal_flush_lsn()::text, "
                                "pg_current_wal_flush_lsn() > %s::pg_lsn", (start,)).fetchone()
        assert end is not None
        if not end[1]:
            return 0, 0, "table" if self.walinspect != "missing" else "server"
        if self.walinspect == "missing":
            row = self.conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end[0], start)
                                    ).fetchone()
            return int(row[0]) if row else 0, 0, "server"
        try:
            return self._table_wal(table, start, str(end[0]))
        except psycopg.errors.UndefinedFile:  # a busy server recycled the segment already
            row = self.conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end[0], start)
                                    ).fetchone()
            return int(row[0]) if row else 0, 0, "server"

    def _table_wal(self, table: str, start: str, end: str) -> tuple[int, int, str]:
        rels = self.conn.execute(
            "SELECT pg_relation_filenode(c.oid) FROM pg_class c WHERE c.oid = %s::regclass "
            "OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass) "
            "OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = %s::regclass)",
            (f'"{table}"', f'"{table}"', f'"{table}"')).fetchall()
        pattern = "/(" + "|".join(str(r[0]) for r in rels if r[0]) + ") "
        row = self.conn.execute(
            "WITH r AS (SELECT xid::text::bigint AS x, record_length, fpi_length, block_ref "
            "           FROM pg_get_wal_records_info(%(s)s, %(e)s)), "
            "ours AS (SELECT DISTINCT x FROM r WHERE block_ref ~ %(p)s AND x <> 0) "
            "SELECT coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0) FROM r "
            "WHERE block_ref ~ %(p)s OR x IN (SELECT x FROM ours)",
            {"s": start, "e": end, "p": pattern}).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), "table"


class Measure:
    """Database CPU, WAL and machine CPU between :meth:`start` and :meth:`stop`."""

    def __init__(self, probe: Probe, prefix: str, table: str) -> None:
        self.probe, self.prefix, self.table = probe, prefix, table

    def start(self) -> None:
        self.pids = list(self.probe.backends(self.prefix))
        self.cpu0 = self.probe.cpu(self.pids)
        self.lsn0 = self.probe.lsn()
        self.busy0 = _machine_busy()
        self.t0 = time.perf_counter()

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        busy1 = _machine_busy()
        backends = self.probe.backends(self.prefix)
        cpu1 = self.probe.cpu(list({*self.pids, *backends}))
        spent: float | None = 0.0
        for pid, after in cpu1.items():
            before = self.cpu0.get(pid, 0.0)
            if before is None:  # the server is on another host
                spent = None
            elif after is not None and spent is not None:  # (None: the backend has ended)
                spent += after - before
        wal, fpi, how = self.probe.wal(self.table, self.lsn0)
        per_node: dict[str, int] = {}
        for name in backends.values():
            per_node[name] = per_node.get(name, 0) + 1
        busy = (busy1[0] - self.busy0[0]) / max(1, busy1[1] - self.busy0[1])
        return {"wall": wall, "db_cpu": spent, "wal": wal, "fpi": fpi, "wal_how": how,
                "machine_busy": busy, "connections": max(per_node.values(), default=0)}


def _total(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several measured stretches as one: times, CPU and WAL added up."""
    cpu = [p["db_cpu"] for p in parts]
    return {"wall": sum(p["wall"] for p in parts),
            "db_cpu": None if None in cpu else sum(c for c in cpu if c is not None),
            "wal": sum(p["wal"] for p in parts), "fpi": sum(p["fpi"] for p in parts),
            "wal_how": _how(parts), "connections": max(p["connections"] for p in parts),
            "machine_busy": median(p["machine_busy"] for p in parts)}


def _how(parts: Sequence[dict[str, Any]]) -> str:
    return "table" if all(p["wal_how"] == "table" for p in parts) else "server"


# -- ticks ------------------------------------------------------------------------


def _node(table: str, rank: int, n: int, kind: str, entries: int, chunk: int, rounds: int,
          window: timedelta, extra: dict[str, Any], start: Any, done: Any, out: Any) -> None:
    node = f"{table}-n{rank}"
    store = _store(table, node, **extra)
    jobs = [f"job-{j:06}" for j in range(entries)]
    chunks = [jobs[i:i + chunk] for i in range(0, entries, chunk)]
    first = rank * len(chunks) // n
    order = [(first + i) % len(chunks) for i in range(len(chunks))]
    stats = []
    try:
        store.ensure_schema()
        for round_ in range(rounds):
            start.wait()
            cpu0, t0, won = os.times(), time.perf_counter(), 0
            for c in order:
                won += _claim_chunk(store, node, _requests(kind, chunks[c], round_, window))
            store.flush_reports()
            cpu1 = os.times()
            stats.append({"won": won, "seconds": time.perf_counter() - t0,
                          "client_cpu": cpu1.user + cpu1.system - cpu0.user - cpu0.system})
            done.wait()
        out.put((rank, stats, None))
        start.wait()  # the parent has read the backends' CPU: the connection may end
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        out.put((rank, stats, repr(exc)))
        with suppress(Exception):
            start.abort()
            done.abort()
    finally:
        store.close()


def _tick(probe: Probe, kind: str, n: int, entries: int, chunk: int, rounds: int,
          window: timedelta, extra: dict[str, Any],
          log: Callable[[str], None]) -> dict[str, Any]:
    table, _ = names("capacity")
    setup = _store(table, f"{table}-setup")
    setup.ensure_schema()
    setup.close()
    start, done, out = _FORK.Barrier(n + 1), _FORK.Barrier(n + 1), _FORK.Queue()
    procs = [_FORK.Process(target=_node, args=(table, i, n, kind, entries, chunk, rounds + 1,
                                               window, extra, start, done, out), daemon=True)
             for i in range(n)]
    for p in procs:
        p.start()
    measure = Measure(probe, f"{table}-n", table)
    rows: list[dict[str, Any]] = []
    last = 0.0
    try:
        for round_ in range(rounds + 1):
            if kind == "window":  # a new window each round
                time.sleep(max(0.0, last + window.total_seconds() * 1.2 - time.monotonic()))
            if round_:
                measure.start()
            start.wait(timeout=300)
            done.wait(timeout=600)
            last = time.monotonic()  # every window of the round was claimed before this
            if round_:
                rows.append(measure.stop())
        results = sorted(out.get(timeout=60) for _ in procs)
        start.wait(timeout=60)  # the nodes may close their connections now
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        drop_tables(PG_DSN, *claims_tables(table))
    errors = [e for _, _, e in results if e]
    if errors:
        raise RuntimeError(f"capacity: a node failed: {errors[0]}")
    won = [sum(stats[r]["won"] for _, stats, _ in results) for r in range(1, rounds + 1)]
    client = sum(s["client_cpu"] for _, stats, _ in results for s in stats[1:])
    attempts = entries * n * rounds
    cpu = [r["db_cpu"] for r in rows]
    db_cpu = None if None in cpu else sum(c for c in cpu if c is not None)
    out_row = {
        "kind": kind, "nodes": n, "entries": entries, "chunk": chunk, "rounds": rounds,
        "pgbouncer_mode": bool(extra.get("elarion_beat_pgbouncer")),
        "won_per_round": won, "duplicates_or_missing": sum(abs(w - entries) for w in won),
        "round_ms": median(1000 * r["wall"] for r in rows),
        "db_cpu_us_per_entry": None if db_cpu is None else db_cpu / (entries * rounds) * 1e6,
        "db_cpu_us_per_attempt": None if db_cpu is None else db_cpu / attempts * 1e6,
        "wal_b_per_entry": sum(r["wal"] for r in rows) / (entries * rounds),
        "fpi_b_per_entry": sum(r["fpi"] for r in rows) / (entries * rounds),
        "wal_how": _how(rows) if rows else "-",
        "client_cpu_us_per_attempt": client / attempts * 1e6,
        "connections_per_node": max((r["connections"] for r in rows), default=0),
        "machine_busy": median(r["machine_busy"] for r in rows),
    }
    log(f"  tick {kind}, {n} node(s){' (pgbouncer mode)' if out_row['pgbouncer_mode'] else ''}"
        f": {out_row['round_ms']:.0f} ms/round, db cpu {_us(out_row['db_cpu_us_per_entry'])} "
        f"us/entry, wal {out_row['wal_b_per_entry']:.0f} B/entry")
    return out_row


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


# -- saturation -----------------------------------------------------------------


def _claimer(table: str, rank: int, chunk: int, seconds: float, start: Any, out: Any) -> None:
    node = f"{table}-n{rank}"
    store = _store(table, node)
    won = calls = 0
    try:
        store.ensure_schema()
        for warm in range(6):  # statements prepared before the clock runs
            _claim_chunk(store, node, _requests("slot", [f"w{rank}-{warm}"], -1))
        store.flush_reports()
        start.wait()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            jobs = [f"s{rank}-{calls}-{k}" for k in range(chunk)]
            won += _claim_chunk(store, node, _requests("slot", jobs, 0))
            calls += 1
        store.flush_reports()
        out.put((rank, won, calls, None))
        start.wait()  # the parent has read the backends' CPU: the connection may end
    except BaseException as exc:  # noqa: BLE001
        out.put((rank, won, calls, repr(exc)))
        with suppress(Exception):
            start.abort()
    finally:
        store.close()


def _saturate(probe: Probe, k: int, chunk: int, seconds: float,
              log: Callable[[str], None]) -> dict[str, Any]:
    table, _ = names("capacity")
    setup = _store(table, f"{table}-setup")
    setup.ensure_schema()
    setup.close()
    start, out = _FORK.Barrier(k + 1), _FORK.Queue()
    procs = [_FORK.Process(target=_claimer, args=(table, i, chunk, seconds, start, out),
                           daemon=True) for i in range(k)]
    for p in procs:
        p.start()
    measure = Measure(probe, f"{table}-n", table)
    try:
        while len(probe.backends(f"{table}-n")) < k and all(p.is_alive() for p in procs):
            time.sleep(0.05)
        measure.start()
        start.wait(timeout=120)
        results = [out.get(timeout=seconds + 120) for _ in procs]
        row = measure.stop()
        start.wait(timeout=60)  # the claimers may close their connections now
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        drop_tables(PG_DSN, *claims_tables(table))
    errors = [e for *_, e in results if e]
    if errors:
        raise RuntimeError(f"capacity: a claimer failed: {errors[0]}")
    won = sum(w for _, w, _, _ in results)
    res = {"processes": k, "chunk": chunk, "seconds": row["wall"], "claims": won,
           "claims_per_s": won / row["wall"],
           "db_cores": None if row["db_cpu"] is None else row["db_cpu"] / row["wall"],
           "machine_busy": row["machine_busy"], "wal_b_per_claim": row["wal"] / max(1, won)}
    log(f"  saturation, {k} claimer(s): {res['claims_per_s']:.0f} claims/s, machine busy "
        f"{100 * res['machine_busy']:.0f}%")
    return res


# -- run tracking -------------------------------------------------------------------


def _runs(probe: Probe, runs: int, batches: Sequence[int],
          log: Callable[[str], None]) -> list[dict[str, Any]]:
    table, _ = names("capacity")
    beat = _store(table, f"{table}-beat")
    worker = _store(table, f"{table}-worker")
    out = []
    try:
        beat.ensure_schema()
        for i, batch in enumerate(batches):
            jobs = [f"run-{i}-{j}" for j in range(runs)]
            claimed = [r for c in range(0, runs, 1000)
                       for r in beat.claim(f"{table}-beat", _requests("slot", jobs[c:c + 1000], 0))]
            worker.clock()  # connected before the clock runs
            measure = Measure(probe, f"{table}-worker", table)
            piece = max(batch, 100)  # measured piece by piece: the WAL read stays short
            parts = []
            for p in range(0, runs, piece):
                measure.start()
                for event in (RunReport.STARTED, "succeeded"):
                    reports = [RunReport(r.request.job, r.occurrence,  # type: ignore[arg-type]
                                         r.request.task_id, event, "w@host",
                                         runtime=None if event == RunReport.STARTED else 0.01)
                               for r in claimed[p:p + piece]]
                    for b in range(0, len(reports), batch):
                        worker.record_runs(reports[b:b + batch])
                parts.append(measure.stop())
            row = _total(parts)
            res = {"batch": batch, "runs": runs, "ms_per_run": 1000 * row["wall"] / runs,
                   "db_cpu_us_per_run": None if row["db_cpu"] is None
                   else row["db_cpu"] / runs * 1e6,
                   "wal_b_per_run": row["wal"] / runs, "wal_how": row["wal_how"],
                   "connections": row["connections"]}
            out.append(res)
            log(f"  run tracking, batches of {batch}: db cpu {_us(res['db_cpu_us_per_run'])} "
                f"us/run, wal {res['wal_b_per_run']:.0f} B/run")
    finally:
        beat.close()
        worker.close()
        drop_tables(PG_DSN, *claims_tables(table))
    return out


# -- the section -------------------------------------------------------------------


def run(entries: int = 10_000, chunk: int = 1000, rounds: int = 5,
        nodes: Sequence[int] = (1, 3), kinds: Sequence[str] = ("slot", "window"),
        unprepared: bool = True, saturation: Sequence[int] = (1, 2, 4, 8),
        seconds: float = 6.0, runs: int = 1000, run_batches: Sequence[int] = (1, 100),
        window_s: float = 15.0, log: Callable[[str], None] = print) -> dict[str, Any]:
    window = timedelta(seconds=window_s)
    probe = Probe()
    try:
        settings = {name: str(probe.conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                    for name in ("max_connections", "shared_buffers", "synchronous_commit",
                                 "full_page_writes", "checkpoint_timeout", "wal_level")}
        ticks = [_tick(probe, kind, n, entries, chunk, rounds, window, {}, log)
                 for kind in kinds for n in nodes]
        if unprepared:
            ticks.append(_tick(probe, "slot", max(nodes), entries, chunk, rounds, window,
                               {"elarion_beat_pgbouncer": True}, log))
        sat = [_saturate(probe, k, chunk, seconds, log) for k in saturation]
        tracked = _runs(probe, runs, run_batches, log)
        walinspect = probe.walinspect
    finally:
        probe.close()
    return {"ticks": ticks, "saturation": sat, "runs": tracked, "server": settings,
            "walinspect": walinspect, "cpus": os.cpu_count()}


def tables(result: dict[str, Any]) -> list[Table]:
    ticks = Table("Capacity: database cost per due entry, one tick of N nodes",
                  ["entries", "kind", "nodes", "prepared", "round ms", "db CPU us/entry",
                   "db CPU us/claim call row", "WAL B/entry", "of which FPI B", "WAL of",
                   "client CPU us/row", "connections/node", "duplicates or missing"])
    for t in result["ticks"]:
        ticks.add(f"{t['entries']:,}", t["kind"], t["nodes"],
                  "no (pgbouncer mode)" if t["pgbouncer_mode"] else "yes", t["round_ms"],
                  t["db_cpu_us_per_entry"] if t["db_cpu_us_per_entry"] is not None else "-",
                  t["db_cpu_us_per_attempt"] if t["db_cpu_us_per_attempt"] is not None else "-",
                  t["wal_b_per_entry"], t["fpi_b_per_entry"], t["wal_how"],
                  t["client_cpu_us_per_attempt"],
                  t["connections_per_node"], t["duplicates_or_missing"])
    first = result["ticks"][0] if result["ticks"] else {}
    ticks.notes = [
        f"median of {first.get('rounds', '?')} rounds after a warm-up; chunks of "
        f"{first.get('chunk', '?')}; every node claims every entry (one wins, the others "
        "lose the chunk in one round trip), marks ride along, the last chunk's are flushed; "
        "'duplicates or missing' = |wins - entries| per round, summed (a window job is won "
        "again only when a round outlasts the window)",
        "db CPU = the nodes' PostgreSQL backends (/proc/<pid>/schedstat); per entry = all "
        "nodes' work for one due entry; per claim call row = per entry and node",
        "WAL of 'table' = the records of the claims table and of its transactions "
        "(pg_walinspect); 'server' = the whole server's WAL, other sessions included "
        "(pg_walinspect missing, or the segment recycled before it was read)",
        f"server: {', '.join(f'{k} {v}' for k, v in result.get('server', {}).items())}; "
        f"{result.get('cpus')} cores shared by clients and server"]
    sat = Table("Capacity: claims per second with k concurrent claimers (distinct jobs)",
                ["claimers", "chunk", "seconds", "claims won", "claims/s", "db cores used",
                 "machine busy %", "WAL B/claim"])
    for s in result["saturation"]:
        sat.add(s["processes"], s["chunk"], s["seconds"], s["claims"], s["claims_per_s"],
                s["db_cores"] if s["db_cores"] is not None else "-",
                100 * s["machine_busy"], s["wal_b_per_claim"])
    sat.notes = ["each claimer is a process with its own store, claiming chunks of fresh "
                 "jobs (all won) in a loop; clients and PostgreSQL share the same cores"]
    runs = Table("Capacity: worker run tracking (a start and a finish per run)",
                 ["batch", "runs", "ms/run", "db CPU us/run", "WAL B/run", "WAL of",
                  "connections"])
    for r in result["runs"]:
        runs.add(r["batch"], r["runs"], r["ms_per_run"],
                 r["db_cpu_us_per_run"] if r["db_cpu_us_per_run"] is not None else "-",
                 r["wal_b_per_run"], r.get("wal_how", "-"), r["connections"])
    runs.notes = ["batch 1: a worker process running one task at a time writes each "
                  "transition alone (two transactions per run)"]
    return [ticks, sat, runs]

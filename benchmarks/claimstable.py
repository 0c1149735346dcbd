"""8. The claims table as it grows: claim latency with N rows already there, and the purge.

Two layouts: ``plain`` (the default table) and ``partitioned``
(``elarion_beat_claims_layout = "partitioned"``: PostgreSQL declarative
partitions by UTC day of ``occurrence_utc``). Each size gets a fresh table made
by the store's own ``ensure_schema()`` (the partitioned one also gets the day
partitions of the history, with ``ensure_partitions``), in a scratch schema of
its own, prefilled with N rows of history (:mod:`benchmarks.claimsfill`: 10,000
jobs' claims over the last 7 days).

Claims go through the real ``PostgresClaimStore.claim``, one chunk of
``chunk`` requests per call, as a tick sends them: 80% exact slots (a new
occurrence at now, to the second, of a slot job) and 20% interval windows (60 s
interval, of a job last claimed minutes ago), ``chunks`` chunks after one
untimed warm-up: p50/p99 milliseconds per chunk, and their ratio to the empty
table. Each window job is claimed once per run (so it wins, as in a real tick);
the slot jobs rotate. Then two chunks of slot claims only: "cold", jobs no claim
has touched since the fill, and "hot", jobs claimed seconds before. A chunk
that hits the statement timeout (raised to 60 s here) counts as failed.

The purge, at ``purge_rows`` rows, as beat runs it: ``purge_pass`` stretches of
``elarion_beat_purge_budget`` seconds until the pass is done, keeping
``purge_keep_days`` of the 7 days of history (the rest is past retention). The
plain table deletes rows in batches of ``elarion_beat_purge_batch`` (each timed:
the longest batch is the longest the purge holds its row locks), the partitioned
one drops the partitions that lie wholly before the cutoff, then deletes the
rest in batches. Counted: rows and partitions before and after (``count(*)``),
the size, and the dead tuples the statistics report afterwards (PostgreSQL's
autovacuum setting is recorded: a dead tuple stays until a vacuum).
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from celery_elarion_beat.config.settings import SETTINGS, Settings
from celery_elarion_beat.exceptions import StoreError
from celery_elarion_beat.schedules.slots import slot_task_id, window_length
from celery_elarion_beat.store import ClaimRequest
from celery_elarion_beat.store.postgres import PostgresClaimStore

from . import claimsfill as cf
from .common import PG_DSN, PREFIX, UTC, Table, percentile, run_id

LAYOUTS = ("plain", "partitioned")
LAYOUT_KEY = "elarion_beat_claims_layout"
NODE = "elbench-node"
#: a claim may take this long here (the default would turn a slow chunk into an error)
CLAIM_TIMEOUT = 60.0
DEFAULT_TIMEOUT = float(next(s.default for s in SETTINGS if s.key == "elarion_beat_claim_timeout"))
INTERVAL = timedelta(seconds=60)


def layout_available(layout: str) -> bool:
    return layout == "plain" or any(s.key == LAYOUT_KEY for s in SETTINGS)


#: the scratch schemas: a run's table lives in one of its own, out of reach of the
#: ``elbench_*`` table clean-up of other benchmark runs (the schema's session lock
#: says it is in use; a schema nobody holds is an interrupted run's: dropped)
SCHEMA_PREFIX = f"{PREFIX}_ct_"
_LOCK_NS = (zlib.crc32(b"elbench claimstable") ^ 0x80000000) - 0x80000000


@contextlib.contextmanager
def scratch_schema() -> Iterator[str]:
    """A fresh schema, held (session advisory lock) until it is dropped."""
    schema = SCHEMA_PREFIX + run_id()
    with psycopg.connect(PG_DSN, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (_LOCK_NS, schema))
        try:
            yield schema
        finally:
            holder.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def reclaim_leftovers() -> list[str]:
    """Drop the scratch schemas no run holds (left by an interrupted run)."""
    dropped = []
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        rows = conn.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)",
                            (SCHEMA_PREFIX,)).fetchall()
        for (schema,) in rows:
            got = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                               (_LOCK_NS, schema)).fetchone()
            if got and got[0]:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (_LOCK_NS, schema))
                dropped.append(schema)
    return dropped


def _store(schema: str, table: str, layout: str) -> PostgresClaimStore:
    conf: dict[str, Any] = {"elarion_beat_dsn": PG_DSN, "elarion_beat_table": table,
                            "elarion_beat_schema": schema, "elarion_beat_node": NODE,
                            "elarion_beat_claim_timeout": CLAIM_TIMEOUT}
    if layout != "plain":
        conf[LAYOUT_KEY] = layout
    return PostgresClaimStore(Settings.from_mapping(conf))


class Pools:
    """Which jobs each kind of chunk claims: windows ``[0, w)`` (each once), cold
    ``[w, w + chunk)``, slot jobs ``[w + chunk, w + 2 chunk)`` (hot: claimed again)."""

    def __init__(self, jobs: int, chunk: int, chunks: int, window_share: float) -> None:
        self.chunk = chunk
        self.per_window = round(chunk * window_share)
        self.windows = (chunks + 1) * self.per_window
        self.cold = range(self.windows, self.windows + chunk)
        self.slots = range(self.windows + chunk, self.windows + 2 * chunk)
        if self.slots.stop > jobs:
            raise ValueError(f"{jobs} jobs are too few for {chunks} chunks of {chunk}")

    def mixed(self, i: int, slot: datetime, window: timedelta) -> list[ClaimRequest]:
        """Chunk *i*: slot claims of the rotating slot jobs, window claims of fresh jobs."""
        n_slots = self.chunk - self.per_window
        start = i * n_slots
        reqs = [_slot(cf.job_name(self.slots[(start + k) % len(self.slots)]), slot)
                for k in range(n_slots)]
        reqs += [ClaimRequest.for_window(cf.job_name(i * self.per_window + k), window,
                                         str(uuid.uuid4())) for k in range(self.per_window)]
        return reqs


def _slot(job: str, slot: datetime) -> ClaimRequest:
    return ClaimRequest.for_slot(job, slot, slot_task_id(job, slot))


def _timed(store: PostgresClaimStore, reqs: Sequence[ClaimRequest]) -> tuple[float | None, int]:
    """Milliseconds of one claim call and the claims won; None when the claim failed
    (it took longer than the statement timeout)."""
    t0 = time.perf_counter()
    try:
        results = store.claim(NODE, reqs)
    except StoreError:
        return None, 0
    return 1000 * (time.perf_counter() - t0), sum(r.won for r in results)


def _stats(ms: Sequence[float | None]) -> dict[str, Any]:
    """p50/p99 of the chunks; a failed chunk counts as the timeout (then a lower bound)."""
    bound = 1000 * CLAIM_TIMEOUT
    values = [bound if t is None else t for t in ms]
    return {"p50": percentile(values, 50), "p99": percentile(values, 99),
            "failed": sum(t is None for t in ms),
            "over_default_timeout": sum(1 for t in values if t > 1000 * DEFAULT_TIMEOUT)}


def _claims(store: PostgresClaimStore, pools: Pools, chunks: int,
            max_failed: int = 3) -> dict[str, Any]:
    """The timed chunks (stopped after *max_failed* failed ones), then cold and hot."""
    window = window_length(INTERVAL, store.settings.window_tolerance)
    slot = store.clock().replace(microsecond=0) - timedelta(seconds=1)

    def next_slot() -> datetime:  # now, to the second, and never the same twice
        nonlocal slot
        slot = max(slot + timedelta(seconds=1), datetime.now(UTC).replace(microsecond=0))
        return slot

    _timed(store, pools.mixed(chunks, next_slot(), window))  # warm-up
    series: list[tuple[float | None, int]] = []
    for i in range(chunks):
        series.append(_timed(store, pools.mixed(i, next_slot(), window)))
        if sum(t is None for t, _ in series) >= max_failed:
            break
    last = next_slot()
    cold = _timed(store, [_slot(cf.job_name(j), last) for j in pools.cold])
    hot = _timed(store, [_slot(cf.job_name(j), last) for j in pools.slots])
    ms = [t for t, _ in series]
    return {"ms": ms, **_stats(ms), "won": sum(w for _, w in series),
            "requests": len(series) * pools.chunk, "cold_ms": cold[0], "hot_ms": hot[0],
            "cold_won": cold[1], "hot_won": hot[1]}


def _purge(store: PostgresClaimStore, schema: str, table: str,
           keep: timedelta) -> dict[str, Any]:
    """The purge as beat runs it: stretches of ``elarion_beat_purge_budget`` seconds
    (``purge_pass``), one after the other until the pass is done."""
    batches: list[float] = []
    inner = store._delete_batch

    def timed(*args: Any, **kwargs: Any) -> Any:  # each batch transaction of the delete
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            batches.append(1000 * (time.perf_counter() - t))

    store._delete_batch = timed  # type: ignore[method-assign]
    with cf.connect(schema) as conn:
        rows_before, before = cf.count(conn, table), cf.sizes(conn, table)
    settings = store.settings
    stretches: list[float] = []
    dropped: list[str] = []
    progress = None
    t0 = time.perf_counter()
    while progress is None or not progress.done:
        t = time.perf_counter()
        progress = store.purge_pass(keep, batch_size=settings.purge_batch,
                                    budget=settings.purge_budget, resume=progress)
        stretches.append(time.perf_counter() - t)
        dropped += progress.dropped
    wall = time.perf_counter() - t0
    store.close()  # its sessions end: their statistics are flushed
    time.sleep(1.5)
    with cf.connect(schema) as conn:
        rows_after, after = cf.count(conn, table), cf.sizes(conn, table)
        _, dead = cf.dead_tuples(conn, table)
        autovacuum = conn.execute("SHOW autovacuum").fetchone()
    return {"keep_days": keep.total_seconds() / 86400, "returned": progress.total,
            "wall_s": wall, "budget_s": settings.purge_budget, "stretches": len(stretches),
            "longest_stretch_s": max(stretches), "dropped": dropped,
            "rows_before": rows_before, "rows_after": rows_after,
            "removed": rows_before - rows_after, "size_before": before, "size_after": after,
            "dead_after": dead, "batches": len(batches),
            "longest_batch_ms": max(batches) if batches else None,
            "autovacuum": autovacuum[0] if autovacuum else "?"}


def _history_partitions(store: PostgresClaimStore, history: cf.History) -> None:
    """The day partitions of the history's days (the store makes today's and ahead)."""
    day = history.start.replace(hour=0, minute=0, second=0, microsecond=0)
    while day <= history.end:
        store.ensure_partitions(now=day)
        day += timedelta(days=1)
    store.ensure_partitions()


def measure(layout: str, rows: int, jobs: int, chunk: int, chunks: int, window_share: float,
            purge_keep_days: float | None, log: Callable[[str], None]) -> dict[str, Any]:
    """One fresh table of *layout* with *rows* rows: fill, claims, and the purge if asked."""
    pools = Pools(jobs, chunk, chunks, window_share)
    with scratch_schema() as schema:
        table = schema  # one table per schema: the same name, short enough for partitions
        store = _store(schema, table, layout)
        try:
            store.ensure_schema()
            out: dict[str, Any] = {"layout": layout, "rows": rows, "schema": schema}
            if rows:
                end = store.clock().replace(second=0, microsecond=0) - timedelta(minutes=5)
                history = cf.History(rows, jobs, pools.windows, end)
                if layout != "plain":
                    _history_partitions(store, history)
                out["fill"] = cf.fill(schema, table, history, store.cluster, log=log)
            with cf.connect(schema) as conn:
                out["size"] = cf.sizes(conn, table)
            out["claims"] = c = _claims(store, pools, chunks)
            log(f"  {layout}, {rows:,} rows: p50 {_ms(c['p50'])} ms, p99 {_ms(c['p99'])} ms, "
                f"failed {c['failed']}, cold {_ms(c['cold_ms'])} ms, hot {_ms(c['hot_ms'])} ms, "
                f"size {out['size']['total'] / 2**20:,.0f} MB"
                + (f", fill {out['fill']['total_s']:.0f}s" if rows else ""))
            if purge_keep_days is not None:
                out["purge"] = p = _purge(store, schema, table, timedelta(days=purge_keep_days))
                log(f"  {layout}, purge of {rows:,} rows: removed {p['removed']:,} in "
                    f"{p['wall_s']:.1f}s ({p['stretches']} stretches), dead tuples after "
                    f"{p['dead_after']:,}")
            return out
        finally:
            store.close()


def run(rows: dict[str, Sequence[int]], jobs: int = 10_000, chunk: int = 1000,
        chunks: int = 30, window_share: float = 0.2, purge_rows: int = 10_000_000,
        purge_keep_days: float = 4.0, fill_budget_s: dict[str, float] | None = None,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every layout at each of its *rows* sizes. A size whose fill would take longer
    than the layout's *fill_budget_s* (at the rate of its previous fill) is skipped."""
    reclaim_leftovers()
    runs: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for layout in LAYOUTS:
        if not layout_available(layout):
            skipped.append({"layout": layout, "rows": None,
                            "why": f"{LAYOUT_KEY} does not exist in this version"})
            continue
        rate: float | None = None
        budget = (fill_budget_s or {}).get(layout)
        for n in rows.get(layout, ()):
            estimate = n / rate if rate else None
            if estimate is not None and budget is not None and estimate > budget:
                skipped.append({"layout": layout, "rows": n,
                                "why": f"fill estimated at {estimate / 60:.0f} min, over the "
                                       f"budget of {budget / 60:.0f} min"})
                log(f"  {layout}, {n:,} rows: skipped ({skipped[-1]['why']})")
                continue
            r = measure(layout, n, jobs, chunk, chunks, window_share,
                        purge_keep_days if n == purge_rows else None, log)
            if n:
                rate = n / r["fill"]["total_s"]
            runs.append(r)
    return {"jobs": jobs, "chunk": chunk, "chunks": chunks, "window_share": window_share,
            "purge_rows": purge_rows, "purge_keep_days": purge_keep_days,
            "claim_timeout": CLAIM_TIMEOUT, "server": _server(), "runs": runs,
            "skipped": skipped}


def _server() -> dict[str, str]:
    """The PostgreSQL settings the figures depend on."""
    names = ("shared_buffers", "work_mem", "jit", "jit_above_cost", "autovacuum",
             "random_page_cost", "effective_cache_size")
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]


def _ms(value: float | None) -> str:
    """Milliseconds for a table; a failed claim took at least the timeout."""
    bound = 1000 * CLAIM_TIMEOUT
    if value is None or value >= bound:
        return f">= {bound:.0f}"
    return f"{value:.1f}"


def _mb(n: int) -> float:
    return n / 2**20


def tables(result: dict[str, Any]) -> list[Table]:
    runs = result["runs"]
    empty = {r["layout"]: r["claims"] for r in runs if r["rows"] == 0}
    fill = Table("Claims table: prefill (INSERT ... SELECT, indexes rebuilt, VACUUM ANALYZE)",
                 ["layout", "rows", "jobs", "claim every", "insert s", "indexes s",
                  "vacuum s", "total s", "table MB", "indexes MB", "total MB", "partitions"])
    lat = Table(f"Claims table: claim latency per chunk of {result['chunk']} "
                f"({100 - round(100 * result['window_share'])}% slots, "
                f"{round(100 * result['window_share'])}% windows)",
                ["layout", "rows", "chunks", "p50 ms", "p99 ms", "p50 / empty", "p99 / empty",
                 "won", "failed", f"over {DEFAULT_TIMEOUT:g} s", "cold chunk ms",
                 "hot chunk ms"])
    for r in runs:
        s, c = r["size"], r["claims"]
        if r["rows"]:
            f = r["fill"]
            fill.add(r["layout"], f"{r['rows']:,}", f"{f['jobs']:,}", f"{f['step_s']:g} s",
                     f["insert_s"], f["index_s"], f["vacuum_s"], f["total_s"], _mb(s["heap"]),
                     _mb(s["index"]), _mb(s["total"]), s["partitions"])
        e = empty.get(r["layout"])
        lat.add(r["layout"], f"{r['rows']:,}", len(c["ms"]), _ms(c["p50"]), _ms(c["p99"]),
                c["p50"] / e["p50"] if e else math.nan, c["p99"] / e["p99"] if e else math.nan,
                f"{c['won']}/{c['requests']}", c["failed"], c["over_default_timeout"],
                _ms(c["cold_ms"]), _ms(c["hot_ms"]))
    for s in result["skipped"]:
        rows = f"{s['rows']:,}" if s["rows"] is not None else "all"
        lat.notes.append(f"not measured: {s['layout']}, {rows} rows: {s['why']}")
    lat.notes += [f"one store.claim() call per chunk (one round trip), after one untimed "
                  f"warm-up chunk; cold/hot: one chunk of {result['chunk']} slot claims for "
                  "jobs untouched since the fill / claimed seconds before",
                  f"elarion_beat_claim_timeout (statement_timeout) raised to "
                  f"{result['claim_timeout']:g} s here; failed = the chunk hit it (counted as "
                  f"{result['claim_timeout']:g} s: a p50/p99 with '>=' is a lower bound; the "
                  f"series stops after 3); over {DEFAULT_TIMEOUT:g} s = chunks that the "
                  "default timeout would have failed"]
    server = result.get("server")
    if server:
        lat.notes.append("PostgreSQL: " + ", ".join(f"{k} {v}" for k, v in server.items()))
    fill.notes = ["the history: 7 days of claims of each job, the newest 5 minutes old; an "
                  "index built in one pass is denser than one grown by inserts"]
    purge = Table(f"Claims table: purge at {result['purge_rows']:,} rows, keeping "
                  f"{result['purge_keep_days']:g} of 7 days",
                  ["layout", "rows before", "rows removed", "partitions before -> after",
                   "wall s", "stretches", "longest stretch s", "batches", "longest batch ms",
                   "MB before", "MB after", "dead tuples after"])
    notes: list[str] = []
    for r in runs:
        p = r.get("purge")
        if p:
            purge.add(r["layout"], f"{p['rows_before']:,}", f"{p['removed']:,}",
                      f"{p['size_before']['partitions']} -> {p['size_after']['partitions']}",
                      p["wall_s"], p["stretches"], p["longest_stretch_s"], p["batches"],
                      p["longest_batch_ms"] if p["longest_batch_ms"] is not None else "-",
                      _mb(p["size_before"]["total"]), _mb(p["size_after"]["total"]),
                      f"{p['dead_after']:,}")
            notes = [f"beat's purge: purge_pass() stretches of elarion_beat_purge_budget "
                     f"({p['budget_s']:g} s), one per tick, until done; a batch = one DELETE "
                     f"transaction of elarion_beat_purge_batch rows; autovacuum on the "
                     f"server: {p['autovacuum']}",
                     "plain: deletes the rows claimed before the cutoff (each job's newest "
                     "kept); partitioned: drops the day partitions wholly before the cutoff "
                     "(each job's newest claim re-inserted into DEFAULT), then the batched "
                     "delete of the rest"]
    purge.notes = notes
    return [fill, lat, purge] if purge.rows else [fill, lat]

"""11. Durable one-offs: N one-offs due within a window, published by real beat nodes.

One one-off is written with ``schedule_once``; the other N - 1 are copies of its row
(its task, options and payload; a new id each) written by one ``INSERT ... SELECT
generate_series`` (``schedule_once`` costs three round trips a one-off: about 300 a
second here, 6 minutes for 100,000). They fall due evenly over ``window`` seconds,
``lead`` seconds after they were written; then ``nodes`` real ``celery beat``
processes of :mod:`benchmarks.one_offs_app` start on the same table and queue.
Nothing consumes the queue but a :class:`~benchmarks.common.QueueReader`, which
counts each message's task id. From the rows (database clock) and the messages:

* the time from the first due time to the last publish, and from the last due time
  to the last publish (the lag behind the schedule);
* lateness per one-off (published - due): p50, p99, max;
* lease statements: distinct ``(node, lease_until)`` pairs (one lease statement sets
  one ``lease_until`` for its whole batch), and one-offs per statement;
* each node's share; duplicates (task ids sent more than once) and missing ones.

When the beats take longer than ``lead`` to start, the first one-offs are already
due: ``beats_late`` says by how many seconds.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from celery_elarion_beat import OneOffState, schedule_once
from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.one_offs.api import close_stores
from celery_elarion_beat.store import open_store
from celery_elarion_beat.testing._harness import (
    ProcessManager,
    claims_tables,
    drop_tables,
    wait_until,
)

from .common import (
    PG_DSN,
    PREFIX,
    REDIS_URL,
    QueueReader,
    Table,
    drop_queue,
    names,
    percentile,
)
from .one_offs_app import TASK, make_app

APP = "benchmarks.one_offs_app"
READY = "beat: claiming occurrences in"


def run(one_offs: int = 100_000, nodes: int = 3, window: float = 60.0, lead: float = 30.0,
        batch: int = 500, poll: float = 1.0, timeout: float = 600.0) -> dict[str, Any]:
    table, queue = names("oneoffs")
    env = {"ELARION_BENCH_BROKER": REDIS_URL, "ELARION_BENCH_QUEUE": queue,
           "ELARION_BENCH_PG_DSN": PG_DSN, "ELARION_BENCH_TABLE": table,
           "ELARION_BENCH_POLL": str(poll), "ELARION_BENCH_BATCH": str(batch),
           # one cluster for the beats and this process, which schedules (its app's main
           # name is another)
           "ELARION_BEAT_CLUSTER": "elbench_one_offs"}
    app = make_app(env, main=f"elbench-oneoffs-{table[-6:]}")
    app.conf.elarion_beat_cluster = env["ELARION_BEAT_CLUSTER"]
    store = open_store(Settings.from_app(app))
    settings = store.settings
    workdir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-oneoffs-"))
    pm = ProcessManager(workdir, APP, env)
    reader = QueueReader(queue)
    ok = False
    try:
        store.ensure_schema()
        reader.start()
        t0 = time.monotonic()
        base = _write(app, store.settings.one_offs_table, one_offs, window, lead)
        written_s = time.monotonic() - t0
        beats = [pm.beat(f"beat-{i}", env={"ELARION_BENCH_NODE": f"node-{i}"})
                 for i in range(1, nodes + 1)]
        for beat in beats:
            beat.wait_for_log(READY, 120)
        beats_late = max(0.0, store.clock().timestamp() - base)
        pending = [OneOffState.SCHEDULED, OneOffState.LEASED]
        wait_until(lambda: not store.one_offs(states=pending, limit=1),
                   timeout + lead + window, interval=1.0,
                   message=lambda: f"every one-off to be published\n{pm.tails(20)}")
        wait_until(lambda: len(reader.snapshot()) >= one_offs, 60, interval=0.5,
                   message="the reader to receive every message")
        time.sleep(1.0)  # a duplicate in flight lands
        received = reader.stop()
        rows = store.one_offs(limit=one_offs + 1000)
        ok = True
    finally:
        reader.stop()
        pm.stop_all(20)
        store.close()
        close_stores()  # the one schedule_once opened
        app.close()
        drop_tables(PG_DSN, settings.one_offs_table, *claims_tables(table))
        drop_queue(queue)
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
    return _result(rows, received, one_offs=one_offs, nodes=nodes, window=window, batch=batch,
                   poll=poll, lead=lead, written_s=written_s, beats_late=beats_late)


def _write(app: Any, table: str, n: int, window: float, lead: float) -> float:
    """Write *n* one-offs due evenly over *window* seconds from *lead* seconds on (database
    clock); the first due time, as a timestamp."""
    template = schedule_once(app, TASK, (0,), countdown=10 * 86400)
    query = sql.SQL("""
        INSERT INTO {t} (cluster, id, idem_key, task_name, due_utc, state, created_at,
                         attempts, options, content_type, content_encoding, body)
        SELECT o.cluster, gen_random_uuid()::text, NULL, o.task_name,
               to_timestamp(%(base)s + %(window)s * (i - 1) / %(n)s), 'scheduled',
               statement_timestamp(), 0, o.options, o.content_type, o.content_encoding, o.body
        FROM {t} o, generate_series(1, %(n)s) AS i WHERE o.id = %(template)s
        """).format(t=sql.Identifier(table))
    with psycopg.connect(PG_DSN) as conn:
        now = conn.execute("SELECT extract(epoch FROM statement_timestamp())").fetchone()
        assert now is not None
        base = float(now[0]) + lead
        conn.execute(query, {"base": base, "window": float(window), "n": n,
                             "template": template.id})
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(sql.Identifier(table)),
                     (template.id,))
    return base


def _result(rows: list[Any], received: list[tuple[dict[str, Any], float]],
            **params: Any) -> dict[str, Any]:
    states = Counter(r.state.value for r in rows)
    published = [r for r in rows if r.published is not None]
    late = sorted((r.published - r.due).total_seconds() for r in published)
    first_due = min(r.due for r in rows)
    last_due = max(r.due for r in rows)
    last_published = max(r.published for r in published)
    leases = Counter((r.node, r.lease_until) for r in published)
    per_node = Counter(r.node for r in published)
    statements = Counter(node for node, _ in leases)
    ids = Counter(h.get("id") for h, _ in received)
    want = {r.id for r in rows}
    return {
        **params,
        "rows": len(rows), "states": dict(states),
        "first_due_to_all_published_s": (last_published - first_due).total_seconds(),
        "last_due_to_all_published_s": (last_published - last_due).total_seconds(),
        "lateness_s": {"p50": percentile(late, 50), "p99": percentile(late, 99),
                       "max": late[-1] if late else None},
        "lease_statements": len(leases),
        "one_offs_per_statement": len(published) / len(leases) if leases else 0.0,
        "per_node": {node: {"one_offs": per_node[node], "lease_statements": statements[node]}
                     for node in sorted(per_node)},
        "attempts": dict(Counter(r.attempts for r in rows)),
        "messages": sum(ids.values()),
        "duplicates": sum(1 for i, k in ids.items() if k > 1),
        "missing": len(want - set(ids)),
        "foreign": len(set(ids) - want),
    }


def tables(result: dict[str, Any]) -> list[Table]:
    summary = Table(
        f"One-offs: {result['one_offs']:,} due within {result['window']:g} s, "
        f"{result['nodes']} beat nodes",
        ["one-offs", "nodes", "written s", "first due -> all published s",
         "last due -> all published s", "late p50 s", "late p99 s", "late max s",
         "lease statements", "per statement", "messages", "duplicates", "missing"])
    lat = result["lateness_s"]
    summary.add(result["one_offs"], result["nodes"], result["written_s"],
                result["first_due_to_all_published_s"], result["last_due_to_all_published_s"],
                lat["p50"], lat["p99"], lat["max"], result["lease_statements"],
                result["one_offs_per_statement"], result["messages"], result["duplicates"],
                result["missing"])
    summary.notes.append(f"batch {result['batch']}, poll {result['poll']:g} s; the beats were "
                         f"ready {result['beats_late']:.1f} s after the first due time")
    split = Table("One-offs, per node", ["node", "one-offs", "share %", "lease statements"])
    total = sum(n["one_offs"] for n in result["per_node"].values()) or 1
    for node, n in result["per_node"].items():
        split.add(node, n["one_offs"], 100.0 * n["one_offs"] / total, n["lease_statements"])
    return [summary, split]

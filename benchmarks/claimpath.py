"""The claim path, measured in one process: what ``--compare`` runs on two trees.

``python benchmarks/claimpath.py --out FILE`` measures, against PostgreSQL and Redis,
and writes one JSON object (no prose, no tables):

* ``chunk``: ``PostgresClaimStore.claim`` of one chunk of ``chunk`` requests (80 %
  exact slots, 20 % windows), each a new occurrence, on a fresh table: seconds per
  call, after a warm-up;
* ``tick_events_on`` / ``tick_events_off``: one ``ClaimingScheduler`` in process with
  ``entries`` interval entries all due, driven with ``tick()`` until nothing is due
  (claims in chunks, publishes to Redis): seconds, Celery events on and off;
* ``floor``: Celery's own ``app.send_task`` loop publishing ``entries`` messages to the
  same Redis on one producer: seconds (what any beat pays to publish them);
* ``idle_tick``: seconds of one ``tick()`` of the same scheduler when nothing is due.

It imports only paths every release since 0.2 has (``celery_elarion_beat``'s face and
``celery_elarion_beat.store.postgres``), so ``--compare`` can run this file of the
working tree against the package of an older commit (``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import redis
from celery import Celery

import celery_elarion_beat
from celery_elarion_beat import ClaimingScheduler, ClaimRequest, Settings
from celery_elarion_beat.store.postgres import PostgresClaimStore

PG_DSN = os.environ.get("ELARION_BENCH_PG_DSN",
                        os.environ.get("ELARION_TEST_PG_DSN",
                                       "postgresql://postgres@127.0.0.1:5432/test"))
REDIS_URL = os.environ.get("ELARION_BENCH_REDIS_URL",
                           os.environ.get("ELARION_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
UTC = timezone.utc
TASK = "bench.noop"


def _drop(table: str) -> None:
    base = table[:-len("_claims")] if table.endswith("_claims") else table
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE tablename = %s "
                            "OR tablename LIKE %s", (table, f"{base}\\_%")).fetchall()
        for (name,) in rows:
            conn.execute(f'DROP TABLE IF EXISTS "{name}" CASCADE')


def _drop_queue(queue: str) -> None:
    with redis.Redis.from_url(REDIS_URL) as r:
        keys = list(r.scan_iter(match=f"*{queue}*", count=1000))
        if keys:
            r.delete(*keys)


def chunk(size: int, reps: int) -> list[float]:
    """Seconds per claim of one chunk of *size* new occurrences."""
    table = f"elbench_cp_{uuid.uuid4().hex[:8]}_claims"
    store = PostgresClaimStore(Settings.from_mapping({"elarion_beat_dsn": PG_DSN,
                                                      "elarion_beat_table": table}))
    base = datetime(2030, 1, 1, tzinfo=UTC)
    slots, windows = size * 4 // 5, size - size * 4 // 5
    times: list[float] = []
    try:
        store.ensure_schema()
        for rep in range(reps + 3):  # three untimed warm-up calls
            at = base + timedelta(minutes=rep)
            requests = [ClaimRequest.for_slot(f"slot-{i:04}", at, f"s{rep}-{i}")
                        for i in range(slots)]
            requests += [ClaimRequest.for_window(f"window-{i:04}", timedelta(milliseconds=1),
                                                 f"w{rep}-{i}") for i in range(windows)]
            gc.collect()
            started = time.perf_counter()
            results = store.claim("bench-node", requests)
            took = time.perf_counter() - started
            assert all(r.won for r in results[:slots]), "a new slot was not won"
            if rep >= 3:
                times.append(took)
            time.sleep(0.002)  # past the windows
    finally:
        store.close()
        _drop(table)
    return times


def _app(queue: str, table: str, events: bool) -> Celery:
    app = Celery(f"elbench-cp-{queue}", broker=REDIS_URL, set_as_current=False)
    app.conf.update(task_default_queue=queue, task_default_exchange=queue,
                    task_default_routing_key=queue, event_exchange=f"{queue}.ev",
                    elarion_beat_dsn=PG_DSN, elarion_beat_table=table,
                    elarion_beat_node="bench-node", elarion_beat_events=events,
                    elarion_beat_heartbeat_interval=60.0, beat_max_loop_interval=60)

    @app.task(name=TASK, shared=False)
    def noop(*args: Any) -> None: ...

    return app


def tick(entries: int, events: bool) -> tuple[float, float]:
    """(seconds to send *entries* due interval entries, seconds of an idle tick after)."""
    tag = uuid.uuid4().hex[:8]
    queue, table = f"elbench.cp.{tag}", f"elbench_cp_{tag}_claims"
    app = _app(queue, table, events)
    due = datetime.now(UTC) - timedelta(seconds=120)
    app.conf.beat_schedule = {f"interval-{i:05}": {"task": TASK, "schedule": timedelta(seconds=60),
                                                   "args": (i,), "last_run_at": due}
                              for i in range(entries)}
    scheduler = ClaimingScheduler(app)
    try:
        scheduler.producer  # noqa: B018 - connect to the broker before the clock starts
        gc.collect()
        started = time.perf_counter()
        for _ in range(entries + 10):
            if scheduler.tick() > 0:
                break
        took = time.perf_counter() - started
        idle_started = time.perf_counter()
        scheduler.tick()
        idle = time.perf_counter() - idle_started
        events = getattr(scheduler, "events", None)
        if events is not None:
            events.flush(60.0)  # untimed: the events' own thread sends them
    finally:
        scheduler.close()
        _drop(table)
        _drop_queue(queue)
    return took, idle


def floor(entries: int) -> float:
    """Seconds of Celery's own send_task loop for *entries* messages on one producer."""
    queue = f"elbench.cp.{uuid.uuid4().hex[:8]}"
    app = _app(queue, "unused_claims", False)
    try:
        with app.producer_or_acquire() as producer:
            app.send_task(TASK, (-1,), producer=producer)
            gc.collect()
            started = time.perf_counter()
            for i in range(entries):
                app.send_task(TASK, (i,), producer=producer, headers={"celery_beat_task": True})
            return time.perf_counter() - started
    finally:
        _drop_queue(queue)


def measure(entries: int, size: int, reps: int) -> dict[str, Any]:
    chunks = chunk(size, reps)
    on, idle = tick(entries, events=True)
    off, _ = tick(entries, events=False)
    return {"package": str(Path(celery_elarion_beat.__file__).parent),
            "version": celery_elarion_beat.__version__,
            "entries": entries, "chunk_size": size,
            "chunk_p50": statistics.median(chunks),
            "chunk_p99": sorted(chunks)[max(0, round(0.99 * len(chunks)) - 1)],
            "tick_events_on": on, "tick_events_off": off, "floor": floor(entries),
            "idle_tick": idle}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/claimpath.py")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    args.out.write_text(json.dumps(measure(args.entries, args.chunk, args.reps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

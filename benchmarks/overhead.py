"""1. Overhead: ClaimingScheduler vs stock ``celery.beat.Scheduler``, one process.

Both schedulers get the same N interval entries, all due (``last_run_at`` two
periods ago), publish to the same Redis broker (one queue of their own per run)
and are driven the same way: ``tick()`` until a tick returns a positive delay,
i.e. nothing is due any more. Stock beat sends one entry per tick (N ticks);
ClaimingScheduler claims the batch in chunks of ``elarion_beat_claim_chunk``
(one PostgreSQL round trip each; window claims, a fresh claims table per run)
and publishes each chunk's winners. The arms alternate, ABC CBA ..., after an
untimed warm-up round.

Timed: from the first ``tick()`` (heap population included for both) to the
return of the last one. Building the scheduler and connecting the producer are
not timed. ClaimingScheduler's Celery events are published by a thread of their
own after the tick has queued them: the time until that queue is drained
(``EventSender.flush``) is measured too, as "events drained".
"""

from __future__ import annotations

import gc
import time
from datetime import datetime, timedelta
from typing import Any

from celery.beat import Scheduler

from celery_elarion_beat import ClaimingScheduler
from celery_elarion_beat.testing._harness import claims_tables, drop_tables

from .common import (
    PG_DSN,
    UTC,
    Table,
    drop_queue,
    make_app,
    median,
    names,
    queue_length,
)


def _entries(n: int, tag: str) -> dict[str, Any]:
    due_since = datetime.now(UTC) - timedelta(seconds=120)
    return {f"interval-{tag}-{i:05}": {"task": "bench.noop", "schedule": timedelta(seconds=60),
                                       "args": (i,), "last_run_at": due_since}
            for i in range(n)}


def _drive(scheduler: Any, limit: int) -> tuple[float, int]:
    """tick() until nothing is due; return (seconds, ticks)."""
    gc.collect()
    ticks = 0
    started = time.perf_counter()
    while True:
        delay = scheduler.tick()
        ticks += 1
        if delay > 0 or ticks > limit:
            break
    return time.perf_counter() - started, ticks


#: the arms: ours with the library's defaults, ours without Celery events, stock beat
KINDS = ("elarion", "elarion-noevents", "stock")
LABELS = {"elarion": "ClaimingScheduler (defaults)",
          "elarion-noevents": "ClaimingScheduler (elarion_beat_events=False)",
          "stock": "stock celery.beat.Scheduler"}


def run_one(kind: str, n: int) -> dict[str, Any]:
    table, queue = names("ovh")
    conf: dict[str, Any] = {"elarion_beat_events": False} if kind == "elarion-noevents" else {}
    app = make_app(queue, entries=_entries(n, table[-6:]), table=table, node="overhead-node",
                   **conf)
    scheduler: Any
    claim_seconds = 0.0
    claim_trips = 0
    try:
        if kind.startswith("elarion"):
            scheduler = ClaimingScheduler(app)
            store = scheduler.store
            original = store.claim

            def timed_claim(node: str, requests: Any) -> Any:
                nonlocal claim_seconds, claim_trips
                t0, trips0 = time.perf_counter(), store.round_trips
                try:
                    return original(node, requests)
                finally:
                    claim_seconds += time.perf_counter() - t0
                    claim_trips += store.round_trips - trips0

            store.claim = timed_claim  # type: ignore[method-assign]
        else:
            scheduler = Scheduler(app)
        scheduler.producer  # noqa: B018 - connect to the broker before the clock starts
        seconds, ticks = _drive(scheduler, limit=n + 10)
        drained = seconds
        events = getattr(scheduler, "events", None)
        events_sent = events_dropped = None
        if events is not None:  # the events the ticks queued, sent by their own thread
            t0 = time.perf_counter()
            events.flush(60.0)
            drained = seconds + time.perf_counter() - t0
            events_sent, events_dropped = events.sent, events.dropped
        sent = queue_length(queue)
        scheduler.close()
        return {"kind": kind, "seconds": seconds, "ticks": ticks, "sent": sent,
                "round_trips": claim_trips, "claim_seconds": claim_seconds,
                "drained_seconds": drained, "events_sent": events_sent,
                "events_dropped": events_dropped}
    finally:
        app.close()
        drop_queue(queue)
        drop_tables(PG_DSN, *claims_tables(table))


def run(n: int, rounds: int, warmup: int = 1, sweep: tuple[int, ...] = (),
        log: Any = print) -> dict[str, Any]:
    for _ in range(warmup):
        for kind in KINDS:
            run_one(kind, n)
    small = []
    for size in sweep:  # smaller batches: the fixed cost of a claim round trip shows
        rows = []
        for r in range(rounds):
            order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))
            one = {kind: run_one(kind, size) for kind in order}
            rows.append({**{kind: one[kind]["seconds"] for kind in order},
                         "drained": one["elarion"]["drained_seconds"]})
        entry = {"n": size, **{kind: median(row[kind] for row in rows) for kind in KINDS},
                 "drained": median(row["drained"] for row in rows),
                 "ratio": median(row["elarion"] / row["stock"] for row in rows),
                 "ratio_noevents": median(row["elarion-noevents"] / row["stock"] for row in rows)}
        small.append(entry)
        log(f"  overhead sweep n={size}: ratio {entry['ratio']:.3f}")
    results: list[dict[str, Any]] = []
    for r in range(rounds):
        order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))
        row: dict[str, Any] = {kind: run_one(kind, n) for kind in order}
        row["round"] = r + 1
        row["ratio"] = row["elarion"]["seconds"] / row["stock"]["seconds"]
        row["ratio_noevents"] = row["elarion-noevents"]["seconds"] / row["stock"]["seconds"]
        results.append(row)
        log(f"  overhead round {r + 1}/{rounds}: " + ", ".join(
            f"{kind} {row[kind]['seconds']:.3f}s" for kind in KINDS)
            + f"; ratio {row['ratio']:.3f}")
    ours = [r["elarion"]["seconds"] for r in results]
    quiet = [r["elarion-noevents"]["seconds"] for r in results]
    stock = [r["stock"]["seconds"] for r in results]
    ratios = [r["ratio"] for r in results]
    summary = {
        "n": n, "rounds": rounds,
        "elarion_median_s": median(ours), "stock_median_s": median(stock),
        "elarion_min_s": min(ours), "stock_min_s": min(stock),
        "ratio_median": median(ratios), "ratio_of_medians": median(ours) / median(stock),
        "ratio_of_minimums": min(ours) / min(stock),
        "ratio_min": min(ratios), "ratio_max": max(ratios),
        "noevents_median_s": median(quiet),
        "drained_median_s": median(r["elarion"]["drained_seconds"] for r in results),
        "events_sent": results[0]["elarion"]["events_sent"],
        "events_dropped": sum(r["elarion"]["events_dropped"] or 0 for r in results),
        "ratio_noevents_median": median(r["ratio_noevents"] for r in results),
        "claim_median_s": median(r["elarion"]["claim_seconds"] for r in results),
        "elarion_ticks": results[0]["elarion"]["ticks"],
        "stock_ticks": results[0]["stock"]["ticks"],
        "elarion_round_trips": results[0]["elarion"]["round_trips"],
        "all_sent": all(r[k]["sent"] == n for r in results for k in KINDS),
    }
    sweep_rows = small + [{"n": n, **{kind: median(r[kind]["seconds"] for r in results)
                                      for kind in KINDS},
                           "drained": summary["drained_median_s"],
                           "ratio": summary["ratio_median"],
                           "ratio_noevents": summary["ratio_noevents_median"]}]
    return {"rounds": results, "summary": summary, "sweep": sweep_rows}


def tables(result: dict[str, Any]) -> list[Table]:
    s = result["summary"]
    t = Table(f"Overhead: {s['n']} interval entries due at once, one process, Redis broker "
              f"({s['rounds']} alternating rounds)",
              ["round", "ours s", "ours, events drained s", "ours, events off s", "stock s",
               "ratio ours/stock", "ratio events off/stock"])
    for r in result["rounds"]:
        t.add(r["round"], r["elarion"]["seconds"], r["elarion"]["drained_seconds"],
              r["elarion-noevents"]["seconds"], r["stock"]["seconds"], r["ratio"],
              r["ratio_noevents"])
    t.add("median", s["elarion_median_s"], s["drained_median_s"], s["noevents_median_s"],
          s["stock_median_s"], s["ratio_median"], s["ratio_noevents_median"])
    t.notes = [
        "ours = ClaimingScheduler with the library defaults (Celery events on); "
        "stock = celery.beat.Scheduler; 'events drained' = ours until its event thread has "
        f"sent every event the ticks queued ({s['events_sent']} sent per run, "
        f"{s['events_dropped']} dropped over all rounds)",
        f"ratio (median of paired rounds) = {s['ratio_median']:.3f} "
        f"[range {s['ratio_min']:.3f}-{s['ratio_max']:.3f}; ratio of minimums "
        f"{s['ratio_of_minimums']:.3f}]; goal <= 1.10",
        f"ticks: ClaimingScheduler {s['elarion_ticks']}, stock {s['stock_ticks']}; "
        f"claim round trips (chunks) per dispatch {s['elarion_round_trips']}; median claim time "
        f"{s['claim_median_s'] * 1000:.1f} ms; every run sent all {s['n']}: {s['all_sent']}",
    ]
    out = [t]
    if len(result.get("sweep", [])) > 1:
        sw = Table("Overhead by batch size (medians of the same alternating rounds)",
                   ["due entries", "ours s", "ours, events drained s", "ours, events off s",
                    "stock s", "ratio ours/stock", "ratio events off/stock"])
        for row in result["sweep"]:
            sw.add(row["n"], row["elarion"], row.get("drained", float("nan")),
                   row["elarion-noevents"], row["stock"], row["ratio"], row["ratio_noevents"])
        out.append(sw)
    return out

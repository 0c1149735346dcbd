"""``python -m celery_elarion_beat.demo``: watch three beat replicas share one schedule.

Three ClaimingScheduler replicas tick side by side (threads of this process),
each with its own node name, against one claims store and one broker. The demo
prints every occurrence as it is decided and ends with a table: per occurrence
who won and who skipped, and the duplicate count (always 0).

Without configuration it needs no services: claims live in ``memory://`` and the
broker is kombu's in-memory transport. Point ``ELARION_BEAT_DSN`` at PostgreSQL
(and ``CELERY_BROKER_URL`` at Redis or RabbitMQ) to run the same demo there.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from collections import defaultdict
from datetime import timedelta
from typing import TextIO

from celery import Celery

from .cron import cron
from .outcome import Outcome, Record
from .scheduler import ClaimingScheduler
from .settings import mask_dsn

NODES = ("node-a", "node-b", "node-c")


def build_app(dsn: str, broker: str, table: str) -> Celery:
    app = Celery("elarion_demo", broker=broker, set_as_current=False)
    app.conf.update(
        elarion_beat_dsn=dsn,
        elarion_beat_table=table,
        result_expires=None,
        beat_max_loop_interval=0.5,
        task_default_queue=f"elarion-demo-{uuid.uuid4().hex[:8]}",
        beat_schedule={
            "every-2s-cron": {"task": "demo.report", "schedule": cron("*/2 * * * * *")},
            "every-3s-interval": {"task": "demo.poll", "schedule": timedelta(seconds=3)},
            "refresh-local-cache": {"task": "demo.refresh", "schedule": cron("*/5 * * * * *"),
                                    "options": {"placement": "every_node"}},
        },
    )
    return app


def run(seconds: float, out: TextIO) -> int:
    dsn = os.environ.get("ELARION_BEAT_DSN", "memory://demo")
    broker = os.environ.get("CELERY_BROKER_URL", f"memory://demo-{uuid.uuid4().hex[:6]}")
    table = f"elarion_demo_{uuid.uuid4().hex[:8]}"
    records: list[Record] = []
    lock = threading.Lock()

    def keep(record: Record) -> None:
        with lock:
            records.append(record)
            mark = "won " if record.outcome is Outcome.DISPATCHED else "skip"
            why = f" ({record.reason}, winner {record.winner})" if record.reason else ""
            print(f"  {record.at:%H:%M:%S}  {record.node}  {mark}  {record.job}{why}",
                  file=out, flush=True)

    print(f"3 beat replicas, claims in {mask_dsn(dsn)}, broker {mask_dsn(broker)}, "
          f"{seconds:g} s", file=out, flush=True)
    schedulers = []
    for node in NODES:
        app = build_app(dsn, broker, table)
        app.conf.elarion_beat_node = node
        scheduler = ClaimingScheduler(app)
        scheduler.recorder.listeners.append(keep)
        schedulers.append(scheduler)
    stop = threading.Event()

    def loop(scheduler: ClaimingScheduler) -> None:
        while not stop.is_set():
            stop.wait(min(scheduler.tick(), 0.5))

    threads = [threading.Thread(target=loop, args=(s,), daemon=True) for s in schedulers]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    for scheduler in schedulers:
        _drop_demo_table(scheduler)
        scheduler.close()
    return report(records, out)


def _drop_demo_table(scheduler: ClaimingScheduler) -> None:
    engine = getattr(scheduler.store, "engine", None)
    table = getattr(scheduler.store, "table", None)
    if engine is not None and table is not None:
        table.drop(engine, checkfirst=True)


def report(records: list[Record], out: TextIO) -> int:
    """Print the verdict table; return the number of duplicates."""
    occurrences: dict[tuple[str, str], dict[str, list[str]]] = defaultdict(
        lambda: {"won": [], "skipped": []})
    every_node: dict[str, int] = defaultdict(int)
    for r in records:
        if r.placement.value == "every_node":
            every_node[r.node] += 1
            continue
        key = (r.job, f"{r.occurrence:%H:%M:%S}" if r.occurrence else "?")
        occurrences[key]["won" if r.outcome is Outcome.DISPATCHED else "skipped"].append(r.node)
    print("\noccurrence                         winner   skipped by", file=out)
    duplicates = 0
    for (job, at), who in sorted(occurrences.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        duplicates += max(0, len(who["won"]) - 1)
        print(f"{job:<22} {at:<11} {','.join(who['won']) or '-':<8} "
              f"{', '.join(sorted(who['skipped']))}", file=out)
    print(f"\nevery-node runs per node: {dict(sorted(every_node.items()))}", file=out)
    print(f"occurrences: {len(occurrences)}, duplicates: {duplicates}", file=out, flush=True)
    return duplicates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m celery_elarion_beat.demo",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to run (20)")
    args = parser.parse_args(argv)
    return 1 if run(args.seconds, sys.stdout) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""6. Where the time goes: scheduler CPU per due entry, by schedule type.

For every due entry a tick runs ``is_due`` (beat's own check) and
``name_occurrence`` (the claim's slot or window). Both are timed here
in-process, for N entries whose ``last_run_at`` differ (as in a real schedule)
and one ``now``, per schedule type.

``cron`` remembers its recent ``(slot, next)`` spans per expression and zone,
shared by every ``cron`` object of that expression: N entries of one expression
cost croniter one search per slot. Three ``cron`` rows cover the memo's cases:

* all N entries share one expression (the spans are found in the memo);
* every entry has an expression of its own, in the steady state: the span of
  its previous slot (where ``last_run_at`` lies) is known from the previous
  tick, the span around *now* is new (one memo miss per due entry and slot);
* every entry has an expression no earlier call has seen (the first tick after
  start-up: both spans are misses).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from celery.schedules import crontab, schedule

from celery_elarion_beat import cron, name_occurrence

from .common import UTC, Table, median

MISS = "cron, a new expression per entry, first sight (2 memo misses)"
STEADY = "cron, an expression per entry, steady state (1 memo miss)"


def _fresh(app: Celery, n: int, salt: int) -> list[Any]:
    """n expressions 's m h * * *' never built before in this process (n <= 3600)."""
    return [cron(f"{i % 60} {i // 60 % 60} {salt % 24} * * *", app=app) for i in range(n)]


def _schedules(app: Celery, n: int, repeat: int) -> list[tuple[str, list[Any], bool]]:
    """(label, one schedule per entry or a single shared one, warm the previous slot)."""
    return [
        ("cron('5 4 3 * * *'), one expression for all", [cron("5 4 3 * * *", app=app)], False),
        ("cron('*/5 * * * * *'), one expression for all", [cron("*/5 * * * * *", app=app)],
         False),
        (STEADY, _fresh(app, n, 2 * repeat), True),
        (MISS, _fresh(app, n, 2 * repeat + 1), False),
        ("celery crontab(minute=4, hour=3)", [crontab(minute=4, hour=3, app=app)], False),
        ("interval timedelta(seconds=60) (window)", [schedule(timedelta(seconds=60), app=app)],
         False),
    ]


def run(n: int, repeats: int = 3, log: Any = print) -> dict[str, Any]:
    app = Celery("bench-percall", set_as_current=False)
    app.conf.timezone = "UTC"
    n = min(n, 3600)
    now = datetime.now(UTC)
    lasts = [now - timedelta(days=2) + timedelta(microseconds=37 * i) for i in range(n)]
    timings: dict[str, tuple[list[float], list[float]]] = {}
    order: list[str] = []
    for repeat in range(repeats):
        for label, scheds, warm in _schedules(app, n, repeat):
            per_entry = scheds if len(scheds) == n else scheds * n
            if warm:  # what the previous tick left in the memo: the span of the previous slot
                for sched, last in zip(per_entry, lasts):
                    sched.elarion_slot(last)
            t0 = time.perf_counter()
            for sched, last in zip(per_entry, lasts):
                sched.is_due(last)
            t1 = time.perf_counter()
            for sched in per_entry:
                name_occurrence("job", sched, now, tolerance=1.0, next_due=30.0)
            t2 = time.perf_counter()
            due_us, name_us = timings.setdefault(label, ([], []))
            due_us.append((t1 - t0) / n * 1e6)
            name_us.append((t2 - t1) / n * 1e6)
            if label not in order:
                order.append(label)
    rows = []
    for label in order:
        due_us, name_us = timings[label]
        row: dict[str, Any] = {"schedule": label, "is_due_us": median(due_us),
                               "name_us": median(name_us)}
        row["total_us"] = row["is_due_us"] + row["name_us"]
        rows.append(row)
        log(f"  per entry: {label}: is_due {row['is_due_us']:.1f} us, name_occurrence "
            f"{row['name_us']:.1f} us")
    return {"n": n, "rows": rows}


def tables(result: dict[str, Any]) -> list[Table]:
    t = Table(f"Scheduler CPU per due entry ({result['n']} entries, median of runs), one process",
              ["schedule", "is_due us", "name_occurrence us", "total us",
               "x 10,000 entries s"])
    for r in result["rows"]:
        t.add(r["schedule"], r["is_due_us"], r["name_us"], r["total_us"],
              r["total_us"] * 10_000 / 1e6)
    t.notes = ["a tick runs is_due once for every due entry and name_occurrence once; every "
               "replica does this for every due entry, won or lost",
               "memo miss: the first call for an expression and slot runs croniter (the slot at "
               "or before the moment and the next instant); entries of one expression share "
               "the result; 'steady state' = the previous slot's span is known, as after an "
               "earlier tick"]
    return [t]

"""One measurement of :mod:`benchmarks.bigschedule`, in a fresh process of its own.

``python -m benchmarks.bigschedule_child PARAMS.json RESULT.json``: builds an app
with a big ``beat_schedule``, constructs one scheduler (ClaimingScheduler or stock
``celery.beat.Scheduler``), ticks it as beat's service loop does, and writes what
it measured to RESULT.json. It imports only Celery and the library (both arms
alike: the schedule holds our ``cron`` entries), never the benchmark harness, so
its memory is the scheduler's and the schedule's only.

The schedule is a pure function of ``n``, the variant and a reference instant,
so both arms get the same entries:

* a third Celery ``crontab(minute=m, hour=h)``, daily;
* a third our ``cron("s m h * * *")`` (seconds first), daily;
* a third intervals of 6 to 23 hours and some seconds, half given as a
  ``timedelta``, half as ``celery.schedules.schedule``;

with the hours 6 to 17 hours away from the reference instant, so that nothing
is due for hours. The ``seconds`` variant turns the first entry into
``cron("* * * * * *")``: one entry due every second, the rest idle.
"""

from __future__ import annotations

import functools
import gc
import importlib
import json
import os
import resource
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from celery import Celery
from celery.beat import Scheduler
from celery.schedules import crontab, schedule
from celery.signals import after_task_publish

from celery_elarion_beat import ClaimingScheduler, cron

TASK = "bench.noop"
#: the hours of the day used, as offsets from the reference hour: all far from now
FAR_HOURS = range(6, 18)
#: beat's service loop sleeps what tick() returns; this loop wakes at least this often
CAP = 1.0
#: the longest wait for ClaimingScheduler's ledger read before the idle measurement
RESUME_WAIT = 120.0


def entries(n: int, variant: str, reference: float) -> dict[str, dict[str, Any]]:
    """The big schedule: n entries, a third of each kind, nothing due for hours."""
    hour0 = datetime.fromtimestamp(reference, timezone.utc).hour
    hours = [(hour0 + k) % 24 for k in FAR_HOURS]
    out: dict[str, dict[str, Any]] = {}
    for i in range(n):
        h, m, s = hours[i % len(hours)], (i // len(hours)) % 60, (i // (60 * len(hours))) % 60
        kind = i % 3
        sched: Any
        if kind == 0:
            sched = crontab(minute=m, hour=h)
        elif kind == 1:
            sched = cron(f"{s} {m} {h} * * *")
        elif i % 2:
            sched = timedelta(hours=6 + i % 18, seconds=i % 3600)
        else:
            sched = schedule(timedelta(hours=6 + i % 18, seconds=i % 3600))
        out[f"bigschedule-{i:07d}"] = {"task": TASK, "schedule": sched, "args": (i,)}
    if variant == "seconds" and n:
        out["bigschedule-0000000"] = {"task": TASK, "schedule": cron("* * * * * *"),
                                      "args": (0,)}
    return out


#: the steps whose time is told apart: (label, module, attribute); a step the code
#: measured no longer has is left out. "entry digests" is part of "heartbeat".
STEPS = (
    ("populate_heap", "celery.beat", "Scheduler.populate_heap"),
    ("populate_heap", "celery_elarion_beat.scheduler", "ClaimingScheduler.populate_heap"),
    ("schedules_equal", "celery.beat", "Scheduler.schedules_equal"),
    ("ledger read", "celery_elarion_beat.beat.recovery", "Recovery.resume"),
    ("heartbeat", "celery_elarion_beat.beat.maintenance", "Maintenance.heartbeat"),
    ("entry digests", "celery_elarion_beat.beat.maintenance", "entry_digests"),
    ("purge", "celery_elarion_beat.beat.maintenance", "Maintenance.purge"),
    ("orphan check", "celery_elarion_beat.beat.orphans", "OrphanWatch.check"),
)


class Steps:
    """Wall and CPU seconds spent in each of :data:`STEPS` (wrapped where defined; a
    step inside a step of the same label, such as a ``super()`` call, counts once)."""

    def __init__(self) -> None:
        self.totals: dict[str, list[float]] = {}
        self._inside: dict[str, int] = {}
        for label, module_name, path in STEPS:
            try:
                owner: Any = importlib.import_module(module_name)
                *parents, name = path.split(".")
                for parent in parents:
                    owner = getattr(owner, parent)
                original = getattr(owner, name)
            except (ImportError, AttributeError):
                continue
            self.totals.setdefault(label, [0.0, 0.0, 0.0])
            setattr(owner, name, self._timed(label, original))

    def _timed(self, label: str, original: Any) -> Any:
        total = self.totals[label]
        inside = self._inside

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if inside.get(label):
                return original(*args, **kwargs)
            inside[label] = 1
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                inside[label] = 0
                total[0] += time.perf_counter() - w0
                total[1] += time.process_time() - c0
                total[2] += 1

        return timed

    def snapshot(self) -> dict[str, list[float]]:
        return {label: list(t) for label, t in self.totals.items()}

    def since(self, before: dict[str, list[float]]) -> dict[str, dict[str, float]]:
        """Per step since *before*: wall and CPU seconds, calls."""
        return {label: {"wall": t[0] - before[label][0], "cpu": t[1] - before[label][1],
                        "calls": t[2] - before[label][2]}
                for label, t in self.totals.items()}


def rss_mb() -> float:
    """Resident set size now (``/proc/self/statm``), MB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def peak_mb() -> float:
    """The peak resident set size so far (``ru_maxrss``, KiB on Linux), MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def _tick(scheduler: Any) -> tuple[float, float, float]:
    """One tick: (delay it returned, wall seconds, CPU seconds)."""
    w0, c0 = time.perf_counter(), time.process_time()
    delay = scheduler.tick()
    return float(delay or 0.0), time.perf_counter() - w0, time.process_time() - c0


def loop(scheduler: Any, seconds: float, until: Any = None) -> dict[str, Any]:
    """Beat's service loop for *seconds* of wall time (and while *until()* holds):
    tick, sleep what it returns (at most :data:`CAP`)."""
    ticks: list[tuple[float, float]] = []
    w0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - w0 < seconds or (until is not None and until()):
        delay, wall, cpu = _tick(scheduler)
        ticks.append((wall, cpu))
        left = seconds - (time.perf_counter() - w0)
        nap = min(max(delay, 0.0), CAP)
        if left > 0:
            nap = min(nap, left)
        if nap > 0:
            time.sleep(nap)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return {"wall": wall, "cpu": cpu, "cpu_pct": 100.0 * cpu / wall, "ticks": len(ticks),
            "max_tick_wall": max((t[0] for t in ticks), default=0.0),
            "max_tick_cpu": max((t[1] for t in ticks), default=0.0)}


def direct_ticks(scheduler: Any, count: int, budget: float) -> dict[str, Any]:
    """*count* back-to-back ticks (no sleep), fewer if they take over *budget* seconds."""
    walls: list[float] = []
    cpus: list[float] = []
    started = time.perf_counter()
    while len(walls) < count and (not walls or time.perf_counter() - started < budget):
        _, wall, cpu = _tick(scheduler)
        walls.append(wall)
        cpus.append(cpu)
    return {"walls": walls, "cpus": cpus}


def _resuming(scheduler: Any) -> bool:
    """ClaimingScheduler reads the ledger once, about 2 s after start."""
    recovery = getattr(scheduler, "recovery", None)
    return bool(getattr(recovery, "due", False))


def _heartbeats(scheduler: Any) -> int:
    """ClaimingScheduler's heartbeats so far (none for stock beat)."""
    return int(getattr(getattr(scheduler, "maintenance", None), "heartbeats", 0) or 0)


def measure(p: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": p["kind"], "variant": p["variant"], "n": p["n"]}
    published = [0]

    def count(**_: Any) -> None:
        published[0] += 1

    after_task_publish.connect(count, weak=False)
    steps = Steps()
    out["rss_imports_mb"] = rss_mb()
    app = Celery(f"bigschedule-{p['kind']}", set_as_current=False)
    app.conf.update(p["conf"])
    app.task(name=TASK, shared=False)(lambda *args: None)
    t0 = time.perf_counter()
    app.conf.beat_schedule = entries(p["n"], p["variant"], p["reference"])
    out["build_s"] = time.perf_counter() - t0
    gc.collect()
    out["rss_schedule_mb"] = rss_mb()

    cls = ClaimingScheduler if p["kind"] == "elarion" else Scheduler
    mark = steps.snapshot()
    w0, c0 = time.perf_counter(), time.process_time()
    scheduler = cls(app)  # setup_schedule runs in the constructor
    w1, c1 = time.perf_counter(), time.process_time()
    scheduler.tick()
    w2, c2 = time.perf_counter(), time.process_time()
    out.update(setup_wall=w1 - w0, setup_cpu=c1 - c0, first_tick_wall=w2 - w1,
               first_tick_cpu=c2 - c1, startup_wall=w2 - w0, startup_cpu=c2 - c0,
               rss_mb=rss_mb(), peak_mb=peak_mb(), schedule_len=len(scheduler.schedule))
    out["steps"] = {"startup": steps.since(mark)}
    try:
        # until ClaimingScheduler has read the ledger (2 s after start, its one-off
        # cost) and, with an entry due each second, the broker connection is made
        began = time.perf_counter()

        def warming() -> bool:
            return (_resuming(scheduler) or (p["variant"] == "seconds" and not published[0])) \
                and time.perf_counter() - began < RESUME_WAIT

        mark = steps.snapshot()
        out["warmup"] = loop(scheduler, p["warmup"], until=warming)
        out["steps"]["warmup"] = steps.since(mark)
        published[0] = 0
        mark = steps.snapshot()
        beats = _heartbeats(scheduler)
        out["idle"] = loop(scheduler, p["idle"])
        out["published"] = published[0]
        out["heartbeats"] = _heartbeats(scheduler) - beats
        out["steps"]["idle"] = steps.since(mark)
        out["rss_after_mb"] = rss_mb()
        out["peak_after_mb"] = peak_mb()
        if p["ticks"]:
            mark = steps.snapshot()
            out["direct"] = direct_ticks(scheduler, p["ticks"], p["tick_budget"])
            out["steps"]["direct"] = steps.since(mark)
    finally:
        scheduler.close()
        app.close()
    return out


def main(argv: list[str]) -> int:
    params = json.loads(Path(argv[0]).read_text())
    result = measure(params)
    Path(argv[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""9. Big schedules: start-up, memory and idle cost with 10,000 to 1,000,000 entries.

ClaimingScheduler (PostgreSQL, the default plain claims table, Celery events
off: nothing is due, so no broker is needed) against stock
``celery.beat.Scheduler`` (the base class, not ``PersistentScheduler``: no
shelve file, whose I/O would dominate stock beat's figures). The schedule is a
third Celery ``crontab``, a third our ``cron`` with seconds and a third
intervals, all due hours from now (see :mod:`benchmarks.bigschedule_child`).
The "one seconds entry" variant makes one entry ``cron("* * * * * *")``: one
publish to Redis (and, for ours, one claim) each second, the rest idle.

Each measurement runs in a fresh child process, arms alternating:

1. start-up: wall and CPU seconds from constructing the scheduler (app with the
   big ``beat_schedule``, task registered; ``setup_schedule`` runs in the
   constructor) to the end of the first ``tick()``. Building the schedule's
   dict is not timed (the app's own cost, the same for both). The claims tables
   are created beforehand, as on a restart.
2. RSS after the first tick: ``/proc/self/statm`` now and ``ru_maxrss`` (peak),
   and the share of the schedule and the scheduler (RSS after the first tick
   less RSS after the imports).
3. idle CPU: beat's service loop (tick, sleep what it returns, at most 1 s) for
   a fixed wall time, after ClaimingScheduler's one-off ledger read 2 s after
   start (timed on its own, "ledger read"): process CPU seconds per wall second,
   as % of one core; the same for the one-seconds-entry variant.
4. one tick that finds nothing due: back-to-back ``tick()`` calls (no sleep),
   mean and median wall and CPU; fewer when they exceed a time budget.
5. where the CPU goes: the child wraps a few steps (populate_heap,
   schedules_equal, the ledger read, the heartbeat and its entry digests, the
   purge, the orphan check) and sums their CPU per phase; a step the measured
   code does not have is left out, so the script runs on older and newer code.

A child that outlives its time limit is killed and its row says so.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from celery_elarion_beat import open_store
from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.testing._harness import (
    ChildProcess,
    claims_tables,
    clean_env,
    drop_tables,
    isolated_conf,
)

from .common import PG_DSN, REDIS_URL, Table, drop_queue, make_app, median, names

KINDS = ("stock", "elarion")
LABELS = {"stock": "stock celery.beat.Scheduler", "elarion": "ClaimingScheduler"}
VARIANTS = ("idle", "seconds")
#: the steps the child process times (see bigschedule_child.STEPS)
STEP_LABELS = ("populate_heap", "schedules_equal", "ledger read", "heartbeat", "entry digests",
               "purge", "orphan check")
#: the steps stock beat has too
STOCK_STEPS = ("populate_heap", "schedules_equal")
NAN = float("nan")


def _conf(queue: str, table: str, node: str) -> dict[str, Any]:
    return isolated_conf(REDIS_URL, queue, result_expires=None, elarion_beat_dsn=PG_DSN,
                         elarion_beat_table=table, elarion_beat_node=node,
                         elarion_beat_events=False)


def _create_tables(queue: str, table: str, node: str) -> None:
    """The claims tables, as a restart finds them (not timed)."""
    app = make_app(queue, table=table, node=node, elarion_beat_events=False)
    store = open_store(Settings.from_app(app))
    try:
        store.ensure_schema()
    finally:
        store.close()
        app.close()


def run_one(kind: str, n: int, variant: str, *, reference: float, idle: float, ticks: int,
            tick_budget: float, limit: float, workdir: Path) -> dict[str, Any]:
    """One child process: build, start, idle, tick; its measurements."""
    table, queue = names("big")
    node = f"bigschedule-{kind}"
    tag = f"{kind}-{variant}-{n}"
    params = {"kind": kind, "variant": variant, "n": n, "reference": reference,
              "conf": _conf(queue, table, node), "warmup": 0.0, "idle": idle,
              "ticks": ticks if variant == "idle" else 0, "tick_budget": tick_budget}
    params_path, result_path = workdir / f"{tag}.params.json", workdir / f"{tag}.result.json"
    params_path.write_text(json.dumps(params))
    result_path.unlink(missing_ok=True)
    child = ChildProcess(tag, [sys.executable, "-m", "benchmarks.bigschedule_child",
                               str(params_path), str(result_path)],
                         clean_env(), workdir / f"{tag}.log", workdir)
    started = time.perf_counter()
    try:
        if kind == "elarion":
            _create_tables(queue, table, node)
        child.start()
        rc = child.wait(limit)
        if rc is None:
            child.terminate(10)
            return {"kind": kind, "variant": variant, "n": n, "timed_out": limit,
                    "seconds": time.perf_counter() - started}
        if rc != 0 or not result_path.exists():
            raise RuntimeError(f"bigschedule child {tag} failed (rc {rc})\n{child.tail(60)}")
        result: dict[str, Any] = json.loads(result_path.read_text())
        result["seconds"] = time.perf_counter() - started
        return result
    finally:
        child.terminate(10)
        drop_queue(queue)
        drop_tables(PG_DSN, *claims_tables(table))


def _summary(run: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run that the tables and the plot show."""
    direct = run.get("direct") or {"walls": [], "cpus": []}
    walls, cpus = direct["walls"], direct["cpus"]
    return {
        "tick_count": len(walls),
        "tick_wall_mean_ms": 1000 * statistics.fmean(walls) if walls else NAN,
        "tick_wall_p50_ms": 1000 * median(walls),
        "tick_cpu_mean_ms": 1000 * statistics.fmean(cpus) if cpus else NAN,
        "tick_cpu_p50_ms": 1000 * median(cpus),
    }


def run(sizes: tuple[int, ...], idle: float, ticks: int = 50, tick_budget: float = 60.0,
        seconds_sizes: tuple[int, ...] | None = None, limit: float = 1800.0,
        parallel: bool = False, log: Any = None) -> dict[str, Any]:
    """Every size, both schedulers (alternating order), idle and one-seconds-entry.

    *parallel* runs the two arms' processes at once (smoke mode: the figures then
    share the CPU and mean nothing)."""
    log = log or (lambda line: print(line, flush=True))
    reference = time.time()
    with_seconds = tuple(sizes if seconds_sizes is None else seconds_sizes)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="elbench-bigschedule-") as tmp:
        for i, n in enumerate(sizes):
            order = KINDS if i % 2 == 0 else tuple(reversed(KINDS))
            for variant in VARIANTS:
                if variant == "seconds" and n not in with_seconds:
                    continue
                jobs = [partial(run_one, kind, n, variant, reference=reference, idle=idle,
                                ticks=ticks, tick_budget=tick_budget, limit=limit,
                                workdir=Path(tmp)) for kind in order]
                if parallel:
                    with ThreadPoolExecutor(len(jobs)) as pool:
                        done = list(pool.map(lambda job: job(), jobs))
                else:
                    done = [job() for job in jobs]
                for r in done:
                    r.update(_summary(r))
                    runs.append(r)
                    log(f"  bigschedule n={n} {variant} {r['kind']}: {_line(r, limit)}")
    return {"sizes": list(sizes), "seconds_sizes": list(with_seconds), "idle_seconds": idle,
            "ticks": ticks, "parallel": parallel,
            "tick_budget": tick_budget, "limit": limit, "runs": runs,
            "ratios": ratios(runs)}


def _line(r: dict[str, Any], limit: float) -> str:
    if "timed_out" in r:
        return f"killed after {limit:g}s"
    tick = f", idle tick {r['tick_wall_mean_ms']:.2f} ms" if r["tick_count"] else ""
    return (f"start-up {r['startup_wall']:.2f}s, RSS {r['rss_mb']:.0f} MB, loop CPU "
            f"{r['idle']['cpu_pct']:.2f}%{tick} ({r['seconds']:.0f}s)")


def _find(runs: list[dict[str, Any]], n: int, kind: str, variant: str) -> dict[str, Any] | None:
    for r in runs:
        if r["n"] == n and r["kind"] == kind and r["variant"] == variant and \
                "timed_out" not in r:
            return r
    return None


#: ratio name -> how to read it from one idle (or seconds) run
_RATIO_KEYS: dict[str, tuple[str, Callable[[dict[str, Any]], float]]] = {
    "startup_wall": ("idle", lambda r: r["startup_wall"]),
    "startup_cpu": ("idle", lambda r: r["startup_cpu"]),
    "rss": ("idle", lambda r: r["rss_mb"]),
    "peak_rss": ("idle", lambda r: r["peak_mb"]),
    "idle_cpu": ("idle", lambda r: r["idle"]["cpu_pct"]),
    "seconds_cpu": ("seconds", lambda r: r["idle"]["cpu_pct"]),
    "tick_wall": ("idle", lambda r: r["tick_wall_mean_ms"]),
    "tick_cpu": ("idle", lambda r: r["tick_cpu_mean_ms"]),
}


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ours / stock, per size, for each figure both arms measured."""
    out = []
    for n in sorted({r["n"] for r in runs}):
        row: dict[str, Any] = {"n": n}
        for key, (variant, get) in _RATIO_KEYS.items():
            ours, stock = _find(runs, n, "elarion", variant), _find(runs, n, "stock", variant)
            try:
                row[key] = get(ours) / get(stock) if ours and stock else NAN
            except ZeroDivisionError:
                row[key] = NAN
        out.append(row)
    return out


def _pct(run: dict[str, Any] | None) -> float:
    return run["idle"]["cpu_pct"] if run else NAN


def _step(run: dict[str, Any], phases: tuple[str, ...], label: str, key: str = "cpu") -> float:
    """Seconds spent in one step over *phases* (NaN where the code has no such step)."""
    steps = run.get("steps") or {}
    values = [steps[phase][label][key] for phase in phases
              if label in steps.get(phase, {})]
    return sum(values) if values else NAN


def tables(result: dict[str, Any]) -> list[Table]:
    runs = result["runs"]
    build = {r["n"]: r["build_s"] for r in runs if "build_s" in r}
    start = Table("Big schedules: start-up and memory (nothing due)",
                  ["entries", "scheduler", "start-up wall s", "start-up CPU s", "RSS MB",
                   "peak RSS MB", "schedule+scheduler MB", "ledger read s"])
    idle = Table(f"Big schedules: idle ({result['idle_seconds']:g} s of beat's loop per run)",
                 ["entries", "scheduler", "idle CPU %", "heartbeats in the loop",
                  "longest loop tick s", "idle tick ms (mean)", "idle tick ms (p50)",
                  "idle tick CPU ms (mean)", "one-second-entry CPU %",
                  "one-second-entry sent"])
    where = Table("Big schedules: where the CPU goes (s)",
                  ["entries", "scheduler", "phase", "CPU s", *STEP_LABELS])
    killed = []
    for n in result["sizes"]:
        for kind in KINDS:
            r = _find(runs, n, kind, "idle")
            if r is None:
                killed.append(f"{n:,} {LABELS[kind]}")
                continue
            ours = kind == "elarion"
            start.add(f"{n:,}", LABELS[kind], r["startup_wall"], r["startup_cpu"], r["rss_mb"],
                      r["peak_mb"], r["rss_mb"] - r["rss_imports_mb"],
                      _step(r, ("startup", "warmup"), "ledger read", "wall") if ours else NAN)
            sec = _find(runs, n, kind, "seconds")
            idle.add(f"{n:,}", LABELS[kind], r["idle"]["cpu_pct"],
                     r.get("heartbeats", "-") if ours else "-", r["idle"]["max_tick_wall"],
                     r["tick_wall_mean_ms"], r["tick_wall_p50_ms"], r["tick_cpu_mean_ms"],
                     _pct(sec), f"{sec['published']} in {sec['idle']['wall']:.0f} s"
                     if sec else "-")
            for phase, cpu, label in (("startup", r["startup_cpu"], "start-up"),
                                      ("idle", r["idle"]["cpu"], "idle loop")):
                where.add(f"{n:,}", LABELS[kind], label, cpu,
                          *[_step(r, (phase,), step) if ours or step in STOCK_STEPS else NAN
                            for step in STEP_LABELS])
    start.notes = [
        "schedule: 1/3 celery crontab (daily), 1/3 cron with seconds (daily), 1/3 intervals "
        "of 6-23 h (timedelta and schedule), every entry due hours from now",
        "stock = celery.beat.Scheduler, the base class (no shelve file, unlike "
        "PersistentScheduler); ours = ClaimingScheduler on PostgreSQL, plain claims table, "
        "events off; each run in a fresh process",
        "start-up = constructor (setup_schedule) + first tick; not timed: building the "
        "beat_schedule dict (" + ", ".join(f"{n:,}: {s:.1f} s" for n, s in build.items())
        + ") and creating the claims tables (a restart finds them)",
        "RSS after the first tick (/proc/self/statm); peak = ru_maxrss; schedule+scheduler = "
        "RSS after the first tick less RSS after the imports",
        "ledger read = ours' one-off read of each interval entry's newest claim, 2 s after "
        "setup: inside the first tick when that tick ends later",
    ]
    idle.notes = [
        "the loop sleeps what tick() returns, at most 1 s; ours heartbeats every "
        "elarion_beat_heartbeat_interval (30 s) inside a tick",
        "idle tick = back-to-back tick() calls that find nothing due, after the loop "
        f"(up to {result['ticks']} or {result['tick_budget']:g} s)",
        "one-second-entry: one entry is cron('* * * * * *') instead, sent to Redis each "
        "second (ours claims it first); sent = messages in the loop's wall time",
    ]
    where.notes = ["CPU seconds inside each step (wrapped in the child process); entry digests "
                   "are part of the heartbeat; '-': the scheduler has no such step"]
    if killed:
        start.notes.append(f"killed after {result['limit']:g} s (no figures): "
                           + ", ".join(killed))
    ratio = Table("Big schedules: ratio ClaimingScheduler / stock",
                  ["entries", "start-up wall", "start-up CPU", "RSS", "peak RSS",
                   "idle CPU", "one-second-entry CPU", "idle tick wall", "idle tick CPU"])
    for row in result["ratios"]:
        ratio.add(f"{row['n']:,}", row["startup_wall"], row["startup_cpu"], row["rss"],
                  row["peak_rss"], row["idle_cpu"], row["seconds_cpu"], row["tick_wall"],
                  row["tick_cpu"])
    ratio.notes = ["goals at 100,000 entries: start-up <= 2x, RSS <= 1.5x, idle CPU <= 2% of "
                   "one core (absolute), the tick that finds nothing due O(log n) or O(due)"]
    return [start, idle, ratio, where]

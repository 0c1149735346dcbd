"""12. Live schedules: how fast an edit reaches every node, and what 10,000 database
entries cost.

**Propagation** (real ``celery beat`` processes of :mod:`benchmarks.live_schedules_app`):
``nodes`` beats run one database entry; the benchmark edits it ``edits`` times, one
edit every ``spacing`` seconds, each a committed transaction (its arguments change),
and notes when each commit returned. Each node logs (JSON, ``action=live-entries-
changed``) the version it read, when it read it (the change is put in place in that
tick). Per edit, the time from its commit until the last node read it; p50, p99, max
and per node. Two modes: PostgreSQL (NOTIFY on the LISTEN connection) and MariaDB (a
poll of the version every ``elarion_beat_db_entries_poll`` seconds).

**10,000 database entries** (PostgreSQL):

* *start-up*, in process: a ``ClaimingScheduler`` set up (its first tick included) with
  ``entries`` database entries, against the same entries as code entries;
* *one edit applied*, in process: with the entries in place, one edit is committed;
  the NOTIFY is awaited on the node's LISTEN socket and the tick that reads it and
  puts it in place is timed (``edit_ticks`` edits), beside idle ticks;
* *idle CPU*, real processes: ``nodes`` beats run the entries (none due during the
  measure); each beat's user + system CPU over ``idle`` seconds (``/proc``), as a
  share of one core;
* *a burst of edits*: with ``due`` of the entries due every 2 s and the beats running,
  the lateness of those sends (message received - slot) over ``window`` seconds
  without edits, then over ``window`` seconds with ``burst_rate`` edits a second of the
  other entries.
"""

from __future__ import annotations

import math
import os
import select
import shutil
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from celery_elarion_beat.beat.scheduler import ClaimingScheduler
from celery_elarion_beat.config.live_entries import EntryDefinition, live_cluster
from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.observe.logformat import read_json_log
from celery_elarion_beat.store import ClaimStore, open_store
from celery_elarion_beat.store.entry_records import EntryChange
from celery_elarion_beat.testing._harness import ProcessManager, claims_tables, drop_tables

from .common import PG_DSN, PREFIX, REDIS_URL, QueueReader, Table, drop_queue, names, percentile
from .live_schedules_app import TASK, make_app

APP = "benchmarks.live_schedules_app"
READY = "database entries at version"
MYSQL_DSN = (os.environ.get("ELARION_BENCH_MYSQL_DSN") or os.environ.get("ELARION_TEST_MYSQL_DSN")
             or "mysql://root@127.0.0.1:3306/test")


#: a month about six months away: the entries below are spread over every minute of
#: the day (10,000 of them: about seven a minute), so on the first of this month only
#: they are due, never during a benchmark run. Daily entries made the idle CPU measure
#: a measure of seven claims a minute (up to 4 % of a core on three loaded nodes).
QUIET_MONTH = (datetime.now().month + 5) % 12 + 1


def _definition(i: int, cron: str | None = None) -> EntryDefinition:
    """An entry once a year (minute and hour spread over the day, on the first of
    :data:`QUIET_MONTH`: none due during the measures) unless *cron* says otherwise."""
    expr = cron or f"0 {i % 60} {(i // 60) % 24} 1 {QUIET_MONTH} *"
    return EntryDefinition.of(TASK, {"cron": expr}, (i,))


class _Run:
    """One run's names, app, store and processes; everything removed by :meth:`close`."""

    def __init__(self, kind: str, dsn: str) -> None:
        self.table, self.queue = names(kind)
        self.dsn = dsn
        self.env = {"ELARION_BENCH_BROKER": REDIS_URL, "ELARION_BENCH_QUEUE": self.queue,
                    "ELARION_BENCH_DSN": dsn, "ELARION_BENCH_TABLE": self.table}
        self.app = make_app(self.env)
        self.settings = Settings.from_app(self.app)
        self.cluster = live_cluster(self.settings, self.app)
        self.store: ClaimStore = open_store(self.settings)
        self.store.ensure_schema()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-live-"))
        self.pm = ProcessManager(self.workdir, APP, self.env)
        self.beats: dict[str, Any] = {}

    def write(self, changes: list[EntryChange]) -> int:
        wrote = self.store.write_entries(self.cluster, changes, "bench")
        assert wrote.version is not None
        return wrote.version

    def start(self, nodes: int, timeout: float = 180.0) -> None:
        for i in range(1, nodes + 1):
            self.beats[f"node-{i}"] = self.pm.beat(f"beat-{i}",
                                                   env={"ELARION_BENCH_NODE": f"node-{i}"})
        for beat in self.beats.values():
            beat.wait_for_log(READY, timeout)

    def read_versions(self) -> dict[str, list[tuple[float, int]]]:
        """Per node, (when, version) of every read of a change it logged."""
        out: dict[str, list[tuple[float, int]]] = {}
        for node, beat in self.beats.items():
            rows = []
            for line in read_json_log(beat.log_path.read_text(errors="replace").splitlines()):
                if line.get("action") == "live-entries-changed":
                    when = datetime.fromisoformat(str(line["ts"]).replace("Z", "+00:00"))
                    rows.append((when.timestamp(), int(line["version"])))
            out[node] = sorted(rows)
        return out

    def close(self, keep: bool = False) -> None:
        try:
            self.pm.stop_all(20)
        finally:
            self.store.close()
            self.app.close()
            drop_tables(self.dsn, *claims_tables(self.table))
            drop_queue(self.queue)
            if not keep:
                shutil.rmtree(self.workdir, ignore_errors=True)


# -- propagation ------------------------------------------------------------------------


def propagation(mode: str, edits: int, nodes: int, spacing: float) -> dict[str, Any]:
    run = _Run(f"live{mode[:4]}", PG_DSN if mode == "notify" else MYSQL_DSN)
    ok = False
    try:
        run.write([EntryChange("add", "edited", _definition(0, "0 0 4 1 1 *"))])
        run.start(nodes)
        time.sleep(2.0)  # every node past its start
        commits: list[tuple[int, float]] = []
        for i in range(1, edits + 1):
            version = run.write([EntryChange("edit", "edited",
                                             _definition(i, "0 0 4 1 1 *"))])
            commits.append((version, time.time()))
            time.sleep(spacing)
        last = commits[-1][0]
        deadline = time.time() + 30
        while time.time() < deadline:
            seen = run.read_versions()
            if all(rows and rows[-1][1] >= last for rows in seen.values()):
                break
            time.sleep(0.5)
        seen = run.read_versions()
        ok = True
    finally:
        run.close(keep=not ok)
    per_node: dict[str, list[float]] = defaultdict(list)
    worst: list[float] = []
    missing = 0
    for version, at in commits:
        times = []
        for node, rows in seen.items():
            first = next((ts for ts, v in rows if v >= version), None)
            if first is None:
                missing += 1
                continue
            per_node[node].append(max(0.0, first - at))
            times.append(max(0.0, first - at))
        if len(times) == len(seen):
            worst.append(max(times))
    worst.sort()
    return {"mode": mode, "edits": edits, "nodes": nodes, "spacing": spacing,
            "poll": run.settings.db_entries_poll, "missing": missing,
            "all_nodes_s": _stats(worst),
            "per_node_s": {node: _stats(sorted(v)) for node, v in sorted(per_node.items())}}


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "max": values[-1]}


# -- 10,000 entries ---------------------------------------------------------------------


def _bulk(run: _Run, entries: int, due: int = 0) -> None:
    """*entries* database entries in one write; the first *due* run every 2 s."""
    changes = [EntryChange("add", f"e{i:05d}",
                           _definition(i, "*/2 * * * * *" if i < due else None))
               for i in range(entries)]
    for start in range(0, len(changes), 5000):  # a few writes (one statement per row)
        run.write(changes[start:start + 5000])


def _scheduler(app: Any, store: ClaimStore) -> tuple[ClaimingScheduler, float]:
    """A scheduler set up, and its first tick; the seconds both took."""
    t0 = time.perf_counter()
    node = ClaimingScheduler(app, store=store)
    node.tick()
    return node, time.perf_counter() - t0


def startup_and_edit(entries: int, edit_ticks: int) -> dict[str, Any]:
    run = _Run("livebig", PG_DSN)
    code_run = _Run("livecode", PG_DSN)
    try:
        _bulk(run, entries)
        code_app = make_app(code_run.env, main="elbench_live_code")
        code_app.conf.beat_schedule = {
            f"e{i:05d}": {"task": TASK, "schedule": _definition(i).schedule.build(code_app),
                          "args": (i,)} for i in range(entries)}
        code_app.conf.elarion_beat_db_entries = False
        code_node, code_s = _scheduler(code_app, code_run.store)
        code_node.close()
        live_node, live_s = _scheduler(run.app, run.store)
        try:
            assert len(live_node.schedule) == entries, len(live_node.schedule)
            idle = []
            for _ in range(20):
                t0 = time.perf_counter()
                live_node.tick()
                idle.append(time.perf_counter() - t0)
            applied = []
            listener = live_node.live._wakeups if live_node.live is not None else None
            fd = listener.fileno() if listener is not None else None
            for i in range(edit_ticks):
                run.write([EntryChange("edit", f"e{i:05d}", _definition(i + 1))])
                if fd is not None:
                    select.select([fd], [], [], 5.0)  # the NOTIFY, as beat's wait gets it
                t0 = time.perf_counter()
                live_node.tick()
                applied.append(time.perf_counter() - t0)
                assert live_node.live is not None and live_node.live.version is not None
        finally:
            live_node.close()
    finally:
        run.close()
        code_run.close()
    return {"entries": entries, "startup_code_s": code_s, "startup_db_s": live_s,
            "startup_extra_s": live_s - code_s, "idle_tick_ms": _ms(idle),
            "edit_tick_ms": _ms(applied), "listened": fd is not None}


def _ms(values: list[float]) -> dict[str, Any]:
    ms = sorted(v * 1000 for v in values)
    return {"n": len(ms), "p50": statistics.median(ms), "max": ms[-1]}


def _cpu(pid: int) -> float:
    """User + system CPU seconds of process *pid* and its children waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _settle(run: _Run, window: float = 2.0, busy: float = 5.0, most: float = 120.0) -> None:
    """Until every beat's start-up is over (its heap built: the first tick comes after
    the log line :meth:`_Run.start` waits for): each uses under *busy* % of a core
    over *window* seconds."""
    deadline = time.monotonic() + most
    while time.monotonic() < deadline:
        before = {node: _cpu(b.pid) for node, b in run.beats.items()}
        time.sleep(window)
        if all((_cpu(b.pid) - before[node]) / window * 100.0 < busy
               for node, b in run.beats.items()):
            return


def idle_and_burst(entries: int, nodes: int, idle: float, due: int, window: float,
                   burst_rate: float) -> dict[str, Any]:
    run = _Run("liveproc", PG_DSN)
    reader = QueueReader(run.queue)
    ok = False
    try:
        _bulk(run, entries)
        run.start(nodes)
        _settle(run)
        before = {node: _cpu(b.pid) for node, b in run.beats.items()}
        time.sleep(idle)
        cpu = {node: (_cpu(b.pid) - before[node]) / idle * 100.0
               for node, b in run.beats.items()}
        # some entries due every 2 s: their sends' lateness, quiet, then under a burst
        run.write([EntryChange("edit", f"e{i:05d}", _definition(i, "*/2 * * * * *"))
                   for i in range(due)])
        reader.start()
        time.sleep(4.0)  # every node has them in place
        quiet_from = time.time()
        time.sleep(window)
        burst_from = time.time()
        sent = _burst(run, due, entries, burst_rate, window)
        burst_to = time.time()
        time.sleep(3.0)
        received = reader.stop()
        ok = True
    finally:
        reader.stop()
        run.close(keep=not ok)

    def lateness(start: float, end: float) -> list[float]:
        out = []
        for headers, at in received:
            occurrence = headers.get("elarion_occurrence")
            if not occurrence:
                continue
            slot = datetime.fromisoformat(str(occurrence).replace("Z", "+00:00")).timestamp()
            if start <= slot < end:
                out.append(at - slot)
        return sorted(out)

    quiet, burst = lateness(quiet_from + 1, burst_from), lateness(burst_from, burst_to)
    return {"entries": entries, "nodes": nodes, "idle_s": idle,
            "idle_cpu_percent": cpu, "due": due, "window_s": window, "burst_rate": burst_rate,
            "edits_sent": sent, "edits_per_s": sent / max(burst_to - burst_from, 1e-9),
            "quiet_late_s": _stats(quiet), "burst_late_s": _stats(burst),
            "expected_per_window": due * window / 2}


def _burst(run: _Run, due: int, entries: int, rate: float, seconds: float) -> int:
    """Edit entries not due (their arguments) at *rate* a second for *seconds*, from a
    thread of its own (as edits come from elsewhere); how many were written."""
    done = [0]

    def edits(stop: Callable[[], bool]) -> None:
        i = 0
        start = time.time()
        while not stop():
            name = f"e{due + (i % (entries - due)):05d}"
            run.write([EntryChange("edit", name, _definition(10_000 + i))])
            i += 1
            done[0] = i
            wait = start + i / rate - time.time()
            if wait > 0:
                time.sleep(wait)

    end = time.time() + seconds
    worker = threading.Thread(target=edits, args=(lambda: time.time() >= end,), daemon=True)
    worker.start()
    worker.join(seconds + 30)
    return done[0]


# -- the section ------------------------------------------------------------------------


def run(edits: int = 1000, nodes: int = 5, spacing: float = 0.2, entries: int = 10_000,
        edit_ticks: int = 20, proc_nodes: int = 3, idle: float = 30.0, due: int = 100,
        window: float = 20.0, burst_rate: float = 100.0,
        modes: tuple[str, ...] = ("notify", "poll")) -> dict[str, Any]:
    out: dict[str, Any] = {"propagation": [propagation(m, edits, nodes, spacing)
                                           for m in modes]}
    out["big"] = startup_and_edit(entries, edit_ticks)
    out["processes"] = idle_and_burst(entries, proc_nodes, idle, due, window, burst_rate)
    return out


def tables(result: dict[str, Any]) -> list[Table]:
    prop = Table("Live schedules: from a committed edit to every node reading it",
                 ["mode", "nodes", "edits", "p50 s", "p99 s", "max s", "missing"])
    for p in result["propagation"]:
        s = p["all_nodes_s"]
        prop.add("NOTIFY (PostgreSQL)" if p["mode"] == "notify"
                 else f"poll {p['poll']:g} s (MariaDB)", p["nodes"], p["edits"], s["p50"],
                 s["p99"], s["max"], p["missing"])
    prop.notes.append("one edit every "
                      + ", ".join(f"{p['spacing']:g} s" for p in result["propagation"][:1])
                      + "; the time until the last of the nodes logged the version")
    big = result["big"]
    costs = Table(f"Live schedules: {big['entries']:,} database entries (PostgreSQL)",
                  ["measure", "value"])
    costs.add("start-up, code entries (s)", big["startup_code_s"])
    costs.add("start-up, database entries (s)", big["startup_db_s"])
    costs.add("start-up, extra (s)", big["startup_extra_s"])
    costs.add("idle tick p50 (ms)", big["idle_tick_ms"]["p50"])
    costs.add("tick applying one edit p50 (ms)", big["edit_tick_ms"]["p50"])
    costs.add("tick applying one edit max (ms)", big["edit_tick_ms"]["max"])
    procs = result["processes"]
    for node, share in sorted(procs["idle_cpu_percent"].items()):
        costs.add(f"idle CPU {node} (% of a core)", share)
    q, b = procs["quiet_late_s"], procs["burst_late_s"]
    costs.add(f"due sends late p50/p99 (s), no edits ({q['n']} sends)",
              f"{_f(q['p50'])} / {_f(q['p99'])}")
    costs.add(f"due sends late p50/p99 (s), {procs['edits_per_s']:.0f} edits/s "
              f"({b['n']} sends)", f"{_f(b['p50'])} / {_f(b['p99'])}")
    costs.notes.append(f"{procs['due']} entries due every 2 s on {procs['nodes']} beats; "
                       f"{procs['edits_sent']} edits in the burst")
    return [prop, costs]


def _f(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else f"{value:.3f}"

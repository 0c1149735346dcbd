"""7. Jitter spreads a thundering herd: N ``0 * * * *`` jobs, 60 s of jitter, 3 nodes.

Method: three ClaimingScheduler nodes in this process share one claims table on
PostgreSQL (the real claim statement, a connection pool each), one fake clock
(the schedulers' clock and every schedule's ``nowfun``) and one queue on kombu's
in-memory broker (each node an app of its own). The jobs are
``cron("0 * * * *")`` with ``options={'jitter': timedelta(seconds=60)}``. The
clock starts 1 s before an hourly slot and steps 50 ms at a time to 2 s past the
jitter window; at each step the three nodes tick at once (a thread each, so their
claims race on PostgreSQL), then the queue is drained: a message's publish time
is the step that drained it, its sender the ``elarion_node`` header. The same N
jobs without jitter, on a table of their own, are the baseline.

Checked and counted: each job is published once, for its slot (the
``elarion_occurrence`` header), at slot + ``jitter_offset(job, slot)`` (within one
step); the claims table holds one row per job, published, by the node that sent
it; each node has exactly one record per job (dispatched, or skipped as claimed
elsewhere), all three at the same step, so every node held the slot for the same
offset, and each dispatched record carries that offset. The messages of each
one-second window of the minute are tested against uniform (chi-square, 59
degrees of freedom; the p-value from the regularized gamma function).

A second cluster runs one jittered job through 24 hourly slots (the clock jumps
to 1 s before each slot, then steps until the job is published): its offsets
change from slot to slot. Over the same 24 slots, the offsets of all N jobs are
computed (``jitter_offset``, not run): no job is always among the last.

The slot is fixed (offsets are a hash of job and slot), so a rerun publishes at
the same offsets; what a rerun changes is which node wins each claim.
"""

from __future__ import annotations

import math
import statistics
import time
import uuid
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from celery import Celery

from celery_elarion_beat import ClaimingScheduler, Outcome, SkipReason, cron
from celery_elarion_beat.config.jitter import jitter_offset
from celery_elarion_beat.observe.outcome import Record
from celery_elarion_beat.testing._harness import (
    claims_tables,
    drop_tables,
    isolated_conf,
    read_claims,
)

from .common import PG_DSN, PREFIX, UTC, Table, run_id

#: the slot every run uses (an hour of the issue's day); later hours follow it
SLOT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
MS = timedelta(milliseconds=1)
TASK = "bench.report"
#: seconds for PostgreSQL's statistics to count the closed sessions' deadlocks
STATS_FLUSH = 1.0
#: the fake clock is this far from the database clock at most (a year)
SKEW = 365 * 24 * 3600.0


class FakeClock:
    """The one clock of a run: the schedulers' clock and every schedule's ``nowfun``."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Cluster:
    """Three (or *n*) nodes on one claims table, one clock and one in-memory queue."""

    clock: FakeClock
    table: str
    queue: str
    nodes: list[ClaimingScheduler] = field(default_factory=list)
    records: dict[str, list[Record]] = field(default_factory=dict)
    pool: ThreadPoolExecutor | None = None
    _drain: Any = None
    _conn: Any = None

    @classmethod
    def start(cls, clock: FakeClock, jobs: Sequence[str], jitter: float | None,
              nodes: int) -> Cluster:
        rid = run_id()
        cluster = cls(clock, f"{PREFIX}_jitter_{rid}", f"{PREFIX}.jitter.{rid}")
        broker = f"memory://{PREFIX}-{rid}"
        options = {"jitter": timedelta(seconds=jitter)} if jitter else {}
        entries = {job: {"task": TASK, "schedule": cron("0 * * * *", nowfun=clock),
                         "options": dict(options)} for job in jobs}
        reader = _app(broker, cluster.queue, cluster.table, "reader", {})
        cluster._conn = reader.connection_for_read()
        cluster._drain = cluster._conn.SimpleQueue(cluster.queue)  # declared before any publish
        for i in range(nodes):
            name = f"node-{i + 1}"
            node = ClaimingScheduler(_app(broker, cluster.queue, cluster.table, name, entries),
                                     clock=clock)
            cluster.records[name] = []
            node.recorder.listeners.append(cluster.records[name].append)
            cluster.nodes.append(node)
        cluster.pool = ThreadPoolExecutor(len(cluster.nodes), thread_name_prefix="beat")
        return cluster

    def tick(self) -> None:
        """Every node ticks once, at once (a thread each)."""
        assert self.pool is not None
        for future in [self.pool.submit(node.tick) for node in self.nodes]:
            future.result()

    def drain(self) -> list[dict[str, Any]]:
        """The headers of every message published since the last drain."""
        out: list[dict[str, Any]] = []
        while True:
            try:
                message = self._drain.get_nowait()
            except self._drain.Empty:
                return out
            out.append(dict(message.headers))
            message.ack()

    def held(self) -> int:
        """Slots still waiting for their jitter, on every node together."""
        return sum(len(node.jittered) for node in self.nodes)

    def round_trips(self) -> dict[str, int]:
        """Claim-store round trips of each node so far."""
        return {node.settings.node: node.store.round_trips for node in self.nodes}

    def close(self) -> list[Any]:
        """Stop the nodes; the claims table's rows (the tables are dropped)."""
        try:
            for node in self.nodes:
                node.close()
            if self.pool is not None:
                self.pool.shutdown()
            self._drain.close()
            self._conn.close()
            return read_claims(PG_DSN, self.table)
        finally:
            drop_tables(PG_DSN, *claims_tables(self.table))


def _app(broker: str, queue: str, table: str, node: str, entries: dict[str, Any]) -> Celery:
    app = Celery(f"bench-jitter-{uuid.uuid4().hex[:6]}", set_as_current=False)
    # the fake clock is hours away from the database's: no skew warning at every heartbeat
    app.conf.update(isolated_conf(broker, queue, beat_schedule=entries, result_expires=None,
                                  elarion_beat_dsn=PG_DSN, elarion_beat_table=table,
                                  elarion_beat_node=node, elarion_beat_max_clock_skew=SKEW))
    return app


def deadlocks() -> int:
    """PostgreSQL's count of deadlocks detected in the benchmark's database (every
    session's, read on a connection of its own)."""
    with psycopg.connect(PG_DSN, connect_timeout=10) as conn:
        row = conn.execute("SELECT deadlocks FROM pg_stat_database "
                           "WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


# -- statistics -----------------------------------------------------------------------


def gamma_q(a: float, x: float) -> float:
    """The regularized upper incomplete gamma function Q(a, x) (series below a + 1,
    continued fraction above), good to about 1e-12: P(chi2_k > x) = Q(k/2, x/2)."""
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:  # P(a, x) by its series
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300  # Q(a, x) by Lentz's continued fraction
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def wilson_hilferty(chi2: float, df: int) -> float:
    """P(chi2_df > chi2) by the Wilson-Hilferty normal approximation (a cross-check)."""
    z = ((chi2 / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def per_second(times_ms: Sequence[int], seconds: int) -> list[int]:
    """Messages per one-second window: window k holds the publish times in
    (k s, k+1 s] after the slot (an offset in (k, k+1] s is published in it, the
    steps being a divisor of a second); a time at the slot itself counts in window 0."""
    counts = [0] * seconds
    for t in times_ms:
        counts[min(seconds - 1, max(0, math.ceil(t / 1000) - 1))] += 1
    return counts


def uniformity(counts: Sequence[int]) -> dict[str, float]:
    """min, max, mean, stddev of *counts* and the chi-square test against uniform."""
    n, k = sum(counts), len(counts)
    expected = n / k
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    return {"min": min(counts), "max": max(counts), "mean": statistics.fmean(counts),
            "stddev": statistics.stdev(counts), "expected_stddev":
            math.sqrt(n * (1 / k) * (1 - 1 / k)), "chi2": chi2, "df": k - 1,
            "p": gamma_q((k - 1) / 2, chi2 / 2), "p_wilson_hilferty": wilson_hilferty(chi2, k - 1)}


def largest_burst(times_ms: Sequence[int], window_ms: int = 1000) -> int:
    """The most publish times inside any window ``[t, t + window)``."""
    ordered = sorted(times_ms)
    return max((bisect_left(ordered, t + window_ms) - i for i, t in enumerate(ordered)),
               default=0)


# -- one slot, N jobs -----------------------------------------------------------------


def _job_names(n: int) -> list[str]:
    return [f"report-{i:04d}" for i in range(n)]


def one_slot(jobs: int, jitter: float | None, step: float, nodes: int,
             log: Callable[[str], Any] = print) -> dict[str, Any]:
    """N jobs on one slot through *nodes* nodes; what was published when, by whom."""
    names = _job_names(jobs)
    window = timedelta(seconds=jitter or 0)
    offsets = {job: (jitter_offset(job, SLOT, window) // MS if jitter else 0) for job in names}
    clock = FakeClock(SLOT - timedelta(seconds=1))
    locks = deadlocks()
    t0 = time.perf_counter()
    cluster = Cluster.start(clock, names, jitter, nodes)
    sent: list[tuple[str, int, str, str]] = []  # job, ms after the slot, node, occurrence
    steps = 0
    trips: dict[str, int] = {}
    try:
        end = SLOT + window + timedelta(seconds=2)
        cluster.tick()
        while clock.now < end:
            clock.now += timedelta(seconds=step)
            cluster.tick()
            steps += 1
            at = (clock.now - SLOT) // MS
            sent += [(h["elarion_job"], at, h["elarion_node"], h["elarion_occurrence"])
                     for h in cluster.drain()]
        held = cluster.held()
        trips = cluster.round_trips()
    finally:
        rows = cluster.close()
    wall = time.perf_counter() - t0
    time.sleep(STATS_FLUSH)
    result = _check(names, offsets, sent, rows, cluster.records, round(step * 1000), held)
    result.update(jitter=jitter, steps=steps, wall=wall, round_trips=trips,
                  deadlocks=deadlocks() - locks)
    times = [at for _, at, _, _ in sent]
    result["per_second"] = per_second(times, 60)
    result["uniformity"] = uniformity(result["per_second"])
    result["burst_1s"] = largest_burst(times)
    result["burst_step"] = max(Counter(times).values(), default=0)
    result["first_ms"], result["last_ms"] = min(times, default=0), max(times, default=0)
    log(f"  jitter {jitter or 0:g} s: {len(sent)} messages in {steps} steps, {wall:.1f} s; "
        f"largest 1 s burst {result['burst_1s']}, per second {result['per_second'][:8]}..., "
        f"deadlocks {result['deadlocks']}")
    return result


def _check(names: Sequence[str], offsets: dict[str, int],
           sent: Sequence[tuple[str, int, str, str]], rows: Sequence[Any],
           records: dict[str, list[Record]], step_ms: int, held: int) -> dict[str, Any]:
    """Whether each job went out once, at its offset, claimed once, alike on every node."""
    slot = SLOT.strftime("%Y-%m-%dT%H:%M:%SZ")
    counts = Counter(job for job, _, _, _ in sent)
    at_offset = [job for job, at, _, occ in sent
                 if occ == slot and offsets[job] <= at < offsets[job] + step_ms]
    delays = [at - offsets[job] for job, at, _, _ in sent]
    sender = {job: node for job, _, node, _ in sent}
    ours = [r for r in rows if r.job in offsets]
    by_node = {node: [r for r in recs if r.job in offsets] for node, recs in records.items()}
    # each node: one record per job, and all nodes' records of a job at the same instant
    when: dict[str, set[datetime]] = {}
    for recs in by_node.values():
        for r in recs:
            when.setdefault(r.job, set()).add(r.at)
    dispatched = [r for recs in by_node.values() for r in recs if r.outcome is Outcome.DISPATCHED]
    return {
        "jobs": len(names), "messages": len(sent), "published_once": sum(
            1 for job in names if counts[job] == 1),
        "duplicates": sum(c - 1 for c in counts.values() if c > 1),
        "missing": sum(1 for job in names if counts[job] == 0),
        "at_offset": len(at_offset), "max_delay_ms": max(delays, default=0),
        "min_delay_ms": min(delays, default=0), "still_held": held,
        "claims": len(ours), "claims_one_per_job": sorted(r.job for r in ours) == sorted(names),
        "claims_for_the_slot": sum(1 for r in ours if r.occurrence == SLOT),
        "claims_published": sum(1 for r in ours if r.state == "published"),
        "claims_by_sender": sum(1 for r in ours if sender.get(r.job) == r.node),
        "claims_per_node": {node: sum(1 for r in ours if r.node == node) for node in records},
        "per_node": {node: {
            "records": len(recs), "jobs": len({r.job for r in recs}),
            "dispatched": sum(1 for r in recs if r.outcome is Outcome.DISPATCHED),
            "skipped_claimed_elsewhere": sum(1 for r in recs
                                             if r.reason is SkipReason.CLAIMED_ELSEWHERE),
            "other": sum(1 for r in recs if r.outcome is not Outcome.DISPATCHED
                         and r.reason is not SkipReason.CLAIMED_ELSEWHERE),
        } for node, recs in by_node.items()},
        "records_agree": sum(1 for job in names if len(when.get(job, ())) == 1),
        "dispatched_jitter_matches": sum(
            1 for r in dispatched
            if r.jitter is not None and round(r.jitter * 1000) == offsets[r.job]
            or r.jitter is None and offsets[r.job] == 0),
        "published": [[job, at, node] for job, at, node, _ in sent],
    }


# -- one job, many slots ------------------------------------------------------------


def hourly(hours: int, jitter: float, step: float, nodes: int,
           log: Callable[[str], Any] = print) -> dict[str, Any]:
    """One jittered job through *hours* hourly slots on *nodes* nodes."""
    job = _job_names(1)[0]
    window = timedelta(seconds=jitter)
    clock = FakeClock(SLOT - timedelta(seconds=1))
    t0 = time.perf_counter()
    cluster = Cluster.start(clock, [job], jitter, nodes)
    slots: list[dict[str, Any]] = []
    try:
        for h in range(hours):
            slot = SLOT + timedelta(hours=h)
            clock.now = slot - timedelta(seconds=1)
            cluster.tick()
            got: list[dict[str, Any]] = []
            while not got and clock.now < slot + window + timedelta(seconds=2):
                clock.now += timedelta(seconds=step)
                cluster.tick()
                got = cluster.drain()
            offset = jitter_offset(job, slot, window) // MS
            at = (clock.now - slot) // MS
            slots.append({"slot": slot.isoformat(), "offset_ms": offset, "published_ms": at,
                          "messages": len(got), "node": got[0]["elarion_node"] if got else None,
                          "at_offset": offset <= at < offset + round(step * 1000),
                          "held_after": cluster.held()})
    finally:
        cluster.close()
    offsets = [s["offset_ms"] / 1000 for s in slots]
    log(f"  one job, {hours} slots: offsets " + ", ".join(f"{o:.1f}" for o in offsets))
    return {"job": job, "slots": slots, "wall": time.perf_counter() - t0,
            "distinct": len(set(offsets)), "min": min(offsets), "max": max(offsets),
            "mean": statistics.fmean(offsets), "stddev": statistics.stdev(offsets)
            if len(offsets) > 1 else 0.0}


def rotation(jobs: int, hours: int, jitter: float) -> dict[str, Any]:
    """Computed, not run: how often each of N jobs falls in the last tenth of the
    window over *hours* slots (no job is always the last)."""
    window = timedelta(seconds=jitter)
    late = window * 0.9
    last: list[int] = []
    means: list[float] = []
    for job in _job_names(jobs):
        offsets = [jitter_offset(job, SLOT + timedelta(hours=h), window) for h in range(hours)]
        last.append(sum(1 for o in offsets if o >= late))
        means.append(statistics.fmean(o.total_seconds() for o in offsets))
    return {"jobs": jobs, "hours": hours, "late_from_s": late.total_seconds(),
            "late_most": max(last), "late_never": sum(1 for n in last if n == 0),
            "late_expected": hours * 0.1, "mean_min": min(means), "mean_max": max(means)}


def run(jobs: int, jitter: float = 60.0, step: float = 0.05, nodes: int = 3, hours: int = 24,
        log: Callable[[str], Any] = print) -> dict[str, Any]:
    return {"jobs": jobs, "jitter": jitter, "step": step, "nodes": nodes, "hours": hours,
            "slot": SLOT.isoformat(),
            "baseline": one_slot(jobs, None, step, nodes, log),
            "jittered": one_slot(jobs, jitter, step, nodes, log),
            "hourly": hourly(hours, jitter, step, nodes, log),
            "rotation": rotation(jobs, hours, jitter)}


def tables(result: dict[str, Any]) -> list[Table]:
    n, jitter, nodes = result["jobs"], result["jitter"], result["nodes"]
    step_ms = round(result["step"] * 1000)
    runs = [("no jitter", result["baseline"]), (f"jitter {jitter:g} s", result["jittered"])]
    t = Table(f"Jitter: one slot, {n} cron('0 * * * *') jobs on {nodes} nodes, one PostgreSQL "
              f"claims table, fake clock in {step_ms} ms steps",
              ["run", "messages", "published once", f"at slot + offset (< {step_ms} ms late)",
               "first s", "last s", "largest 1 s burst", f"largest {step_ms} ms step",
               "claims (one per job)", "claims per node", "records agree", "store round trips",
               "deadlocks", "wall s"])
    for label, r in runs:
        t.add(label, r["messages"], r["published_once"], r["at_offset"], r["first_ms"] / 1000,
              r["last_ms"] / 1000, r["burst_1s"], r["burst_step"],
              f"{r['claims']} ({'yes' if r['claims_one_per_job'] else 'no'})",
              "/".join(str(v) for v in r["claims_per_node"].values()),
              f"{r['records_agree']} of {r['jobs']}", sum(r["round_trips"].values()),
              r["deadlocks"], r["wall"])
    t.notes = ["records agree: every node has one record of the job (dispatched, or skipped as "
               "claimed elsewhere), all at the same step: each node held the slot for the same "
               "offset",
               "the nodes tick in threads released together at each step; whoever claims "
               "first sends",
               "store round trips: all nodes' (claims with their ride-along publish marks, "
               "retries, look-ups of a racer's claim, heartbeats); deadlocks: detected by "
               "PostgreSQL in the database during the run (pg_stat_database, every session)"]
    u = Table(f"Jitter: messages per second over the minute ({n} jobs, 60 one-second windows)",
              ["run", "min", "max", "mean", "stddev", "chi-square (59 df)", "p-value",
               "p (Wilson-Hilferty)"])
    for label, r in runs:
        s = r["uniformity"]
        u.add(label, s["min"], s["max"], s["mean"], s["stddev"], s["chi2"], s["p"],
              s["p_wilson_hilferty"])
    expected = result["jittered"]["uniformity"]["expected_stddev"]
    u.notes = [f"uniform: mean {n / 60:.2f}, stddev {expected:.2f} (multinomial); window k holds "
               "the messages published in (k, k+1] s after the slot"]
    h = result["hourly"]
    one = Table(f"Jitter: one job's offset over {len(h['slots'])} hourly slots ({nodes} nodes)",
                ["slot", "offset s", "published s after the slot", "messages", "node"])
    for s in h["slots"]:
        one.add(s["slot"][11:16], s["offset_ms"] / 1000, s["published_ms"] / 1000,
                s["messages"], s["node"])
    rot = result["rotation"]
    one.notes = [f"offsets: {h['distinct']} distinct, min {h['min']:.3f} s, max {h['max']:.3f} s, "
                 f"mean {h['mean']:.2f} s, stddev {h['stddev']:.2f} s",
                 f"computed for all {rot['jobs']} jobs over the same {rot['hours']} slots: the "
                 f"job most often in the last tenth of the window (>= {rot['late_from_s']:g} s) "
                 f"was there {rot['late_most']} times (expected {rot['late_expected']:.1f}); "
                 f"per-job mean offsets {rot['mean_min']:.1f} to {rot['mean_max']:.1f} s"]
    return [t, u, one]

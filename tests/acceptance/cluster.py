"""A real cluster for the acceptance tests: one worker and N beats on one broker.

The beats run ``celery -A tests.acceptance.proj beat -S ClaimingScheduler`` as
nodes ``node-1`` .. ``node-N``; the worker runs every task into a runs table.
Everything the cluster touches is named after one run id (queue, claims table,
runs table) so that parallel or leftover runs never mix, and is removed again
by :meth:`Cluster.close`.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from celery_elarion_beat import slot_task_id
from celery_elarion_beat.beat.purge import PURGE_JOB
from celery_elarion_beat.config.node_queue import node_queue
from celery_elarion_beat.config.settings import Settings
from celery_elarion_beat.store.records import ClaimRow as Claim
from celery_elarion_beat.testing._harness import (
    ChildProcess,
    ProcessManager,
    claims_tables,
    drop_tables,
    read_claims,
    stop_all,
    wait_until,
)
from tests.acceptance import proj

UTC = timezone.utc
APP = "tests.acceptance.proj"

#: generous: a loaded 2-core machine may take long to import celery
START_TIMEOUT = 90.0
DRAIN_TIMEOUT = 30.0

# the beat_schedule of tests.acceptance.proj
CRON_JOB = proj.CRON_JOB          # cron("*/2 * * * * *"): a slot every even second
INTERVAL_JOB = proj.INTERVAL_JOB  # timedelta(seconds=2): window claims
MINUTE_JOB = proj.MINUTE_JOB      # crontab(): a slot every minute
INTERVAL = timedelta(seconds=2)
#: window = interval - min(elarion_beat_window_tolerance (1 s), 10% of the interval)
MIN_INTERVAL_GAP = INTERVAL - min(timedelta(seconds=1), INTERVAL * 0.1)

READY = r"beat: claiming occurrences in .* as node "
CLAIM_OUTCOME = r"beat: (Sending due task|Skipping) "


# -- time --------------------------------------------------------------------


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def iso(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def next_minute(ts: float) -> float:
    """The first minute boundary strictly after *ts*."""
    return (math.floor(ts / 60) + 1) * 60.0


def even_ceil(ts: float) -> float:
    """The first even second at or after *ts* (a slot of the 2 s cron)."""
    return math.ceil(ts / 2) * 2.0


def quiet_moment(ts: float, busy: Iterable[float] = ()) -> float:
    """The first instant at or after *ts* as far as possible from any claim in flight.

    Cron slots are claimed at even seconds; *busy* adds instants (e.g. the latest
    interval claim) whose phase within the 2 s cycle repeats. Without *busy* this
    is half-way between two cron slots: an odd second.
    """
    phases = [0.0] + [b % 2.0 for b in busy]

    def distance(x: float) -> float:
        return min(min(abs(x - p), 2.0 - abs(x - p)) for p in phases)

    best = max((i / 20 for i in range(40)), key=lambda x: (round(distance(x), 3), -abs(x - 1.0)))
    return math.ceil((ts - best) / 2) * 2.0 + best


def grid(start: float, end: float, step: int) -> list[datetime]:
    """Instants of a *step*-second grid (aligned to the epoch) within [start, end]."""
    first = math.ceil(start / step) * step
    return [utc(t) for t in range(int(first), int(math.floor(end)) + 1, step)]


# -- rows --------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    entry: str | None
    job: str | None
    occurrence: str | None
    node: str | None
    placement: str | None
    claim: str | None
    task_id: str
    worker: str | None
    executed_at: datetime


# -- the cluster -------------------------------------------------------------


class Cluster:
    """One worker and *beats* beat nodes on *broker_url*, claiming through *claims_dsn*."""

    def __init__(self, workdir: Path, *, pg_dsn: str, broker_url: str,
                 claims_dsn: str | None = None, beats: int = 3) -> None:
        self.run_id = uuid.uuid4().hex[:10]
        self.pg_dsn = pg_dsn
        self.queue = f"elarion-acc-{self.run_id}"
        self.claims_table = f"acc_claims_{self.run_id}"
        self.runs_table = f"acc_runs_{self.run_id}"
        self.env = {
            "ELARION_ACC_BROKER": broker_url,
            "ELARION_ACC_QUEUE": self.queue,
            "ELARION_ACC_CLAIMS_DSN": claims_dsn or pg_dsn,
            "ELARION_ACC_CLAIMS_TABLE": self.claims_table,
            "ELARION_ACC_RUNS_DSN": pg_dsn,
            "ELARION_ACC_RUNS_TABLE": self.runs_table,
        }
        self.n_beats = beats
        self.pm = ProcessManager(workdir, APP, self.env)
        self.worker: ChildProcess | None = None
        self.beats: dict[str, ChildProcess] = {}
        self.ready_at: float | None = None
        self._tables_made = False

    # -- setup / teardown ----------------------------------------------------

    def prepare(self) -> None:
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL(proj.RUNS_TABLE_DDL).format(table=sql.Identifier(self.runs_table)))
        self._tables_made = True
        app = proj.make_app(self.env, main=f"elarion-acc-probe-{self.run_id}")
        with app.connection_for_write() as conn:
            app.amqp.TaskConsumer(conn).purge()  # declares the queue, then empties it
        app.close()

    def close(self) -> None:
        """Stop every process, then drop the tables and the queue (best effort)."""
        try:
            self.pm.stop_all()
        finally:
            if self._tables_made:
                drop_tables(self.pg_dsn, self.runs_table, *claims_tables(self.claims_table))
            delete_queue(self.env)

    # -- processes -----------------------------------------------------------

    def start(self) -> float:
        """Start the worker, then every beat; return when each beat has claimed once."""
        self.prepare()
        self.worker = self.pm.worker(f"acc-worker-{self.run_id}")
        self.worker.wait_for_log(r"\bready\.", START_TIMEOUT)
        for i in range(1, self.n_beats + 1):
            node = f"node-{i}"
            self.beats[node] = self.pm.beat(f"beat-{node}", env={"ELARION_ACC_NODE": node})
        for beat in self.beats.values():
            beat.wait_for_log(READY, START_TIMEOUT)
        # ready = the beat has been through at least one claim round trip
        for beat in self.beats.values():
            beat.wait_for_log(CLAIM_OUTCOME, START_TIMEOUT)
        self.ready_at = time.time()
        return self.ready_at

    def alive_beats(self) -> list[str]:
        return [node for node, beat in self.beats.items() if beat.alive()]

    def stop_beats(self) -> float:
        """SIGTERM every beat; return the instant the first one was asked to stop."""
        stop_mark = time.time()
        stop_all(self.beats.values())
        return stop_mark

    def drain(self, claims_before: float, excused: Iterable[str] = ()) -> None:
        """Wait until every claim made before *claims_before* has run (or time out)."""
        skip = set(excused)

        def done() -> bool:
            ran = {r.task_id for r in self.runs()}
            wanted = {c.task_id for c in self.claims()
                      if c.claimed_at.timestamp() < claims_before and c.task_id not in skip}
            return wanted <= ran

        try:
            wait_until(done, DRAIN_TIMEOUT, interval=0.5, message="the worker to drain")
        except AssertionError:
            pass  # the assertions name what is missing
        time.sleep(1.0)  # anything still in flight (a duplicate) has a moment to land

    def stop_worker(self) -> None:
        if self.worker is not None:
            self.worker.terminate()

    # -- data ----------------------------------------------------------------

    def claims(self) -> list[Claim]:
        # the purge election (maintenance.PURGE_JOB) claims a window too; it is no entry
        return [c for c in read_claims(self.pg_dsn, self.claims_table) if c.job != PURGE_JOB]

    def runs(self) -> list[Run]:
        query = sql.SQL("SELECT entry, job, occurrence, node, placement, claim, task_id, worker, "
                        "executed_at FROM {} ORDER BY id").format(sql.Identifier(self.runs_table))
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            return [Run(*row) for row in conn.execute(query)]

    def tails(self, n: int = 30) -> str:
        return self.pm.tails(n)


def delete_node_queues(make_app: Callable[..., Any], env: dict[str, str],
                       nodes: Iterable[str], main: str = "elarion-acc-cleanup") -> None:
    """Delete the node queue of each of *nodes* (an app of *make_app* configured from
    *env* names it) from the broker (best effort)."""
    for node in nodes:
        app = make_app({**env, "ELARION_ACC_NODE": node}, main=main)
        try:
            with app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=2)
                bound = node_queue(Settings.from_app(app)).bind(conn.default_channel)
                bound.declare()  # Redis deletes the bindings it knows of only
                bound.delete()
        except Exception:  # noqa: BLE001 - cleanup must never fail a test
            pass
        finally:
            app.close()


def delete_queue(env: dict[str, str]) -> None:
    """Delete a test run's queue and exchange from the broker (best effort)."""
    app = proj.make_app(env, main="elarion-acc-cleanup")
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=2)
            channel = conn.default_channel
            for queue in app.amqp.queues.values():
                try:
                    bound = queue.bind(channel)
                    bound.declare()  # the virtual transports (Redis) delete known bindings only
                    bound.delete()
                    if queue.exchange is not None and queue.exchange.name:
                        queue.exchange.bind(channel).delete()
                except Exception:  # noqa: BLE001 - cleanup must never fail a test
                    channel = conn.channel()
    except Exception:  # noqa: BLE001
        pass
    finally:
        app.close()


# -- analysis ----------------------------------------------------------------


@dataclass
class Analysis:
    """What a run of the cluster did, and every violated property (``problems``)."""

    claims: list[Claim]
    runs: list[Run]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def fail(self, text: str) -> None:
        self.problems.append(text)

    def claims_of(self, job: str) -> list[Claim]:
        return [c for c in self.claims if c.job == job]

    def runs_of(self, job: str) -> list[Run]:
        return [r for r in self.runs if r.entry == job]

    def slot_runs(self, job: str) -> dict[str, list[Run]]:
        by: dict[str, list[Run]] = {}
        for run in self.runs_of(job):
            by.setdefault(run.occurrence or "?", []).append(run)
        return by


def summary(workdir: Path, name: str, text: str) -> None:
    """Print a scenario's summary (shown with -s / -rP or on failure) and keep it beside
    the logs."""
    print(f"\n===== {name} =====\n{text}", flush=True)
    (workdir / "summary.txt").write_text(f"{name}\n{text}\n")


def unclaimed_run(run: Any) -> str:
    return (f"run of {run.entry} task {run.task_id} (occurrence {run.occurrence}, node "
            f"{run.node}) has no claim: sent without winning")


def header_problems(run: Any, claim: Claim) -> list[str]:
    """How the elarion headers a run came with differ from the claim it was sent for."""
    wrong = []
    if run.job != run.entry or run.job != claim.job:
        wrong.append(f"elarion_job={run.job!r} (entry {run.entry!r}, claim {claim.job!r})")
    if run.occurrence != iso(claim.occurrence):
        wrong.append(f"elarion_occurrence={run.occurrence!r} (claim {iso(claim.occurrence)})")
    if run.node != claim.node:
        wrong.append(f"elarion_node={run.node!r} (the claim is held by {claim.node!r})")
    if run.placement != "cluster":
        wrong.append(f"elarion_placement={run.placement!r}")
    if run.claim != claim.kind:
        wrong.append(f"elarion_claim={run.claim!r} (claim kind {claim.kind!r})")
    return wrong


def analyse(claims: list[Claim], runs: list[Run], *, stop_mark: float,
            excused_task_ids: Iterable[str] = ()) -> Analysis:
    """Check the properties that hold for every scenario, over the whole run."""
    a = Analysis(claims, runs)
    excused = set(excused_task_ids)
    claim_by_task = {c.task_id: c for c in claims}

    # the task saw the elarion headers of the claim it was sent for
    expected_kind = {CRON_JOB: "slot", MINUTE_JOB: "slot", INTERVAL_JOB: "window"}
    for run in runs:
        claim = claim_by_task.get(run.task_id)
        if claim is None:
            a.fail(unclaimed_run(run))
            continue
        wrong = header_problems(run, claim)
        if run.claim != expected_kind.get(run.entry or ""):
            wrong.append(f"elarion_claim={run.claim!r} (entry {run.entry!r})")
        if wrong:
            a.fail(f"run {run.task_id} of {run.entry}: wrong headers: {', '.join(wrong)}")

    # no task id ran twice, no slot ran twice
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.task_id] = seen.get(run.task_id, 0) + 1
    dup_tasks = {t: n for t, n in seen.items() if n > 1}
    if dup_tasks:
        a.fail(f"task ids executed more than once: {dup_tasks}")
    dup_slots = 0
    for job in (CRON_JOB, MINUTE_JOB):
        for occurrence, group in sorted(a.slot_runs(job).items()):
            if len(group) > 1:
                dup_slots += 1
                a.fail(f"{job} slot {occurrence} executed {len(group)} times: "
                       f"{[(r.task_id, r.node) for r in group]}")
    a.counts["duplicates"] = len(dup_tasks) + dup_slots

    # slot claims are on their grid and carry the deterministic task id
    for claim in claims:
        if claim.kind != "slot":
            continue
        if claim.task_id != slot_task_id(claim.job, claim.occurrence):
            a.fail(f"{claim.job} slot {iso(claim.occurrence)}: task id {claim.task_id} is not "
                   "uuid5(job, slot)")
        step = 2 if claim.job == CRON_JOB else 60
        ts = claim.occurrence.timestamp()
        if claim.occurrence.microsecond or int(ts) % step:
            a.fail(f"{claim.job} slot {claim.occurrence.isoformat()} is off its {step} s grid")

    # interval claims (DB clock) keep at least the window apart
    windows = sorted(a.claims_of(INTERVAL_JOB), key=lambda c: c.occurrence)
    gaps = [(b.occurrence - p.occurrence, p, b) for p, b in pairwise(windows)]
    close = [(g.total_seconds(), iso(p.occurrence), iso(b.occurrence), p.node, b.node)
             for g, p, b in gaps if g < MIN_INTERVAL_GAP]
    if close:
        a.fail(f"interval claims closer than {MIN_INTERVAL_GAP.total_seconds():g}s: {close}")
    if gaps:
        shortest = min(g for g, _, _ in gaps).total_seconds()
        longest = max(g for g, _, _ in gaps).total_seconds()
        a.notes.append(f"interval gaps (s): min {shortest:.3f} max {longest:.3f}")

    # every claim made well before the stop ran exactly once: winners' task ids == executed ids
    cutoff = utc(stop_mark - 1.0)
    settled = [c for c in claims if c.claimed_at < cutoff]
    ran = set(seen)
    unrun = [c for c in settled if c.task_id not in ran and c.task_id not in excused]
    forgiven = [c for c in settled if c.task_id not in ran and c.task_id in excused]
    if unrun:
        a.fail("claims won but never executed: " + ", ".join(
            f"{c.job}@{iso(c.occurrence)} by {c.node} (claimed {c.claimed_at.time()})"
            for c in unrun))
    late = [c for c in claims if c.claimed_at >= cutoff and c.task_id not in ran]
    for c in late:
        a.notes.append(f"not checked: {c.job}@{iso(c.occurrence)} claimed by {c.node} at "
                       f"{c.claimed_at.time()} while the beats were being stopped, never ran")
    for c in forgiven:
        a.notes.append(f"forgiven: {c.job} claimed by {c.node} at {c.claimed_at.time()} "
                       "just before that beat was killed, never sent (at-most-once)")
    a.counts.update(
        claims=len(claims), runs=len(runs),
        cron_claims=len(a.claims_of(CRON_JOB)), cron_runs=len(a.runs_of(CRON_JOB)),
        interval_claims=len(windows), interval_runs=len(a.runs_of(INTERVAL_JOB)),
        minute_claims=len(a.claims_of(MINUTE_JOB)), minute_runs=len(a.runs_of(MINUTE_JOB)),
        unexecuted_claims=len(unrun), forgiven_claims=len(forgiven),
        unchecked_shutdown_claims=len(late))
    return a


def expect_exactly_once(a: Analysis, job: str, expected: list[datetime], label: str) -> None:
    """Every slot in *expected* ran exactly once."""
    by = a.slot_runs(job)
    missing = [iso(s) for s in expected if iso(s) not in by]
    twice = [iso(s) for s in expected if len(by.get(iso(s), [])) > 1]
    a.counts[f"{label}_expected"] = a.counts.get(f"{label}_expected", 0) + len(expected)
    a.counts[f"{label}_missing"] = a.counts.get(f"{label}_missing", 0) + len(missing)
    if missing or twice:
        winners = {iso(c.occurrence): c.node for c in a.claims_of(job)}
        a.fail(f"{label}: {job} slots not executed exactly once; missing {missing} "
               f"(claimed by: {[winners.get(m, 'nobody') for m in missing]}), "
               f"more than once {twice}; expected {[iso(s) for s in expected]}; "
               f"executed {sorted(by)}")


def report(a: Analysis, extra: str = "") -> str:
    lines = ["counts: " + ", ".join(f"{k}={v}" for k, v in a.counts.items())]
    lines += a.notes
    if a.problems:
        lines.append(f"{len(a.problems)} PROBLEM(S):")
        lines += [f"  - {p}" for p in a.problems]
    if extra:
        lines.append(extra)
    return "\n".join(lines)

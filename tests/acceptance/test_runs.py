"""Acceptance: know what ran (issue #13), on real beat and worker processes.

Each scenario runs ``celery beat -S celery_elarion_beat.ClaimingScheduler`` nodes
and ``celery worker`` processes of :mod:`tests.acceptance.proj_runs` (whose app
calls ``install_worker``) on Redis and PostgreSQL, then holds the claims ledger
(its run columns: ``run_state``, ``started_at``, ``finished_at``, ``worker``,
``runtime``, ``run_error``; its ``skipped`` rows) against what the tasks recorded
themselves in the runs table, and against the JSON log records of the beats and
workers (never their text).

* recorded: each run of a cron, an interval and a failing entry ends on its claim
  row as ``succeeded`` or ``failed``, with the worker, the runtime and timestamps
  that agree with the task's own record.
* overlap: a 3 s task on a 1 s cron on two beats: with ``overlap: skip`` the runs
  never overlap and the slots in between are stored ``skipped`` / ``still-running``
  (and logged so); with the default ``allow`` they overlap.
* killed: ``kill -9`` of the worker (and its pool) in the middle of a run of an
  ``overlap: skip`` entry: the dead run blocks the entry until ``overlap_timeout``
  after its claim, no longer, and the next run goes to a live worker.
* every-node: two beats, each with its worker: each run of an every-node entry has
  one row of kind ``node``, naming its sender and its worker.
* unreachable: the worker's ledger DSN leads nowhere (silent: a connect that hangs
  until its timeout, where the worker waiting for the ledger would show): the tasks
  run on at their pace, and the worker logs one warning. (A refused connection, the
  quick failure, is tests/integration/test_worker_tracking.py's, with a real worker.)
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable
from datetime import timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from celery_elarion_beat.store.records import ClaimRow
from celery_elarion_beat.store.states import (
    PUBLISHED,
    RUN_FAILED,
    RUNNING,
    SKIPPED,
    STILL_RUNNING,
    SUCCEEDED,
)
from celery_elarion_beat.testing._harness import sleep_until, wait_until
from tests.acceptance import proj_runs as proj
from tests.acceptance.cluster import (
    DRAIN_TIMEOUT,
    START_TIMEOUT,
    Analysis,
    grid,
    iso,
    report,
    summary,
    utc,
)
from tests.acceptance.runs import DeadPort, Run, RunsCluster, check_executions

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# real beats and workers; runs seen within 2-4 s
pytestmark += [pytest.mark.heavy]

#: how long the cluster runs after every beat has started, per scenario
RUN_FOR = 8.0
OVERLAP_RUN_FOR = 12.0
#: the quick task sleeps 0.2 s: its runtime is at least that, and far from seconds
QUICK_RUNTIME = (0.15, 5.0)
#: successive runs of the overlap 'skip' entry start at least this far apart (the
#: task takes proj.SLOW = 3 s; the next run is claimed once its finish is recorded)
SKIP_MIN_GAP = 2.5
#: a slot is skipped as still-running no later than this after the ledger's finish of
#: the run that blocked it (the finish is written a moment after it happened)
FINISH_SEEN = 2.0
#: the killed run blocks the entry until overlap_timeout after its claim, and the
#: next run follows within this (the next slot, a claim, a publish, a pick-up)
RERUN_WITHIN = 4.0
#: in the unreachable scenario: a run starts at most this long after its claim
PACE = 4.0
#: DB clock rounding between two timestamps taken by different statements
EPSILON = timedelta(milliseconds=50)
#: finished_at - started_at and the worker's runtime are two measures of one run
SPAN_SLACK = 1.0
FINISHED = (SUCCEEDED, RUN_FAILED)
DROPPED_TEXT = "could not record runs in the claims ledger"


# -- helpers -------------------------------------------------------------------------


def seconds(delta: timedelta) -> float:
    return round(delta.total_seconds(), 3)


def settled(claims: Iterable[ClaimRow], before: float) -> list[ClaimRow]:
    """The claims made before *before* (epoch) that were published."""
    return [c for c in claims if c.state == PUBLISHED and c.claimed_at.timestamp() < before]


def drain(cluster: RunsCluster, before: float, ledger: bool = True) -> None:
    """Wait until every claim published before *before* ran to its end and (with
    *ledger*) its finish is on its row; on a time-out the assertions name what is
    missing."""
    def done() -> bool:
        runs = {r.task_id: r for r in cluster.runs()}
        for claim in settled(cluster.claims(), before):
            run = runs.get(claim.task_id)
            if run is None or run.finished_at is None:
                return False
            if ledger and claim.run_state not in FINISHED:
                return False
        return True

    try:
        wait_until(done, DRAIN_TIMEOUT, interval=0.3, message="the runs to finish")
    except AssertionError:
        pass


def runs_of(runs: Iterable[Run], job: str) -> list[Run]:
    return sorted((r for r in runs if r.entry == job), key=lambda r: r.started_at)


def claims_of(claims: Iterable[ClaimRow], job: str) -> list[ClaimRow]:
    return sorted((c for c in claims if c.job == job), key=lambda c: c.occurrence)


def row_text(c: ClaimRow) -> str:
    return (f"{c.job}@{iso(c.occurrence)} {c.state}/{c.run_state} claimed "
            f"{c.claimed_at.time()} started {c.started_at and c.started_at.time()} finished "
            f"{c.finished_at and c.finished_at.time()} runtime {c.runtime} worker {c.worker} "
            f"error {c.run_error!r:.80} publish_error {c.publish_error!r}")


def check_run_row(a: Analysis, claim: ClaimRow, run: Run | None, worker: str,
                  state: str) -> None:
    """The ledger's account of one finished run against the task's own record."""
    wrong = []
    if claim.run_state != state:
        wrong.append(f"run_state {claim.run_state!r}, expected {state!r}")
    if claim.worker != worker:
        wrong.append(f"worker {claim.worker!r}, expected {worker!r}")
    # started_at is the database clock at the worker's write minus the report's age on
    # the worker's monotonic clock: an estimate that can land a few ms either side
    if claim.started_at is None or claim.started_at < claim.claimed_at - EPSILON:
        wrong.append("started_at missing or before claimed_at")
    if claim.finished_at is None or (claim.started_at is not None
                                     and claim.finished_at < claim.started_at):
        wrong.append("finished_at missing or before started_at")
    if claim.runtime is None or claim.runtime < 0:
        wrong.append("no runtime")
    elif claim.started_at is not None and claim.finished_at is not None:
        span = (claim.finished_at - claim.started_at).total_seconds()
        if abs(span - claim.runtime) > SPAN_SLACK:
            wrong.append(f"finished_at - started_at = {span:.3f}s for a runtime of "
                         f"{claim.runtime:.3f}s")
    if run is not None and run.finished_at is not None:
        body = (run.finished_at - run.started_at).total_seconds()
        # the tracker times prerun..postrun, around the body the task timed itself
        if claim.runtime is not None and claim.runtime < body - EPSILON.total_seconds():
            wrong.append(f"runtime {claim.runtime:.3f}s shorter than the body ({body:.3f}s)")
        # the ledger's start is when prerun ran: before the body began (and wrote its row)
        if claim.started_at is not None and claim.started_at > run.started_at + EPSILON:
            wrong.append(f"started_at {claim.started_at.time()} after the body began "
                         f"({run.started_at.time()})")
        # the ledger's finish is when postrun ran: after the body's end
        if claim.finished_at is not None and claim.finished_at < run.finished_at - EPSILON:
            wrong.append(f"finished_at {claim.finished_at.time()} before the body ended "
                         f"({run.finished_at.time()})")
        if run.worker != claim.worker:
            wrong.append(f"the task ran on {run.worker!r}, the ledger says {claim.worker!r}")
        if (run.outcome or "") != state:
            wrong.append(f"the task recorded outcome {run.outcome!r}")
    if wrong:
        a.fail(f"{claim.job}@{iso(claim.occurrence)} ({claim.task_id}): {'; '.join(wrong)}: "
               f"{row_text(claim)}")


def check_settled_ran(a: Analysis, before: float) -> list[ClaimRow]:
    """Every claim published before *before* ran exactly once; the settled claims."""
    done = settled(a.claims, before)
    ran = {r.task_id for r in a.runs}
    unrun = [c for c in done if c.task_id not in ran]
    if unrun:
        a.fail("published claims never executed: " + ", ".join(row_text(c) for c in unrun))
    unsent = [c for c in a.claims if c.claimed_at.timestamp() < before
              and c.state not in (PUBLISHED, SKIPPED)]
    if unsent:
        a.fail("claims neither published nor skipped: " + ", ".join(map(row_text, unsent)))
    a.counts["settled_claims"] = len(done)
    return done


def still_running_records(cluster: RunsCluster) -> list[dict[str, Any]]:
    return cluster.records(action="skipped", reason=STILL_RUNNING)


# -- recorded: every run ends on its claim row -----------------------------------------


def test_runs_recorded_on_their_claims(workdir: Path, pg_dsn: str, redis_url: str) -> None:
    cluster = RunsCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="recorded")
    try:
        cluster.prepare()
        cluster.start_worker("w1", concurrency=2)
        worker = cluster.hostname("w1")
        cluster.launch_beats()
        started = cluster.wait_started()
        sleep_until(max(started.values()) + RUN_FOR)
        end_mark = cluster.stop_beats()
        before = end_mark - 1.0
        drain(cluster, before)
        cluster.stop_worker()
        claims, runs = cluster.claims(), cluster.runs()

        a = Analysis(claims, runs)  # type: ignore[arg-type]
        check_executions(a)
        done = check_settled_ran(a, before)
        run_by_task = {r.task_id: r for r in runs}
        # the node name the worker was started with (-n <name>@%h)
        if worker != f"acc-w1-{cluster.run_id}@{socket.gethostname()}":
            a.fail(f"the worker calls itself {worker!r}")
        expected = {proj.QUICK_CRON: SUCCEEDED, proj.QUICK_INTERVAL: SUCCEEDED,
                    proj.FAILING: RUN_FAILED}
        for job, state in expected.items():
            mine = [c for c in done if c.job == job]
            a.counts[f"{job}_settled"] = len(mine)
            if len(mine) < (3 if job == proj.QUICK_CRON else 2):
                a.fail(f"{job}: only {len(mine)} published claims in {RUN_FOR:g}s")
            for claim in mine:
                check_run_row(a, claim, run_by_task.get(claim.task_id), worker, state)
            runtimes = [c.runtime for c in mine if c.runtime is not None]
            if runtimes:
                a.notes.append(f"{job}: runtimes {min(runtimes):.3f}..{max(runtimes):.3f}s")
            if state == SUCCEEDED:
                odd = [row_text(c) for c in mine if c.runtime is not None
                       and not QUICK_RUNTIME[0] <= c.runtime < QUICK_RUNTIME[1]]
                if odd:
                    a.fail(f"{job}: runtimes outside {QUICK_RUNTIME} for a {proj.QUICK}s "
                           f"task: {odd}")
                errors = [row_text(c) for c in mine if c.run_error is not None]
                if errors:
                    a.fail(f"{job}: succeeded runs with a run_error: {errors}")
            else:
                bad = [row_text(c) for c in mine
                       if not (c.run_error or "").startswith("ValueError")
                       or proj.FAILURE not in (c.run_error or "")]
                if bad:
                    a.fail(f"{job}: run_error must be 'ValueError: {proj.FAILURE}': {bad}")
        # slot and window rows both: the interval entry's claims are windows
        kinds = {c.kind for c in done if c.job == proj.QUICK_INTERVAL}
        if kinds != {"window"}:
            a.fail(f"{proj.QUICK_INTERVAL}: claim kinds {kinds}, expected windows")
        text = report(a, f"worker {worker}, beats up {utc(max(started.values())).time()}, "
                         f"stop {utc(end_mark).time()}")
        summary(workdir, "recorded (runs on their claim rows)", text)
        assert not a.problems, f"{text}\n{cluster.tails()}"
    finally:
        cluster.close()


# -- overlap: skip holds the next run back, allow does not --------------------------


def test_overlap_skip_and_allow(workdir: Path, pg_dsn: str, redis_url: str) -> None:
    cluster = RunsCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="overlap",
                          beats=2)
    try:
        cluster.prepare()
        # room for every overlapping run of 'allow' (3 at a time) and the one of 'skip'
        cluster.start_worker("w1", concurrency=8)
        worker = cluster.hostname("w1")
        cluster.launch_beats()
        started = cluster.wait_started()
        first_up = max(started.values())
        sleep_until(first_up + OVERLAP_RUN_FOR)
        end_mark = cluster.stop_beats()
        before = end_mark - 1.0
        drain(cluster, before)
        cluster.stop_worker()
        claims, runs = cluster.claims(), cluster.runs()
        records = still_running_records(cluster)

        a = Analysis(claims, runs)  # type: ignore[arg-type]
        check_executions(a)
        done = check_settled_ran(a, before)
        run_by_task = {r.task_id: r for r in runs}
        for claim in done:
            check_run_row(a, claim, run_by_task.get(claim.task_id), worker, SUCCEEDED)
        window = [s for s in grid(first_up + 1, end_mark - 2, 1)]

        # skip: the runs never overlap; the slots in between are stored skipped
        rows = claims_of(claims, proj.SKIP_JOB)
        skip_runs = runs_of(runs, proj.SKIP_JOB)
        skipped = [c for c in rows if c.state == SKIPPED]
        published = [c for c in rows if c.state == PUBLISHED]
        a.counts.update(skip_runs=len(skip_runs), skip_skipped=len(skipped),
                        skip_published=len(published))
        if len(skip_runs) < 2 or len([c for c in skipped if c.claimed_at.timestamp()
                                      < before]) < 2:
            a.fail(f"skip: {len(skip_runs)} runs and {len(skipped)} skipped slots in "
                   f"{OVERLAP_RUN_FOR:g}s; expected at least 2 of each")
        wrong = [row_text(c) for c in skipped if c.publish_error != STILL_RUNNING
                 or c.run_state is not None or c.worker is not None]
        if wrong:
            a.fail(f"skip: skipped rows must say publish_error {STILL_RUNNING!r} and have no "
                   f"run: {wrong}")
        gaps = [(seconds(b.started_at - p.started_at), p, b) for p, b in pairwise(skip_runs)]
        close = [(g, p.occurrence, b.occurrence) for g, p, b in gaps if g < SKIP_MIN_GAP]
        if close:
            a.fail(f"skip: runs started less than {SKIP_MIN_GAP}s apart (a {proj.SLOW:g}s "
                   f"task): {close}")
        overlapped = [(p.occurrence, b.occurrence) for p, b in pairwise(skip_runs)
                      if p.finished_at is None or b.started_at < p.finished_at]
        if overlapped:
            a.fail(f"skip: a run started before the previous one had ended: {overlapped}")
        a.notes.append(f"skip: gaps between run starts {[g for g, _, _ in gaps]}s")
        for claim in skipped:
            # blocked by the job's newest published run before it, still unfinished then
            blocker = max((c for c in published if c.claimed_at < claim.claimed_at),
                          key=lambda c: c.claimed_at, default=None)
            if blocker is None:
                a.fail(f"skip: {iso(claim.occurrence)} skipped with no run before it")
            elif (blocker.finished_at is not None and claim.claimed_at
                  > blocker.finished_at + timedelta(seconds=FINISH_SEEN)):
                a.fail(f"skip: {iso(claim.occurrence)} skipped at {claim.claimed_at.time()}, "
                       f"{seconds(claim.claimed_at - blocker.finished_at)}s after the run of "
                       f"{iso(blocker.occurrence)} was recorded finished")
        missing = [iso(s) for s in window if s not in {c.occurrence for c in rows}]
        if missing:
            a.fail(f"skip: slots with no row (neither run nor skipped): {missing}")
        # every skipped row was logged by a beat, and every still-running skip is a row
        logged = {r.get("occurrence") for r in records if r.get("job") == proj.SKIP_JOB}
        unlogged = [iso(c.occurrence) for c in skipped if c.claimed_at.timestamp() < before
                    and iso(c.occurrence) not in logged]
        if unlogged:
            a.fail(f"skip: skipped rows no beat logged as still-running: {unlogged}")
        ghosts = sorted(logged - {iso(c.occurrence) for c in skipped})
        if ghosts:
            a.fail(f"skip: logged as still-running but not stored skipped: {ghosts}")
        a.counts["still_running_records"] = len(records)
        a.counts["beats_that_logged_still_running"] = len({r["node"] for r in records})

        # allow (the default): every slot runs; runs overlap
        rows = claims_of(claims, proj.ALLOW_JOB)
        allow_runs = runs_of(runs, proj.ALLOW_JOB)
        a.counts.update(allow_runs=len(allow_runs),
                        allow_skipped=len([c for c in rows if c.state == SKIPPED]))
        if [c for c in rows if c.state == SKIPPED]:
            a.fail(f"allow: rows stored skipped: "
                   f"{[row_text(c) for c in rows if c.state == SKIPPED]}")
        if [r for r in records if r.get("job") == proj.ALLOW_JOB]:
            a.fail("allow: a beat logged a still-running skip of the 'allow' entry")
        missing = [iso(s) for s in window if s not in {c.occurrence for c in rows}]
        if missing:
            a.fail(f"allow: slots with no claim: {missing}")
        starts = [seconds(b.started_at - p.started_at) for p, b in pairwise(allow_runs)]
        concurrent = [(p.occurrence, b.occurrence) for p, b in pairwise(allow_runs)
                      if p.finished_at is None or b.started_at < p.finished_at]
        a.notes.append(f"allow: gaps between run starts {starts}s")
        if len(allow_runs) < 4 or not concurrent or min(starts) >= proj.SLOW:
            a.fail(f"allow: the runs must overlap: {len(allow_runs)} runs, gaps {starts}")
        text = report(a, f"worker {worker}, beats up {utc(first_up).time()}, stop "
                         f"{utc(end_mark).time()}")
        summary(workdir, "overlap (skip and allow)", text)
        assert not a.problems, f"{text}\n{cluster.tails()}"
    finally:
        cluster.close()


# -- killed: a dead run blocks until overlap_timeout, no longer -----------------------


@pytest.mark.fault
def test_killed_worker_blocks_until_overlap_timeout(workdir: Path, pg_dsn: str,
                                                     redis_url: str) -> None:
    cluster = RunsCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="killed")
    timeout = proj.KILLED_TIMEOUT
    try:
        cluster.prepare()
        # two workers up before the first run: the one that takes it is killed, the
        # other stands by, so the next run's start does not wait for a worker to boot
        cluster.start_worker("a", concurrency=2)
        cluster.start_worker("b", concurrency=2)
        hosts = {label: cluster.hostname(label) for label in ("a", "b")}
        cluster.launch_beats()
        cluster.wait_started()

        def job_runs() -> list[Run]:
            return runs_of(cluster.runs(), proj.KILLED_JOB)

        first = wait_until(job_runs, START_TIMEOUT, interval=0.05,
                           message=lambda: f"the first run\n{cluster.tails()}")[0]
        victim = next(label for label, host in hosts.items() if host == first.worker)

        def recorded_running() -> bool:
            return any(c.task_id == first.task_id and c.run_state == RUNNING
                       for c in cluster.claims())

        # mid-run: the ledger knows the run started (the worker writes that a moment later)
        wait_until(recorded_running, timeout.total_seconds() - 2.0, interval=0.05,
                   message=lambda: f"the ledger to record the start of {first.task_id}\n"
                                   f"{cluster.tails()}")
        cluster.workers[victim].kill9()  # the worker and its pool: no cleanup, no finish
        killed_at = cluster.workers[victim].killed_at
        assert killed_at is not None
        # the replacement an operator starts (it may or may not be up for the next run)
        cluster.start_worker(f"{victim}2", concurrency=2, wait=False)

        def rerun() -> list[Run]:
            return [r for r in job_runs() if r.task_id != first.task_id]

        second = wait_until(rerun, timeout.total_seconds() + START_TIMEOUT, interval=0.1,
                            message=lambda: f"a run after the killed one\n{cluster.tails()}")[0]
        time.sleep(1.0)
        end_mark = cluster.stop_beats()
        for worker in cluster.workers.values():
            worker.kill9()  # the 30 s run on the survivor would hold a warm shutdown
        claims, runs = cluster.claims(), cluster.runs()
        records = still_running_records(cluster)

        a = Analysis(claims, runs)  # type: ignore[arg-type]
        check_executions(a)
        rows = claims_of(claims, proj.KILLED_JOB)
        by_task = {c.task_id: c for c in rows}
        dead, nxt = by_task.get(first.task_id), by_task.get(second.task_id)
        if dead is None or nxt is None:
            a.fail(f"no claim for the runs {first.task_id} / {second.task_id}")
            text = report(a)
            assert not a.problems, f"{text}\n{cluster.tails()}"
            return
        blocked_until = dead.claimed_at + timeout
        a.notes.append(
            f"dead run {iso(dead.occurrence)} claimed {dead.claimed_at.time()} on {victim} "
            f"({first.worker}), started {first.started_at.time()}, killed "
            f"{utc(killed_at).time()}; next run {iso(nxt.occurrence)} claimed "
            f"{seconds(nxt.claimed_at - dead.claimed_at)}s and started "
            f"{seconds(second.started_at - dead.claimed_at)}s after the dead one's claim, "
            f"on {second.worker}")
        if utc(killed_at) >= blocked_until - timedelta(seconds=1):
            a.fail(f"the worker was killed {seconds(utc(killed_at) - dead.claimed_at)}s after "
                   f"the claim: too late to test the overlap timeout ({timeout})")
        # the dead run: started on the victim, never finished (in the ledger and its own)
        if (dead.run_state != RUNNING or dead.worker != first.worker
                or dead.finished_at is not None or dead.started_at is None):
            a.fail(f"the killed run's row must stay running on {first.worker} with no "
                   f"finish: {row_text(dead)}")
        if first.finished_at is not None:
            a.fail(f"the killed run's body ended: {first}")
        # between the dead run and the next one: every slot skipped, still-running
        between = [c for c in rows if dead.occurrence < c.occurrence < nxt.occurrence]
        wrong = [row_text(c) for c in between
                 if c.state != SKIPPED or c.publish_error != STILL_RUNNING]
        if wrong:
            a.fail(f"slots between the dead run and the next must be skipped "
                   f"{STILL_RUNNING!r}: {wrong}")
        if len(between) < 3:
            a.fail(f"only {len(between)} slots skipped after the dead run")
        late = [row_text(c) for c in between if c.claimed_at >= blocked_until + EPSILON]
        if late:
            a.fail(f"skipped after the overlap timeout ({blocked_until.time()}): {late}")
        logged = {r.get("occurrence") for r in records if r.get("job") == proj.KILLED_JOB}
        unlogged = [iso(c.occurrence) for c in between if iso(c.occurrence) not in logged]
        if unlogged:
            a.fail(f"skipped slots the beat did not log as still-running: {unlogged}")
        # the next run: claimed once the timeout passed, not much later, on a live worker
        if not blocked_until - EPSILON <= nxt.claimed_at \
                <= blocked_until + timedelta(seconds=RERUN_WITHIN):
            a.fail(f"the next run was claimed {seconds(nxt.claimed_at - dead.claimed_at)}s "
                   f"after the dead one; expected {timeout.total_seconds():g}.."
                   f"{timeout.total_seconds() + RERUN_WITHIN:g}s")
        if second.started_at > blocked_until + timedelta(seconds=RERUN_WITHIN):
            a.fail(f"the next run started {seconds(second.started_at - dead.claimed_at)}s "
                   f"after the dead one's claim; expected within "
                   f"{timeout.total_seconds() + RERUN_WITHIN:g}s")
        if second.worker == first.worker:
            a.fail(f"the next run ran on the killed worker {first.worker}")
        if nxt.state != PUBLISHED or nxt.run_state not in (RUNNING, SUCCEEDED) \
                or nxt.worker != second.worker:
            a.fail(f"the next run's row: {row_text(nxt)}")
        others = [r.task_id for r in runs_of(runs, proj.KILLED_JOB)
                  if r.started_at < second.started_at and r.task_id != first.task_id]
        if others:
            a.fail(f"runs between the killed one and the next: {others}")
        a.counts.update(skipped_between=len(between), still_running_records=len(records))
        text = report(a, f"stop {utc(end_mark).time()}")
        summary(workdir, "killed (overlap timeout frees a dead run)", text)
        assert not a.problems, f"{text}\n{cluster.tails()}"
    finally:
        cluster.close()


# -- unreachable: the worker's ledger is gone, the tasks run on ------------------------


@pytest.mark.fault
@pytest.mark.parametrize("mode", ["silent"])
def test_unreachable_ledger_does_not_stop_the_tasks(workdir: Path, pg_dsn: str,
                                                     redis_url: str, mode: str) -> None:
    with DeadPort(mode) as dead:
        cluster = RunsCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url,
                              schedule="recorded")
        try:
            cluster.prepare()
            # solo: one process, one tracker, so exactly one warning
            cluster.start_worker("w1", env={"ELARION_ACC_CLAIMS_DSN": dead.dsn})
            cluster.launch_beats()  # the beats claim in the real database
            started = cluster.wait_started()
            sleep_until(max(started.values()) + RUN_FOR)
            end_mark = cluster.stop_beats()
            before = end_mark - 1.0
            drain(cluster, before, ledger=False)
            worker = cluster.workers["w1"]
            cluster.stop_worker()
            dropped = worker.records(action="runs-dropped")
            claims, runs = cluster.claims(), cluster.runs()

            a = Analysis(claims, runs)  # type: ignore[arg-type]
            check_executions(a)
            done = check_settled_ran(a, before)
            run_by_task = {r.task_id: r for r in runs}
            expected = {proj.QUICK_CRON: SUCCEEDED, proj.QUICK_INTERVAL: SUCCEEDED,
                        proj.FAILING: RUN_FAILED}
            wrong = [(r.entry, r.task_id, r.outcome) for r in runs if r.finished_at is not None
                     and r.outcome != expected.get(r.entry or "")]
            if wrong:
                a.fail(f"tasks that did not end as their entry does: {wrong}")
            a.counts["tasks_run"] = len(runs)
            if len(done) < 10:
                a.fail(f"only {len(done)} published claims in {RUN_FOR:g}s")
            # at their pace: each run starts soon after its claim, and its body is quick
            delays = [seconds(run_by_task[c.task_id].started_at - c.claimed_at)
                      for c in done if c.task_id in run_by_task]
            if delays:
                a.notes.append(f"claim -> start delays {min(delays)}..{max(delays)}s")
            slow = [d for d in delays if d > PACE]
            if slow:
                a.fail(f"runs started more than {PACE:g}s after their claim (the worker "
                       f"waited for the ledger?): {delays}")
            # the worker wrote nothing in the ledger
            written = [row_text(c) for c in claims if c.run_state is not None
                       or c.started_at is not None or c.worker is not None]
            if written:
                a.fail(f"the worker's ledger was unreachable, yet rows have runs: {written}")
            # one warning, as a record and as a line, and no recovery
            lines = worker.lines(DROPPED_TEXT)
            a.counts.update(dropped_records=len(dropped), dropped_lines=len(lines))
            if (len(dropped) != 1 or dropped[0].get("level") != "WARNING"
                    or DROPPED_TEXT not in str(dropped[0].get("message"))):
                a.fail(f"expected one WARNING record with action runs-dropped: {dropped}")
            if len(lines) != 1:
                a.fail(f"expected one line containing {DROPPED_TEXT!r}: {lines}")
            if worker.records(action="runs-recorded"):
                a.fail("the worker says it records runs again")
            text = report(a, f"ledger {mode} on port {dead.port}, stop {utc(end_mark).time()}")
            summary(workdir, f"unreachable ledger ({mode})", text)
            assert not a.problems, f"{text}\n{cluster.tails()}"
        finally:
            cluster.close()


# -- every-node: each node's runs, one row each ---------------------------------------


def test_every_node_runs_get_a_row_per_node(workdir: Path, pg_dsn: str, redis_url: str) -> None:
    """Two beats, each with its own worker (the worker of node-N consumes node-N's queue):
    every execution of the every-node entry, as the task recorded it, has exactly one
    row of kind ``node`` in the ledger, naming the beat node that sent it and the
    worker that ran it, ``succeeded`` with the runtime of a 0.2 s task."""
    cluster = RunsCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="everynode",
                          beats=2)
    try:
        cluster.prepare()
        nodes = ("node-1", "node-2")
        for node in nodes:
            cluster.start_worker(node, env={"ELARION_ACC_NODE": node})
        workers = {node: cluster.hostname(node) for node in nodes}
        cluster.launch_beats(nodes)
        started = cluster.wait_started(nodes)
        sleep_until(max(started.values()) + 6.0)
        cluster.stop_beats()
        assert wait_until(lambda: len([c for c in cluster.claims() if c.kind == "node"
                                       and c.run_state == SUCCEEDED])
                          >= len(cluster.runs()) >= 8, DRAIN_TIMEOUT), cluster.tails()
        cluster.stop_worker()
        runs = cluster.runs()
        rows = [c for c in cluster.claims() if c.job == proj.EVERY_NODE_JOB]
        problems: list[str] = []
        by_task = {c.task_id: c for c in rows}
        if len(by_task) != len(rows):
            problems.append("two rows for one task id")
        for run in runs:
            row = by_task.get(run.task_id)
            if row is None:
                problems.append(f"run {run.task_id} on {run.worker} has no row")
                continue
            sender = run.node
            if (row.kind, row.node, row.state, row.run_state) != ("node", sender, PUBLISHED,
                                                                 SUCCEEDED):
                problems.append(f"row of {run.task_id}: {row_text(row)}")
            if row.worker != workers[sender]:
                problems.append(f"row of {run.task_id} names worker {row.worker!r}, the run "
                                f"was on {workers[sender]!r}")
            if row.runtime is None or not QUICK_RUNTIME[0] <= row.runtime < QUICK_RUNTIME[1]:
                problems.append(f"row of {run.task_id}: runtime {row.runtime}")
        strays = set(by_task) - {r.task_id for r in runs}
        if strays:
            problems.append(f"rows with no execution: {sorted(strays)}")
        per_node = {node: sum(1 for r in rows if r.node == node) for node in nodes}
        if min(per_node.values()) < 4:
            problems.append(f"too few runs per node: {per_node}")
        assert not problems, "\n".join(problems) + f"\n{cluster.tails()}"
    finally:
        cluster.close()

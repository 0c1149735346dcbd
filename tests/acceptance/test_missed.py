"""Acceptance: never lose a slot (issue #12), on real beat and worker processes.

Each scenario runs ``celery beat`` nodes and one ``celery worker`` of
:mod:`tests.acceptance.proj_missed` on Redis and PostgreSQL, then checks what ran
(the runs table: the task records the elarion headers it came with, among them
``elarion_catch_up`` and ``elarion_takeover``) against the claims table (its
``state``, ``published_at``, ``publish_error`` and ``takeovers`` columns) and the
beats' JSON log records.

* a: the whole cluster stops for at least three slots of second-resolution cron
  entries, then three nodes restart at the same moment: each catch-up policy
  replays what it says, each replayed slot once; an interval entry keeps its
  rhythm (it counts from its last claim in the ledger, not from the restart).
* b: ``kill -9`` of the node that holds two claims between claim and publish (the
  test hook :class:`~celery_elarion_beat.testing.hooks.PausingScheduler`): a live
  node takes the ``at_least_once`` one over and publishes it once, with its task
  id; the ``at_most_once`` one is reported as orphaned and never sent.
* c: the broker goes away between a claim and its publish: the claim row records
  the failure; once the broker is back, the ``at_least_once`` slot is published,
  once, with its task id.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from celery_elarion_beat.observe.logformat import record_time
from celery_elarion_beat.schedules.slots import slot_task_id
from celery_elarion_beat.testing._harness import sleep_until, wait_until
from tests.acceptance import proj_missed as proj
from tests.acceptance.cluster import (
    START_TIMEOUT,
    Analysis,
    expect_exactly_once,
    grid,
    iso,
    parse_iso,
    report,
    summary,
    utc,
)
from tests.acceptance.missed import (
    PAUSING_SCHEDULER,
    MissedCluster,
    check_runs,
    check_settled,
)
from tests.helpers.tcpproxy import TcpProxy

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# real beats stopped and restarted; an interval run after a restart at most 1.5 s late
pytestmark += [pytest.mark.heavy]

SLOT = 2  # every cron entry of proj_missed has a slot every even second
SLOT_TD = timedelta(seconds=SLOT)
#: the cluster stays down at least this long, then restarts half-way between two slots
DOWN = 5.0
#: after every beat has (re)started: time for a few normal slots before the stop
SETTLE = 5.0
#: a run that is due when beat is up happens within this (claim + publish + skew)
ON_TIME = 1.5
#: wall-clock slack on top of the spec'd bound publish_timeout + heartbeat
SLACK = 10.0
WAIT = 30.0
#: how long the paused node of scenario c holds its claim before it publishes: long
#: enough to cut the broker first, short enough that its publish fails (and is recorded)
#: before the claim is orphaned (publish_timeout)
PAUSE = 1.0


def _slots(after: datetime | float, before: datetime | float) -> list[datetime]:
    """The slots strictly after *after* and strictly before *before*."""
    lo = after.timestamp() if isinstance(after, datetime) else after
    hi = before.timestamp() if isinstance(before, datetime) else before
    return [s for s in grid(lo, hi, SLOT) if lo < s.timestamp() < hi]


# -- a: the whole cluster stopped across several slots --------------------------


@pytest.mark.fault
def test_catch_up_after_every_node_stopped(workdir, pg_dsn, redis_url) -> None:
    cluster = MissedCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="catch-up")
    interval = proj.INTERVAL.total_seconds()
    try:
        cluster.prepare()
        cluster.start_worker()
        cluster.launch_beats()
        cluster.wait_started()

        # run until the interval entry has run once (one interval after start), then
        # stop every node right after it: the restart will come mid-interval
        def windows(after: float = 0.0) -> list[Any]:
            return [c for c in cluster.claims()
                    if c.job == proj.INTERVAL_JOB and c.occurrence.timestamp() > after]

        wait_until(windows, interval + START_TIMEOUT, interval=0.1,
                   message=lambda: f"the first interval run\n{cluster.tails()}")
        stop_mark = cluster.stop_beats()
        down_from = time.time()
        assert not cluster.alive_beats(), cluster.alive_beats()
        before = cluster.claims()

        # three nodes restart at the same moment, half-way between two slots: more than
        # DOWN + 1 s after the last beat exited, so at least three slots nobody claimed
        restart = (int(down_from + DOWN) // SLOT + 1) * SLOT + SLOT / 2
        sleep_until(restart)
        relaunched = cluster.launch_beats()
        started = cluster.wait_started()
        w_next = wait_until(lambda: windows(stop_mark), interval + START_TIMEOUT, interval=0.1,
                            message=lambda: f"the interval run after the restart\n"
                                            f"{cluster.tails()}")[0]
        sleep_until(max(time.time(), max(started.values()) + SETTLE,
                        w_next.claimed_at.timestamp() + 1))
        end_mark = cluster.stop_beats()
        cluster.drain(end_mark - 1.0)
        cluster.stop_worker()
        claims, runs = cluster.claims(), cluster.runs()

        a = Analysis(claims, runs)  # type: ignore[arg-type]
        check_runs(a)
        check_settled(a, end_mark - 1.0)
        first_up = min(started.values())
        # the ledger read (and catch-up computed) by each restarted node: its records
        resumes = {}
        for record in cluster.records(action="catch-up"):
            if record["process"].endswith(".2"):
                resumes.setdefault(record["node"], []).append(record)
        resumed_at = {node: min(record_time(r) for r in rs) for node, rs in resumes.items()}
        if not resumed_at:
            a.fail("no restarted beat logged a catch-up record")
        a.counts["nodes_that_caught_up"] = len(resumed_at)
        a.counts["catch_up_records"] = sum(len(rs) for rs in resumes.values())
        end = end_mark - 2.0

        for job in proj.CATCH_UP_JOBS:
            own = [c for c in before if c.job == job]
            if not own:
                a.fail(f"{job}: no claim before the stop")
                continue
            last = max(c.occurrence for c in own)
            down = _slots(last, relaunched)  # missed while no beat process existed
            job_runs = [r for r in runs if r.entry == job
                        and r.occurrence is not None and r.occurrence > iso(last)]
            caught = sorted((r for r in job_runs if r.catch_up == 1), key=lambda r: r.occurrence)
            caught_slots = [r.occurrence for r in caught]
            ran = {r.occurrence for r in job_runs}
            label = job.replace("-", "_")
            a.counts[f"{label}_missed_while_down"] = len(down)
            a.counts[f"{label}_caught_up"] = len(caught)
            a.counts[f"{label}_normal_after_restart"] = len(job_runs) - len(caught)
            if len(down) < 3:
                a.fail(f"{job}: the cluster was down across only {len(down)} slots")
            # from the first slot every node was up for on, each slot ran exactly once
            expect_exactly_once(a, job, _slots(first_up, end), label)
            if job == proj.CU_SKIP:
                replayed = [iso(s) for s in down if iso(s) in ran]
                if caught or replayed:
                    a.fail(f"{job}: skip replayed {caught_slots}; missed slots that ran: "
                           f"{replayed}")
                continue
            if not caught:
                a.fail(f"{job}: nothing caught up (missed while down: "
                       f"{[iso(s) for s in down]})")
                continue
            oldest = parse_iso(caught_slots[0])
            # nothing older than the oldest replay ran; from it on, every slot exactly once
            older = [iso(s) for s in _slots(last, oldest) if iso(s) in ran]
            if older:
                a.fail(f"{job}: slots older than its oldest replay {caught_slots[0]} ran: {older}")
            expect_exactly_once(a, job, [s for s in grid(oldest.timestamp(), end, SLOT)],
                                f"{label}_from_oldest_replay")
            if job == proj.CU_LATEST:
                if len(caught) != 1 or oldest < down[-1]:
                    a.fail(f"{job}: latest must replay exactly one slot, the latest missed "
                           f"(>= {iso(down[-1])}); replayed {caught_slots}")
            elif job == proj.CU_ALL:
                not_replayed = [iso(s) for s in down if iso(s) not in caught_slots]
                if not_replayed:
                    a.fail(f"{job}: missed slots not replayed: {not_replayed}")
            elif job == proj.CU_CAPPED:
                newest = down[-1] - (proj.CAPPED_MAX - 1) * SLOT_TD
                if len(caught) != proj.CAPPED_MAX or oldest < newest:
                    a.fail(f"{job}: must replay only the {proj.CAPPED_MAX} newest missed slots "
                           f"(missed while down: {[iso(s) for s in down]}); replayed "
                           f"{caught_slots}")
            elif job == proj.CU_WINDOW:
                by_task = {c.task_id: c for c in claims}
                too_old = []
                for run in caught:
                    holder = by_task[run.task_id].node
                    # the node read the ledger after its started record: now - window is later
                    if parse_iso(run.occurrence) < utc(started[holder]) - proj.WINDOW:
                        too_old.append((run.occurrence, holder))
                if too_old:
                    a.fail(f"{job}: replayed slots older than the {proj.WINDOW} window: {too_old}")
                cut = [s for s in down if s < utc(first_up) - proj.WINDOW]
                a.counts[f"{label}_cut_by_window"] = len(cut)
                if not cut:
                    a.fail(f"{job}: no missed slot was older than the window; the scenario "
                           "did not test the window")
            if job in (proj.CU_ALL, proj.CU_CAPPED, proj.CU_WINDOW):
                # oldest first: in the order the worker ran them, and claimed them
                executed = [r.occurrence for r in runs if r.entry == job and r.catch_up == 1]
                if executed != sorted(executed):
                    a.fail(f"{job}: replays did not run oldest first: {executed}")
                # each node claims its replays oldest first; across nodes the order is
                # each node's start (under `window` a node that started later replays
                # fewer, newer slots, and may claim them before an earlier node's older)
                for node in sorted({c.node for c in claims if c.job == job}):
                    claimed = [iso(c.occurrence) for c in sorted(
                        (c for c in claims if c.job == job and c.node == node
                         and iso(c.occurrence) in caught_slots), key=lambda c: c.claimed_at)]
                    if claimed != sorted(claimed):
                        a.fail(f"{job}: {node} did not claim its replays oldest first: "
                               f"{claimed}")

        # the interval entry: its next run counts from its last claim, not from the restart
        intervals = sorted((c for c in claims if c.job == proj.INTERVAL_JOB),
                           key=lambda c: c.occurrence)
        last_window = max((c for c in before if c.job == proj.INTERVAL_JOB),
                          key=lambda c: c.occurrence)
        after = [c for c in intervals if c.occurrence > last_window.occurrence]
        due = last_window.occurrence.timestamp() + interval
        resumed = min(resumed_at.values()) if resumed_at else first_up
        expected = max(due, resumed)
        gap = (w_next.occurrence - last_window.occurrence).total_seconds()
        a.counts["interval_runs"] = len([r for r in runs if r.entry == proj.INTERVAL_JOB])
        a.notes.append(
            f"interval: last run before the stop {iso(last_window.occurrence)}, due again "
            f"{iso(utc(due))}, first node read the ledger {utc(resumed).time()} "
            f"({'mid-interval' if resumed < due else 'after the due time'}), next run "
            f"{w_next.occurrence.time()}: gap {gap:.2f}s for an interval of {interval:g}s, "
            f"{w_next.occurrence.timestamp() - expected:+.2f}s from when it was due")
        if not after or after[0].task_id != w_next.task_id:
            a.fail(f"interval: unexpected claims after the stop: {after}")
        if w_next.occurrence.timestamp() > expected + ON_TIME:
            a.fail(f"interval: the run after the restart came {gap:.2f}s after the last one, "
                   f"{w_next.occurrence.timestamp() - expected:.2f}s after it was due "
                   f"({iso(utc(expected))}): the restart postponed it")
        if gap < interval - 1.0:
            a.fail(f"interval: the run after the restart came only {gap:.2f}s after the last "
                   "one: the restart doubled it")
        up = ", ".join(f"{n} +{t - relaunched:.1f}s" for n, t in sorted(started.items()))
        timeline = (f"stop {utc(stop_mark).time()} (all down {utc(down_from).time()}), "
                    f"restart {utc(relaunched).time()}, beats up {up}, end {utc(end_mark).time()}")
        text = report(a, timeline)
        summary(workdir, "scenario a (whole cluster stopped, catch-up)", text)
        assert not a.problems, f"{text}\n{cluster.tails()}"
    finally:
        cluster.close()


# -- b: kill -9 between claim and publish ------------------------------------------


def _marker(path: Path) -> dict[str, Any] | None:
    """The pause marker of PausingScheduler, once it is complete."""
    try:
        found = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return found if isinstance(found, dict) else None


@pytest.mark.fault
def test_kill_9_between_claim_and_publish(workdir, pg_dsn, redis_url) -> None:
    marker_path = workdir / "paused.json"
    cluster = MissedCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="delivery")
    pause = {"ELARION_TEST_PAUSE_JOB": f"{proj.AT_MOST_ONCE},{proj.AT_LEAST_ONCE}",
             "ELARION_TEST_PAUSE_MARKER": str(marker_path)}
    try:
        cluster.prepare()
        cluster.start_worker()
        cluster.launch_beats(scheduler=PAUSING_SCHEDULER, env=pause)
        started = cluster.wait_started()
        # the first node to win the chunk of the two entries claims both, then pauses
        marker = wait_until(lambda: _marker(marker_path), START_TIMEOUT, interval=0.1,
                            message=lambda: f"a beat to pause\n{cluster.tails()}")
        victim = next(node for node, beat in cluster.beats.items() if beat.pid == marker["pid"])
        slot = parse_iso(marker["occurrence"])
        # the paused chunk: the victim's claims of the slot it has not published (it may
        # have claimed and published another chunk of the slot before)
        held = {c.job: c for c in cluster.claims()
                if c.node == victim and c.occurrence == slot and c.state == "pending"}
        cluster.beats[victim].kill9()
        killed_at = cluster.beats[victim].killed_at
        assert killed_at is not None
        survivors = [node for node in cluster.beats if node != victim]
        assert {proj.AT_MOST_ONCE, proj.AT_LEAST_ONCE} <= set(held), \
            f"{victim} paused holding {sorted(held)}, not both entries\n{cluster.tails()}"
        alo = held[proj.AT_LEAST_ONCE]

        # at_least_once: a live node takes the orphan over and publishes it
        def taken_over() -> list[Any]:
            return [r for r in cluster.runs() if r.task_id == alo.task_id]

        wait_until(taken_over, proj.PUBLISH_TIMEOUT + proj.HEARTBEAT + WAIT, interval=0.1,
                   message=lambda: f"the orphan of {proj.AT_LEAST_ONCE} to run\n"
                                   f"{cluster.tails()}")

        # at_most_once: the cluster reports the orphan once (one live node, whichever
        # marks it reported first; the others read the mark)
        def reported() -> bool:
            return any(cluster.beats[node].records(action="orphaned", job=proj.AT_MOST_ONCE,
                                                   occurrence=iso(slot))
                       for node in survivors)

        wait_until(reported, WAIT, message=lambda: f"a survivor to report the orphan of "
                                                   f"{proj.AT_MOST_ONCE}\n{cluster.tails()}")
        status = cluster.status()
        sleep_until(time.time() + SETTLE)
        end_mark = cluster.stop_beats()
        cluster.drain(end_mark - 1.0, excused=[c.task_id for c in held.values()])
        cluster.stop_worker()
        claims, runs = cluster.claims(), cluster.runs()

        a = Analysis(claims, runs)  # type: ignore[arg-type]
        check_runs(a)
        dropped = {job: c for job, c in held.items() if proj.DELIVERY[job] == "at_most_once"}
        check_settled(a, end_mark - 1.0, excused=[c.task_id for c in dropped.values()])
        rows = {(c.job, c.occurrence): c for c in claims}
        entries = {e.get("name"): e for e in status.get("entries", [])}
        a.counts.update(held_by_victim=len(held), taken_over=len(held) - len(dropped),
                        reported_only=len(dropped))
        for job, claim in sorted(held.items()):
            row = rows[(job, claim.occurrence)]
            job_runs = [r for r in runs if r.entry == job and r.occurrence == iso(slot)]
            listed = entries.get(job, {})
            orphaned = [iso(parse_any(o)) for o in listed.get("orphaned") or []]
            if job in dropped:
                # at_most_once: the cluster reports the orphan once; it is never sent
                if job_runs or row.state != "pending" or row.node != victim or row.takeovers:
                    a.fail(f"{job} {iso(slot)}: an at_most_once orphan must stay pending, held "
                           f"by {victim}, and never run: {row}, runs {job_runs}")
                per_node = {node: len(cluster.beats[node].records(
                    action="orphaned", job=job, occurrence=iso(slot))) for node in survivors}
                a.counts[f"{job}_orphan_reports"] = sum(per_node.values())
                if sum(per_node.values()) != 1:
                    a.fail(f"{job}: the live nodes must report the orphan once in all (the "
                           f"cluster's mark stops the others): {per_node}")
                if not row.orphan_reported:
                    a.fail(f"{job} {iso(slot)}: the claim does not carry the cluster's "
                           f"orphan mark (orphan_reported_at): {row}")
                if iso(slot) not in orphaned:
                    a.fail(f"status --json does not list {job} {iso(slot)} as orphaned: "
                           f"{json.dumps(listed)}")
                continue
            # at_least_once: one live node takes the orphan over and publishes it, once
            delay = ((row.published_at - claim.claimed_at).total_seconds()
                     if row.published_at is not None else None)
            ran_after = [round((r.executed_at - claim.claimed_at).total_seconds(), 2)
                         for r in job_runs]
            a.notes.append(f"{job} {iso(slot)}: claimed by {victim} at "
                           f"{claim.claimed_at.time()}, taken over by {row.node}, published "
                           f"{delay if delay is None else round(delay, 2)}s and run {ran_after}s "
                           "after the claim")
            if delay is not None:
                a.counts[f"{job}_publish_delay_ms"] = round(delay * 1000)
            if len(job_runs) != 1 or job_runs[0].task_id != claim.task_id \
                    or job_runs[0].takeover != 1 or job_runs[0].catch_up != 0:
                a.fail(f"{job}: the orphan must run exactly once, with its task id "
                       f"{claim.task_id} and elarion_takeover=1: {job_runs}")
            if (row.state != "published" or row.takeovers != 1 or row.node not in survivors
                    or row.task_id != claim.task_id):
                a.fail(f"{job}: after the takeover the row must be published, takeovers 1, "
                       f"held by a survivor, with the same task id: {row}")
            if delay is None or not (proj.PUBLISH_TIMEOUT <= delay
                                     <= proj.PUBLISH_TIMEOUT + proj.HEARTBEAT + SLACK):
                a.fail(f"{job}: published {delay}s after its claim; expected between "
                       f"publish_timeout and publish_timeout + heartbeat + {SLACK:g}s")
            taken = cluster.records(action="orphan-taken-over", job=job)
            if len(taken) != 1 or taken[0]["node"] != row.node:
                a.fail(f"{job}: expected one takeover record, by {row.node}: "
                       f"{[(r['node'], r['occurrence']) for r in taken]}")
            if cluster.records(action="orphaned", job=job):
                a.fail(f"{job}: reported as orphaned instead of taken over")
            if orphaned:
                a.fail(f"status --json still lists {job} as orphaned: {orphaned}")
        if alo.task_id != marker["task_id"] or alo.task_id != slot_task_id(alo.job, slot):
            a.fail(f"{alo.job}: task id {alo.task_id} is not the paused one "
                   f"{marker['task_id']} / uuid5")
        for key in ("catch_up", "delivery", "orphaned", "unpublished"):
            if any(key not in e for e in entries.values()):
                a.fail(f"status --json: no {key!r} field in the entries")

        # every other slot ran exactly once, before and after the kill
        first = max(started.values())
        for job in proj.DELIVERY_JOBS:
            lost = {slot} if job in dropped else set()
            expect_exactly_once(a, job, [s for s in _slots(first, end_mark - 2.0)
                                         if s not in lost], job)
        timeline = (f"beats up {utc(min(started.values())).time()}..{utc(first).time()}, "
                    f"{victim} paused at {iso(slot)} holding {sorted(held)}, killed "
                    f"{utc(killed_at).time()}, end {utc(end_mark).time()}")
        text = report(a, timeline)
        summary(workdir, "scenario b (kill -9 between claim and publish)", text)
        assert not a.problems, f"{text}\n{cluster.tails()}"
    finally:
        cluster.close()


def parse_any(text: str) -> datetime:
    """An ISO 8601 instant as status prints it (``...Z`` or ``+00:00``)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- c: the broker goes away between a claim and its publish -----------------------


@pytest.mark.fault
def test_publish_failure_recorded_and_retried_after_the_broker_returns(
        workdir, pg_dsn, redis_url) -> None:
    target = urlparse(redis_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 6379).start()
    proxied = target._replace(netloc=f"{proxy.host}:{proxy.port}").geturl()
    marker_path = workdir / "paused.json"
    cluster = MissedCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="broker",
                            beats=2)
    try:
        cluster.prepare()
        cluster.start_worker()  # straight to the broker: only the beats lose it
        cluster.launch_beats(scheduler=PAUSING_SCHEDULER, env={
            "ELARION_ACC_BROKER": proxied, "ELARION_TEST_PAUSE_JOB": proj.BROKER_JOB,
            "ELARION_TEST_PAUSE_SECONDS": str(PAUSE),
            "ELARION_TEST_PAUSE_MARKER": str(marker_path)})
        started = cluster.wait_started()
        marker = wait_until(lambda: _marker(marker_path), START_TIMEOUT, interval=0.05,
                            message=lambda: f"a beat to pause\n{cluster.tails()}")
        cut = time.time()
        proxy.cut()  # the paused node publishes into a dead broker connection
        slot = parse_iso(marker["occurrence"])
        holder = next(node for node, beat in cluster.beats.items() if beat.pid == marker["pid"])

        def row() -> Any:
            return next((c for c in cluster.claims()
                         if c.job == proj.BROKER_JOB and c.occurrence == slot), None)

        claim = row()
        failed = wait_until(lambda: (r := row()) is not None and r.state == "failed" and r,
                            PAUSE + WAIT, interval=0.1,
                            message=lambda: f"the claim of {iso(slot)} to be marked failed: "
                                            f"{row()}\n{cluster.tails()}")
        failed_at = time.time()
        proxy.restore()
        restored = time.time()
        wait_until(lambda: [r for r in cluster.runs() if r.task_id == marker["task_id"]],
                   proj.PUBLISH_TIMEOUT + proj.HEARTBEAT + WAIT, interval=0.1,
                   message=lambda: f"the failed slot {iso(slot)} to run after the broker came "
                                   f"back: {row()}\n{cluster.tails()}")
        sleep_until(time.time() + SETTLE)
        end_mark = cluster.stop_beats()
        cluster.drain(end_mark - 1.0)
        cluster.stop_worker()
        claims, runs = cluster.claims(), cluster.runs()

        a = Analysis(claims, runs)  # type: ignore[arg-type]
        check_runs(a)
        check_settled(a, end_mark - 1.0)
        final = next(c for c in claims if c.job == proj.BROKER_JOB and c.occurrence == slot)
        slot_runs = [r for r in runs if r.entry == proj.BROKER_JOB and r.occurrence == iso(slot)]
        failures = cluster.records(action="publish-error")
        a.counts.update(publish_errors_logged=len(failures),
                        takeovers_of_the_slot=final.takeovers,
                        claims_taken_over=len([c for c in claims if c.takeovers]),
                        slot_runs=len(slot_runs))
        if claim is None or claim.node != holder or claim.task_id != marker["task_id"]:
            a.fail(f"the paused claim is not {holder}'s with task id {marker['task_id']}: "
                   f"{claim}")
        if not failed.publish_error:
            a.fail(f"the failed claim has no publish_error: {failed}")
        if (len(slot_runs) != 1 or slot_runs[0].task_id != marker["task_id"]
                or slot_runs[0].takeover != final.takeovers):
            a.fail(f"{iso(slot)} must run exactly once, with task id {marker['task_id']} and "
                   f"elarion_takeover={final.takeovers}: {slot_runs}")
        if final.state != "published" or final.takeovers < 1 or final.published_at is None \
                or final.published_at.timestamp() < restored:
            a.fail(f"after the broker came back the claim must be taken over and published: "
                   f"{final}")
        expect_exactly_once(a, proj.BROKER_JOB, _slots(max(started.values()), end_mark - 2.0),
                            "slots")
        errors = [r for r in failures if r.get("occurrence") == iso(slot)]
        a.notes.append(f"{iso(slot)} seen failed as held by {failed.node} (takeovers "
                       f"{failed.takeovers}): {failed.publish_error!r:.160}; publish errors "
                       f"logged for it by {[r['node'] for r in errors]}")
        if not any(r["node"] == holder for r in errors):
            a.fail(f"{holder} logged no publish error for {iso(slot)}")
        timeline = (f"{holder} claimed {iso(slot)} at "
                    f"{claim.claimed_at.time() if claim else '?'}, broker cut "
                    f"{utc(cut).time()}, row seen failed {utc(failed_at).time()}, broker back "
                    f"{utc(restored).time()}, taken over by {final.node} ({final.takeovers}x), "
                    f"published {final.published_at.time() if final.published_at else None}, "
                    f"end {utc(end_mark).time()}")
        text = report(a, timeline)
        summary(workdir, "scenario c (broker gone after the claim)", text)
        assert not a.problems, f"{text}\n{cluster.tails()}"
    finally:
        try:
            cluster.close()
        finally:
            proxy.stop()

"""Acceptance: live control (issue #14), on real beat, worker and CLI processes.

One worker of :mod:`tests.acceptance.proj_control` (``install_worker``: it records each
run on its claim row, and consumes every beat's node queue) serves the module; the
operator's commands run as ``celery -A tests.acceptance.proj_control elarion-beat ...``
processes on Redis and PostgreSQL.

* trigger, no beat running: one run, with ``elarion_manual=1``, on a claims row of kind
  ``manual`` that ends ``published`` / ``succeeded``, and an audit row.
* triggers released together (processes waiting at a barrier): one run, the others
  refused naming the run they duplicate and ``--force``; two ``--force`` triggers
  released together: two more runs.
* bad input (an unknown job, ``--until`` that is no time or in the past): refused with
  a message naming what is wrong, and nothing is written.
* pause, resume, expiry on three beats: after ``pause`` returns no node sends the job
  (its slots are stored ``skipped`` / ``paused`` and every beat logs the skip), the
  every-node entry stops on every node, the job never paused runs once per slot
  throughout; a trigger of the paused job runs anyway; after ``resume`` the runs come
  back, once per slot; ``pause --for`` ends by itself; ``audit --json`` lists it all
  with the actor and the reason.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

import pytest

from celery_elarion_beat.observe.logformat import record_time
from celery_elarion_beat.store.records import ClaimRow
from celery_elarion_beat.store.states import MANUAL_KIND, PAUSED, PUBLISHED, SKIPPED, SUCCEEDED
from celery_elarion_beat.testing._harness import sleep_until
from tests.acceptance.cluster import (
    START_TIMEOUT,
    Analysis,
    expect_exactly_once,
    grid,
    iso,
    report,
    summary,
    utc,
)
from tests.acceptance.control import NODES, CliRun, ControlCluster, cli_actor, cli_node, json_lines
from tests.acceptance.proj_control import (
    EVERY_NODE_JOB,
    MANUAL_ONCE,
    MANUAL_RACE,
    PAUSED_JOB,
    STEADY_JOB,
    beat_schedule,
)
from tests.acceptance.runs import Run, check_executions

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# a module cluster of real beats and a worker; a pause must be read at the next tick
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("acceptance-control")]

SLOT = 2.0
#: "within one tick": a slot up to this long after ``pause`` returned may still run
SLACK = SLOT + 0.5
#: how long the job stays paused before ``resume``
HOLD = 7.0
#: ``pause --for``
EXPIRES = 6.0
#: a message sent is executed within this (one solo worker on a loaded machine)
DELIVERY = 2.0
#: triggers released together at the barrier
RACERS = 3
#: a run shows up this long after its trigger returned, or never
RUN_WITHIN = 20.0
#: what the operator says
REASON = "maintenance"
TRIGGER_REASON = "hotfix"
EXPIRY_REASON = "deploy"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pg_dsn: str,
            redis_url: str) -> Iterator[ControlCluster]:
    """The module's cluster: its tables, queue and one worker (the tests start beats)."""
    workdir = tmp_path_factory.mktemp("control") / "procs"
    workdir.mkdir()
    control = ControlCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url)
    try:
        control.prepare()
        control.start_control_worker()
        yield control
    finally:
        control.close()


# -- helpers -------------------------------------------------------------------------


def seconds_after(at: datetime, ts: float) -> float:
    return round(at.timestamp() - ts, 3)


def runs_of(cluster: ControlCluster, job: str, manual: bool | None = None) -> list[Run]:
    """The runs of *job* in order (*manual*: only triggered ones, or only scheduled ones)."""
    flags = cluster.manual_headers()
    return [r for r in cluster.runs() if r.entry == job
            and (manual is None or (flags.get(r.task_id) == 1) == manual)]


def rows_of(claims: Iterable[ClaimRow], job: str, kind: str = "slot") -> list[ClaimRow]:
    return sorted((c for c in claims if c.job == job and c.kind == kind),
                  key=lambda c: c.occurrence)


def between(rows: Iterable[ClaimRow], start: float, end: float) -> list[ClaimRow]:
    """The rows whose occurrence is in (start, end) (epoch seconds)."""
    return [c for c in rows if start < c.occurrence.timestamp() < end]


def row_text(c: ClaimRow) -> str:
    return (f"{c.job}@{iso(c.occurrence)} {c.kind} {c.state}/{c.publish_error} node {c.node} "
            f"run {c.run_state} task {c.task_id}")


def ran_once(rows: Iterable[ClaimRow], runs: Iterable[Run]) -> list[ClaimRow]:
    """The published rows whose task ran (exactly once)."""
    count: dict[str, int] = {}
    for run in runs:
        count[run.task_id] = count.get(run.task_id, 0) + 1
    return [c for c in rows if c.state == PUBLISHED and count.get(c.task_id) == 1]


def audit_of(entries: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    """The audit entries of *job*, oldest first (the command lists the newest first)."""
    return sorted((e for e in entries if e.get("job") == job), key=lambda e: str(e["at"]))


def parse_at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def manual_row_problems(row: ClaimRow, run: Run, cli: CliRun, worker: str) -> list[str]:
    """How a triggered run's claims row differs from what the spec says."""
    wrong = []
    if row.kind != MANUAL_KIND or row.state != PUBLISHED:
        wrong.append(f"kind/state {row.kind}/{row.state}, expected {MANUAL_KIND}/{PUBLISHED}")
    if row.node != cli_node():
        wrong.append(f"node {row.node!r}, expected the operator's user@host {cli_node()!r}")
    if not cli.started - 1.0 <= row.occurrence.timestamp() <= cli.returned + 1.0:
        wrong.append(f"occurrence {row.occurrence} outside the command's run "
                     f"({utc(cli.started).time()}..{utc(cli.returned).time()})")
    if row.task_id != run.task_id:
        wrong.append(f"task id {row.task_id}, the run's is {run.task_id}")
    if row.run_state != SUCCEEDED or row.worker != run.worker:
        wrong.append(f"run_state {row.run_state!r} on {row.worker!r}, expected {SUCCEEDED} on "
                     f"{run.worker!r} (the worker tracks the run)")
    if run.job != row.job:
        wrong.append(f"header elarion_job={run.job!r}")
    return wrong


def wait_ran(cluster: ControlCluster, job: str, count: int) -> list[Run]:
    """Wait for *count* runs of *job*, each tracked to its end on its claims row, and a
    moment more (a duplicate has time to land); the runs."""
    def tracked() -> bool:
        runs = runs_of(cluster, job)
        done = {c.task_id for c in cluster.claims() if c.job == job and c.run_state}
        return len(runs) >= count and {r.task_id for r in runs} <= done

    cluster.wait_for(f"{count} tracked runs of {job}", tracked, RUN_WITHIN)
    time.sleep(1.5)
    return runs_of(cluster, job)


# -- trigger -------------------------------------------------------------------------


def test_trigger_without_beat_runs_once_with_the_manual_header(cluster: ControlCluster) -> None:
    cluster.stop_beats()
    assert not cluster.alive_beats()
    worker = cluster.hostname("w1")
    (cli,) = cluster.cli_ok(["trigger", MANUAL_ONCE, "--reason", TRIGGER_REASON])
    runs = wait_ran(cluster, MANUAL_ONCE, 1)
    rows = rows_of(cluster.claims(), MANUAL_ONCE, MANUAL_KIND)
    flags = cluster.manual_headers()
    problems = []
    if len(runs) != 1 or len(rows) != 1:
        problems.append(f"{len(runs)} runs and {len(rows)} manual rows, expected one each: "
                        f"{runs} {[row_text(c) for c in cluster.claims()]}")
    else:
        (run,), (row,) = runs, rows
        if flags.get(run.task_id) != 1:
            problems.append(f"header elarion_manual={flags.get(run.task_id)!r}, expected 1")
        problems += manual_row_problems(row, run, cli, worker)
        if run.task_id not in cli.output:
            problems.append(f"the command did not print the task id {run.task_id}")
        audit = [a for a in cluster.audit() if a["job_name"] == MANUAL_ONCE]
        if [(a["action"], a["actor"], a["reason"], a["task_id"]) for a in audit] != [
                ("trigger", cli_actor(), TRIGGER_REASON, run.task_id)]:
            problems.append(f"audit rows {audit}")
    assert not problems, "\n".join(problems) + f"\n{cli}\n{cluster.tails()}"


def test_triggers_released_together_run_once_unless_forced(cluster: ControlCluster) -> None:
    cluster.stop_beats()
    race = cluster.cli(*[["trigger", MANUAL_RACE]] * RACERS, barrier=True)
    won = [cli for cli in race if cli.rc == 0]
    refused = [cli for cli in race if cli.rc != 0]
    text = "\n".join(map(str, race))
    assert len(won) == 1, f"{len(won)} of {RACERS} triggers released together ran:\n{text}"
    (run,) = wait_ran(cluster, MANUAL_RACE, 1)
    # each refusal names the run it duplicates, and how to run it anyway
    unclear = [str(cli) for cli in refused
               if "--force" not in cli.output or run.task_id not in cli.output
               or "Traceback" in cli.output]
    assert not unclear, "refusals must name the duplicate's task id and --force:\n" + \
        "\n".join(unclear)
    assert len(rows_of(cluster.claims(), MANUAL_RACE, MANUAL_KIND)) == 1, text

    forced = cluster.cli(*[["trigger", MANUAL_RACE, "--force"]] * 2, barrier=True)
    assert all(cli.rc == 0 for cli in forced), "\n".join(map(str, forced))
    runs = wait_ran(cluster, MANUAL_RACE, 3)
    rows = rows_of(cluster.claims(), MANUAL_RACE, MANUAL_KIND)
    flags = cluster.manual_headers()
    assert len(runs) == 3 and len({r.task_id for r in runs}) == 3, runs
    assert {c.task_id for c in rows} == {r.task_id for r in runs}, [row_text(c) for c in rows]
    assert all(c.state == PUBLISHED and c.run_state == SUCCEEDED for c in rows), \
        [row_text(c) for c in rows]
    assert all(flags.get(r.task_id) == 1 for r in runs), flags
    triggered = {a["task_id"] for a in cluster.audit()
                 if a["job_name"] == MANUAL_RACE and a["action"] == "trigger"}
    assert {r.task_id for r in runs} <= triggered, cluster.audit()


# -- bad input -----------------------------------------------------------------------


def test_bad_input_is_refused_and_changes_nothing(cluster: ControlCluster) -> None:
    cluster.stop_beats()
    before = (cluster.claims(), cluster.pauses(), cluster.audit(), cluster.runs())
    past = iso(utc(time.time() - 3600))
    unknown, unknown_pause, not_a_time, in_the_past = cluster.cli(
        ["trigger", "nosuchjob"], ["pause", "nosuchjob"],
        ["pause", PAUSED_JOB, "--until", "not-a-time"], ["pause", STEADY_JOB, "--until", past])
    problems = []
    for cli in (unknown, unknown_pause, not_a_time, in_the_past):
        if cli.rc in (0, None) or "Traceback" in cli.output:
            problems.append(f"expected a clean refusal: {cli}")
    for cli in (unknown, unknown_pause):
        missing = [job for job in ["nosuchjob", *beat_schedule()] if job not in cli.output]
        if missing:
            problems.append(f"the message does not name {missing}: {cli}")
    for cli in (not_a_time, in_the_past):
        if "--until" not in cli.output:
            problems.append(f"the message does not name --until: {cli}")
    if "not-a-time" not in not_a_time.output:
        problems.append(f"the message does not name the value: {not_a_time}")
    time.sleep(1.0)  # a run sent by mistake has time to land
    after = (cluster.claims(), cluster.pauses(), cluster.audit(), cluster.runs())
    for name, old, new in zip(("claims", "pauses", "audit", "runs"), before, after,
                              strict=True):
        if old != new:
            problems.append(f"{name} changed: {old} -> {new}")
    assert not problems, "\n".join(problems)


# -- pause, resume, expiry -----------------------------------------------------------


def test_pause_resume_and_expiry_across_the_cluster(cluster: ControlCluster) -> None:
    cluster.launch_beats(NODES)
    up = max(cluster.wait_started(NODES).values())

    def sent_by_every_node(after: float) -> bool:
        nodes = {r.node for r in runs_of(cluster, EVERY_NODE_JOB)
                 if r.started_at.timestamp() > after}
        return set(NODES) <= nodes

    def published_slots(after: float) -> list[ClaimRow]:
        return [c for c in ran_once(rows_of(cluster.claims(), PAUSED_JOB),
                                    runs_of(cluster, PAUSED_JOB))
                if c.occurrence.timestamp() > after]

    # it runs before it is paused: the job, and the every-node entry on each node
    cluster.wait_for("runs of every entry", lambda: published_slots(up)
                     and sent_by_every_node(up), START_TIMEOUT)

    pauses = cluster.cli_ok(["pause", PAUSED_JOB, "--reason", REASON],
                            ["pause", EVERY_NODE_JOB, "--reason", REASON])
    paused_at = max(cli.returned for cli in pauses)
    paused_rows = {p["job_name"]: p for p in cluster.pauses()}
    (trigger,) = cluster.cli_ok(["trigger", PAUSED_JOB, "--reason", TRIGGER_REASON])
    sleep_until(paused_at + HOLD)
    resumes = cluster.cli_ok(["resume", PAUSED_JOB], ["resume", EVERY_NODE_JOB])
    resume_started = min(cli.started for cli in resumes)
    resumed_at = max(cli.returned for cli in resumes)
    not_paused = cluster.pauses()

    # the runs come back: two slots of the job, and the every-node entry on each node
    cluster.wait_for("the runs to come back after resume",
                     lambda: len(published_slots(resumed_at)) >= 2
                     and sent_by_every_node(resumed_at))
    (expiring,) = cluster.cli_ok(["pause", PAUSED_JOB, "--for", f"{EXPIRES:g}s",
                                  "--reason", EXPIRY_REASON])
    pause_row = {p["job_name"]: p for p in cluster.pauses()}.get(PAUSED_JOB, {})
    until = pause_row.get("until_utc")
    assert until is not None, f"pause --for left no until: {cluster.pauses()}"
    until_ts = until.timestamp()
    # ... and ends by itself: a slot after it runs, without a resume
    cluster.wait_for("a run after the pause expired",
                     lambda: published_slots(until_ts), EXPIRES + 15.0)
    sleep_until(time.time() + SLOT)
    end_mark = cluster.stop_beats()
    (audit_cli,) = cluster.cli_ok(["audit", "--json"])
    time.sleep(1.0)  # the last runs land

    claims, runs, flags = cluster.claims(), cluster.runs(), cluster.manual_headers()
    manual_runs = [r for r in runs if flags.get(r.task_id) == 1]
    scheduled = [r for r in runs if flags.get(r.task_id) != 1]
    slot_runs = [r for r in scheduled if r.entry in (PAUSED_JOB, STEADY_JOB)]
    a = Analysis([c for c in claims if c.kind == "slot"], slot_runs)  # type: ignore[arg-type]
    check_executions(a)  # each scheduled run came with its claim's headers, once
    strict: list[str] = []  # what only the one-slot slack excuses

    # -- the paused job -------------------------------------------------------------------
    rows = rows_of(claims, PAUSED_JOB)
    if set(paused_rows) != {PAUSED_JOB, EVERY_NODE_JOB} or not_paused:
        a.fail(f"pauses table after pause: {paused_rows}; after resume: {not_paused}")
    windows = {"paused": (paused_at, resume_started),
               "expiring": (expiring.returned, until_ts)}
    for label, (start, end) in windows.items():
        held = between(rows, start + SLACK, end)
        sent = [row_text(c) for c in held if c.state != SKIPPED or c.publish_error != PAUSED]
        if sent:
            a.fail(f"{label}: slots of {PAUSED_JOB} more than one slot after the pause "
                   f"returned ({utc(start).time()}) not stored skipped/paused: {sent}")
        if len(held) < (2 if label == "paused" else 1):
            a.fail(f"{label}: only {len(held)} slots skipped while paused: "
                   f"{[row_text(c) for c in between(rows, start, end)]}")
        early = [row_text(c) for c in between(rows, start, start + SLACK)
                 if c.state != SKIPPED]
        if early:
            strict.append(f"{label}: sent after the pause returned: {early}")
        a.counts[f"{label}_skipped"] = len(held)
    # after resume, and once the pause --for expired: once per slot
    back = [s for s in grid(resumed_at + 0.01, expiring.started - SLOT, 2)]
    after_expiry = [s for s in grid(until_ts + 0.01, end_mark - SLOT, 2)]
    expect_exactly_once(a, PAUSED_JOB, back, "resumed")
    expect_exactly_once(a, PAUSED_JOB, after_expiry, "expired")
    late = [row_text(c) for c in between(rows, until_ts, until_ts + SLACK)
            if c.state != PUBLISHED]
    if late:
        a.fail(f"the first slot after the pause expired ({until}) did not run: {late}")
    wrong = [row_text(c) for c in rows if c.state == SKIPPED and c.publish_error != PAUSED]
    if wrong:
        a.fail(f"skipped for another reason than the pause: {wrong}")
    if not [c for c in rows if c.state == PUBLISHED and c.occurrence.timestamp() < paused_at]:
        a.fail(f"{PAUSED_JOB} never ran before it was paused")

    # -- a trigger of the paused job runs anyway -----------------------------------------
    manual = [r for r in manual_runs if r.entry == PAUSED_JOB]
    manual_rows = rows_of(claims, PAUSED_JOB, MANUAL_KIND)
    if len(manual) != 1 or len(manual_rows) != 1:
        a.fail(f"the trigger while paused: {len(manual)} runs, {len(manual_rows)} rows")
    else:
        wrong = manual_row_problems(manual_rows[0], manual[0], trigger, cluster.hostname("w1"))
        if wrong:
            a.fail(f"the trigger while paused: {wrong}")
    odd = [(r.entry, r.task_id, flags.get(r.task_id)) for r in scheduled
           if flags.get(r.task_id) != 0]
    if odd:
        a.fail(f"scheduled runs without elarion_manual=0: {odd}")

    # -- the job never paused: once per slot, throughout ---------------------------------
    expect_exactly_once(a, STEADY_JOB, grid(up + SLOT, end_mark - SLOT, 2), "steady")
    skipped_steady = [row_text(c) for c in rows_of(claims, STEADY_JOB) if c.state != PUBLISHED]
    if skipped_steady:
        a.fail(f"{STEADY_JOB} was never paused: {skipped_steady}")

    # -- the every-node entry: no node sends it while paused -----------------------------
    # (its messages name no occurrence: when each beat sent it, and when it ran)
    every = [r for r in runs if r.entry == EVERY_NODE_JOB]
    start, end = paused_at, resume_started
    for node in NODES:
        beat = cluster.beats[node]
        sent = [record_time(r) for r in beat.records(action="dispatched", job=EVERY_NODE_JOB)]
        held_sends = [utc(t).time() for t in sent if start + SLACK < t < end]
        if held_sends:
            a.fail(f"{node} sent {EVERY_NODE_JOB} while it was paused, at {held_sends}")
        if [t for t in sent if start < t <= start + SLACK]:
            strict.append(f"{node} sent {EVERY_NODE_JOB} within a slot of the pause")
        ran = [r.started_at.timestamp() for r in every if r.node == node]
        held_runs = [utc(t).time() for t in ran if start + SLACK + DELIVERY < t < end]
        if held_runs:
            a.fail(f"runs of {EVERY_NODE_JOB} from {node} while it was paused: {held_runs}")
        if not [t for t in sent if t > resumed_at]:
            a.fail(f"{node}: no {EVERY_NODE_JOB} sent after resume")
        a.counts[f"{node}_every_node_sent"] = len(sent)
        # every beat logs its skips: of the claimed job and of its every-node entry
        for job in (PAUSED_JOB, EVERY_NODE_JOB):
            skips = beat.records(action="skipped", reason=PAUSED, job=job)
            a.counts[f"{node}_{job}_paused_skips"] = len(skips)
            if not skips:
                a.fail(f"{node} logged no {PAUSED!r} skip of {job}")

    # -- the audit log ---------------------------------------------------------------------
    entries = json_lines(audit_cli.output)
    actions = audit_of(entries, PAUSED_JOB)
    expected = [("pause", REASON, None), ("trigger", TRIGGER_REASON, manual[0].task_id
                                          if manual else None),
                ("resume", "", None), ("pause", EXPIRY_REASON, None)]
    got = [(e["action"], e["reason"], e["task_id"]) for e in actions]
    if got != expected:
        a.fail(f"audit of {PAUSED_JOB}: {got}, expected {expected}")
    if [(e["action"], e["reason"]) for e in audit_of(entries, EVERY_NODE_JOB)] != [
            ("pause", REASON), ("resume", "")]:
        a.fail(f"audit of {EVERY_NODE_JOB}: {audit_of(entries, EVERY_NODE_JOB)}")
    actors = {e["actor"] for e in entries}
    if actors != {cli_actor()}:
        a.fail(f"audit actors {actors}, expected {cli_actor()!r}")
    last_until = actions[-1]["until"] if actions else None
    if last_until is None or abs(parse_at(last_until).timestamp() - until_ts) > 0.01:
        a.fail(f"audit of pause --for: until {last_until}, the pause said {until}")
    commands = [*pauses, trigger, *resumes, expiring]
    for entry, cli in zip([e for e in entries if e["job"] == PAUSED_JOB][::-1],
                          [c for c in commands if PAUSED_JOB in c.args], strict=False):
        at = parse_at(entry["at"]).timestamp()
        if not cli.started - 1.0 <= at <= cli.returned + 1.0:
            a.fail(f"audit {entry} is not within its command's run "
                   f"({utc(cli.started).time()}..{utc(cli.returned).time()})")

    a.notes += [f"strict (no slack) findings: {strict or 'none'}",
                f"paused {utc(paused_at).time()} resumed {utc(resumed_at).time()} "
                f"pause --for returned {utc(expiring.returned).time()} until {until.time()} "
                f"first run after it {published_slots(until_ts)[0].occurrence.time()}",
                f"commands took {[round(c.returned - c.started, 2) for c in commands]}s"]
    text = report(a, f"beats up {utc(up).time()}, stop {utc(end_mark).time()}")
    summary(cluster.pm.workdir, "pause / resume / expiry on three beats", text)
    assert not a.problems, f"{text}\n{cluster.tails()}"

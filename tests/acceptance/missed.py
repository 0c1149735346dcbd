"""Harness of the "never lose a slot" acceptance tests: :class:`~.cluster.Cluster` on
the app :mod:`tests.acceptance.proj_missed`.

The same cluster (one worker, beats ``node-1`` .. ``node-N``, everything named after
one run id and removed by :meth:`~.cluster.Cluster.close`), except that its beats
can be stopped and started again (a new process per start: ``beat-node-1.2.log``
is the second life of node-1), with another scheduler class or environment, and
that they log JSON lines (``ELARION_BEAT_LOG_FORMAT=json``): the tests read what a
beat did from its records' fields (``action``, ``job``, ``ts``), never from text.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from celery_elarion_beat.observe.logformat import record_time
from celery_elarion_beat.schedules.slots import slot_task_id
from celery_elarion_beat.testing._harness import ChildProcess, ProcessManager
from tests.acceptance import proj_missed
from tests.acceptance.cluster import (
    START_TIMEOUT,
    Analysis,
    Cluster,
    header_problems,
    iso,
    unclaimed_run,
)

APP = "tests.acceptance.proj_missed"
PAUSING_SCHEDULER = "celery_elarion_beat.testing.hooks.PausingScheduler"


@dataclass(frozen=True)
class Run:
    """One execution, as the task recorded it (the elarion headers it came with)."""

    entry: str | None
    job: str | None
    occurrence: str | None
    node: str | None
    placement: str | None
    claim: str | None
    task_id: str
    worker: str | None
    catch_up: int | None
    takeover: int | None
    executed_at: datetime


class MissedCluster(Cluster):
    """A :class:`Cluster` of :mod:`tests.acceptance.proj_missed` whose beats restart.

    *schedule* picks the entries (``ELARION_ACC_SCHEDULE``); *env* is added to every
    process's environment.
    """

    def __init__(self, workdir: Path, *, pg_dsn: str, broker_url: str, schedule: str,
                 beats: int = 3, env: Mapping[str, str] | None = None) -> None:
        super().__init__(workdir, pg_dsn=pg_dsn, broker_url=broker_url, beats=beats)
        self.env.update({"ELARION_ACC_SCHEDULE": schedule, "ELARION_BEAT_LOG_FORMAT": "json",
                         **(env or {})})
        self.pm = ProcessManager(workdir, APP, self.env)
        self.lives: dict[str, int] = {}

    #: the app module of the processes (its RUNS_TABLE_DDL and make_app)
    proj: Any = proj_missed

    def prepare(self) -> None:
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL(self.proj.RUNS_TABLE_DDL).format(
                table=sql.Identifier(self.runs_table)))
        self._tables_made = True
        app = self.proj.make_app(self.env, main=f"elarion-acc-probe-{self.run_id}")
        with app.connection_for_write() as conn:
            app.amqp.TaskConsumer(conn).purge()  # declares the queue, then empties it
        app.close()

    # -- processes -----------------------------------------------------------

    def start_worker(self) -> ChildProcess:
        self.worker = self.pm.worker(f"acc-worker-{self.run_id}")
        self.worker.wait_for_log(r"\bready\.", START_TIMEOUT)
        return self.worker

    def launch_beats(self, nodes: Iterable[str] | None = None,
                     scheduler: str = "celery_elarion_beat.ClaimingScheduler",
                     env: Mapping[str, str] | None = None) -> float:
        """Start a beat for each of *nodes* (default: node-1 .. node-N) at once, without
        waiting; the instant just before the first one was started."""
        names = list(nodes) if nodes is not None else [
            f"node-{i}" for i in range(1, self.n_beats + 1)]
        launched = time.time()
        for node in names:
            life = self.lives[node] = self.lives.get(node, 0) + 1
            self.beats[node] = self.pm.beat(f"beat-{node}.{life}", scheduler=scheduler,
                                            env={"ELARION_ACC_NODE": node, **(env or {})})
        return launched

    def wait_started(self, nodes: Iterable[str] | None = None) -> dict[str, float]:
        """Wait until each beat has set up its schedule and store; node -> when (its
        ``started`` record; the ledger is read right after it)."""
        started = {}
        for node in nodes if nodes is not None else list(self.beats):
            record = self.beats[node].wait_for_record({"action": "started"}, START_TIMEOUT)
            started[node] = record_time(record)
        return started

    def records(self, **match: Any) -> list[dict[str, Any]]:
        """The JSON records of every beat (all lives) whose fields equal *match*."""
        out = []
        for process in self.pm.processes:
            if process.name.startswith("beat-"):
                out += [{**r, "process": process.name} for r in process.records(**match)]
        return out

    def status(self) -> dict[str, Any]:
        """``celery elarion-beat status --json``, parsed (fails with its output if not JSON)."""
        probe = self.pm.celery(f"status-{len(self.pm.processes)}",
                               ["elarion-beat", "status", "--json"])
        rc = probe.wait(START_TIMEOUT)
        output = probe.log()
        start = output.find("{\n")
        try:
            parsed, _ = json.JSONDecoder().raw_decode(output[max(start, 0):])
        except ValueError as exc:
            raise AssertionError(f"status --json (rc {rc}) printed no JSON ({exc}):\n"
                                 f"{output[-3000:]}") from None
        assert isinstance(parsed, dict), output[-3000:]
        return parsed

    # -- data ----------------------------------------------------------------

    def runs(self) -> list[Run]:  # type: ignore[override]
        query = sql.SQL("SELECT entry, job, occurrence, node, placement, claim, task_id, worker, "
                        "catch_up, takeover, executed_at FROM {} ORDER BY id").format(
            sql.Identifier(self.runs_table))
        with psycopg.connect(self.pg_dsn, autocommit=True, connect_timeout=10) as conn:
            return [Run(*row) for row in conn.execute(query)]


# -- analysis ----------------------------------------------------------------


def check_runs(a: Analysis) -> None:
    """What holds in every scenario: each run was sent for the claim it names (headers,
    holder, takeover count), slot claims carry uuid5(job, slot), and no task id and
    no slot ran twice."""
    claim_by_task = {c.task_id: c for c in a.claims}
    for run in a.runs:
        claim = claim_by_task.get(run.task_id)
        if claim is None:
            a.fail(unclaimed_run(run))
            continue
        wrong = header_problems(run, claim)
        if run.takeover != claim.takeovers:
            wrong.append(f"elarion_takeover={run.takeover!r} (claim taken over "
                         f"{claim.takeovers} times)")
        if run.catch_up not in (0, 1):
            wrong.append(f"elarion_catch_up={run.catch_up!r}")
        if wrong:
            a.fail(f"run {run.task_id} of {run.entry}: wrong headers: {', '.join(wrong)}")
    seen = Counter(run.task_id for run in a.runs)
    twice = {task: n for task, n in seen.items() if n > 1}
    if twice:
        a.fail("task ids executed more than once: " + ", ".join(
            f"{task} x{n} {[(r.entry, r.occurrence, r.node, f'catch_up={r.catch_up}') for r in a.runs if r.task_id == task]}"  # noqa: E501
            for task, n in twice.items()))
    slots = Counter((run.entry, run.occurrence) for run in a.runs if run.claim == "slot")
    double = {key: n for key, n in slots.items() if n > 1}
    if double:
        a.fail(f"slots executed more than once: {double}")
    a.counts["duplicates"] = len(twice) + len(double)
    for claim in a.claims:
        if claim.kind == "slot" and claim.task_id != slot_task_id(claim.job, claim.occurrence):
            a.fail(f"{claim.job} slot {iso(claim.occurrence)}: task id {claim.task_id} is not "
                   "uuid5(job, slot)")
    a.counts.update(claims=len(a.claims), runs=len(a.runs))


def check_settled(a: Analysis, before: float, excused: Iterable[str] = ()) -> None:
    """Every claim made before *before* (except *excused* task ids) ran, and its row
    says published."""
    skip = set(excused)
    ran = {run.task_id for run in a.runs}
    settled = [c for c in a.claims if c.claimed_at.timestamp() < before and c.task_id not in skip]
    unrun = [c for c in settled if c.task_id not in ran]
    if unrun:
        a.fail("claims never executed: " + ", ".join(
            f"{c.job}@{iso(c.occurrence)} by {c.node} ({c.state})" for c in unrun))
    unconfirmed = [c for c in settled if c.state != "published"]
    if unconfirmed:
        a.fail("claims not marked published: " + ", ".join(
            f"{c.job}@{iso(c.occurrence)} by {c.node}: {c.state} {c.publish_error or ''}"
            for c in unconfirmed))
    a.counts["unexecuted_claims"] = len(unrun)
    a.counts["unconfirmed_claims"] = len(unconfirmed)

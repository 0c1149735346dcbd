"""The documented least-privilege roles run the whole acceptance scenario, not only the SQL.

docs/howto/database-role.md grants three PostgreSQL roles (beat, the workers, the
operators). tests/docs/test_database_role.py runs those grants and drives a store
with them in-process; here the same SQL blocks (the page's, as written, with this
run's role and table names) are granted, and then real processes run as the roles:

* three ``celery beat`` nodes as the beat role (``elarion_beat_create_table = False``,
  as the page says): cron, interval, minutely and every-node entries, heartbeats
  every second, the cluster-wide purge every 5 s (old claims back-dated by the owner
  must go);
* a worker as the workers' role with ``install_worker``: it records every run on its
  claim row, and inserts the rows of every-node runs;
* ``elarion-beat pause``, ``resume``, ``trigger``, ``status``, ``claims`` and ``audit``
  as the operators' role, on a live job;
* a one-off scheduled (``schedule_once``) as the workers' role once the beats run: the
  beats lease and publish it as their role, and it runs once; a finished one-off
  back-dated by the owner is purged by the beat role.

The acceptance properties must hold (:func:`tests.acceptance.cluster.analyse`: each
cron slot ran exactly once, windows apart, headers right, every claim ran), the
paused slots are stored skipped (``paused``) and never run, the run by hand runs once,
the worker's run columns are filled in, and no process logs a permission error. What
the roles may not do is shown too: the beat role's ``init-db`` is refused (the page
says to run it as the owner).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from celery_elarion_beat import ClaimRequest, Settings, open_store, schedule_once, slot_task_id
from celery_elarion_beat.one_offs.api import close_stores
from celery_elarion_beat.testing._harness import ChildProcess, ProcessManager, sleep_until
from tests.acceptance import cluster as acc
from tests.acceptance.cluster import (
    CRON_JOB,
    INTERVAL_JOB,
    MINUTE_JOB,
    START_TIMEOUT,
    Cluster,
    analyse,
    even_ceil,
    expect_exactly_once,
    grid,
    iso,
    next_minute,
    report,
    summary,
)
from tests.docs.test_database_role import operator_role, rename, sql_blocks, worker_role
from tests.fault.proj_least_privilege import (
    CONTROL_JOB,
    EVERY_NODE_JOB,
    TASK,
    node_queue_template,
)
from tests.flower.support import delete_broker_keys

pytestmark = [pytest.mark.postgres]
# real beats and workers under a role of their own; its GRANTs on the public schema must not race
# the other grant tests (tuple concurrently updated)
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("pg-grants")]

APP = "tests.fault.proj_least_privilege"
PASSWORD = "change-me"  # the page's; PostgreSQL's trust authentication ignores it
CLUSTER_JOBS = (CRON_JOB, INTERVAL_JOB, MINUTE_JOB)
#: back-dated claims of a job no longer scheduled: the purge deletes all but the newest
OLD_JOB = "lp-retired"
OLD_SLOTS = [datetime(2026, 1, 1, h, tzinfo=timezone.utc) for h in range(4)]
#: the ``entry`` of the one-off the workers' role schedules
ONE_OFF_ENTRY = "lp-one-off"
PERMISSION = re.compile(r"permission denied|InsufficientPrivilege|must be owner", re.I)
#: how long the cluster runs after it is ready (the control steps happen within it)
RUN_SECONDS = 26.0
#: launch the cluster between these many seconds before a minute boundary (it is ready
#: some 5 to 60 s later, by the machine's load; the run lasts past the boundary)
LEAD = (20.0, 32.0)


class RolesProcessManager(ProcessManager):
    """Starts the cluster's worker with the workers' role and every node queue."""

    def __init__(self, workdir: Path, env: Mapping[str, str], worker_env: Mapping[str, str],
                 queues: Iterable[str]) -> None:
        super().__init__(workdir, APP, env)
        self.worker_env = dict(worker_env)
        self.queues = ",".join(queues)

    def worker(self, name: str, *args: str, env: Mapping[str, str] | None = None,
               loglevel: str = "INFO") -> ChildProcess:
        return super().worker(name, "-Q", self.queues, *args,
                              env={**self.worker_env, **(env or {})}, loglevel=loglevel)


def role_dsn(pg_dsn: str, role: str) -> str:
    return make_url(pg_dsn).set(username=role, password=PASSWORD).render_as_string(
        hide_password=False)


def grant_documented_roles(admin: Engine, beat_role: str, names: Settings) -> None:
    """Run the page's PostgreSQL blocks with this run's role and table names."""
    tables = {"elarion_scheduler_claims": names.table,
              "elarion_scheduler_nodes": names.nodes_table,
              "elarion_scheduler_pauses": names.pauses_table,
              "elarion_scheduler_audit": names.audit_table,  # and its _id_seq
              "elarion_scheduler_oneoffs": names.one_offs_table,
              "elarion_scheduler_foreign_beats": names.foreign_beats_table}
    with admin.connect() as conn:
        for statement in sql_blocks("PostgreSQL"):
            for documented, ours in tables.items():
                statement = statement.replace(documented, ours)
            conn.execute(text(rename(statement, beat_role)))


def drop_roles(admin: Engine, *roles: str) -> None:
    with admin.connect() as conn:
        for role in roles:
            if conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"),
                            {"r": role}).scalar():
                conn.execute(text(f'DROP OWNED BY "{role}"'))
                conn.execute(text(f'DROP ROLE "{role}"'))


def back_date_old_claims(pg_dsn: str, names: Settings) -> None:
    """As the owner: claims of :data:`OLD_JOB` made two days ago (past the retention)."""
    store = open_store(Settings.from_mapping({"elarion_beat_dsn": pg_dsn,
                                              "elarion_beat_table": names.table}))
    try:
        store.claim("owner", [ClaimRequest.for_slot(OLD_JOB, slot, slot_task_id(OLD_JOB, slot))
                              for slot in OLD_SLOTS])
    finally:
        store.close()
    admin = create_engine(make_url(pg_dsn).set(drivername="postgresql+psycopg"))
    try:
        with admin.begin() as conn:
            conn.execute(text(f'UPDATE "{names.table}" SET claimed_at = now() - '
                              "interval '2 days' WHERE job_name = :j"), {"j": OLD_JOB})
    finally:
        admin.dispose()


def schedule_one_off(dsn: str, names: Settings, entry: str, key: str) -> str:
    """``schedule_once`` of the cluster's task, due now, as the role of *dsn*; its id."""
    app = Celery("lp-one-offs", set_as_current=False)
    app.conf.update(elarion_beat_dsn=dsn, elarion_beat_table=names.table,
                    elarion_beat_create_table=False)
    try:
        return schedule_once(app, TASK, kwargs={"entry": entry}, key=key).id
    finally:
        close_stores()


def back_date_finished_one_off(pg_dsn: str, names: Settings) -> str:
    """As the owner: a one-off published two days ago (past the retention); its id."""
    one_off = schedule_one_off(pg_dsn, names, OLD_JOB, f"old-{uuid.uuid4().hex}")
    admin = create_engine(make_url(pg_dsn).set(drivername="postgresql+psycopg"))
    try:
        with admin.begin() as conn:
            conn.execute(text(f'UPDATE "{names.one_offs_table}" SET state = \'published\', '
                              "published_at = now() - interval '2 days', "
                              "finished_at = now() - interval '2 days' WHERE id = :i"),
                         {"i": one_off})
    finally:
        admin.dispose()
    return one_off


def one_off_rows(pg_dsn: str, names: Settings) -> dict[str, tuple[str, str | None, int]]:
    """id -> (state, lease node, attempts) of every one-off, as the owner reads them."""
    admin = create_engine(make_url(pg_dsn).set(drivername="postgresql+psycopg"))
    try:
        with admin.connect() as conn:
            return {row[0]: (row[1], row[2], row[3]) for row in conn.execute(text(
                f'SELECT id, state, lease_node, attempts FROM "{names.one_offs_table}"'))}
    finally:
        admin.dispose()


def nodes_seen(pg_dsn: str, names: Settings) -> set[str]:
    admin = create_engine(make_url(pg_dsn).set(drivername="postgresql+psycopg"))
    try:
        with admin.connect() as conn:
            return {row[0] for row in conn.execute(text(
                f'SELECT node FROM "{names.nodes_table}"'))}
    finally:
        admin.dispose()


def run_states(pg_dsn: str, names: Settings) -> dict[str, tuple[str, str, str, str | None]]:
    """task id -> (job, node, kind, run_state) of every claim row, as the owner reads them
    (:func:`read_claims` leaves the run columns out)."""
    admin = create_engine(make_url(pg_dsn).set(drivername="postgresql+psycopg"))
    try:
        with admin.connect() as conn:
            return {row[0]: tuple(row[1:]) for row in conn.execute(text(
                f'SELECT task_id, job_name, node, kind, run_state FROM "{names.table}"'))}
    finally:
        admin.dispose()


def operate(cluster: Cluster, env: Mapping[str, str], name: str, *args: str) -> ChildProcess:
    """``elarion-beat <args>`` as the operators' role, run to its end."""
    process = cluster.pm.celery(f"cli-{name}", ["elarion-beat", *args], env=env)
    assert process.wait(START_TIMEOUT) is not None, f"{name} did not finish\n{process.tail()}"
    return process


def operate_all(cluster: Cluster, env: Mapping[str, str],
                commands: Mapping[str, list[str]]) -> list[ChildProcess]:
    """Several ``elarion-beat`` commands as the operators' role, at once."""
    started = [cluster.pm.celery(f"cli-{name}", ["elarion-beat", *args], env=env)
               for name, args in commands.items()]
    for process in started:
        assert process.wait(START_TIMEOUT) is not None, f"{process.name} did not finish\n" \
            + process.tail()
    return started


def permission_errors(processes: Iterable[ChildProcess]) -> list[str]:
    return [f"{p.name}: {line.strip()[:300]}" for p in processes
            for line in p.log().splitlines() if PERMISSION.search(line)]


def test_the_documented_roles_run_the_whole_scenario(tmp_path: Path, pg_dsn: str,
                                                      redis_url: str) -> None:
    tag = uuid.uuid4().hex[:10]
    beat_role = f"elarion_beat_{tag}"
    roles = (beat_role, worker_role(beat_role), operator_role(beat_role))
    cluster = Cluster(tmp_path, pg_dsn=pg_dsn, broker_url=redis_url,
                      claims_dsn=role_dsn(pg_dsn, beat_role))
    nodes = [f"node-{i}" for i in range(1, cluster.n_beats + 1)]
    queues = [cluster.queue] + [node_queue_template(cluster.env).format(node=n) for n in nodes]
    cluster.pm = RolesProcessManager(
        tmp_path, cluster.env, {"ELARION_ACC_CLAIMS_DSN": role_dsn(pg_dsn, roles[1])}, queues)
    operator = {"ELARION_ACC_CLAIMS_DSN": role_dsn(pg_dsn, roles[2]),
                "ELARION_ACC_NODE": "operator"}
    names = Settings.from_mapping({"elarion_beat_table": cluster.claims_table})
    admin = create_engine(make_url(pg_dsn).set(drivername="postgresql+psycopg"),
                          isolation_level="AUTOCOMMIT")
    try:
        # the owner creates the tables (init-db), then grants exactly what the page says
        owner = open_store(Settings.from_mapping({"elarion_beat_dsn": pg_dsn,
                                                  "elarion_beat_table": names.table}))
        owner.create_schema()  # type: ignore[attr-defined]
        owner.close()
        grant_documented_roles(admin, beat_role, names)
        back_date_old_claims(pg_dsn, names)
        old_one_off = back_date_finished_one_off(pg_dsn, names)
        # what the beat role may not do: create a table (the page: init-db as the owner)
        refused_init = operate(cluster, {"ELARION_ACC_CLAIMS_TABLE": f"{names.table}_new"},
                               "init-db-as-beat", "init-db")
        existing_init = operate(cluster, {}, "init-db-as-beat-existing", "init-db")

        # launch so that a minute boundary (the minutely entry) falls inside the run
        boundary = next_minute(time.time() + LEAD[0])
        sleep_until(boundary - LEAD[1])
        ready = cluster.start()
        if boundary < ready + 4:  # a very slow start: the next minute
            boundary += 60
        # a one-off, scheduled as the workers' role: the beats send it as theirs
        one_off = schedule_one_off(role_dsn(pg_dsn, roles[1]), names, ONE_OFF_ENTRY,
                                   f"lp-{tag}")
        # live control on CONTROL_JOB, as the operators' role
        paused = operate(cluster, operator, "pause", "pause", CONTROL_JOB, "--for", "10m",
                         "--reason", "least privilege")
        paused_at = time.time()
        sleep_until(paused_at + 7)
        resuming_at = time.time()
        resumed = operate(cluster, operator, "resume", "resume", CONTROL_JOB)
        resumed_at = time.time()
        triggered = operate(cluster, operator, "trigger", "trigger", CONTROL_JOB, "--reason",
                            "by hand", "--json")
        sleep_until(max(ready + RUN_SECONDS, resumed_at + 8, boundary + 3))
        status, audit, claims_cli = operate_all(cluster, operator, {
            "status": ["status", "--json", "--fail-on", "none"], "audit": ["audit", "--json"],
            "claims": ["claims", "--job", CONTROL_JOB]})
        seen_nodes = nodes_seen(pg_dsn, names)
        stop_mark = cluster.stop_beats()
        # never to run: the back-dated claims, the slots skipped while paused
        excused = [c.task_id for c in cluster.claims()
                   if c.job == OLD_JOB or c.state == "skipped"]
        cluster.drain(stop_mark - 1.0, excused)
        cluster.stop_worker()
        claims, runs = cluster.claims(), cluster.runs()
        recorded = run_states(pg_dsn, names)

        a = analyse([c for c in claims if c.job in CLUSTER_JOBS],
                    [r for r in runs if r.entry in CLUSTER_JOBS], stop_mark=stop_mark)
        warm_end = even_ceil(ready + 2)
        expect_exactly_once(a, CRON_JOB, grid(warm_end, stop_mark - 2, 2), "cron")
        expect_exactly_once(a, MINUTE_JOB, grid(warm_end, stop_mark - 2, 60), "minute")
        if a.counts["minute_expected"] < 1:
            a.fail(f"the minute boundary {iso(acc.utc(boundary))} fell outside the run")
        if a.counts["interval_claims"] < 5:
            a.fail(f"only {a.counts['interval_claims']} interval windows were claimed")

        # the worker (its role) recorded each run on its claim row
        unrecorded = [f"{r.entry}@{r.occurrence}" for r in runs
                      if r.entry not in (EVERY_NODE_JOB, ONE_OFF_ENTRY)
                      and recorded.get(r.task_id, ("",) * 4)[3] != "succeeded"]
        if unrecorded:
            a.fail(f"runs the worker did not record as succeeded: {unrecorded[:10]}")
        a.counts["runs_recorded"] = len(runs) - len(unrecorded)

        check_every_node(a, recorded, runs, nodes, warm_end, stop_mark)
        check_one_offs(a, runs, one_off_rows(pg_dsn, names), one_off, old_one_off, nodes)
        check_control(a, claims, runs, paused_at, resuming_at, resumed_at, stop_mark)
        check_purge_and_heartbeats(a, claims, cluster, seen_nodes, nodes)

        # the operators' commands worked, as their role
        for process in (paused, resumed, triggered, audit, claims_cli):
            if process.returncode != 0:
                a.fail(f"{process.name} exited {process.returncode}: {process.tail(5)}")
        actions = [json.loads(line)["action"] for line in audit.log().splitlines()
                   if line.startswith("{")]
        if sorted(actions) != ["pause", "resume", "trigger"]:
            a.fail(f"audit as the operators' role shows {actions}")
        shown = json.loads(status.log()[status.log().index("{"):])
        if status.returncode != 0 or {n["node"] for n in shown["nodes"]} != set(nodes):
            a.fail(f"status as the operators' role: exit {status.returncode}, nodes "
                   f"{[n.get('node') for n in shown.get('nodes', [])]}")

        # nothing was refused to a role that may do it; the beat role may not init-db
        refused = permission_errors(p for p in cluster.pm.processes if p is not refused_init)
        if refused:
            a.fail("permission errors:\n  " + "\n  ".join(refused[:10]))
        a.counts["permission_errors"] = len(refused)
        if refused_init.returncode == 0 or not PERMISSION.search(refused_init.log()):
            a.fail(f"init-db of a new table as the beat role was not refused: "
                   f"{refused_init.tail(5)}")
        if existing_init.returncode != 0:
            a.fail(f"init-db as the beat role, tables made: {existing_init.tail(5)}")
        text_ = report(a, f"ready {iso(acc.utc(ready))}, paused {acc.utc(paused_at).time()}, "
                       f"resumed {acc.utc(resumed_at).time()}, stop {acc.utc(stop_mark).time()}"
                       "\ninit-db of a new table as the beat role: "
                       + " ".join(refused_init.log().split()[:40]))
        summary(tmp_path, "least privilege", text_)
        assert not a.problems, f"{text_}\n{cluster.tails()}"
    finally:
        try:
            cluster.close()
        finally:
            delete_broker_keys(redis_url, cluster.run_id)
            drop_roles(admin, *roles)
            admin.dispose()


def check_every_node(a: acc.Analysis, recorded: Mapping[str, tuple[str, str, str, str | None]],
                     runs: list[Any], nodes: list[str], warm_end: float,
                     stop_mark: float) -> None:
    """Each node ran the every-node entry every 2 s (an every-node run has no claim, so
    no occurrence header: counted and spaced by execution time); the worker (its role)
    inserted a row of kind ``node`` for each run."""
    mine = [r for r in runs if r.entry == EVERY_NODE_JOB]
    slots = len(grid(warm_end, stop_mark - 2, 2))
    for node in nodes:
        ran = sorted(r.executed_at.timestamp() for r in mine if r.node == node
                     and warm_end <= r.executed_at.timestamp() <= stop_mark - 2)
        gaps = [b - p for p, b in zip(ran, ran[1:])]
        # one slot more or less at each end: the window is cut at arbitrary instants
        if not slots - 1 <= len(ran) <= slots + 1 or (gaps and min(gaps) < 1.0):
            a.fail(f"{EVERY_NODE_JOB} on {node}: {len(ran)} runs for {slots} slots, "
                   f"shortest gap {min(gaps, default=0):.2f}s")
    rows = [recorded.get(r.task_id) for r in mine]
    unrecorded = [r for r in rows if r is None or r[2] != "node" or r[3] != "succeeded"]
    if unrecorded or {r[1] for r in rows if r} != set(nodes):
        a.fail(f"every-node runs the worker did not record: {unrecorded[:5]}")
    a.counts["every_node_runs"] = len(mine)


def check_one_offs(a: acc.Analysis, runs: list[Any],
                   rows: Mapping[str, tuple[str, str | None, int]], one_off: str,
                   old_one_off: str, nodes: list[str]) -> None:
    """The one-off the workers' role scheduled ran once, under its id, published by a
    beat (its role leased and finished it); the back-dated finished one was purged."""
    ran = [r for r in runs if r.entry == ONE_OFF_ENTRY]
    if [r.task_id for r in ran] != [one_off]:
        a.fail(f"the one-off {one_off} ran as {[r.task_id for r in ran]}")
    state = rows.get(one_off)
    if state is None or state[0] != "published" or state[1] not in nodes or state[2] != 1:
        a.fail(f"the one-off {one_off} as the owner reads it: {state}")
    if old_one_off in rows:
        a.fail(f"the finished one-off back-dated two days was not purged: {rows[old_one_off]}")
    a.counts["one_off_runs"] = len(ran)


def check_control(a: acc.Analysis, claims: list[Any], runs: list[Any], paused_at: float,
                  resuming_at: float, resumed_at: float, stop_mark: float) -> None:
    """While paused, every slot of the job is stored skipped (paused) and never runs;
    after the resume each slot runs once; the run by hand runs once."""
    ran: dict[str, int] = {}
    for r in runs:
        if r.entry == CONTROL_JOB:
            ran[r.task_id] = ran.get(r.task_id, 0) + 1
    slots = [c for c in claims if c.job == CONTROL_JOB and c.kind == "slot"]
    # written before paused_at; the resume, after resuming_at (less a second: a claim
    # may come a little after its slot)
    during = [c for c in slots if paused_at <= c.occurrence.timestamp() <= resuming_at - 1]
    after = [c for c in slots if resumed_at + 2 <= c.occurrence.timestamp() <= stop_mark - 2]
    if len(during) < 2 or any((c.state, c.publish_error) != ("skipped", "paused")
                              or c.task_id in ran for c in during):
        shown = [(iso(c.occurrence), c.state, c.publish_error) for c in during]
        a.fail(f"paused slots: {shown}")
    if len(after) < 3 or any(ran.get(c.task_id) != 1 for c in after):
        shown = [(iso(c.occurrence), ran.get(c.task_id)) for c in after]
        a.fail(f"slots after the resume: {shown}")
    manual = [c for c in claims if c.job == CONTROL_JOB and c.kind == "manual"]
    if len(manual) != 1 or ran.get(manual[0].task_id) != 1 or manual[0].state != "published":
        a.fail(f"the run by hand: {manual} ran {[ran.get(c.task_id) for c in manual]}")
    a.counts.update(paused_slots=len(during), slots_after_resume=len(after),
                    manual_runs=len(manual))


def check_purge_and_heartbeats(a: acc.Analysis, claims: list[Any], cluster: Cluster,
                               seen: set[str], nodes: list[str]) -> None:
    old = sorted(c.occurrence for c in claims if c.job == OLD_JOB)
    if old != [OLD_SLOTS[-1]]:
        a.fail(f"the purge (as the beat role) left {OLD_JOB} claims {[iso(o) for o in old]}; "
               "expected only the newest")
    purged = [line for b in cluster.beats.values()
              for line in b.lines(f"beat: purged {len(OLD_SLOTS) - 1} claims")]
    if not purged:
        a.fail("no beat logged the purge of the back-dated claims")
    if seen != set(nodes):
        a.fail(f"heartbeat rows (as the beat role): {sorted(seen)}")

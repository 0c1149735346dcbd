"""The claim store through PgBouncer in transaction pooling mode (``elarion_beat_pgbouncer``).

A real ``pgbouncer`` (Debian's package; .ci/run installs it) listens on a free
port in front of the test PostgreSQL with ``pool_mode = transaction`` and four
server connections per database, so the clients' transactions really do share
server connections. In CI a missing binary fails the module; elsewhere it skips.

Without the setting PgBouncer refuses the connection (the ``options`` startup
parameter that carries the timeouts); with the timeouts moved out of the way but
server-side prepares left on, concurrent claims fail once psycopg prepares
(after 5 executions): "prepared statement "_pg3_0" does not exist / already
exists". The claims race here for more than 5 rounds, so prepares would kick in.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import tempfile
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from celery.schedules import crontab

from celery_elarion_beat import (
    ClaimingScheduler,
    ClaimRequest,
    Outcome,
    Settings,
    StoreError,
    open_store,
)
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.store.records import NodeState, PublishReport, RunReport
from celery_elarion_beat.testing._harness import ChildProcess, read_claims
from tests.helpers.fakes import FakeClock, published
from tests.helpers.ports import free_port
from tests.integration.test_scheduler_postgres import pg_app
from tests.operate import proj_ops
from tests.operate.support import invoke

THREADS = 8
ROUNDS = 8  # > psycopg's prepare_threshold (5): a prepared statement would be reused
SLOTS = 40
WINDOWS = 4
WINDOW = timedelta(hours=1)  # every round's window claims fall in round 0's window
BASE = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)


def _binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None)



def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def pgbouncer_dsn(pg_dsn: str) -> Iterator[str]:
    """A DSN through a PgBouncer in transaction mode in front of the test database."""
    binary = _binary()
    if binary is None:
        message = "pgbouncer is not installed (apt-get install pgbouncer; .ci/run does)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    target = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    user = str(target.get("user") or "postgres")
    workdir = Path(tempfile.mkdtemp(prefix="elarion-pgbouncer-"))
    port = free_port()
    (workdir / "users.txt").write_text(f'"{user}" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={target.get('host') or '127.0.0.1'} port={target.get('port') or 5432}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 4\nmin_pool_size = 0\n"
        "reserve_pool_size = 0\nmax_client_conn = 500\n"
        "server_reset_query =\nignore_startup_parameters = extra_float_digits\n")
    argv = [binary]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root: drop to the database's user
        owner = next((u for u in ("postgres", "nobody") if _has_user(u)), "nobody")
        workdir.chmod(0o755)
        for child in workdir.iterdir():
            child.chmod(0o644)
        argv += ["-u", owner]
    process = ChildProcess("pgbouncer", [*argv, str(workdir / "pgbouncer.ini")],
                           dict(os.environ), workdir / "pgbouncer.log", workdir).start()
    try:
        process.wait_ready(lambda: _answers(port), 30, f"listening on 127.0.0.1:{port}")
        dbname = target.get("dbname") or "test"
        yield f"postgresql://{user}@127.0.0.1:{port}/{dbname}"
    finally:
        process.terminate(10)
        shutil.rmtree(workdir, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _store(dsn: str, table: str, node: str, **extra: Any) -> PostgresClaimStore:
    return PostgresClaimStore(Settings.from_mapping({
        "elarion_beat_dsn": dsn, "elarion_beat_table": table, "elarion_beat_node": node,
        "elarion_beat_pgbouncer": True, **extra}))


@pytest.fixture
def stores(pgbouncer_dsn: str, table_name: str) -> Iterator[list[PostgresClaimStore]]:
    """One store (its own pool) per racing node, all through PgBouncer."""
    made = [_store(pgbouncer_dsn, table_name, f"node-{i}") for i in range(THREADS)]
    made[0].ensure_schema()
    yield made
    for store in made:
        store.close()


def _race(count: int, work: Any) -> list[BaseException]:
    """Run ``work(i)`` in *count* threads released together; the errors they raised."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return errors


def test_without_the_setting_pgbouncer_refuses_the_connection(pgbouncer_dsn: str,
                                                              table_name: str) -> None:
    """Why the setting exists: the timeouts in the startup packet are refused."""
    store = _store(pgbouncer_dsn, table_name, "node-a", elarion_beat_pgbouncer=False)
    try:
        with pytest.raises(StoreError, match="unsupported startup parameter"):
            store.ensure_schema()
    finally:
        store.close()


def test_slots_and_windows_are_won_once_by_racing_nodes_round_after_round(
        stores: list[PostgresClaimStore], pg_dsn: str, table_name: str) -> None:
    wins: dict[tuple[str, int], list[str]] = defaultdict(list)
    window_wins: dict[tuple[str, int], list[str]] = defaultdict(list)
    lock = threading.Lock()

    for round_ in range(ROUNDS):
        slot = BASE + timedelta(minutes=round_)

        def claim(i: int, slot: datetime = slot, round_: int = round_) -> None:
            store = stores[i]
            requests = [ClaimRequest.for_slot(f"slot-{k:02}", slot, f"{round_}-{k}-{i}")
                        for k in range(SLOTS)]
            requests += [ClaimRequest.for_window(f"win-{k}", WINDOW, f"w{round_}-{k}-{i}")
                         for k in range(WINDOWS)]
            results = store.claim(f"node-{i}", requests)
            # the winners' publish marks ride along with the next round's claim
            store.defer_report([PublishReport(r.request.job, r.occurrence, r.token)
                                for r in results if r.won and r.occurrence and r.token])
            with lock:
                for r in results:
                    if r.won:
                        table = wins if r.request.kind.value == "slot" else window_wins
                        table[(r.request.job, round_)].append(f"node-{i}")

        errors = _race(THREADS, claim)
        assert not errors, f"round {round_}: {errors[0]!r}"

    for store in stores:
        store.flush_reports()
    for round_ in range(ROUNDS):
        for k in range(SLOTS):
            assert len(wins[(f"slot-{k:02}", round_)]) == 1, (round_, k, wins[(f"slot-{k:02}",
                                                                             round_)])
    # one window each: won once, in the first round, by one node; lost ever after
    assert sorted(window_wins) == [(f"win-{k}", 0) for k in range(WINDOWS)], window_wins
    assert all(len(won) == 1 for won in window_wins.values()), window_wins
    rows = read_claims(pg_dsn, table_name)
    assert len([r for r in rows if r.kind == "slot"]) == ROUNDS * SLOTS
    assert {r.state for r in rows} == {"published"}  # every mark landed
    assert sum(1 for r in rows if r.kind == "window") == sum(map(len, window_wins.values()))


def test_heartbeat_purge_pause_and_resume_work_through_it(
        stores: list[PostgresClaimStore], pg_dsn: str, table_name: str) -> None:
    def beat(i: int) -> None:
        for n in range(ROUNDS):
            state = NodeState(node=f"node-{i}", boot_id=f"boot-{i}", version="t",
                              fingerprint="f", entries={"slot-00": "crontab"},
                              counts={("slot-00", "dispatched", ""): n})
            now, nodes = stores[i].heartbeat(state, retention=timedelta(hours=1),
                                             live_within=timedelta(minutes=5))
            assert any(node.node == f"node-{i}" for node in nodes)
            stores[i].pause(f"job-{i}", "tester", reason=f"round {n}")
            assert stores[i].resume(f"job-{i}", "tester") is not None

    errors = _race(THREADS, beat)
    assert not errors, repr(errors[0])
    _, nodes = stores[0].nodes()
    assert sorted(n.node for n in nodes) == [f"node-{i}" for i in range(THREADS)]
    assert len(stores[0].audit(limit=1000)) == THREADS * ROUNDS * 2

    # a pause seen by a claim through PgBouncer: skipped, then won after the resume
    stores[1].pause("job-x", "tester")
    paused = stores[2].claim("node-2", [ClaimRequest.for_slot("job-x", BASE, "t-1")])
    assert not paused[0].won and paused[0].pause is not None
    stores[3].resume("job-x", "tester")
    won = stores[2].claim("node-2", [ClaimRequest.for_slot(
        "job-x", BASE + timedelta(minutes=1), "t-2")])
    assert won[0].won

    # the purge keeps each job's newest claim, however many times it runs
    for minute in range(ROUNDS):
        stores[minute % THREADS].claim("node-0", [ClaimRequest.for_slot(
            f"old-{k}", BASE + timedelta(minutes=minute), f"o{minute}-{k}") for k in range(3)])
    deleted = [stores[i].purge(timedelta(0), batch_size=2) for i in range(ROUNDS)]
    assert sum(deleted) == 3 * (ROUNDS - 1) + 1  # job-x's older (skipped) claim too
    left = {r.job for r in read_claims(pg_dsn, table_name)}
    assert left == {"job-x", "old-0", "old-1", "old-2"}


def test_the_claim_timeout_holds_per_transaction_and_never_leaks(
        pgbouncer_dsn: str, pg_dsn: str, table_name: str) -> None:
    """SET LOCAL in every transaction: a claim stuck behind a lock gives up after
    elarion_beat_claim_timeout, JIT is off, and no other client of PgBouncer inherits
    either."""
    with psycopg.connect(pg_dsn, autocommit=True) as direct:
        row = direct.execute("SHOW jit").fetchone()
        assert row is not None
        default_jit = row[0]
    store = _store(pgbouncer_dsn, table_name, "node-a", elarion_beat_claim_timeout=1)
    store.ensure_schema()
    try:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "1s"
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "1s"
            # unprepared, a chunk's plan would pass jit_above_cost: compiled at every claim
            assert conn.exec_driver_sql("SHOW jit").scalar() == "off"
        for _ in range(ROUNDS):  # the other server connections carry nothing over
            with psycopg.connect(pgbouncer_dsn, autocommit=True) as other:
                row = other.execute("SELECT current_setting('statement_timeout'), "
                                    "current_setting('jit')").fetchone()
                assert row == ("0", default_jit)
        holder = psycopg.connect(pg_dsn)  # directly: holds the slot's row uncommitted
        release = threading.Timer(30, holder.rollback)  # without a timeout, no hang forever
        try:
            holder.execute(f'INSERT INTO "{table_name}" (cluster, job_name, occurrence_utc, '
                           "node, task_id, kind, claimed_at) VALUES (%s, 'stuck', %s, 'other', "
                           "'x', 'slot', now())", (store.cluster, BASE))
            release.start()
            with pytest.raises(StoreError, match="lock timeout|statement timeout"):
                store.claim("node-a", [ClaimRequest.for_slot("stuck", BASE, "t-1")])
        finally:
            release.cancel()
            holder.rollback()
            holder.close()
    finally:
        store.close()


def test_worker_run_tracking_writes_through_it(pgbouncer_dsn: str, table_name: str,
                                               stores: list[PostgresClaimStore]) -> None:
    """The worker opens its store from the app's settings (as RunTracker does) and
    records each run's start and finish, from racing worker threads."""
    claimed = {}
    for round_ in range(ROUNDS):
        results = stores[0].claim("node-0", [ClaimRequest.for_slot(
            f"run-{k}", BASE + timedelta(minutes=round_), f"r{round_}-{k}")
            for k in range(THREADS)])
        claimed.update({(r.request.job, round_): r for r in results})
    app = pg_app(pgbouncer_dsn, table_name, "worker-host", {}, elarion_beat_pgbouncer=True)
    # the workers of the app whose beat claimed: its cluster
    workers = [open_store(Settings.from_app(app, environ={
        "ELARION_BEAT_CLUSTER": stores[0].cluster})) for _ in range(THREADS)]

    def track(i: int) -> None:
        for round_ in range(ROUNDS):
            r = claimed[(f"run-{i}", round_)]
            assert r.occurrence is not None
            for event in (RunReport.STARTED, "succeeded"):
                workers[i].record_runs([RunReport(
                    r.request.job, r.occurrence, r.request.task_id, event, f"w{i}@host",
                    runtime=0.1 if event != RunReport.STARTED else None)])

    try:
        errors = _race(THREADS, track)
    finally:
        for worker in workers:
            worker.close()
    assert not errors, repr(errors[0])
    rows = [r for r in stores[0].find_claims(limit=1000) if r.job.startswith("run-")]
    assert len(rows) == THREADS * ROUNDS
    assert {r.run_state for r in rows} == {"succeeded"}
    assert {r.state for r in rows} == {"published"}


def test_two_beats_tick_through_it_and_send_each_slot_once(pgbouncer_dsn: str,
                                                           table_name: str) -> None:
    clock = FakeClock(BASE - timedelta(seconds=1))
    entries = {f"job-{k}": {"task": "tasks.job", "schedule": crontab(nowfun=clock)}
               for k in range(20)}
    apps = [pg_app(pgbouncer_dsn, table_name, f"node-{i}", entries,
                   elarion_beat_pgbouncer=True) for i in range(2)]
    beats = [ClaimingScheduler(app, clock=clock) for app in apps]
    try:
        for _ in range(ROUNDS):
            clock.advance(60)
            for beat in beats:
                beat.tick()
        sent = Counter(m["headers"]["id"] for app in apps for m in published(app))
        assert len(sent) == 20 * ROUNDS and set(sent.values()) == {1}
        assert sum(b.recorder.total(Outcome.DISPATCHED) for b in beats) == 20 * ROUNDS
    finally:
        for beat in beats:
            beat.close()


def test_the_cli_works_through_it(pgbouncer_dsn: str, table_name: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``celery elarion-beat`` with the setting from the environment (ELARION_BEAT_PGBOUNCER)."""
    monkeypatch.setenv("ELARION_BEAT_PGBOUNCER", "true")
    conf = {k: proj_ops.app.conf.get(k) for k in ("elarion_beat_dsn", "elarion_beat_table")}
    proj_ops.app.conf.update(elarion_beat_dsn=pgbouncer_dsn, elarion_beat_table=table_name)
    try:
        for args, expect in ((["init-db"], "ready:"), (["pause", "report"], "report"),
                             (["status"], "report"), (["resume", "report"], "report"),
                             (["claims"], ""), (["purge", "--older-than", "1d"], "deleted"),
                             (["audit"], "pause")):
            for _ in range(2 if args == ["status"] else 1):
                code, out = invoke(*args)
                assert code == 0 and expect in out, (args, out)
    finally:
        proj_ops.app.conf.update(conf)

"""The run half of the contract, on every backend: the workers' records of a run
(started, finished, outcome, runtime) land on the claim row, an every-node run gets a
row of its own, and ``overlap: skip`` is decided inside the claim, once for everyone."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import inspect

from celery_elarion_beat import ClaimRequest, SchemaMissing, Settings, open_store
from celery_elarion_beat.config.overlap import OverlapRule
from celery_elarion_beat.store import PublishReport
from celery_elarion_beat.store.interface import ClaimStore
from celery_elarion_beat.store.records import RunReport, SchemaStep
from tests.contract.conftest import SLOT

HOUR = timedelta(hours=1)
SKIP = OverlapRule(timeout=HOUR, pending=timedelta(seconds=30))
NEXT = SLOT + timedelta(seconds=1)


def _row(store, job: str = "report", occurrence=SLOT):
    (row,) = [r for r in store.find_claims(job=job) if r.occurrence == occurrence]
    return row


def _claim(store, node: str = "node-a", slot=SLOT, job: str = "report",
           overlap: OverlapRule | None = None):
    request = ClaimRequest.for_slot(job, slot, str(uuid.uuid4()), overlap=overlap)
    (result,) = store.claim(node, [request])
    return result


def _run(result, event: str, job: str = "report", **fields) -> RunReport:
    return RunReport(job, result.occurrence, result.request.task_id, event,
                     fields.pop("worker", "celery@w1"), **fields)


def test_a_run_goes_published_started_succeeded_on_its_claim_row(make_store) -> None:
    store = make_store()
    won = _claim(store)
    store.report([PublishReport("report", SLOT, won.token)])
    store.record_runs([_run(won, "started")])
    row = _row(store)
    assert (row.state, row.run_state, row.worker) == ("published", "running", "celery@w1")
    assert row.started_at is not None and row.finished_at is None
    store.record_runs([_run(won, "succeeded", runtime=2.5)])
    row = _row(store)
    assert (row.run_state, row.runtime, row.run_error) == ("succeeded", 2.5, None)
    assert row.finished_at is not None and row.finished_at >= row.started_at


def test_a_failed_run_keeps_its_exception(make_store) -> None:
    store = make_store()
    won = _claim(store)
    store.record_runs([_run(won, "started"),
                       _run(won, "failed", runtime=0.1, error="ZeroDivisionError: division")])
    row = _row(store)
    assert row.run_state == "failed" and row.run_error == "ZeroDivisionError: division"


def test_a_start_before_the_publish_report_marks_the_claim_published(make_store) -> None:
    # the claimer's report rides along with its next claim: the worker may be first
    store = make_store()
    won = _claim(store)
    store.record_runs([_run(won, "started")])
    row = _row(store)
    assert row.state == "published" and row.published_at is not None
    store.report([PublishReport("report", SLOT, won.token)])  # late, harmless
    assert _row(store).state == "published"


def test_the_age_of_a_record_dates_the_transition_back(make_store) -> None:
    store = make_store()
    won = _claim(store)
    before = store.clock()
    store.record_runs([_run(won, "started", age=60.0)])
    started = _row(store).started_at
    assert before - timedelta(seconds=62) <= started <= before - timedelta(seconds=58)


def test_a_record_under_another_task_id_changes_nothing(make_store) -> None:
    store = make_store()
    _claim(store)
    store.record_runs([RunReport("report", SLOT, "another-task", "started", "w")])
    assert _row(store).run_state is None


def test_a_window_claim_is_found_from_its_occurrence_to_the_second(make_store) -> None:
    store = make_store()
    request = ClaimRequest.for_window("poll", timedelta(seconds=60), str(uuid.uuid4()))
    (won,) = store.claim("node-a", [request])
    # the header names the occurrence to the second; the row's has microseconds
    header = won.occurrence.replace(microsecond=0)
    store.record_runs([RunReport("poll", header, request.task_id, "started", "w")])
    assert _row(store, "poll", won.occurrence).run_state == "running"


def test_every_node_runs_get_a_row_per_run(make_store) -> None:
    store = make_store()
    at = SLOT.replace(microsecond=123456)
    reports = [RunReport("cache", at, f"task-{node}", "started", f"celery@{node}", node=node,
                         every_node=True) for node in ("a", "b")]
    store.record_runs(reports)
    store.record_runs([RunReport("cache", at, "task-a", "succeeded", "celery@a", runtime=0.2,
                                 node="a", every_node=True)])
    rows = {r.node: r for r in store.find_claims(job="cache")}
    # a collision of two nodes' start times keeps one row: never an error
    assert set(rows) <= {"a", "b"} and rows
    for row in rows.values():
        assert row.kind == "node" and row.state == "published"
    if "a" in rows:
        assert rows["a"].run_state == "succeeded" and rows["a"].runtime == 0.2


def test_every_node_runs_at_different_times_each_keep_a_row(make_store) -> None:
    store = make_store()
    store.record_runs([
        RunReport("cache", SLOT.replace(microsecond=1000 * i), f"t{i}", "started", f"w{i}",
                  node=f"n{i}", every_node=True) for i in range(3)])
    rows = store.find_claims(job="cache")
    assert sorted(r.node for r in rows) == ["n0", "n1", "n2"]
    assert {r.run_state for r in rows} == {"running"}
    # every-node rows are runs, never orphans
    _, unpublished = store.unpublished(HOUR)
    assert not [r for r in unpublished if r.job == "cache"]


# -- overlap ---------------------------------------------------------------------------------


def test_overlap_skip_holds_back_the_next_slot_while_the_run_is_unfinished(make_store) -> None:
    store = make_store()
    won = _claim(store, overlap=SKIP)
    store.report([PublishReport("report", SLOT, won.token)])
    store.record_runs([_run(won, "started")])
    blocked = _claim(store, "node-b", NEXT, overlap=SKIP)
    assert not blocked.won and blocked.still_running and blocked.blocker == SLOT
    # the decision is stored: every other node reads the same answer
    again = _claim(make_store(), "node-c", NEXT, overlap=SKIP)
    assert not again.won and again.still_running and again.winner == "node-b"
    assert _row(store, occurrence=NEXT).state == "skipped"
    store.record_runs([_run(won, "succeeded", runtime=1.0)])
    after = _claim(store, "node-b", NEXT + timedelta(seconds=1), overlap=SKIP)
    assert after.won and not after.still_running


def test_a_run_not_started_yet_also_holds_back_the_next(make_store) -> None:
    store = make_store()
    won = _claim(store, overlap=SKIP)
    store.report([PublishReport("report", SLOT, won.token)])
    assert _claim(store, "node-b", NEXT, overlap=SKIP).still_running
    # a claim still pending (its report not written yet) counts too
    store2 = make_store()
    _claim(store2, job="other", overlap=SKIP)
    assert _claim(store2, "node-b", NEXT, job="other", overlap=SKIP).still_running


def test_allow_never_looks_at_the_previous_run(make_store) -> None:
    store = make_store()
    won = _claim(store)
    store.record_runs([_run(won, "started")])
    assert _claim(store, "node-b", NEXT).won


def test_failed_and_retried_runs(make_store) -> None:
    store = make_store()
    won = _claim(store, overlap=SKIP)
    store.record_runs([_run(won, "started"), _run(won, "retried", runtime=0.1)])
    assert _claim(store, "node-b", NEXT, overlap=SKIP).still_running  # retried: not finished
    store.record_runs([_run(won, "started"), _run(won, "failed", runtime=0.1, error="E: x")])
    assert _claim(store, "node-b", NEXT + timedelta(seconds=1), overlap=SKIP).won


def test_a_run_older_than_the_overlap_timeout_counts_as_dead(make_store) -> None:
    store = make_store()
    won = _claim(store, overlap=SKIP)
    store.record_runs([_run(won, "started")])
    # 2 s: the blocked claim lands within it on a loaded machine
    short = OverlapRule(timeout=timedelta(seconds=2), pending=timedelta(seconds=2))
    assert _claim(store, "node-b", NEXT, overlap=short).still_running
    time.sleep(2.2)
    assert _claim(store, "node-b", NEXT + timedelta(seconds=1), overlap=short).won


def test_a_publish_that_failed_blocks_nothing(make_store) -> None:
    store = make_store()
    won = _claim(store, overlap=SKIP)
    store.report([PublishReport("report", SLOT, won.token, error="broker down")])
    assert _claim(store, "node-b", NEXT, overlap=SKIP).won


def test_overlap_applies_to_windows(make_store) -> None:
    store = make_store()
    first = ClaimRequest.for_window("poll", timedelta(seconds=0.2), "t1", overlap=SKIP)
    (won,) = store.claim("node-a", [first])
    assert won.won
    time.sleep(0.3)
    second = ClaimRequest.for_window("poll", timedelta(seconds=0.2), "t2", overlap=SKIP)
    (blocked,) = store.claim("node-b", [second])
    assert not blocked.won and blocked.still_running
    # the skip holds the window: a third node inside it reads the decision
    third = ClaimRequest.for_window("poll", timedelta(seconds=0.2), "t3", overlap=SKIP)
    (also,) = make_store().claim("node-c", [third])
    assert not also.won and also.still_running


def test_nodes_deciding_at_once_agree(make_store) -> None:
    """Eight connections claim the next slot together while the run is unfinished:
    one stores the skip, and every one of them answers still-running."""
    store = make_store()
    won = _claim(store, overlap=SKIP)
    store.record_runs([_run(won, "started")])
    stores = [make_store() for _ in range(8)]
    barrier = threading.Barrier(len(stores))

    def claim(i: int):
        barrier.wait()
        return _claim(stores[i], f"node-{i}", NEXT, overlap=SKIP)

    with ThreadPoolExecutor(len(stores)) as pool:
        results = list(pool.map(claim, range(len(stores))))
    assert not any(r.won for r in results)
    assert all(r.still_running for r in results), results
    assert len({r.winner for r in results}) == 1


# -- upgrade -----------------------------------------------------------------------------------

_RUN_COLUMNS = ("run_state", "started_at", "finished_at", "worker", "runtime", "run_error")


def _make_old(store: ClaimStore) -> str:
    """Make the store's claims table one of the previous version: no run columns, no
    job index (whose name is returned)."""
    engine = getattr(store, "engine", None)
    if engine is None:
        pytest.skip("the memory store has no table to upgrade")
    table = store.table
    quoted = store._quoted(table)
    index = f"ix_{table.name}_job_claimed"
    with engine.begin() as conn:
        drop = (f"DROP INDEX {index} ON {quoted}" if engine.dialect.name in ("mysql", "mariadb")
                else f"DROP INDEX {index}")
        conn.exec_driver_sql(drop)
        for column in _RUN_COLUMNS:
            conn.exec_driver_sql(f"ALTER TABLE {quoted} DROP COLUMN {column}")
    return index


def test_init_db_tells_each_upgrade_before_it_runs_then_the_store_works(make_store) -> None:
    """``init-db`` shows which upgrade of a big table it is at: ``create_schema`` tells
    each statement first, numbered; afterwards the store runs claims under its claim
    timeout again (the upgrades ran without it)."""
    store = make_store()
    index = _make_old(store)
    steps: list[SchemaStep] = []
    store.create_schema(steps.append)
    assert [(s.number, s.total) for s in steps] == [
        (n, len(_RUN_COLUMNS) + 1) for n in range(1, len(_RUN_COLUMNS) + 2)]
    assert [s.statement.split(" ADD COLUMN ")[-1].split()[0] for s in steps[:-1]] == list(
        _RUN_COLUMNS) and index in steps[-1].statement
    store.create_schema(steps.append)  # up to date: nothing more to tell
    assert len(steps) == len(_RUN_COLUMNS) + 1
    assert _claim(store, overlap=SKIP).won


def test_a_table_made_before_the_ledger_is_upgraded(make_store) -> None:
    """A claims table of the previous version (no run columns, no job index) gets them
    when beat or a worker opens it with elarion_beat_create_table (the default), and a
    strict store names the statements."""
    store = make_store()
    index = _make_old(store)
    engine = store.engine
    table = store.table
    dsn = engine.url.render_as_string(hide_password=False)
    strict = open_store(Settings.from_mapping({
        "elarion_beat_dsn": dsn, "elarion_beat_table": table.name,
        "elarion_beat_create_table": False,
        "elarion_beat_claims_layout": store.settings.claims_layout}))
    try:
        with pytest.raises(SchemaMissing, match="ADD COLUMN run_state.*" + index):
            strict.ensure_schema()
    finally:
        strict.close()
    fresh = make_store()  # ensure_schema with create_table: brings the table up to date
    with engine.connect() as conn:
        names = {c["name"] for c in inspect(conn).get_columns(table.name)}
        indexes = {i["name"] for i in inspect(conn).get_indexes(table.name)}
    assert set(_RUN_COLUMNS) <= names and index in indexes
    won = _claim(fresh, overlap=SKIP)
    fresh.record_runs([_run(won, "started")])
    assert _claim(fresh, "node-b", NEXT, overlap=SKIP).still_running

"""`celery elarion-beat status --since` (the per-entry reconciliation, its exit codes and
--fail-on) and the run columns of `claims`, through the click runner, on the memory
store and on the real PostgreSQL server.

The ledger is written through the store seam as beat and the workers write it
(claim, report, take_over, record_runs); occurrences are chosen in the past, so an
interval entry's rows are written as slot claims at those times. The expected
counts are derived here from the period the command printed, by plain minute
arithmetic (not the package's slot naming)."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner

from celery_elarion_beat import ClaimRequest, slot_task_id
from celery_elarion_beat.config.overlap import OverlapRule
from celery_elarion_beat.schedules.slots import parse_iso
from celery_elarion_beat.store import ClaimStore, MemoryClaimStore, PublishReport
from celery_elarion_beat.store.foreign_records import ForeignSighting
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.store.records import ClaimResult, RunReport
from celery_elarion_beat.testing._harness import drop_tables
from tests.operate import proj_ledger
from tests.operate.support import invoke, settings_for

APP = "tests.operate.proj_ledger"
MINUTE = timedelta(minutes=1)
SKIP = OverlapRule(timeout=timedelta(hours=1), pending=timedelta(seconds=1))
ERROR = "ZeroDivisionError: division by zero " + "x" * 80
COUNTERS = ("expected", "claimed", "published", "succeeded", "failed", "running", "missed",
            "orphaned", "skipped", "duplicates", "manual")


@pytest.fixture(params=[pytest.param("memory", marks=pytest.mark.memory),
                        pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger(request: pytest.FixtureRequest) -> Iterator[ClaimStore]:
    """A store, and the ledger app's CLI pointed at it."""
    store: ClaimStore
    if request.param == "memory":
        name = uuid.uuid4().hex
        store = MemoryClaimStore(name)
        proj_ledger.app.conf.update(elarion_beat_dsn=f"memory://{name}")
    else:
        pg_dsn, table = request.getfixturevalue("pg_dsn"), request.getfixturevalue("table_name")
        store = PostgresClaimStore(settings_for(pg_dsn, table, elarion_beat_publish_timeout=1))
        store.ensure_schema()
        proj_ledger.app.conf.update(elarion_beat_dsn=pg_dsn, elarion_beat_table=table)
    yield store
    store.close()
    if isinstance(store, MemoryClaimStore):
        MemoryClaimStore.reset(store.name)


def status(*args: str) -> tuple[int, dict]:
    code, out = invoke("status", "--json", *args, app=APP)
    assert code in (0, 1), out
    return code, json.loads(out)


def entries(data: dict) -> dict[str, dict]:
    return {e["job"]: e for e in data["reconciliation"]["entries"]}


# -- writing the ledger ----------------------------------------------------------------------


@dataclass
class Minutely:
    """The "minutely" crontab's rows: every minute slot for 200 minutes but two, one
    occurrence skipped (overlap) and a few with a story each."""

    last: datetime
    held: set[datetime] = field(default_factory=set)  # slots with a row (skipped too)
    claims: dict[int, ClaimResult] = field(default_factory=dict)  # minutes back -> claim

    def at(self, k: int) -> datetime:
        return self.last - k * MINUTE

    def run(self, k: int, event: str, worker: str = "celery@w1", **fields: object) -> RunReport:
        won = self.claims[k]
        assert won.occurrence is not None
        return RunReport("minutely", won.occurrence, won.request.task_id, event, worker,
                         **fields)


MISSING = (31, 100)  # never claimed: missed
SKIPPED_K = 30  # claimed with overlap: skip while runs are unfinished
UNREPORTED = (9, 10)  # claim never reported (9: orphaned; 10: taken over, see below)


def write_minutely(store: ClaimStore) -> Minutely:
    m = Minutely(store.clock().replace(second=0, microsecond=0))
    ks = [k for k in range(200) if k not in MISSING and k != SKIPPED_K]
    results = store.claim("node-a", [ClaimRequest.for_slot("minutely", m.at(k),
                                                           slot_task_id("minutely", m.at(k)))
                                     for k in ks])
    assert all(r.won for r in results)
    m.claims = dict(zip(ks, results))
    m.held = {m.at(k) for k in ks} | {m.at(SKIPPED_K)}
    store.report([PublishReport("minutely", r.occurrence, r.token)
                  for k, r in m.claims.items() if k not in UNREPORTED and k != 8])
    store.report([PublishReport("minutely", m.at(8), m.claims[8].token or "",
                                error="broker down")])  # 8: orphaned (publish failed)
    store.record_runs([
        m.run(5, "started"), m.run(5, "succeeded", runtime=1.5),
        m.run(11, "started"), m.run(11, "succeeded", runtime=0.25),
        m.run(6, "started"), m.run(6, "failed", runtime=0.2, error=ERROR),
        m.run(7, "started"),  # running
        m.run(12, "started"), m.run(12, "retried", runtime=0.1),  # running (will retry)
    ])
    time.sleep(1.2)  # elarion_beat_publish_timeout is 1 s: 8, 9 and 10 are orphans now
    (orphan,) = [r for r in store.find_claims(job="minutely", limit=1000)
                 if r.occurrence == m.at(10)]
    (taken,) = store.take_over("node-b", [orphan], timedelta(seconds=1))
    # ... but its first message had reached a worker 30 s ago: published twice
    store.record_runs([RunReport("minutely", m.at(10), taken.row.task_id, "started",
                                 "celery@w2", age=30.0)])
    (skipped,) = store.claim("node-a", [ClaimRequest.for_slot("minutely", m.at(SKIPPED_K),
                                                              "skip-task", overlap=SKIP)])
    assert skipped.still_running and not skipped.won
    return m


POLL_ROWS = (200, 170, 160, 140, 135, 90, 80, 70, 60, 50, 40, 30, 20, 10)  # minutes back


def write_poll(store: ClaimStore, now: datetime) -> None:
    """The 10-minute interval entry: a skipped occurrence at 150, two claims 5 minutes
    apart (140, 135: a duplicate), a 45-minute gap (135 -> 90: three missed runs)."""
    won = store.claim("node-a", [ClaimRequest.for_slot("poll", now - k * MINUTE, f"poll-{k}")
                                 for k in POLL_ROWS])
    store.report([PublishReport("poll", r.occurrence, r.token or "")
                  for r in won])
    (skipped,) = store.claim("node-a", [ClaimRequest.for_slot(
        "poll", now - 150 * MINUTE, "poll-150", overlap=SKIP)])
    assert skipped.still_running
    store.record_runs([RunReport("poll", now - 160 * MINUTE, "poll-160", event, "celery@w1",
                                 runtime=3.0 if event == "succeeded" else None)
                       for event in ("started", "succeeded")])


def write_cache(store: ClaimStore, now: datetime) -> None:
    """Every-node runs: node a 2 succeeded (one more before the period), node b 1 failed
    and 1 running."""
    def report(minutes: int, node: str, event: str, **fields: object) -> RunReport:
        return RunReport("cache", now - minutes * MINUTE, f"cache-{minutes}", event,
                         f"celery@{node}", node=node, every_node=True,
                         **fields)

    store.record_runs([report(k, node, "started") for k, node in
                       ((3, "a"), (5, "a"), (4, "b"), (6, "b"), (200, "a"))])
    store.record_runs([report(3, "a", "succeeded", runtime=0.1),
                       report(5, "a", "succeeded", runtime=0.1),
                       report(4, "b", "failed", runtime=0.1, error="OSError: disk full")])


def minute_marks(start: datetime, end: datetime) -> list[datetime]:
    first = start.replace(second=0, microsecond=0)
    if first < start:
        first += MINUTE
    return [first + k * MINUTE for k in range(int((end - first) / MINUTE) + 1)]


# -- status --since --------------------------------------------------------------------------


def test_status_since_counts_each_entry_and_fails_on_the_findings(ledger: ClaimStore) -> None:
    m = write_minutely(ledger)
    now = ledger.clock()
    write_poll(ledger, now)
    write_cache(ledger, now)
    code, data = status("--since", "3h")
    rec = data["reconciliation"]
    start, end = parse_iso(rec["start"]), parse_iso(rec["end"])
    assert timedelta(hours=3) == end - start and end >= now and not rec["clipped"]
    assert rec["grace"] == 60.0
    got = entries(data)

    # minutely: every minute mark of the period is expected (those less than the grace
    # old only once claimed); a mark without a row is missed
    held_in = {s for s in m.held if start <= s <= end}
    expected = [s for s in minute_marks(start, end) if s <= end - MINUTE or s in m.held]
    missed = sorted((s for s in expected if s not in m.held), reverse=True)
    assert [parse_iso(s) for s in got["minutely"]["missed_at"]] == missed
    assert missed == [m.at(k) for k in MISSING]
    claimed = len(held_in) - 1  # the skipped occurrence is no claim
    assert {k: got["minutely"][k] for k in COUNTERS} == {
        "expected": len(expected), "claimed": claimed, "published": claimed - 2,
        "succeeded": 2, "failed": 1, "running": 3, "missed": 2, "orphaned": 2, "skipped": 1,
        "duplicates": 1, "manual": 0}
    assert got["minutely"]["kind"] == "slots" and not got["minutely"]["capped"]
    (failure,) = got["minutely"]["failures"]
    assert failure["worker"] == "celery@w1" and failure["error"] == ERROR
    assert parse_iso(failure["occurrence"]) == m.at(6)
    assert [parse_iso(o) for o in got["minutely"]["orphaned_at"]] == [m.at(8), m.at(9)]
    assert [parse_iso(d) for d in got["minutely"]["duplicate_at"]] == [m.at(10)]

    # poll (every 10 minutes): expected 180 min / 10; a gap of 45 minutes holds three
    # missed runs; 140 and 135 are 5 minutes apart: a duplicate
    assert {k: got["poll"][k] for k in COUNTERS} == {
        "expected": 18, "claimed": 13, "published": 13, "succeeded": 1, "failed": 0,
        "running": 0, "missed": 3, "orphaned": 0, "skipped": 1, "duplicates": 1,
        "manual": 0}
    assert [parse_iso(d) for d in got["poll"]["duplicate_at"]] == [now - 135 * MINUTE]
    assert [parse_iso(x) for x in got["poll"]["missed_at"]] == [
        now - k * MINUTE for k in (105, 115, 125)]

    # cache (every node): runs only, per node
    assert {k: got["cache"][k] for k in COUNTERS} == {
        "expected": None, "claimed": None, "published": 4, "succeeded": 2, "failed": 1,
        "running": 1, "missed": None, "orphaned": None, "skipped": None, "duplicates": None,
        "manual": 0}
    assert got["cache"]["nodes"] == {
        "a": {"runs": 2, "succeeded": 2, "failed": 0, "running": 0},
        "b": {"runs": 2, "succeeded": 0, "failed": 1, "running": 1}}

    # fresh: never claimed, no node ran it: nothing expected, nothing missed
    assert {k: got["fresh"][k] for k in COUNTERS} == {**dict.fromkeys(COUNTERS, 0)}
    assert rec["totals"] == {k: sum(e[k] or 0 for e in got.values()) for k in COUNTERS}

    assert code == 1 and data["exit_code"] == 1 and not data["healthy"]
    assert data["findings"] == ["missed", "failed", "duplicates", "orphaned"]
    assert data["fail_on"] == sorted(["missed", "failed", "duplicates", "orphaned", "drift",
                                      "behind", "foreign-beat", "node-missing", "shared"])
    assert data["foreign_beats"] == []  # no worker saw a beat that claims nothing

    # the same for a human, pasted into a postmortem
    code, out = invoke("status", "--since", "3h", app=APP)
    assert code == 1, out
    period = re.search(r"^reconciliation (\S+ \S+Z) \.\. (\S+ \S+Z) \(UTC, database clock; "
                       r"3h, grace 1m\)$", out, re.MULTILINE)
    assert period, out
    lines = {line.split()[0]: line.split() for line in out[period.end():].splitlines()
             if line.split() and line.split()[0] in {*got, "total"}}
    for job in (*got, "total"):
        numbers = lines[job][1:len(COUNTERS) + 1]
        want = rec["totals"] if job == "total" else got[job]
        assert numbers == ["-" if want[k] is None else str(want[k]) for k in COUNTERS], out
    assert "every node: a 2 runs, b 2 runs (1 failed)" in out
    assert "interval: expected is nominal" in out
    assert f"MISSED minutely: 2 ({m.at(31):%Y-%m-%d %H:%M:%S}Z; " in out
    assert (f"FAILED minutely: 1 ({m.at(6):%Y-%m-%d %H:%M:%S}Z on celery@w1: "
            "ZeroDivisionError: division by zero x...)") in out
    assert "FAILED cache: 1 (" in out and "on celery@b: OSError: disk full)" in out
    assert "DUPLICATES poll: 1 (" in out and "ORPHANED minutely: 2 (" in out
    assert out.rstrip().endswith("UNHEALTHY: missed, failed, duplicates, orphaned")

    code, out = invoke("status", "--since", "3h", "--fail-on", "none", app=APP)
    assert code == 0 and out.rstrip().endswith(
        "UNHEALTHY: missed, failed, duplicates, orphaned (exit 0: --fail-on none)"), out


def claim_minutes(store: ClaimStore, minutes: range, skip: tuple[int, ...] = (),
                  unpublished: tuple[int, ...] = ()) -> dict[int, ClaimResult]:
    """Claim the "minutely" slots *minutes* back from the latest one, and publish them
    (but *unpublished*)."""
    last = store.clock().replace(second=0, microsecond=0)
    ks = [k for k in minutes if k not in skip]
    won = store.claim("node-a", [ClaimRequest.for_slot(
        "minutely", last - k * MINUTE, slot_task_id("minutely", last - k * MINUTE))
        for k in ks])
    store.report([PublishReport("minutely", r.occurrence, r.token or "")
                  for k, r in zip(ks, won) if k not in unpublished])
    return dict(zip(ks, won))


def only_missed(store: ClaimStore) -> None:
    claim_minutes(store, range(40), skip=(3,))


def only_failed(store: ClaimStore) -> None:
    won = claim_minutes(store, range(40))[2]
    assert won.occurrence is not None
    store.record_runs([RunReport("minutely", won.occurrence, won.request.task_id, event,
                                 "celery@w1", runtime=0.1, error="KeyError: 'x'")
                       for event in ("started", "failed")])


def only_duplicates(store: ClaimStore) -> None:
    now = store.clock()
    won = store.claim("node-a", [ClaimRequest.for_slot("poll", now - k * MINUTE, f"p{k}")
                                 for k in (38, 28, 18, 13, 3)])  # 18 and 13: 5 min apart
    store.report([PublishReport("poll", r.occurrence, r.token or "")
                  for r in won])


def only_orphaned(store: ClaimStore) -> None:
    claim_minutes(store, range(40), unpublished=(0,))
    time.sleep(1.2)  # past elarion_beat_publish_timeout


SCENARIOS = {"missed": only_missed, "failed": only_failed, "duplicates": only_duplicates,
             "orphaned": only_orphaned}


@pytest.mark.parametrize("finding", list(SCENARIOS))
def test_each_finding_fails_status_unless_fail_on_leaves_it_out(ledger: ClaimStore,
                                                               finding: str) -> None:
    SCENARIOS[finding](ledger)
    code, data = status("--since", "30m")
    assert data["findings"] == [finding], data["reconciliation"]["totals"]
    assert data["reconciliation"]["totals"][finding] == 1
    assert code == 1
    assert status("--since", "30m", "--fail-on", finding)[0] == 1
    others = ",".join(f for f in ("missed", "failed", "duplicates", "orphaned", "drift")
                      if f != finding)
    assert status("--since", "30m", "--fail-on", others)[0] == 0
    assert status("--since", "30m", "--fail-on", "none")[0] == 0
    assert status("--since", "30m", "--fail-on", f" {finding.upper()} , drift")[0] == 1


def test_a_beat_that_claims_nothing_fails_status_unless_fail_on_leaves_it_out(
        ledger: ClaimStore) -> None:
    """A worker recorded messages of a stock beat (tests/acceptance/test_foreign_beat.py
    proves that with real processes): ``status`` lists the sender from any machine."""
    claim_minutes(ledger, range(40))
    ledger.record_foreign_beats([
        ForeignSighting("gen4242@web-3", "proj.tasks.report", 3, "minutely", "celery@w1"),
        ForeignSighting("gen4242@web-3", "proj.tasks.poll", 1, None, "celery@w2")])
    code, data = status("--since", "30m")
    assert code == 1 and data["findings"] == ["foreign-beat"] and not data["healthy"], data
    (sender,) = data["foreign_beats"]
    assert (sender["origin"], sender["host"], sender["count"]) == ("gen4242@web-3", "web-3", 4)
    assert {t["task"]: (t["entry"], t["count"]) for t in sender["tasks"]} == {
        "proj.tasks.report": ("minutely", 3), "proj.tasks.poll": (None, 1)}
    assert parse_iso(data["foreign_beats_since"]) < parse_iso(sender["first_seen"])
    assert status("--since", "30m", "--fail-on", "foreign-beat")[0] == 1
    assert status("--since", "30m", "--fail-on", "missed,drift")[0] == 0
    assert status("--fail-on", "foreign-beat")[0] == 1  # without --since: the last day
    code, out = invoke("status", "--since", "30m", app=APP)
    assert code == 1 and "FOREIGN BEATS since " in out, out
    assert ("gen4242@web-3 on web-3: 4 messages, last " in out
            and "proj.tasks.report (minutely) x3" in out), out
    assert out.rstrip().endswith("UNHEALTHY: foreign-beat"), out


@pytest.mark.postgres
def test_status_without_the_foreign_beats_table_says_so_and_reports_the_rest(
        pg_dsn: str, table_name: str) -> None:
    """DDL off, and no migration made the table yet: the other findings stand."""
    owner = PostgresClaimStore(settings_for(pg_dsn, table_name))
    owner.ensure_schema()
    claim_minutes(owner, range(40), skip=(3,))
    drop_tables(pg_dsn, owner.settings.foreign_beats_table)
    owner.close()
    proj_ledger.app.conf.update(elarion_beat_dsn=pg_dsn, elarion_beat_table=table_name,
                                elarion_beat_create_table=False)
    try:
        result = CliRunner().invoke(celery_cli, ["-A", APP, "elarion-beat", "status",
                                                 "--since", "30m", "--json"])
        assert result.exit_code == 1, result.output
        data = json.loads(result.stdout)
        assert data["findings"] == ["missed"] and data["foreign_beats"] is None, data
        assert "foreign_beats_table(metadata)" in data["foreign_beats_error"]
        assert ("warning: beats that claim nothing are not known: the foreign beats table "
                in result.stderr), result.stderr
    finally:
        proj_ledger.app.conf.update(elarion_beat_create_table=True)


def test_a_clean_period_is_healthy(ledger: ClaimStore) -> None:
    won = claim_minutes(ledger, range(40))
    ledger.record_runs([RunReport("minutely", r.occurrence, r.request.task_id, event, "w",
                                  runtime=0.5)
                        for r in won.values() for event in ("started", "succeeded")])
    code, data = status("--since", "30m")
    counts = entries(data)["minutely"]
    assert code == 0 and data["findings"] == [] and data["healthy"], counts
    assert counts["expected"] == counts["claimed"] == counts["published"] \
        == counts["succeeded"] >= 29
    code, out = invoke("status", "--since", "30m", app=APP)
    assert code == 0 and out.rstrip().endswith("healthy"), out


def test_fail_on_and_since_refuse_bad_values(ledger: ClaimStore) -> None:
    code, out = invoke("status", "--since", "1h", "--fail-on", "missed,late", app=APP)
    assert code == 2 and "--fail-on" in out and "'late' is not a finding" in out, out
    assert "missed, failed, duplicates, orphaned, drift" in out and "none" in out
    code, out = invoke("status", "--fail-on", "none,missed", app=APP)
    assert code == 2 and "'none' cannot be combined" in out, out
    code, out = invoke("status", "--since", "yesterday", app=APP)
    assert code == 2 and "--since" in out and "24h" in out, out


def test_the_period_is_clipped_to_the_claim_retention_and_takes_iso_times(
        ledger: ClaimStore) -> None:
    _, data = status("--since", "30d")
    rec = data["reconciliation"]
    assert rec["clipped"] and parse_iso(rec["end"]) - parse_iso(rec["start"]) == timedelta(
        days=7)  # elarion_beat_claim_retention
    since = (ledger.clock() - timedelta(hours=2)).replace(microsecond=0)
    _, data = status("--since", since.strftime("%Y-%m-%dT%H:%M:%SZ"))
    assert parse_iso(data["reconciliation"]["start"]) == since
    assert not data["reconciliation"]["clipped"]
    _, data = status()
    assert "reconciliation" not in data  # only with --since


# -- claims ----------------------------------------------------------------------------------


def test_claims_shows_state_start_runtime_lateness_worker_and_error(ledger: ClaimStore) -> None:
    m = write_minutely(ledger)
    code, out = invoke("claims", "--job", "minutely", "--limit", "13", app=APP)
    assert code == 0, out
    cluster, header, rule, *rows = out.splitlines()
    assert cluster == "cluster: default"
    assert header.split() == ["job", "occurrence", "state", "winner", "task", "id", "kind",
                              "claimed", "at", "started", "runtime", "lateness", "worker",
                              "error"]
    by_occurrence = {line.split()[1]: line for line in rows}

    def row(k: int) -> str:
        return by_occurrence[m.at(k).strftime("%Y-%m-%dT%H:%M:%SZ")]

    assert row(5).split()[2] == "succeeded" and " 1.5s " in row(5) and "celery@w1" in row(5)
    assert row(6).split()[2] == "failed"
    assert row(6).endswith("ZeroDivisionError: division by zero x...")  # shortened
    assert row(7).split()[2] == "running" and row(12).split()[2] == "retried"
    assert row(8).split()[2] == "orphaned" and row(8).endswith("broker down")
    assert row(9).split()[2] == "orphaned"
    assert row(10).split()[2] == "running" and "node-b" in row(10) and "celery@w2" in row(10)
    assert row(0).split()[2] == "published" and re.search(r" \+[\d.dhm]+s ", row(0))

    code, out = invoke("claims", "--job", "minutely", "--limit", "13", "--json", app=APP)
    lines = {parse_iso(r["occurrence"]): r for r in map(json.loads, out.splitlines())}
    failed = lines[m.at(6)]
    assert failed["state"] == "failed" and failed["run_error"] == ERROR
    assert failed["runtime"] == 0.2 and failed["worker"] == "celery@w1"
    assert failed["started_at"] and failed["finished_at"] and failed["published_at"]
    assert failed["lateness"] == pytest.approx(
        (datetime.fromisoformat(failed["published_at"]) - m.at(6)).total_seconds())
    assert lines[m.at(8)]["state"] == "orphaned" and lines[m.at(8)]["publish_error"] == \
        "broker down" and lines[m.at(8)]["lateness"] is None
    taken = lines[m.at(10)]
    assert taken["takeovers"] == 1 and taken["node"] == "node-b"
    assert taken["started_at"] < taken["claimed_at"]
    assert lines[m.at(11)]["state"] == "succeeded" and lines[m.at(11)]["runtime"] == 0.25

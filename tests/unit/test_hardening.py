"""Hardening, in process: injected clock, memory store, kombu's memory broker.

Each test reproduces a path where 0.1 broke the promise (a busy loop, a lazy
scheduler that could not tick, settings the schema refused, an unbounded log
line, status false negatives and false alarms) and pins the fixed behaviour.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import crontab, schedule

from celery_elarion_beat import (
    ClaimingScheduler,
    ClaimRequest,
    ClaimResult,
    ConfigurationError,
    MemoryClaimStore,
    Settings,
)
from celery_elarion_beat.beat.maintenance import Maintenance
from celery_elarion_beat.observe.outcome import Recorder
from celery_elarion_beat.operate.status import build_status
from celery_elarion_beat.store.records import NodeState
from tests.helpers.fakes import FakeClock, make_app, published

BERLIN = ZoneInfo("Europe/Berlin")


class CountingStore(MemoryClaimStore):
    """A real memory store that counts the claim calls made to it."""

    def __init__(self, name: str, clock: FakeClock) -> None:
        super().__init__(name, clock=clock)
        self.calls: list[list[str]] = []

    def claim(self, node: str, requests: Sequence[ClaimRequest]) -> list[ClaimResult]:
        self.calls.append([r.job for r in requests])
        return super().claim(node, requests)


# -- 7: the repeated daylight-saving hour -------------------------------------


def test_a_node_started_in_the_repeated_hour_does_not_busy_loop() -> None:
    """A node starts at 02:10 CET, in the repeated hour, 40 minutes after the first
    02:30 (CEST) of ``crontab(minute=30, hour=2)``. Celery 5.6 and later say "due, next
    in 0 s" on every tick until the repeated hour is over; Celery 5.3-5.5 say "due"
    once, at the second 02:30 (CET). Either way that slot, the first 02:30, is
    claimed once (a handled slot is never claimed again), and beat sleeps."""
    start = datetime(2026, 10, 25, 2, 10, fold=1, tzinfo=BERLIN).astimezone(timezone.utc)
    clock = FakeClock(start)
    app = make_app({"report": {"task": "tasks.report", "schedule": crontab(
        minute=30, hour=2, nowfun=lambda: clock().astimezone(BERLIN))}}, timezone="Europe/Berlin")
    store = CountingStore(uuid.uuid4().hex, clock)
    beat = ClaimingScheduler(app, clock=clock, store=store)
    ticks = 0
    try:
        while clock() < start + timedelta(minutes=40) and ticks < 1000:
            wait = beat.tick()
            ticks += 1
            clock.advance(max(wait, 0.01))
        report_claims = [jobs for jobs in store.calls if "report" in jobs]
        assert len(report_claims) == 1, f"{len(report_claims)} claims of one slot"
        assert [c.occurrence for c in store.find_claims(job="report")] == [
            datetime(2026, 10, 25, 0, 30, tzinfo=timezone.utc)]
        assert ticks <= 90  # one wake-up per heartbeat interval (30 s), not a loop
    finally:
        beat.close()


# -- 16: a lazily built scheduler ---------------------------------------------


def test_a_lazy_scheduler_ticks_on_the_store_from_its_settings() -> None:
    clock = FakeClock(datetime(2026, 11, 29, 2, 59, 59, tzinfo=timezone.utc))
    namespace = uuid.uuid4().hex
    app = make_app({})
    app.conf.elarion_beat_dsn = f"memory://{namespace}"
    beat = ClaimingScheduler(app, lazy=True, clock=clock)
    try:
        beat.add(name="report", task="tasks.report", schedule=crontab(minute="*", nowfun=clock))
        clock.advance(1.5)
        beat.tick()
        assert [m["headers"]["elarion_job"] for m in published(app)] == ["report"]
        assert MemoryClaimStore(namespace).find_claims()[0].job == "report"
    finally:
        beat.close()
        MemoryClaimStore.reset(namespace)


def test_no_events_thread_until_the_first_event() -> None:
    """Beat's banner scheduler (lazy) sends nothing and starts no thread; a running
    node's first event is its first heartbeat (``elarion-heartbeat``), at start."""
    clock = FakeClock(datetime(2026, 11, 29, 2, 59, 30, tzinfo=timezone.utc))
    app = make_app({"report": {"task": "tasks.report", "schedule": crontab(nowfun=clock)}})
    before = set(threading.enumerate())
    banner = ClaimingScheduler(app, lazy=True, clock=clock,
                               store=MemoryClaimStore(uuid.uuid4().hex))
    assert banner.info  # what beat's banner reads
    assert not [t for t in set(threading.enumerate()) - before if t.name == "elarion-events"]
    beat = ClaimingScheduler(app, clock=clock, store=MemoryClaimStore(uuid.uuid4().hex))
    try:
        assert [t for t in threading.enumerate() if t.name == "elarion-events"]
    finally:
        beat.close()


# -- 11, 12: limits the schema enforces, numbers that make sense ---------------


@pytest.mark.parametrize(("key", "value", "named"), [
    ("elarion_beat_node", "n" * 192, "191"),
    ("elarion_beat_table", "t" * 50, "49"),
    ("elarion_beat_nodes_table", "t" * 59, "58"),
    ("elarion_beat_purge_batch", 0.5, "whole number"),
    ("elarion_beat_purge_batch", 0, "between 1"),
    ("elarion_beat_purge_batch", True, "whole number"),
    ("elarion_beat_claim_chunk", "1e9", "between 1 and 100000"),
    ("elarion_beat_claim_chunk", 2.5, "whole number"),
    ("elarion_beat_claim_timeout", "nan", "number of seconds"),
    ("elarion_beat_claim_timeout", float("inf"), "number of seconds"),
    ("elarion_beat_node_timeout", 20, "elarion_beat_heartbeat_interval"),
    ("elarion_beat_node_retention", 60, "elarion_beat_node_timeout"),
])
def test_limits_are_checked_when_the_settings_are_read(key: str, value: object,
                                                       named: str) -> None:
    with pytest.raises(ConfigurationError, match=key) as info:
        Settings.from_mapping({key: value})
    assert named in str(info.value)


def test_the_longest_accepted_names_fit_the_schema() -> None:
    s = Settings.from_mapping({"elarion_beat_node": "n" * 191, "elarion_beat_table": "t" * 49})
    assert len(f"ix_{s.table}_claimed_at") <= 63 and len(f"{s.nodes_table}_pkey") <= 63


# -- 15: the drift WARNING is bounded -----------------------------------------


def test_a_drift_warning_names_a_few_entries_not_ten_thousand(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc))
    store = MemoryClaimStore(uuid.uuid4().hex, clock=clock)
    theirs = {f"job-{i:05}": "other" for i in range(10_000)}
    store.heartbeat(NodeState("node-b", "boot", "0", "fp-b", theirs))
    app = make_app({})
    entries = {f"job-{i:05}": ScheduleEntryLike() for i in range(10_000)}
    settings = Settings.from_mapping({"elarion_beat_node": "node-a"})
    maintenance = Maintenance(settings, store, Recorder(), clock, lambda: entries)
    caplog.set_level(logging.WARNING, logger="celery_elarion_beat")
    maintenance.heartbeat()
    (line,) = [r.getMessage() for r in caplog.records if "schedule drift" in r.getMessage()]
    assert len(line) < 1000 and "and 9990 more" in line
    assert len(maintenance.drift["node-b"]) == 10_000  # status gets the full list
    del app


class ScheduleEntryLike:
    """The three attributes a fingerprint reads."""

    task = "tasks.job"
    schedule = schedule(timedelta(minutes=5))
    options: dict[str, object] = {}
    args: tuple[object, ...] = ()
    kwargs: dict[str, object] = {}


# -- 5, 6, 13: status from the ledger -----------------------------------------


def status_app(namespace: str, **entries: object) -> Celery:
    app = make_app(dict(entries))
    app.conf.elarion_beat_dsn = f"memory://{namespace}"
    return app


def test_status_reports_a_full_cluster_outage_while_down_and_after_return() -> None:
    clock = FakeClock(datetime(2026, 11, 29, 0, 0, 30, tzinfo=timezone.utc))
    namespace = uuid.uuid4().hex
    app = status_app(namespace, hourly={"task": "tasks.hourly",
                                        "schedule": crontab(minute=0, nowfun=clock)})
    beat = ClaimingScheduler(app, clock=clock, store=MemoryClaimStore(namespace, clock=clock))
    store = MemoryClaimStore(namespace, clock=clock)
    settings = Settings.from_app(app)
    try:
        for _ in range(3):  # 01:00, 02:00, 03:00 are claimed, then every node dies
            clock.advance(3600)
            beat.tick()
        assert len(published(app)) == 3
        clock.advance(5 * 3600 + 60)  # 08:01:30, nobody alive since 03:00
        down = build_status(app, settings, store)
        (entry,) = down.entries
        assert not down.healthy and not any(n.alive for n in down.nodes)
        assert entry.missed == datetime(2026, 11, 29, 8, 0, tzinfo=timezone.utc)
        assert entry.missed_count == 5  # 04:00 .. 08:00
        back = ClaimingScheduler(app, clock=clock, store=MemoryClaimStore(namespace, clock=clock))
        try:
            clock.advance(3600)
            back.tick()  # 09:00 is claimed again
            after = build_status(app, settings, store)
            assert not after.healthy and after.entries[0].missed_count == 5
            assert after.entries[0].missed == datetime(2026, 11, 29, 8, 0, tzinfo=timezone.utc)
            recent = build_status(app, settings, store, lookback=timedelta(minutes=30))
            assert recent.healthy  # an operator can narrow the look back
        finally:
            back.close()
    finally:
        beat.close()
        MemoryClaimStore.reset(namespace)


def test_status_is_healthy_for_a_monthly_job_after_the_purge() -> None:
    clock = FakeClock(datetime(2026, 11, 1, 0, 0, 30, tzinfo=timezone.utc))
    namespace = uuid.uuid4().hex
    app = status_app(namespace, monthly={
        "task": "tasks.monthly", "schedule": crontab(minute=0, hour=0, day_of_month=1,
                                                     nowfun=clock)})
    store = MemoryClaimStore(namespace, clock=clock)
    store.claim("node-a", [ClaimRequest.for_slot(
        "monthly", datetime(2026, 11, 1, tzinfo=timezone.utc), "t")])
    clock.advance(20 * 86400)
    assert store.purge(timedelta(days=7)) == 0  # the job's newest claim is kept
    report = build_status(app, Settings.from_app(app), store)
    assert report.healthy, report.as_dict()
    assert report.entries[0].last_occurrence == datetime(2026, 11, 1, tzinfo=timezone.utc)
    MemoryClaimStore.reset(namespace)


def test_skip_counts_survive_a_pipe_in_the_job_name() -> None:
    clock = FakeClock(datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc))
    namespace = uuid.uuid4().hex
    app = status_app(namespace, **{"a|b": {"task": "tasks.x", "schedule": crontab()}})
    store = MemoryClaimStore(namespace, clock=clock)
    store.heartbeat(NodeState("node-a", "boot", "0", "fp", {},
                              {("a|b", "skipped", "claimed-elsewhere"): 4}))
    report = build_status(app, Settings.from_app(app), store)
    assert report.entries[0].skips == {"claimed-elsewhere": 4}
    MemoryClaimStore.reset(namespace)


def test_the_next_slot_is_the_instant_itself_not_a_second_later() -> None:
    from celery_elarion_beat.schedules.slots import next_slot

    clock = FakeClock(datetime(2026, 11, 29, 3, 0, 59, 900_000, tzinfo=timezone.utc))
    every_minute = crontab(minute="*", nowfun=clock)
    slot = datetime(2026, 11, 29, 3, 0, tzinfo=timezone.utc)
    assert next_slot("job", every_minute, slot, clock()) == slot + timedelta(minutes=1)
    fall_back = crontab(minute=30, hour=2)  # the repeated hour of Europe/Berlin, app tz
    fall_back.tz = BERLIN
    first = datetime(2026, 10, 25, 0, 30, tzinfo=timezone.utc)  # 02:30 CEST
    later = datetime(2026, 10, 25, 1, 10, tzinfo=timezone.utc)  # 02:10 CET
    assert next_slot("job", fall_back, first, later) == datetime(
        2026, 10, 26, 1, 30, tzinfo=timezone.utc)  # 02:30 CET the next day

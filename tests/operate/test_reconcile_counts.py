"""The reconciliation's counting rules (celery_elarion_beat.operate.reconcile), on rows built by
hand at fixed times: the grace, the interval gaps, the duplicate definitions, every-node
runs and the caps. No service: pure functions, and the memory store for the caps."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat import ClaimRequest
from celery_elarion_beat.config.entries import schedule_entries
from celery_elarion_beat.operate import reconcile as rec
from celery_elarion_beat.operate.reconcile import count_entry, reconcile
from celery_elarion_beat.store import MemoryClaimStore
from celery_elarion_beat.store.records import ClaimRow

END = datetime(2026, 11, 29, 12, 0, 30, tzinfo=timezone.utc)
MIN = timedelta(minutes=1)
GRACE = timedelta(seconds=60)
TIMEOUT = timedelta(seconds=30)


def row(at: datetime, **fields: object) -> ClaimRow:
    values: dict = {"node": "node-a", "task_id": f"t-{at:%H%M%S%f}", "kind": "slot",
                    "claimed_at": at, "state": "published", "published_at": at}
    values.update(fields)
    return ClaimRow("job", at, **values)


def slots(n: int) -> list[datetime]:
    """The last *n* minute slots up to END, newest first."""
    last = END.replace(second=0)
    return [last - k * MIN for k in range(n)]


def interval(rows: list[ClaimRow], start: datetime, every: timedelta = 10 * MIN,
             tolerance: float = 1.0):
    return count_entry("job", "interval", rows, start=start, end=END, grace=GRACE,
                       publish_timeout=TIMEOUT, every=every, tolerance=tolerance)


def test_an_unclaimed_slot_younger_than_the_grace_is_not_expected_yet() -> None:
    listed = slots(3)  # 12:00, 11:59, 11:58; END is 12:00:30
    count = count_entry("job", "slots", [row(listed[2])], start=END - 5 * MIN, end=END,
                        grace=GRACE, publish_timeout=TIMEOUT, slots=listed)
    assert (count.expected, count.claimed, count.missed) == (2, 1, 1)
    assert count.missed_at == [listed[1]]
    claimed = count_entry("job", "slots", [row(listed[0]), row(listed[2])], start=END - 5 * MIN,
                          end=END, grace=GRACE, publish_timeout=TIMEOUT, slots=listed)
    assert (claimed.expected, claimed.claimed, claimed.missed) == (3, 2, 1)


def test_slots_before_the_entry_was_first_known_are_not_expected() -> None:
    listed = slots(10)
    count = count_entry("job", "slots", [row(s) for s in listed[:4]], start=listed[3],
                        end=END, grace=GRACE, publish_timeout=TIMEOUT, slots=listed)
    assert (count.expected, count.missed) == (4, 0)


def test_interval_runs_that_drift_a_little_miss_nothing() -> None:
    start = END - timedelta(hours=3)
    runs = [start + timedelta(seconds=5) + k * (10 * MIN + timedelta(seconds=2))
            for k in range(18) if start + k * (10 * MIN + timedelta(seconds=2)) < END]
    count = interval([row(at, kind="window") for at in runs], start)
    assert count.expected == 18 and count.claimed == len(runs) == 18
    assert (count.missed, count.duplicates) == (0, 0)
    late = interval([row(at, kind="window") for at in runs[:-1]], start)  # the last is late
    assert late.claimed == 17 and late.missed == 1


def test_an_interval_gap_holds_the_runs_that_did_not_happen() -> None:
    start = END - timedelta(hours=1)
    # 60 min: runs at +0, +10, then nothing until +50 (two runs, 20 and 30 and 40: 3 missed)
    runs = [start, start + 10 * MIN, start + 50 * MIN]
    count = interval([row(at) for at in runs], start)
    assert count.missed == 3
    assert count.missed_at == [start + 40 * MIN, start + 30 * MIN, start + 20 * MIN]
    # a run late by less than an interval is late, not missed (whatever the grace)
    begin = END - 21 * MIN
    for late in (timedelta(seconds=59), timedelta(minutes=9)):
        rows = [row(begin), row(begin + 10 * MIN + late), row(END - timedelta(seconds=1))]
        assert interval(rows, begin).missed == 0
    assert interval([row(begin), row(END - timedelta(seconds=1))], begin).missed == 1
    # the tail counts like the status dead-man check: older than interval + grace
    assert interval([row(END - 11 * MIN)], END - 12 * MIN).missed == 1
    assert interval([row(END - 11 * MIN + timedelta(seconds=1))], END - 12 * MIN).missed == 0
    # from the period's start: at least what was missed (a run just before it assumed)
    assert interval([row(start + 25 * MIN)], start).missed == 1 + 3  # + the tail: 35 min


def test_a_skipped_occurrence_fills_its_gap_but_is_no_run() -> None:
    start = END - 30 * MIN
    rows = [row(start + 2 * MIN), row(start + 12 * MIN, state="skipped",
                                      publish_error="still-running"),
            row(start + 22 * MIN)]
    count = interval(rows, start)
    assert (count.claimed, count.skipped, count.missed, count.duplicates) == (2, 1, 0, 0)


def test_interval_duplicates_are_claims_closer_than_the_claim_window() -> None:
    start = END - timedelta(hours=1)
    first = start + MIN
    # the window is the interval less the tolerance (1 s): 9:59 apart is fine
    ok = interval([row(first), row(first + 10 * MIN - timedelta(seconds=1))], start)
    assert ok.duplicates == 0
    close = interval([row(first), row(first + 10 * MIN - timedelta(seconds=1.5))], start)
    assert close.duplicates == 1 and close.duplicate_at == [
        first + 10 * MIN - timedelta(seconds=1.5)]
    # a skipped occurrence in between is no run
    skipped = interval([row(first), row(first + MIN, state="skipped")], start)
    assert skipped.duplicates == 0


def test_a_takeover_whose_first_message_had_started_is_a_duplicate() -> None:
    at = END - 5 * MIN
    started_before = row(at, takeovers=1, claimed_at=at + MIN, run_state="running",
                         started_at=at + timedelta(seconds=20))
    started_after = row(at, takeovers=1, claimed_at=at + MIN, run_state="running",
                        started_at=at + 2 * MIN)
    never_taken = row(at, run_state="running", started_at=at - MIN)
    counts = [count_entry("job", "other", [r], start=END - 10 * MIN, end=END, grace=GRACE,
                          publish_timeout=TIMEOUT).duplicates
              for r in (started_before, started_after, never_taken)]
    assert counts == [1, 0, 0]


def test_states_outcomes_and_orphans() -> None:
    at = END - 5 * MIN
    rows = [row(at), row(at - MIN, run_state="succeeded"), row(at - 2 * MIN, run_state="failed",
                                                               run_error="E: x"),
            row(at - 3 * MIN, run_state="retried"), row(at - 4 * MIN, run_state="running"),
            row(at - 5 * MIN, state="pending", published_at=None, claimed_at=END),  # in flight
            row(at - 6 * MIN, state="failed", published_at=None, publish_error="refused"),
            row(at - 7 * MIN, state="pending", published_at=None),  # orphaned
            row(at - 8 * MIN, state=None),  # a 0.1 row: it was sent
            row(at - 9 * MIN, kind="node")]  # an every-node run: not this entry's claim
    count = count_entry("job", "other", rows, start=END - timedelta(hours=1), end=END,
                        grace=GRACE, publish_timeout=TIMEOUT)
    assert (count.claimed, count.published, count.succeeded, count.failed, count.running,
            count.orphaned, count.expected, count.missed) == (9, 6, 1, 1, 2, 2, None, None)
    assert [r.run_error for r in count.failures] == ["E: x"]


def test_every_node_runs_count_per_node_and_nothing_is_expected() -> None:
    at = END - 5 * MIN
    rows = [row(at, kind="node", node="a", run_state="succeeded"),
            row(at - MIN, kind="node", node="a", run_state="failed"),
            row(at - 2 * MIN, kind="node", node="b", run_state="running"),
            row(at - 3 * MIN, kind="node", node="b"),  # received, not started: a run
            row(at - 4 * MIN)]  # a claim from when it was a cluster entry: not a run
    count = count_entry("job", "every_node", rows, start=END - timedelta(hours=1), end=END,
                        grace=GRACE, publish_timeout=TIMEOUT)
    assert (count.published, count.succeeded, count.failed, count.running) == (4, 1, 1, 1)
    assert (count.expected, count.claimed, count.missed, count.duplicates) == (None,) * 4
    assert count.nodes == {"a": {"runs": 2, "succeeded": 1, "failed": 1, "running": 0},
                           "b": {"runs": 2, "succeeded": 0, "failed": 0, "running": 1}}


def test_counting_stops_at_the_caps_and_says_from_when(monkeypatch: pytest.MonkeyPatch) -> None:
    name = uuid.uuid4().hex
    store = MemoryClaimStore(name, clock=lambda: END)
    app = Celery("caps", broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {"minutely": {"task": "t", "schedule": crontab()},
                              "poll": {"task": "t", "schedule": timedelta(minutes=1)}}
    store.claim("node-a", [ClaimRequest.for_slot(job, s, f"{job}-{s:%H%M}")
                           for s in slots(30) for job in ("minutely", "poll")])
    monkeypatch.setattr(rec, "MAX_EXPECTED", 5)
    monkeypatch.setattr(rec, "MAX_ROWS", 8)
    out = reconcile(schedule_entries(app), store, now=END, start=END - 20 * MIN, grace=GRACE,
                    publish_timeout=TIMEOUT, tolerance=1.0)
    minutely, poll = sorted(out.entries, key=lambda e: e.job)
    assert minutely.capped and minutely.start == slots(5)[-1]
    assert (minutely.expected, minutely.claimed, minutely.missed) == (5, 5, 0)
    assert poll.capped and poll.start == slots(8)[-1] and poll.claimed == 8
    MemoryClaimStore.reset(name)


def test_manual_runs_are_counted_apart_from_the_schedule() -> None:
    listed = slots(3)
    manual = row(listed[1] + timedelta(seconds=17), kind="manual", run_state="failed",
                 run_error="boom")
    count = count_entry("job", "slots", [row(s) for s in listed] + [manual],
                        start=END - 5 * MIN, end=END, grace=GRACE, publish_timeout=TIMEOUT,
                        slots=listed)
    assert (count.expected, count.claimed, count.missed, count.manual) == (3, 3, 0, 1)
    assert count.failed == 1 and count.failures == [manual]  # its outcome still counts
    # an interval: a manual run is no occurrence, so it fills no gap
    start = END - 60 * MIN
    runs = [row(start + k * 10 * MIN) for k in range(3)]
    gap = interval(runs, start)
    with_manual = interval(runs + [row(END - 15 * MIN, kind="manual")], start)
    assert (with_manual.missed, with_manual.claimed) == (gap.missed, gap.claimed)
    assert with_manual.manual == 1


def test_a_slot_waiting_for_its_jitter_is_not_missed_yet() -> None:
    listed = slots(3)  # 12:00, 11:59, 11:58; END is 12:00:30, grace 60 s

    def delay(slot: datetime) -> timedelta:
        return timedelta(seconds=45) if slot == listed[1] else timedelta(0)

    plain = count_entry("job", "slots", [row(listed[2])], start=END - 5 * MIN, end=END,
                        grace=GRACE, publish_timeout=TIMEOUT, slots=listed)
    late = count_entry("job", "slots", [row(listed[2])], start=END - 5 * MIN, end=END,
                       grace=GRACE, publish_timeout=TIMEOUT, slots=listed, delay=delay)
    assert (plain.expected, plain.missed) == (2, 1)  # 11:59 is past the grace
    assert (late.expected, late.missed) == (1, 0)    # ... but not past its jitter plus grace

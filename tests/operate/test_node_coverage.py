"""Every-node accountability (#35): which live beat nodes ran each every-node entry.

The computation (:mod:`celery_elarion_beat.operate.coverage`) on the memory store with
an injected clock: tracked against not tracked, live for two periods or not yet, the
window of ``--since`` against the entry's own last two periods, interval and crontab
periods; then ``celery elarion-beat status`` through the click runner: the JSON fields,
the finding ``node-missing`` and ``--fail-on``, and the text report. The real processes
are tests/acceptance/test_node_missing.py's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from celery.beat import ScheduleEntry
from celery.schedules import crontab, schedule

from celery_elarion_beat.operate.coverage import coverage_mark, every_node_coverage
from celery_elarion_beat.store import MemoryClaimStore
from celery_elarion_beat.store.records import NodeState, RunReport
from tests.operate import proj_coverage
from tests.operate.support import invoke

pytestmark = pytest.mark.memory

NOW = datetime(2026, 12, 7, 12, 0, 30, tzinfo=timezone.utc)  # a Monday
S = timedelta(seconds=1)
LIVE = timedelta(seconds=120)
RETENTION = timedelta(days=7)
EVERY_10S = ScheduleEntry("cache", "t.cache", schedule=schedule(timedelta(seconds=10)),
                          options={"placement": "every_node"})
CLUSTER = ScheduleEntry("report", "t.report", schedule=schedule(timedelta(seconds=10)))


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@pytest.fixture
def store(clock: Clock) -> Iterator[MemoryClaimStore]:
    name = f"coverage-{uuid.uuid4().hex}"
    yield MemoryClaimStore(name, clock=clock)
    MemoryClaimStore.reset(name)


def beat(store: MemoryClaimStore, clock: Clock, node: str, started: timedelta,
         seen: timedelta = timedelta(0), entries: dict[str, str] | None = None,
         boot: str = "1") -> None:
    """*node*'s beat (boot *boot*), started *started* before NOW, last seen *seen* before
    NOW."""
    state = NodeState(node, f"boot-{node}-{boot}", "0", "fp", entries or {})
    for back in (started, seen):
        clock.at = NOW - back
        store.heartbeat(state)
    clock.at = NOW


def ran(store: MemoryClaimStore, node: str, *ago: float, job: str = "cache") -> None:
    """Runs of *job* that *node*'s worker recorded, started *ago* seconds before NOW (a
    run is keyed by its start: two nodes' runs never start at one instant here)."""
    store.record_runs([RunReport(job, NOW - timedelta(seconds=a), uuid.uuid4().hex, "started",
                                 f"celery@{node}", node=node, every_node=True) for a in ago])


def cover(store: MemoryClaimStore, *entries: ScheduleEntry, start: datetime | None = None):
    now, nodes = store.nodes()
    return every_node_coverage({e.name: e for e in entries}, nodes, store, now=now,
                               live_within=LIVE, retention=RETENTION, start=start)


def test_a_tracked_node_with_no_run_in_two_periods_is_missing(store, clock) -> None:
    for node in "abcde":
        beat(store, clock, node, started=timedelta(minutes=5),
             seen=timedelta(minutes=10) if node == "e" else timedelta(0))
    ran(store, "a", 3, 13, 23)
    ran(store, "b", 25, 35)          # tracked: ran, but not in the last two periods
    ran(store, "d", 3600)            # tracked an hour ago ...
    beat(store, clock, "d", started=timedelta(seconds=15), boot="2")  # ... and restarted
    ran(store, "e", 3601)            # tracked, but its beat is dead: nobody expects it
    (got,) = cover(store, EVERY_10S, CLUSTER).values()
    assert got.job == "cache" and got.since == NOW - 20 * S  # two periods
    assert got.ran == {"a": 2}       # 3 and 13 s ago; 23 s is before the window
    assert got.missing == ["b"]
    assert got.not_tracked == ["c"]  # no worker of c ever recorded a run: never missing
    assert got.too_new == ["d"]      # live for 15 s only: not two periods yet


def test_the_since_window_decides_what_counts(store, clock) -> None:
    beat(store, clock, "a", started=timedelta(minutes=5))
    beat(store, clock, "b", started=timedelta(minutes=5))
    ran(store, "a", 2)
    ran(store, "b", 40)
    assert cover(store, EVERY_10S, start=NOW - 60 * S)["cache"].ran == {"a": 1, "b": 1}
    got = cover(store, EVERY_10S, start=NOW - 30 * S)["cache"]
    assert (got.ran, got.missing, got.since) == ({"a": 1}, ["b"], NOW - 30 * S)
    # a window shorter than two periods judges nobody: a node may not have run yet
    got = cover(store, EVERY_10S, start=NOW - 15 * S)["cache"]
    assert (got.missing, got.too_new) == ([], ["b"])
    # a node must have been live for two periods within the window
    beat(store, clock, "b", started=timedelta(seconds=19), boot="2")
    got = cover(store, EVERY_10S, start=NOW - 30 * S)["cache"]
    assert (got.missing, got.too_new) == ([], ["b"])


def test_tracking_reaches_back_to_the_claim_retention_only(store, clock) -> None:
    beat(store, clock, "a", started=timedelta(days=30))
    ran(store, "a", timedelta(days=8).total_seconds())
    assert cover(store, EVERY_10S)["cache"].not_tracked == ["a"]
    ran(store, "a", timedelta(days=6).total_seconds())
    assert cover(store, EVERY_10S)["cache"].missing == ["a"]


def test_a_node_whose_schedule_lacks_the_entry_is_not_expected(store, clock) -> None:
    beat(store, clock, "a", started=timedelta(minutes=5), entries={"other": "digest"})
    beat(store, clock, "b", started=timedelta(minutes=5), entries={"cache": "digest"})
    ran(store, "a", 100, job="other")
    ran(store, "b", 100)
    got = cover(store, EVERY_10S)["cache"]
    assert got.missing == ["b"] and got.not_tracked == []


def test_a_crontab_period_is_the_gap_between_its_slots() -> None:
    # weekdays at 09:00: on a Monday at noon, two periods reach back to Thursday
    weekdays = crontab(minute=0, hour=9, day_of_week="mon-fri")
    assert coverage_mark("w", weekdays, NOW, NOW - RETENTION) == datetime(
        2026, 12, 3, 9, 0, tzinfo=timezone.utc)
    assert coverage_mark("m", crontab(), NOW, NOW - RETENTION) == datetime(
        2026, 12, 7, 11, 58, tzinfo=timezone.utc)
    assert coverage_mark("i", schedule(timedelta(minutes=5)), NOW, NOW - RETENTION) == \
        NOW - timedelta(minutes=10)
    # two periods longer than the retention: never judged
    assert coverage_mark("w", weekdays, NOW, NOW - timedelta(days=2)) is None
    assert coverage_mark("i", schedule(timedelta(days=4)), NOW, NOW - RETENTION) is None


def test_a_crontab_entry_is_judged_over_its_slots(store, clock) -> None:
    minutely = ScheduleEntry("cache", "t.cache", schedule=crontab(),
                             options={"placement": "every_node"})
    beat(store, clock, "a", started=timedelta(seconds=150))  # since 11:58:00
    beat(store, clock, "b", started=timedelta(seconds=100))  # since 11:58:50: too new
    ran(store, "a", 200)
    ran(store, "b", 201)
    got = cover(store, minutely)["cache"]
    assert got.since == datetime(2026, 12, 7, 11, 58, tzinfo=timezone.utc)
    assert (got.missing, got.too_new) == (["a"], ["b"])


# -- status -------------------------------------------------------------------------------


APP = "tests.operate.proj_coverage"


@pytest.fixture
def live_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryClaimStore]:
    """The coverage app's store (on the real clock): beats a, b and c live for a minute;
    a's and b's workers record runs, c's never did; b's stopped 30 s ago."""
    name = f"coverage-cli-{uuid.uuid4().hex}"
    monkeypatch.setitem(proj_coverage.app.conf, "elarion_beat_dsn", f"memory://{name}")
    real = MemoryClaimStore(name)
    now = real.clock()
    earlier = MemoryClaimStore(name, clock=lambda: now - timedelta(minutes=1))
    for node in "abc":
        state = NodeState(node, f"boot-{node}", "0", "fp")
        earlier.heartbeat(state)
        real.heartbeat(state)
    real.record_runs([RunReport("cache", now - timedelta(seconds=s), uuid.uuid4().hex,
                                "started", f"celery@{node}", node=node, every_node=True)
                      for node, s in (("a", 5), ("a", 15), ("b", 30), ("b", 40))])
    yield real
    MemoryClaimStore.reset(name)


def status(*args: str) -> tuple[int, dict]:
    code, out = invoke("status", "--json", *args, app=APP)
    assert code in (0, 1), out
    return code, json.loads(out)


def test_status_names_the_missing_node_and_fails_on_node_missing(live_store) -> None:
    code, data = status("--since", "20s")
    entries = {e["name"]: e for e in data["entries"]}
    cache = entries["cache"]
    assert cache["nodes_missing"] == ["b"] and cache["nodes_ran"] == {"a": 2}, cache
    assert cache["nodes_not_tracked"] == ["c"] and cache["nodes_too_new"] == []
    assert cache["nodes_since"] is not None
    # a cluster entry is never judged per node
    assert entries["report"]["nodes_missing"] is None and entries["report"]["nodes_ran"] is None
    assert data["findings"] == ["node-missing"] and code == 1 and not data["healthy"]
    assert "node-missing" in data["fail_on"]
    assert status("--since", "20s", "--fail-on", "node-missing")[0] == 1
    assert status("--since", "20s", "--fail-on", "missed,foreign-beat")[0] == 0
    # a longer window holds b's runs: nothing missing
    code, data = status("--since", "45s")
    assert code == 0 and data["findings"] == [], data
    assert {e["name"]: e for e in data["entries"]}["cache"]["nodes_ran"] == {"a": 2, "b": 2}
    # without --since: the entry's last two periods (20 s)
    code, data = status()
    assert code == 1 and data["findings"] == ["node-missing"]


def test_status_text_shows_the_missing_node_and_the_untracked(live_store) -> None:
    code, out = invoke("status", "--since", "20s", "--fail-on", "node-missing", app=APP)
    assert code == 1, out
    assert "NODE MISSING b" in out  # the entry's state
    assert "\nNODE MISSING: live beat nodes whose workers recorded no run" in out
    assert "  cache: b (no run since " in out and "; ran: a 2)" in out, out
    assert "NOT TRACKED: every-node runs are not recorded on c " in out, out
    assert out.rstrip().endswith("UNHEALTHY: node-missing"), out

"""The preview of a change of a database entry across its effective time
(:mod:`celery_elarion_beat.operate.change_preview`), on the memory store with a clock of
the test's: an interval keeps its phase (or restarts), a revision already written
with a later effective time governs its own span, a removed override gives the code
entry back, and the preview checks the change as a save would."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_elarion_beat import live_schedules as live
from celery_elarion_beat.exceptions import ConfigurationError, EntryConflict
from celery_elarion_beat.live_schedules.api import Change
from celery_elarion_beat.operate.change_preview import preview_change
from celery_elarion_beat.store.memory import MemoryClaimStore
from celery_elarion_beat.store.records import ClaimRequest

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=timezone.utc)
S = timedelta(seconds=1)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def setup() -> Iterator[tuple[Celery, MemoryClaimStore, Clock]]:
    name = uuid.uuid4().hex
    app = Celery(f"cp{name[:6]}", set_as_current=False)
    app.conf.update(elarion_beat_dsn=f"memory://{name}", elarion_beat_db_entries=True,
                    elarion_beat_db_entry_tasks="live.*", timezone="UTC", beat_schedule={
                        "nightly": {"task": "live.nightly", "schedule": crontab(0, 3)}})
    clock = Clock(T0 - timedelta(minutes=1))
    yield app, MemoryClaimStore(name, clock=clock), clock
    app.close()


def times(side: dict[str, object]) -> list[tuple[str, datetime]]:
    return [(str(o["governs"]), datetime.fromisoformat(str(o["utc"]).replace("Z", "+00:00")))
            for o in side["occurrences"]]  # type: ignore[attr-defined]


def test_an_interval_keeps_its_phase_across_the_edit_unless_restarted(setup) -> None:
    app, store, clock = setup
    entry = live.add_entry(app, "poll", "live.job", {"every": 10}, store=store)
    clock.now = T0  # a node claims the entry's window now: its rhythm counts from T0
    (won,) = store.claim("n1", [ClaimRequest.for_window(
        "poll", timedelta(seconds=10), "t1", revision=entry.revision)])
    assert won.won
    clock.now = T0 + 4 * S
    change = Change("edit", "poll", schedule={"every": 3}, revision=entry.revision,
                    effective=T0 + 25 * S)
    p = preview_change(app, change, store=store, limit=3).as_dict()
    assert times(p["before"]) == [(f"revision {entry.revision}", T0 + 10 * S),
                                  (f"revision {entry.revision}", T0 + 20 * S)]
    # the old rhythm's last point before T0+25 is T0+20; on the new interval: T0+23
    assert times(p["after"]) == [("the edit", T0 + s * S) for s in (26, 29, 32)]
    assert p["after"]["occurrences"][0]["anchor"].startswith("its phase kept")
    restarted = preview_change(app, Change("edit", "poll", schedule={"every": 3},
                                           revision=entry.revision, effective=T0 + 25 * S,
                                           restart=True), store=store, limit=2).as_dict()
    assert times(restarted["after"]) == [("the edit", T0 + 28 * S), ("the edit", T0 + 31 * S)]


def test_a_revision_still_to_come_governs_its_own_span(setup) -> None:
    app, store, clock = setup
    clock.now = T0
    first = live.add_entry(app, "hourly", "live.job", {"cron": "0 0 * * * *"}, store=store)
    pending = live.edit_entry(app, "hourly", schedule={"cron": "0 15 * * * *"},
                              effective=T0 + timedelta(hours=2, minutes=30), store=store)
    p = preview_change(app, Change("edit", "hourly", schedule={"cron": "0 45 * * * *"},
                                   revision=pending.revision,
                                   effective=T0 + timedelta(hours=4, minutes=50)),
                       store=store, limit=10).as_dict()
    hour = timedelta(hours=1)
    # the first revision until 14:30 (its slots at or after now: 12:00 is one), the
    # pending one from then on, until the previewed edit takes over at 16:50
    assert times(p["before"]) == [
        *[(f"revision {first.revision}", T0 + h * hour) for h in (0, 1, 2)],
        *[(f"revision {pending.revision}", T0 + h * hour + 15 * 60 * S) for h in (3, 4)]]
    assert times(p["after"])[:2] == [("the edit", T0 + 5 * hour + 45 * 60 * S),
                                     ("the edit", T0 + 6 * hour + 45 * 60 * S)]
    assert p["before"]["governs"] == [f"revision {first.revision}",
                                      f"revision {pending.revision}"]


def test_the_last_occurrence_before_a_far_effective_time(setup) -> None:
    app, store, clock = setup
    clock.now = T0
    entry = live.add_entry(app, "minutely", "live.job", {"cron": "0 * * * * *"}, store=store)
    effective = T0 + timedelta(days=3, minutes=7, seconds=30)
    p = preview_change(app, Change("disable", "minutely", revision=entry.revision,
                                   effective=effective), store=store, limit=5).as_dict()
    assert len(p["before"]["occurrences"]) == 5 and p["before"]["more"] is True
    assert p["before"]["last"]["utc"] == "2026-06-04T12:07:00Z"
    assert p["after"] == {"occurrences": [], "more": False, "governs":
                          ["nothing runs (disabled)"], "last": None}


def test_removing_an_override_gives_the_code_entry_back(setup) -> None:
    app, store, clock = setup
    clock.now = T0
    live.override_entry(app, "nightly", schedule={"crontab": "0 4 * * *"}, store=store)
    entry = live.get_entry(app, "nightly", store=store)
    p = preview_change(app, Change("remove", "nightly", revision=entry.revision),
                       store=store, limit=2).as_dict()
    assert times(p["after"]) == [("the code entry", datetime(2026, 6, 2, 3, tzinfo=timezone.utc)),
                                 ("the code entry", datetime(2026, 6, 3, 3, tzinfo=timezone.utc))]
    assert p["before"]["occurrences"] == [] and p["effective"] == "2026-06-01T12:00:00Z"


def test_the_preview_checks_the_change_as_a_save_would_and_writes_nothing(setup) -> None:
    app, store, clock = setup
    clock.now = T0
    entry = live.add_entry(app, "report", "live.job", {"every": 60}, store=store)
    with pytest.raises(EntryConflict):
        preview_change(app, Change("edit", "report", schedule={"every": 5},
                                   revision=entry.revision - 1), store=store)
    with pytest.raises(ConfigurationError, match="^task: 'other.job' is not allowed"):
        preview_change(app, Change("edit", "report", task="other.job",
                                   revision=entry.revision), store=store)
    with pytest.raises(ConfigurationError, match="^effective: .* is before the database"):
        preview_change(app, Change("edit", "report", schedule={"every": 5},
                                   revision=entry.revision, effective=T0 - timedelta(hours=1)),
                       store=store)
    same = preview_change(app, Change("edit", "report", schedule={"every": 60},
                                      revision=entry.revision), store=store)
    assert same.unchanged and "writes nothing" in same.notes[-1]
    assert [r.revision for r in live.entry_history(app, "report", store=store)] == [
        entry.revision]

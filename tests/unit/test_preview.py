"""``elarion-beat preview``'s rows (:mod:`celery_elarion_beat.operate.preview`): the occurrences of
each entry across the 2026 DST weekends, written out by hand.

Berlin: 2026-03-29 01:00Z 02:00 CET -> 03:00 CEST; 2026-10-25 01:00Z 03:00 CEST -> 02:00 CET.
New York: 2026-03-08 07:00Z 02:00 EST -> 03:00 EDT; 2026-11-01 06:00Z 02:00 EDT -> 01:00 EST.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery.schedules import BaseSchedule, crontab

from celery_elarion_beat import Placement, Settings, cron
from celery_elarion_beat.config.entries import read_schedule as checked_entries
from celery_elarion_beat.operate.preview import preview_entries
from celery_elarion_beat.store.control_records import ALL_JOBS, Pause

UTC = timezone.utc


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def preview(schedule: dict[str, Any], start: str, hours: float, tz: str = "Europe/Berlin",
            **kwargs: Any) -> Any:
    app = Celery("preview", set_as_current=False)
    app.conf.timezone = tz
    app.conf.beat_schedule = schedule
    entries, invalid = checked_entries(app, Settings.from_app(app))
    assert not invalid, invalid
    begin = at(start)
    return preview_entries(entries, begin, begin + timedelta(hours=hours),
                           app_zone=app.timezone, **kwargs)


def table(result: Any) -> list[tuple[str, str, str]]:
    """(utc, local wall time and zone, DST mark) of each row."""
    return [(r.as_dict()["utc"], f"{r.local:%H:%M %Z}", r.dst_mark) for r in result.rows]


def test_celery_crontab_in_the_app_zone_runs_a_skipped_wall_time_at_the_jump() -> None:
    result = preview({"nightly": {"task": "t.n", "schedule": crontab(minute=30, hour=2)}},
                     "2026-03-28T00:00:00Z", 72)
    assert table(result) == [
        ("2026-03-28T01:30:00Z", "02:30 CET", ""),
        ("2026-03-29T01:00:00Z", "03:00 CEST",
         "DST +1h (CET->CEST); 02:30 does not exist: Celery sends it once, at 03:30 CEST "
         "(01:30Z), claimed as the 03:00 CEST slot"),
        ("2026-03-30T00:30:00Z", "02:30 CEST", ""),
    ]
    row = result.rows[1]
    assert (row.kind, row.placement, row.nodes, row.offset) == ("slot", Placement.CLUSTER,
                                                                None, "+02:00")


def test_our_cron_reads_its_own_zone_and_runs_a_repeated_wall_time_once() -> None:
    result = preview({"report": {"task": "t.r",
                                 "schedule": cron("30 2 * * *", tz="Europe/Berlin")}},
                     "2026-10-24T00:00:00Z", 72, tz="UTC")
    assert table(result) == [
        ("2026-10-24T00:30:00Z", "02:30 CEST", ""),
        ("2026-10-25T00:30:00Z", "02:30 CEST",
         "02:30 happens twice: runs once, at the first (CEST)"),
        ("2026-10-26T01:30:00Z", "02:30 CET", "DST -1h (CEST->CET)"),
    ]
    assert {r.as_dict()["zone"] for r in result.rows} == {"Europe/Berlin"}


def test_our_cron_in_new_york_across_both_transitions() -> None:
    spring = preview({"export": {"task": "t.e",
                                 "schedule": cron("30 2 * * *", tz="America/New_York")}},
                     "2026-03-07T12:00:00Z", 48)
    assert table(spring) == [
        ("2026-03-08T07:00:00Z", "03:00 EDT",
         "DST +1h (EST->EDT); 02:30 does not exist: runs once at the jump (03:00 EDT)"),
        ("2026-03-09T06:30:00Z", "02:30 EDT", ""),
    ]
    fall = preview({"export": {"task": "t.e",
                               "schedule": cron("30 1 * * *", tz="America/New_York")}},
                   "2026-10-31T12:00:00Z", 48)
    assert table(fall) == [
        ("2026-11-01T05:30:00Z", "01:30 EDT",
         "01:30 happens twice: runs once, at the first (EDT)"),
        ("2026-11-02T06:30:00Z", "01:30 EST", "DST -1h (EDT->EST)"),
    ]


def test_an_hourly_crontab_runs_the_repeated_hour_twice_and_the_gap_at_the_jump() -> None:
    def hourly() -> dict[str, Any]:  # a crontab keeps the zone of the first app it saw
        return {"sync": {"task": "t.s", "schedule": crontab(minute=0)}}

    assert table(preview(hourly(), "2026-10-24T23:00:00Z", 4)) == [
        ("2026-10-24T23:00:00Z", "01:00 CEST", ""),
        ("2026-10-25T00:00:00Z", "02:00 CEST", "02:00 happens twice: 1st of 2 (CEST)"),
        ("2026-10-25T01:00:00Z", "02:00 CET",
         "DST -1h (CEST->CET); 02:00 again: 2nd of 2 (CET)"),
        ("2026-10-25T02:00:00Z", "03:00 CET", ""),
    ]
    assert table(preview(hourly(), "2026-03-29T00:00:00Z", 3)) == [
        ("2026-03-29T00:00:00Z", "01:00 CET", ""),
        ("2026-03-29T01:00:00Z", "03:00 CEST",
         "DST +1h (CET->CEST); 02:00 does not exist; 03:00 CEST runs at the jump as usual"),
        ("2026-03-29T02:00:00Z", "04:00 CEST", ""),
    ]
    assert table(preview(hourly(), "2026-11-01T04:00:00Z", 4, tz="America/New_York")) == [
        ("2026-11-01T04:00:00Z", "00:00 EDT", ""),
        ("2026-11-01T05:00:00Z", "01:00 EDT", "01:00 happens twice: 1st of 2 (EDT)"),
        ("2026-11-01T06:00:00Z", "01:00 EST",
         "DST -1h (EDT->EST); 01:00 again: 2nd of 2 (EST)"),
        ("2026-11-01T07:00:00Z", "02:00 EST", ""),
    ]


def test_our_every_hour_cron_skips_the_wall_time_of_the_gap() -> None:
    result = preview({"half": {"task": "t.h",
                               "schedule": cron("30 * * * *", tz="Europe/Berlin")}},
                     "2026-03-29T00:00:00Z", 3)
    assert table(result) == [
        ("2026-03-29T00:30:00Z", "01:30 CET", ""),
        ("2026-03-29T01:30:00Z", "03:30 CEST",
         "DST +1h (CET->CEST); 02:30 does not exist: skipped"),
        ("2026-03-29T02:30:00Z", "04:30 CEST", ""),
    ]
    tens = preview({"ten": {"task": "t.t", "schedule": cron("*/10 * * * *")}},
                   "2026-03-29T00:45:00Z", 0.5)
    assert table(tens) == [
        ("2026-03-29T00:50:00Z", "01:50 CET", ""),
        ("2026-03-29T01:00:00Z", "03:00 CEST", "DST +1h (CET->CEST); 02:00-02:50 (6 wall "
         "times) do not exist; 03:00 CEST runs at the jump as usual"),
        ("2026-03-29T01:10:00Z", "03:10 CEST", ""),
    ]


def test_an_interval_counts_from_its_newest_claim_or_from_the_start() -> None:
    poll = {"poll": {"task": "t.p", "schedule": timedelta(minutes=30)}}
    unknown = preview(poll, "2026-03-29T00:00:00Z", 2)
    assert table(unknown) == [
        ("2026-03-29T00:30:00Z", "01:30 CET", ""),
        ("2026-03-29T01:00:00Z", "03:00 CEST", "DST +1h (CET->CEST)"),
        ("2026-03-29T01:30:00Z", "03:30 CEST", ""),
    ]
    row = unknown.rows[0]
    assert (row.kind, row.window) == ("window", timedelta(seconds=1799))
    assert row.anchor.startswith("cluster anchor: newest claim unknown")
    anchored = preview(poll, "2026-03-29T00:00:00Z", 2,
                       anchors={"poll": at("2026-03-28T23:50:00Z")})
    assert table(anchored) == [
        ("2026-03-29T00:20:00Z", "01:20 CET", ""),
        ("2026-03-29T00:50:00Z", "01:50 CET", ""),
        ("2026-03-29T01:20:00Z", "03:20 CEST", "DST +1h (CET->CEST)"),
        ("2026-03-29T01:50:00Z", "03:50 CEST", ""),
    ]
    assert anchored.rows[0].anchor == "cluster anchor: newest claim 2026-03-28T23:50:00Z"
    per_node = preview(poll, "2026-03-29T00:00:00Z", 1, anchor_mode="node",
                       anchors={"poll": at("2026-03-28T23:50:00Z")})
    assert [r.as_dict()["utc"] for r in per_node.rows] == ["2026-03-29T00:30:00Z"]
    assert per_node.rows[0].anchor.startswith("anchored at each node's start")


def test_an_every_node_entry_is_sent_by_each_live_node_and_never_claimed() -> None:
    schedule = {
        "cache": {"task": "t.c", "schedule": crontab(minute=0, hour="*/12"),
                  "options": {"placement": "every_node"}},
        "report": {"task": "t.r", "schedule": crontab(minute=0, hour=12)},
    }
    known = preview(schedule, "2026-03-28T12:00:00Z", 24, live_nodes=["node-b", "node-a"])
    assert [(r.as_dict()["utc"], r.job, r.kind, r.placement.value, r.nodes)
            for r in known.rows] == [
        ("2026-03-28T23:00:00Z", "cache", "none", "every_node", ("node-a", "node-b")),
        ("2026-03-29T10:00:00Z", "cache", "none", "every_node", ("node-a", "node-b")),
        ("2026-03-29T10:00:00Z", "report", "slot", "cluster", None),
    ]
    assert known.nodes == ["node-a", "node-b"]
    unknown = preview(schedule, "2026-03-28T12:00:00Z", 24)
    assert unknown.nodes is None
    assert [r.as_dict()["nodes"] for r in unknown.rows] == [None, None, None]


def test_another_display_zone_keeps_the_marks_of_the_entry_zone() -> None:
    result = preview({"nightly": {"task": "t.n", "schedule": crontab(minute=30, hour=2)}},
                     "2026-03-29T00:00:00Z", 2, display_zone=ZoneInfo("America/New_York"))
    (row,) = result.rows
    assert row.as_dict()["local"] == "2026-03-28T21:00:00-04:00"
    assert row.as_dict()["zone"] == "America/New_York"
    assert row.dst_mark == ("DST +1h (CET->CEST, Europe/Berlin); 02:30 does not exist: Celery "
                            "sends it once, at 03:30 CEST (01:30Z), claimed as the 03:00 CEST "
                            "slot")


def test_a_pause_marks_the_occurrences_before_its_end() -> None:
    schedule = {"nightly": {"task": "t.n", "schedule": crontab(minute=30, hour=2)},
                "other": {"task": "t.o", "schedule": crontab(minute=0, hour=12)}}
    own = Pause("nightly", at("2026-03-27T10:00:00Z"), "alice@vm (cli)", "db move",
                until=at("2026-03-29T00:00:00Z"))
    result = preview(schedule, "2026-03-28T00:00:00Z", 48, pauses=[own])
    assert [(r.job, r.as_dict()["utc"], r.paused is not None) for r in result.rows] == [
        ("nightly", "2026-03-28T01:30:00Z", True),
        ("other", "2026-03-28T11:00:00Z", False),
        ("nightly", "2026-03-29T01:00:00Z", False),
        ("other", "2026-03-29T10:00:00Z", False),
    ]
    assert result.rows[0].as_dict()["paused"]["until"] == "2026-03-29T00:00:00Z"
    every = Pause(ALL_JOBS, at("2026-03-27T10:00:00Z"), "bob", "freeze")
    held = preview(schedule, "2026-03-28T00:00:00Z", 48, pauses=[every])
    assert all(r.paused is every for r in held.rows) and len(held.rows) == 4


def test_the_limit_cuts_each_entry_and_says_so() -> None:
    result = preview({"sync": {"task": "t.s", "schedule": crontab(minute=0)},
                      "nightly": {"task": "t.n", "schedule": crontab(minute=30, hour=2)}},
                     "2026-03-28T00:00:00Z", 10, limit=3)
    assert [(r.job, r.as_dict()["utc"]) for r in result.rows] == [
        ("sync", "2026-03-28T00:00:00Z"),
        ("sync", "2026-03-28T01:00:00Z"),
        ("nightly", "2026-03-28T01:30:00Z"),
        ("sync", "2026-03-28T02:00:00Z"),
    ]
    assert result.cut == ["sync"]


def test_invalid_entries_are_reported_with_their_reason_and_not_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("preview", set_as_current=False)
    app.conf.beat_schedule = {
        "good": {"task": "t.g", "schedule": timedelta(minutes=5)},
        "no-schedule": {"task": "t.x", "schedule": "daily"},
        "bad-placement": {"task": "t.y", "schedule": crontab(),
                          "options": {"placement": "everywhere"}},
    }
    caplog.set_level(logging.INFO, logger="celery_elarion_beat")
    entries, invalid = checked_entries(app, Settings.from_app(app))
    assert list(entries) == ["good"]
    reasons = {i.job: i.reason for i in invalid}
    assert set(reasons) == {"no-schedule", "bad-placement"}
    assert "'daily', not a schedule" in reasons["no-schedule"]
    assert "options['placement'] = 'everywhere'" in reasons["bad-placement"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_the_json_form_carries_every_field_and_the_transitions() -> None:
    result = preview({"nightly": {"task": "t.n", "schedule": crontab(minute=30, hour=2)}},
                     "2026-03-29T00:00:00Z", 2, live_nodes=[])
    doc = result.as_dict()
    assert doc["transitions"] == [{"zone": "Europe/Berlin", "utc": "2026-03-29T01:00:00Z",
                                   "mark": "DST +1h (CET->CEST)",
                                   "clocks": "02:00 CET -> 03:00 CEST (+1h)"}]
    (occ,) = doc["occurrences"]
    assert occ == {
        "job": "nightly", "task": "t.n", "utc": "2026-03-29T01:00:00Z",
        "local": "2026-03-29T03:00:00+02:00", "zone": "Europe/Berlin", "offset": "+02:00",
        "dst_mark": "DST +1h (CET->CEST); 02:30 does not exist: Celery sends it once, at "
                    "03:30 CEST (01:30Z), claimed as the 03:00 CEST slot",
        "kind": "slot", "placement": "cluster", "window": None, "anchor": None,
        "nodes": None, "paused": None}
    assert doc["nodes"] == []


class Opaque(BaseSchedule):
    """A custom schedule beat can run (it claims a window) but that names no instants."""

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        return False, 60.0


class Failing(Opaque):
    def elarion_slot(self, now: datetime) -> datetime:
        raise RuntimeError("no slot here")


def test_a_schedule_that_names_no_instants_is_listed_as_unknown() -> None:
    result = preview({"opaque": {"task": "t.o", "schedule": Opaque()},
                      "failing": {"task": "t.f", "schedule": Failing()},
                      "nightly": {"task": "t.n", "schedule": crontab(minute=30, hour=2)}},
                     "2026-03-28T00:00:00Z", 24)
    assert sorted(result.unknown) == ["failing", "opaque"]
    assert [r.job for r in result.rows] == ["nightly"]


def test_the_send_time_of_a_missing_wall_time_is_what_beat_really_does() -> None:
    """The mark's send time agrees with a simulated cluster (Celery's own crontab)."""
    from celery import Celery

    from celery_elarion_beat.testing import simulate

    app = Celery("preview-sim", set_as_current=False)
    app.conf.update(timezone="Europe/Berlin", beat_schedule={
        "nightly": {"task": "t.n", "schedule": crontab(minute=30, hour=2)}})
    (sent,) = [o for o in simulate(app, "2026-03-29T00:00:00Z", "2026-03-29T12:00:00Z",
                                   nodes=1)]
    result = preview({"nightly": {"task": "t.n", "schedule": crontab(minute=30, hour=2)}},
                     "2026-03-29T00:00:00Z", 12)
    (row,) = result.rows
    assert sent.slot == row.utc
    assert f"at {sent.sent_at:%H:%M}Z" not in row.dst_mark  # the mark writes (01:30Z)
    assert f"({sent.sent_at:%H:%M}Z)" in row.dst_mark

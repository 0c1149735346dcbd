"""The demo's verdict reads the beats' JSON log records, never the text of a line."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from celery_elarion_beat import demo
from celery_elarion_beat.observe.logformat import JsonFormatter

AT = "2026-01-01T10:00:02Z"


def record(action: str, at: str = "2026-01-01 10:00:02.003", message: str = "beat: ...",
           **fields: Any) -> str:
    """One line as beat writes it with ``elarion_beat_log_format = "json"``."""
    log = logging.LogRecord("celery_elarion_beat.scheduler", logging.INFO, __file__, 1,
                            message, None, None)
    log.created = datetime.strptime(at, "%Y-%m-%d %H:%M:%S.%f").replace(
        tzinfo=timezone.utc).timestamp()
    for key, value in {"action": action, **fields}.items():
        setattr(log, key, value)
    return JsonFormatter().format(log)


def test_text_lines_are_not_read_even_when_they_say_what_a_record_says() -> None:
    text = "\n".join([
        "celery beat v5.7.0 (recovery) is starting.",
        "[2026-01-01 10:00:02,003: INFO/MainProcess] beat: Sending due task report "
        f"(proj.report) [slot {AT} won]",
        record("dispatched", job="report", occurrence=AT, placement="cluster", claim="slot"),
    ])
    assert demo.parse_beat_log("node-a", text) == [demo.Decision("node-a", "report", AT, True)]


def test_other_actions_are_not_decisions() -> None:
    text = "\n".join([record("started", node="node-a"), record("purge", deleted=3),
                      record("clock-skew", skew=2.5), record("schedule-drift", other="node-b")])
    assert demo.parse_beat_log("node-a", text) == []


def test_a_publish_error_turns_the_send_before_it_into_a_skip() -> None:
    text = "\n".join([
        record("dispatched", job="report", occurrence=AT),
        record("publish-error", job="report", occurrence=AT, task_id="t"),
        record("dispatched", job="refresh", occurrence=None, placement="every_node"),
    ])
    assert demo.parse_beat_log("node-a", text) == [
        demo.Decision("node-a", "report", AT, False, "publish-error"),
        demo.Decision("node-a", "refresh", None, True),
    ]


def test_a_skip_without_an_occurrence_is_filed_under_the_second_it_was_logged() -> None:
    text = "\n".join([
        record("skipped", at="2026-01-01 10:00:03.999", job="poll", occurrence=None,
               claim="window", reason="claim-error", winner=None),
        record("invalid-entry", at="2026-01-01 10:00:04.010", job="broken"),
    ])
    assert demo.parse_beat_log("node-b", text) == [
        demo.Decision("node-b", "poll", "2026-01-01T10:00:03Z", False, "claim-error"),
        demo.Decision("node-b", "broken", "2026-01-01T10:00:04Z", False, "invalid-entry"),
    ]


def test_the_verdict_of_records_names_senders_skippers_and_reasons() -> None:
    logs = {
        "node-a": record("dispatched", job="report", occurrence=AT),
        "node-b": record("skipped", job="report", occurrence=AT, reason="claimed-elsewhere",
                         winner="node-a"),
        "node-c": "\n".join([
            record("dispatched", job="report", occurrence=AT),
            record("publish-error", job="report", occurrence=AT)]),
    }
    decisions = [d for node, text in logs.items() for d in demo.parse_beat_log(node, text)]
    verdict = demo.build_verdict([], decisions, [
        {"job": "report", "occurrence": AT, "sent_by": "node-a", "ran_on": "node-b",
         "placement": "cluster"}], nodes=("node-a", "node-b", "node-c"))
    (row,) = verdict.rows
    assert (row.senders, row.skipped_by, row.reasons, row.ran_on) == \
        (["node-a"], ["node-b", "node-c"], ["claimed-elsewhere", "publish-error"], ["node-b"])
    assert verdict.duplicates == 0 and not verdict.problems


def test_a_node_whose_log_gave_no_decisions_is_named_in_a_note() -> None:
    decisions = demo.parse_beat_log("node-a", record("dispatched", job="report",
                                                     occurrence=AT))
    decisions += demo.parse_beat_log("node-b", "[2026-01-01 10:00:02,003: INFO/MainProcess] "
                                     "beat: Sending due task report (proj.report) [slot x won]")
    verdict = demo.build_verdict([], iter(decisions), [], nodes=("node-a", "node-b"))
    assert [r.senders for r in verdict.rows] == [["node-a"]]
    assert any("no decisions in the beat logs of node-b" in n for n in verdict.notes)

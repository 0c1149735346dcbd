"""The demo's pure parts: reading its beats' records, joining the three sources, the table."""
# ruff: noqa: E501  (real JSON log records below)

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from celery_elarion_beat import demo

NODES = set(demo.NODES)
LOGS = {  # the beats' JSON log records (elarion_beat_log_format = "json"), among other lines
    "node-a": """
celery beat v5.7.0 (recovery) is starting.
{"ts": "2026-01-01T10:00:02.003Z", "level": "INFO", "logger": "celery_elarion_beat.scheduler", "message": "beat: Sending due task report-every-2s (elarion_demo.record) [slot 2026-01-01T10:00:02Z won]", "action": "dispatched", "job": "report-every-2s", "node": "node-a", "placement": "cluster", "claim": "slot", "occurrence": "2026-01-01T10:00:02Z", "task_id": "6f1c2d0e-0b7a-5d43-9c51-1f0e7a3b9d12"}
{"ts": "2026-01-01T10:00:03.004Z", "level": "INFO", "logger": "celery_elarion_beat.scheduler", "message": "beat: Skipping poll-every-3s at 2026-01-01T10:00:03Z (window 2.7s, claimed at 2026-01-01T10:00:03Z): claimed-elsewhere (winner node-b)", "action": "skipped", "job": "poll-every-3s", "node": "node-a", "placement": "cluster", "claim": "window", "occurrence": "2026-01-01T10:00:03Z", "reason": "claimed-elsewhere", "winner": "node-b"}
{"ts": "2026-01-01T10:00:05.001Z", "level": "INFO", "logger": "celery_elarion_beat.scheduler", "message": "beat: Sending due task refresh-cache-every-5s (elarion_demo.record) [every node]", "action": "dispatched", "job": "refresh-cache-every-5s", "node": "node-a", "placement": "every_node", "claim": null, "occurrence": null, "task_id": "0d9e6c1a-4b8f-4f0e-a3c2-7b5d1e9f2a64"}
""",
    "node-b": """
{"ts": "2026-01-01T10:00:02.005Z", "level": "INFO", "logger": "celery_elarion_beat.scheduler", "message": "beat: Skipping report-every-2s at 2026-01-01T10:00:02Z: claimed-elsewhere (winner node-a)", "action": "skipped", "job": "report-every-2s", "node": "node-b", "placement": "cluster", "claim": "slot", "occurrence": "2026-01-01T10:00:02Z", "reason": "claimed-elsewhere", "winner": "node-a"}
{"ts": "2026-01-01T10:00:03.001Z", "level": "INFO", "logger": "celery_elarion_beat.scheduler", "message": "beat: Sending due task poll-every-3s (elarion_demo.record) [window at 2026-01-01T10:00:03Z won]", "action": "dispatched", "job": "poll-every-3s", "node": "node-b", "placement": "cluster", "claim": "window", "occurrence": "2026-01-01T10:00:03Z", "task_id": "9a7b3c5d-2e1f-4a6b-8c9d-0e1f2a3b4c5d"}
{"ts": "2026-01-01T10:00:04.001Z", "level": "INFO", "logger": "celery_elarion_beat.scheduler", "message": "beat: Skipping report-every-2s at 2026-01-01T10:00:04Z: claim-error", "action": "skipped", "job": "report-every-2s", "node": "node-b", "placement": "cluster", "claim": "slot", "occurrence": "2026-01-01T10:00:04Z", "reason": "claim-error", "winner": null}
""",
}


def _claim(job: str, at: str, node: str, kind: str = "slot") -> SimpleNamespace:
    when = datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    return SimpleNamespace(job=job, occurrence=when, node=node, kind=kind)


def _decisions() -> list[demo.Decision]:
    return [d for node, text in LOGS.items() for d in demo.parse_beat_log(node, text)]


def test_beat_log_lines_are_parsed_into_decisions() -> None:
    assert _decisions() == [
        demo.Decision("node-a", "report-every-2s", "2026-01-01T10:00:02Z", True),
        demo.Decision("node-a", "poll-every-3s", "2026-01-01T10:00:03Z", False,
                      "claimed-elsewhere", "node-b"),
        demo.Decision("node-a", "refresh-cache-every-5s", None, True),
        demo.Decision("node-b", "report-every-2s", "2026-01-01T10:00:02Z", False,
                      "claimed-elsewhere", "node-a"),
        demo.Decision("node-b", "poll-every-3s", "2026-01-01T10:00:03Z", True),
        demo.Decision("node-b", "report-every-2s", "2026-01-01T10:00:04Z", False,
                      "claim-error", None),
    ]


def _run(job: str, occ: str | None, sent_by: str, ran_on: str,
         placement: str = "cluster") -> dict[str, Any]:
    return {"job": job, "occurrence": occ, "sent_by": sent_by, "ran_on": ran_on,
            "placement": placement}


def test_a_clean_run_has_no_duplicates_and_joins_the_three_sources() -> None:
    claims = [_claim("report-every-2s", "2026-01-01T10:00:02Z", "node-a"),
              _claim("poll-every-3s", "2026-01-01T10:00:03Z", "node-b", "window")]
    runs = [_run("report-every-2s", "2026-01-01T10:00:02Z", "node-a", "node-c"),
            _run("poll-every-3s", "2026-01-01T10:00:03Z", "node-b", "node-b"),
            _run("refresh-cache-every-5s", None, "node-a", "node-a", "every_node")]
    verdict = demo.build_verdict(claims, _decisions(), runs)
    assert verdict.ok and verdict.duplicates == 0 and verdict.problems == []
    by_key = {(r.job, r.occurrence): r for r in verdict.rows}
    report = by_key[("report-every-2s", "2026-01-01T10:00:02Z")]
    assert (report.kind, report.winner, report.senders, report.skipped_by, report.ran_on) == \
        ("slot", "node-a", ["node-a"], ["node-b"], ["node-c"])
    failed = by_key[("report-every-2s", "2026-01-01T10:00:04Z")]
    assert failed.winner is None and failed.reasons == ["claim-error"]
    assert verdict.every_node == {"node-a": Counter({"node-a": 1})}
    assert any("did not run on node-b, node-c" in n for n in verdict.notes)
    assert any("claim-error" in n for n in verdict.notes)


def test_a_second_execution_of_one_occurrence_is_a_duplicate() -> None:
    claims = [_claim("report-every-2s", "2026-01-01T10:00:02Z", "node-a")]
    runs = [_run("report-every-2s", "2026-01-01T10:00:02Z", "node-a", "node-b"),
            _run("report-every-2s", "2026-01-01T10:00:02Z", "node-a", "node-c")]
    verdict = demo.build_verdict(claims, _decisions(), runs)
    assert verdict.duplicates == 1 and not verdict.ok
    assert "ran on ['node-b', 'node-c']" in verdict.problems[0]


def test_two_senders_of_one_slot_are_a_duplicate_even_if_one_message_was_lost() -> None:
    decisions = [demo.Decision("node-a", "j", "2026-01-01T10:00:02Z", True),
                 demo.Decision("node-b", "j", "2026-01-01T10:00:02Z", True)]
    verdict = demo.build_verdict([_claim("j", "2026-01-01T10:00:02Z", "node-a")], decisions,
                                 [_run("j", "2026-01-01T10:00:02Z", "node-a", "node-a")])
    assert verdict.duplicates == 1 and not verdict.ok


def test_an_every_node_message_run_by_another_node_is_a_problem() -> None:
    runs = [_run("refresh", None, "node-a", "node-b", "every_node")]
    verdict = demo.build_verdict([], [], runs)
    assert not verdict.ok and "sent by node-a ran on {'node-b': 1}" in verdict.problems[0]


def test_the_table_prints_every_row_and_the_duplicate_count() -> None:
    import io

    claims = [_claim("report-every-2s", "2026-01-01T10:00:02Z", "node-a")]
    verdict = demo.build_verdict(claims, _decisions(), [
        _run("report-every-2s", "2026-01-01T10:00:02Z", "node-a", "node-c")])
    out = io.StringIO()
    demo.print_verdict(verdict, out)
    text = out.getvalue()
    assert re.search(r"^report-every-2s\s+2026-01-01T10:00:02Z\s+slot\s+node-a\s+node-b\s+"
                     r"node-c\s+1$", text, re.M), text
    assert "node-b (claim-error)" in text
    assert text.rstrip().endswith("duplicates: 0")


def test_the_demo_app_is_configured_from_its_environment(tmp_path: Path) -> None:
    app = demo.make_app({demo.ENV_DIR: str(tmp_path), demo.ENV_RUN: "abc"})
    assert app.conf.broker_url == "filesystem://"
    options = app.conf.broker_transport_options
    assert options["data_folder_in"] == options["data_folder_out"]
    assert Path(options["processed_folder"]).parent == tmp_path / "broker"
    assert app.conf.task_default_queue == "elarion-demo-abc"
    assert app.conf.elarion_beat_node_queue == "elarion-demo-abc.node.{node}"
    assert set(app.conf.beat_schedule) == {demo.CRON_JOB, demo.CRONTAB_JOB, demo.INTERVAL_JOB,
                                           demo.EVERY_NODE_JOB}
    redis = demo.make_app({demo.ENV_BROKER: "redis://127.0.0.1:6379/0"})
    assert not redis.conf.broker_transport_options


def test_live_progress_waits_for_a_line_a_worker_is_still_writing(tmp_path: Path) -> None:
    import io

    path = tmp_path / demo.RESULTS
    run = {"at": 0, "placement": "cluster", "claim": "slot", "job": "report-every-2s",
           "occurrence": "2026-01-01T10:00:02Z", "sent_by": "node-a", "ran_on": "node-b"}
    line = json.dumps(run).encode() + b"\n"
    out = io.StringIO()
    progress = demo.Progress(path, out)
    progress.poll()  # no file yet
    path.write_bytes(line + b"\x00" * 10 + b"\n" + b'{"partial')  # a write in flight
    progress.poll()
    assert out.getvalue().count("sent by node-a  ran on node-b") == 1
    assert progress.offset == len(line)
    path.write_bytes(line + line)  # the write has landed
    progress.poll()
    assert out.getvalue().count("sent by node-a  ran on node-b") == 2
    assert progress.offset == 2 * len(line)


def test_filesystem_bindings_are_declared_before_the_workers_start(tmp_path: Path) -> None:
    """kombu's filesystem transport races when workers create one binding file together;
    the demo writes every binding first, so the workers only read and extend them."""
    for folder in demo.filesystem_options(tmp_path).values():
        if isinstance(folder, str):
            Path(folder).mkdir(parents=True, exist_ok=True)
    demo.declare_filesystem_queues(tmp_path, "abc")
    control = tmp_path / "broker" / "control"
    node_bindings = json.loads((control / "elarion.node.exchange").read_text())
    assert sorted(b[2] for b in node_bindings) == [f"elarion-demo-abc.node.{n}"
                                                   for n in sorted(NODES)]
    shared = json.loads((control / "elarion-demo-abc.exchange").read_text())
    assert [b[2] for b in shared] == ["elarion-demo-abc"]


def test_the_demo_broker_never_shows_a_half_written_message(tmp_path: Path) -> None:
    """kombu's filesystem transport creates ``<name>.msg`` before writing it: a worker
    that moves and reads it then gets an empty payload and dies (JSONDecodeError, seen
    in a CI run). The demo's transport writes a ``.part`` file and renames it; no
    kombu version reads the ``.part`` file as a message."""
    import json

    import pytest
    from kombu import Connection
    from kombu.transport import filesystem

    from celery_elarion_beat.demo.transport import Transport, part_path

    options = demo.filesystem_options(tmp_path)
    for folder in options.values():
        if isinstance(folder, str):
            Path(folder).mkdir(parents=True, exist_ok=True)
    messages = Path(options["data_folder_in"])
    with Connection(transport=Transport, transport_options=options) as conn:
        channel = conn.default_channel
        # what kombu's own writer leaves visible for a moment: an empty .msg file
        (messages / "1_a.q.msg").write_bytes(b"")
        with pytest.raises(json.JSONDecodeError):
            filesystem.Channel._get(channel, "q")
        # what ours leaves visible while writing: a .part file, which no reader takes
        partial = Path(part_path(str(messages / "2_b.q.msg")))
        assert partial.parent == messages and partial.name == "2_b.q.part"
        partial.write_bytes(b"")
        with pytest.raises(filesystem.Empty):
            channel._get("q")
        channel._put("q", {"body": "hello", "headers": {}})
        assert channel._get("q")["body"] == "hello"
        assert [p.name for p in messages.iterdir()] == ["2_b.q.part"]

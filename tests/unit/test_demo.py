# ruff: noqa: E501  (real beat log lines below)
"""The README's first command: ``python -m celery_elarion_beat.demo``.

The end-to-end tests run the demo as a user would: three real beat processes
and three real workers, on SQLite claims and kombu's filesystem broker (no
services, no ELARION_*/CELERY_* variables), then on PostgreSQL with Redis and
RabbitMQ. The verdict the demo prints is also written as JSON (``--json``), and
the tests assert it: zero duplicates, every cron occurrence has exactly one
winner that sent it and it ran once, every node ran the every-node job on its
own worker.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from celery_elarion_beat import demo
from tests.helpers.processes import clean_env

NODES = set(demo.NODES)


def run_demo(tmp_path: Path, seconds: float, extra_env: dict[str, str] | None = None,
             timeout: float = 240) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    verdict = tmp_path / "verdict.json"
    env = clean_env(extra_env)  # no ELARION_* / CELERY_* from the host
    done = subprocess.run(
        [sys.executable, "-m", "celery_elarion_beat.demo", "--seconds", str(seconds),
         "--json", str(verdict)],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    return done, json.loads(verdict.read_text())


def assert_sound(verdict: dict[str, Any], stdout: str, min_slots: int) -> None:
    """The guarantees the demo is there to show."""
    assert verdict["duplicates"] == 0 and verdict["problems"] == [] and verdict["ok"], stdout
    assert re.search(r"^duplicates: 0$", stdout, re.M), stdout
    rows = verdict["rows"]
    slots = [r for r in rows if r["kind"] == "slot"]
    windows = [r for r in rows if r["kind"] == "window"]
    assert len(slots) >= min_slots, stdout
    assert windows, stdout
    for r in slots + windows:
        # one winner in the claims table; it, and only it, sent the occurrence; ran once
        assert r["winner"] in NODES, r
        assert r["senders"] == [r["winner"]], r
        assert len(r["ran_on"]) == 1 and r["ran_on"][0] in NODES, r
        assert r["winner"] not in r["skipped_by"], r
        assert len(set(r["skipped_by"])) == len(r["skipped_by"]), r
        assert set(r["reasons"]) <= {"claimed-elsewhere"}, r
    # once all three beats run, every slot is decided by all three: one won, two skipped
    complete = [r for r in slots if {r["winner"], *r["skipped_by"]} == NODES]
    assert len(complete) >= len(slots) - 2, stdout
    # every node sent the every-node job, and its own worker ran it (node queues)
    assert set(verdict["every_node"]) == NODES, stdout
    for node, ran_on in verdict["every_node"].items():
        assert set(ran_on) == {node}, (node, ran_on)
        assert ran_on[node] >= 1
    # the claims table holds no occurrence nobody ran
    assert all(r["ran_on"] for r in rows), stdout


@pytest.mark.acceptance
def test_demo_without_services_runs_three_real_replicas_with_no_duplicates(
        tmp_path: Path) -> None:
    started = time.monotonic()
    done, verdict = run_demo(tmp_path, seconds=20)
    out = done.stdout
    assert "claims: sqlite:////" in out and "broker: filesystem://" in out, out
    assert_sound(verdict, out, min_slots=8)
    # live progress: a line per executed occurrence, with who sent it and who ran it
    progress = re.findall(r"^  \d\d:\d\d:\d\d  (\S+)\s+.*sent by (node-\w)\s+ran on (node-\w)$",
                          out, re.M)
    assert len(progress) == sum(len(r["ran_on"]) for r in verdict["rows"]) + sum(
        sum(c.values()) for c in verdict["every_node"].values()), out
    # the table and the per-node summary are printed
    assert re.search(r"^report-every-2s\s+\S+Z\s+slot\s+node-\w\s+node-\w, node-\w\s+node-\w\s+1$",
                     out, re.M), out
    assert re.search(r"^node-a\s+\d+\s+\d+\s+\d+\s+\d+$", out, re.M), out
    # it cleans up after itself: no process of it is left, its directory is gone
    workdir = re.search(r"work directory: (\S+)", out)
    assert workdir and not Path(workdir.group(1)).exists(), out
    for pid in re.findall(r"(?:worker|beat) (\d+)", out.split("started", 1)[1].splitlines()[0]):
        assert not _alive(int(pid)), f"demo process {pid} outlived the demo"
    assert time.monotonic() - started < 120


@pytest.mark.acceptance
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_demo_runs_the_same_on_postgresql_with_a_real_broker(
        tmp_path: Path, pg_dsn: str, redis_url: str, amqp_url: str, broker: str) -> None:
    url = redis_url if broker == "redis" else amqp_url
    done, verdict = run_demo(tmp_path, seconds=10,
                             extra_env={"ELARION_BEAT_DSN": pg_dsn, "CELERY_BROKER_URL": url})
    out = done.stdout
    assert "claims: postgresql://" in out and f"broker: {url.split(':')[0]}://" in out, out
    assert_sound(verdict, out, min_slots=3)
    # the run's own tables were dropped again
    table = re.search(r"tables (elarion_demo_\w+_claims) and (elarion_demo_\w+_nodes)", out)
    assert table, out
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        for name in table.groups():
            assert conn.execute("SELECT to_regclass(%s)", (name,)).fetchone() == (None,), name
    # and the run's queues were deleted from the broker
    queue = re.search(r"queues? (elarion-demo-\w+)", out)
    assert queue, out
    with demo.make_app({demo.ENV_BROKER: url}).connection_for_write() as conn:
        for name in (queue.group(1), *(f"{queue.group(1)}.node.{n}" for n in sorted(NODES))):
            assert not _queue_exists(conn, name), name


def _queue_exists(conn: Any, name: str) -> bool:
    if conn.transport.driver_type == "redis":
        return bool(conn.default_channel.client.exists(name))
    try:
        conn.channel().queue_declare(name, passive=True)
    except Exception as exc:  # amqp NotFound (404)
        assert "NOT_FOUND" in str(exc) or "404" in str(exc), exc
        return False
    return True


@pytest.mark.acceptance
def test_ctrl_c_stops_every_replica_and_still_prints_the_table(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery_elarion_beat.demo", "--seconds", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(),
        cwd=tmp_path)
    lines = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            lines.append(line)
            if "one line per executed occurrence" in line or time.monotonic() > deadline:
                break
        time.sleep(5)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + rest
    assert proc.returncode == 130, out
    assert "interrupted: stopping the replicas" in out and "duplicates: 0" in out, out
    pids = [int(p) for p in re.findall(r"(?:worker|beat) (\d+)",
                                       out.split("started", 1)[1].splitlines()[0])]
    assert len(pids) == 6, out
    time.sleep(0.5)
    assert not [p for p in pids if _alive(p)], out
    workdir = re.search(r"work directory: (\S+)", out)
    assert workdir and not Path(workdir.group(1)).exists(), out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too (it is reaped by its parent, which may be gone)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


# -- the verdict logic, on made-up inputs ------------------------------------------


def _claim(job: str, at: str, node: str, kind: str = "slot") -> SimpleNamespace:
    when = datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    return SimpleNamespace(job=job, occurrence=when, node=node, kind=kind)


LOGS = {
    "node-a": """
[2026-01-01 10:00:02,003: INFO/MainProcess] beat: Sending due task report-every-2s (elarion_demo.record) [slot 2026-01-01T10:00:02Z won]
[2026-01-01 10:00:03,004: INFO/MainProcess] beat: Skipping poll-every-3s at 2026-01-01T10:00:03Z (window 2.7s, claimed at 2026-01-01T10:00:03Z): claimed-elsewhere (winner node-b)
[2026-01-01 10:00:05,001: INFO/MainProcess] beat: Sending due task refresh-cache-every-5s (elarion_demo.record) [every node]
""",
    "node-b": """
[2026-01-01 10:00:02,005: INFO/MainProcess] beat: Skipping report-every-2s at 2026-01-01T10:00:02Z: claimed-elsewhere (winner node-a)
[2026-01-01 10:00:03,001: INFO/MainProcess] beat: Sending due task poll-every-3s (elarion_demo.record) [window at 2026-01-01T10:00:03Z won]
[2026-01-01 10:00:04,001: INFO/MainProcess] beat: Skipping report-every-2s at 2026-01-01T10:00:04Z: claim-error
""",
}


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


@pytest.mark.acceptance
def test_with_the_claims_database_unreachable_the_replicas_fail_closed(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery_elarion_beat.demo", "--seconds", "4"],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env=clean_env({"ELARION_BEAT_DSN": "postgresql://nobody@127.0.0.1:9/none"}))
    out = done.stdout
    assert done.returncode == 2, out + done.stderr
    assert "The beats failed closed" in out and "claim-error" in out, out
    assert re.search(r"^duplicates: 0$", out, re.M), out
    # no cluster occurrence ran; the every-node entry still did, on every node
    assert re.search(r"executions: 0$", out, re.M), out
    assert "Traceback" not in out + done.stderr


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

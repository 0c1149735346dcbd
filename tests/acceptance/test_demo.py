"""The demo end to end: `python -m celery_elarion_beat.demo` as a user runs it, with real
beat and worker processes (no services, then PostgreSQL with Redis and RabbitMQ)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from celery_elarion_beat import demo
from celery_elarion_beat.testing._harness import clean_env

# each test runs the demo: three beats and three workers
pytestmark = [pytest.mark.heavy]

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
# Redis, as the docs show it; RabbitMQ clusters are proven by the every-node and broker
# loss tests (three beats and workers on RabbitMQ), so the demo's run on it is left out
@pytest.mark.parametrize("broker", ["redis"])
def test_demo_runs_the_same_on_postgresql_with_a_real_broker(
        tmp_path: Path, pg_dsn: str, redis_url: str, amqp_url: str, broker: str) -> None:
    url = redis_url if broker == "redis" else amqp_url
    done, verdict = run_demo(tmp_path, seconds=10,
                             extra_env={"ELARION_BEAT_DSN": pg_dsn, "CELERY_BROKER_URL": url})
    out = done.stdout
    assert "claims: postgresql://" in out and f"broker: {url.split(':')[0]}://" in out, out
    assert_sound(verdict, out, min_slots=3)
    # the run's own tables were dropped again
    table = re.search(r"tables ((?:elarion_demo_\w+, )*elarion_demo_\w+), dropped", out)
    assert table, out
    names = table.group(1).split(", ")
    stem = names[0].removesuffix("_claims")
    assert names == [f"{stem}_{kind}" for kind in (
        "claims", "nodes", "pauses", "audit", "oneoffs", "foreign_beats", "entries",
        "revisions", "versions")], names
    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        for name in names:
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


@pytest.mark.acceptance
@pytest.mark.fault
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

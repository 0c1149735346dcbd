"""The shared harness (celery_elarion_beat.testing) on plain Python children and SQLite."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from celery_elarion_beat import ClaimRequest, Settings, open_store
from celery_elarion_beat.testing._harness import (
    ChildProcess,
    ProcessError,
    clean_env,
    drop_tables,
    read_claims,
    stop_all,
    wait_until,
)


def child(tmp_path: Path, code: str, name: str = "child") -> ChildProcess:
    return ChildProcess(name, [sys.executable, "-c", code], clean_env(), tmp_path / f"{name}.log",
                        tmp_path / name).start()


def test_clean_env_drops_the_parents_settings_and_adds_the_package(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELARION_BEAT_DSN", "postgresql://leak")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://leak")
    env = clean_env({"ELARION_BEAT_NODE": "n1"})
    assert "ELARION_BEAT_DSN" not in env and "CELERY_BROKER_URL" not in env
    assert env["ELARION_BEAT_NODE"] == "n1" and env["PYTHONUNBUFFERED"] == "1"
    package_root = Path(__file__).resolve().parents[2]
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(package_root)


def test_a_child_is_waited_for_by_log_pattern_and_by_json_record(tmp_path: Path) -> None:
    record = {"ts": "2026-01-01T00:00:00.000Z", "level": "INFO", "logger": "x",
              "message": "m", "action": "started"}
    p = child(tmp_path, "import time; print('booting'); "
                        f"print({json.dumps(json.dumps(record))}); time.sleep(60)")
    try:
        assert p.wait_for_log(r"boot(ing)", 20).group(1) == "ing"
        assert p.wait_for_record({"action": "started"}, 20)["logger"] == "x"
        assert p.records(action="started") and not p.records(action="other")
        assert p.lines("boot") == ["booting"]
    finally:
        assert p.terminate(10) == -signal.SIGTERM
    assert not p.alive()


def test_a_child_that_exits_fails_the_wait_at_once_with_its_log(tmp_path: Path) -> None:
    p = child(tmp_path, "import sys; print('bad config'); sys.exit(3)")
    started = time.monotonic()
    with pytest.raises(ProcessError, match=r"(?s)exited \(rc 3\) before logging.*bad config"):
        p.wait_for_log("never", 30)
    assert time.monotonic() - started < 15
    with pytest.raises(AssertionError):  # a failed wait fails a test, not an error in it
        wait_until(lambda: False, 0.1, message="nothing")


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout(tmp_path: Path) -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")
    stubborn, polite = child(tmp_path, code, "stubborn"), child(tmp_path, "import time; "
                                                                 "time.sleep(60)", "polite")
    stubborn.wait_for_log("ready", 20)
    stop_all([stubborn, polite], timeout=1)
    assert stubborn.returncode == -signal.SIGKILL and polite.returncode == -signal.SIGTERM


def test_claims_are_read_and_tables_dropped(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'claims.db'}"
    assert read_claims(dsn, "t_claims") == []  # no table yet
    store = open_store(Settings.from_mapping({"elarion_beat_dsn": dsn,
                                              "elarion_beat_table": "t_claims"}))
    slot = datetime(2026, 1, 1, 3, tzinfo=timezone.utc)
    store.claim("node-a", [ClaimRequest.for_slot("b", slot, "t2"),
                           ClaimRequest.for_slot("a", slot, "t1")])
    store.close()
    rows = read_claims(dsn, "t_claims")
    assert [(r.job, r.occurrence, r.node, r.kind) for r in rows] == [
        ("a", slot, "node-a", "slot"), ("b", slot, "node-a", "slot")]
    drop_tables(dsn, "t_claims", "t_nodes", "absent")
    assert read_claims(dsn, "t_claims") == []
    store = open_store(Settings.from_mapping({"elarion_beat_dsn": dsn,
                                              "elarion_beat_table": "x_claims"}))
    store.claim("n", [ClaimRequest.for_slot("a", slot, "t")])
    store.close()
    drop_tables(dsn, prefix="x_")
    assert read_claims(dsn, "x_claims") == []


class _Counting(ChildProcess):
    """A child whose signals are counted as they are sent (the OS coalesces two close
    SIGTERMs, so the child cannot always tell)."""

    sent: list[int]

    def signal(self, sig: int) -> None:
        self.sent.append(sig)
        super().signal(sig)


def test_stop_all_sends_one_sigterm(tmp_path: Path) -> None:
    """A process that takes a moment to shut down gets one SIGTERM, not a second one
    from the wait that follows (a beat hit by it during interpreter shutdown prints
    ``Exception ignored ... SystemExit``: a traceback in a healthy run)."""
    code = ("import signal, time\n"
            "seen = []\n"
            "signal.signal(signal.SIGTERM, lambda *_: seen.append(time.time()))\n"
            "print('ready', flush=True)\n"
            "while not seen:\n"
            "    time.sleep(0.01)\n"
            "time.sleep(1.0)  # a slow shutdown\n")
    slow = _Counting("slow", [sys.executable, "-c", code], clean_env(), tmp_path / "slow.log",
                     tmp_path / "slow")
    slow.sent = []
    slow.start().wait_for_log("ready", 20)
    stop_all([slow], timeout=10)
    assert slow.returncode == 0
    # the SIGKILL after the exit is the group's stragglers' (the leader is gone)
    assert slow.sent == [signal.SIGTERM, signal.SIGKILL]

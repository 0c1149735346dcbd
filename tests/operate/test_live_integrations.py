"""Database entries seen as code entries are (live schedules): ``preview`` (an edit still
to come shown from its effective time), ``status`` (the entries, the dead-man check from
the revision's effective time, a node behind the database entries told apart from
drift), ``trigger``/``pause`` of a database entry, and ``simulate()``; against the real
PostgreSQL (simulate: the memory store)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_elarion_beat import live_schedules as live
from celery_elarion_beat.operate.status import build_status
from celery_elarion_beat.store.postgres import PostgresClaimStore
from celery_elarion_beat.store.records import NodeState
from celery_elarion_beat.testing import simulate
from tests.operate import proj_live
from tests.operate.support import invoke, settings_for

APP = "tests.operate.proj_live"
UTC = timezone.utc


@pytest.fixture
def db(pg_dsn: str, table_name: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(proj_live.app.conf, "elarion_beat_dsn", pg_dsn)
    monkeypatch.setitem(proj_live.app.conf, "elarion_beat_table", table_name)
    store = PostgresClaimStore(settings_for(pg_dsn, table_name, elarion_beat_db_entries=True))
    store.ensure_schema()
    yield store
    store.close()


def test_preview_shows_database_entries_and_an_edit_from_its_effective_time(db) -> None:
    now = db.clock().replace(microsecond=0)
    live.add_entry(proj_live.app, "hourly", "live.job", {"crontab": "0 * * * *"})
    later = (now + timedelta(hours=3)).replace(minute=30, second=0)
    live.edit_entry(proj_live.app, "hourly", schedule={"crontab": "15 * * * *"},
                    effective=later)
    code, out = invoke("preview", "--from", now.isoformat(), "--hours", "6", "--json",
                       app=APP)
    assert code == 0, out
    rows = [r for r in json.loads(out)["occurrences"] if r["job"] == "hourly"]
    minutes = [(datetime.fromisoformat(r["utc"].replace("Z", "+00:00")) >= later,
                datetime.fromisoformat(r["utc"].replace("Z", "+00:00")).minute) for r in rows]
    assert minutes and all(m == 0 for after, m in minutes if not after)
    assert all(m == 15 for after, m in minutes if after)
    assert any(after for after, _ in minutes) and any(not after for after, _ in minutes)


def test_status_reports_database_entries_and_a_node_behind_them(db, pg_dsn, table_name
                                                                ) -> None:
    live.add_entry(proj_live.app, "nightly", "live.job", {"cron": "0 0 3 * * *"})
    settings = settings_for(pg_dsn, table_name, elarion_beat_db_entries=True,
                            elarion_beat_db_entry_tasks="live.*")
    report = build_status(proj_live.app, settings, db)
    assert "nightly" in [e.name for e in report.entries]
    assert report.entries_version == 1 and report.behind == {}
    # two nodes with the same code: one holds version 1, one still 0 (it missed the add)
    for node, version in (("node-a", 1), ("node-b", 0)):
        db.heartbeat(NodeState(node, str(uuid.uuid4()), "x", "same-code", {},
                               entries_version=version))
    report = build_status(proj_live.app, settings, db)
    assert report.drift == {} and report.behind == {}  # written just now: hearing takes time
    with db.engine.begin() as conn:  # the add was written a minute ago
        conn.exec_driver_sql(f"UPDATE {db._quoted(db.revisions)} "
                             "SET at = at - interval '1 minute'")
    report = build_status(proj_live.app, settings, db)
    assert report.behind == {"node-b": 0} and report.drift == {}
    assert "behind" in report.findings and "drift" not in report.findings
    code, out = invoke("status", app=APP)
    assert code == 1 and "BEHIND the database entries (version 1): node-b" in out


def test_trigger_and_pause_take_database_entries(db) -> None:
    live.add_entry(proj_live.app, "nightly", "live.job", {"cron": "0 0 3 * * *"},
                   args=[7])
    code, out = invoke("pause", "nightly", "--reason", "check", app=APP)
    assert code == 0, out
    code, out = invoke("resume", "nightly", app=APP)
    assert code == 0, out
    code, out = invoke("trigger", "nightly", "--json", app=APP)
    assert code in (0, 1), out  # sent, or the memory broker refused: the claim exists
    assert [r.kind for r in db.find_claims(job="nightly")] == ["manual"]


def test_simulate_runs_the_database_entries_too() -> None:
    name = f"sim-{uuid.uuid4().hex}"
    app = Celery(f"simlive{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.update(elarion_beat_dsn=f"memory://{name}", elarion_beat_db_entries=True,
                    elarion_beat_db_entry_tasks="live.*", timezone="UTC",
                    beat_schedule={})
    live.add_entry(app, "every-10", "live.job", {"cron": "*/10 * * * * *"})
    sent = simulate(app, "2026-05-01T00:00:00Z", "2026-05-01T00:01:00Z")
    assert [(o.job, o.slot.second) for o in sent] == [("every-10", s)
                                                      for s in (0, 10, 20, 30, 40, 50)]

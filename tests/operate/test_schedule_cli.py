"""``celery -A proj elarion-beat schedule ...`` and the live-schedules API against the real
PostgreSQL: every verb, bad input refused naming the option (nothing written, exit 2),
conflicts (exit 1), export and an idempotent import (one version bump per file), and a
change committed (or rolled back) with the caller's own transaction."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from sqlalchemy import create_engine, text

from celery_elarion_beat import Settings
from celery_elarion_beat import live_schedules as live
from celery_elarion_beat.exceptions import ConfigurationError, EntryConflict
from celery_elarion_beat.store.postgres import PostgresClaimStore
from tests.operate import proj_live
from tests.operate.support import invoke, settings_for

APP = "tests.operate.proj_live"
#: the app's cluster, whose entries the CLI and the API write (the run pins it)
CLUSTER = Settings.from_app(proj_live.app).require_cluster()


@pytest.fixture
def db(pg_dsn: str, table_name: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(proj_live.app.conf, "elarion_beat_dsn", pg_dsn)
    monkeypatch.setitem(proj_live.app.conf, "elarion_beat_table", table_name)
    store = PostgresClaimStore(settings_for(pg_dsn, table_name, elarion_beat_db_entries=True))
    store.ensure_schema()
    yield store
    store.close()


def run(*args: str) -> tuple[int, str]:
    return invoke("schedule", *args, app=APP)


def listed() -> dict[str, dict]:
    code, out = run("list", "--json")
    assert code == 0, out
    return {item["name"]: item for item in json.loads(out)}


def test_add_list_edit_disable_enable_history_remove(db: PostgresClaimStore) -> None:
    code, out = run("add", "nightly", "--task", "live.job", "--cron", "0 0 3 * * *",
                    "--tz", "Europe/Berlin", "--args-json", "[1, \"a\"]", "--reason", "new")
    assert code == 0, out
    assert "added nightly: live.job cron 0 0 3 * * * Europe/Berlin enabled, revision 1" in out
    entries = listed()
    assert {"name", "task", "schedule", "source", "enabled", "revision"} <= set(
        entries["nightly"])
    assert entries["nightly"] | {} == entries["nightly"]
    assert (entries["nightly"]["source"], entries["nightly"]["revision"],
            entries["nightly"]["schedule"], entries["nightly"]["runs"]) == (
        "database", 1, "cron 0 0 3 * * * Europe/Berlin", "database")
    assert entries["report"]["source"] == "code" and entries["report"]["revision"] is None
    code, out = run("edit", "nightly", "--kwargs-json", '{"days": 7}', "--revision", "1")
    assert code == 0, out
    view = live.get_entry(proj_live.app, "nightly")
    assert view.definition is not None and view.definition.args == (1, "a")  # kept
    assert dict(view.definition.kwargs) == {"days": 7} and view.revision == 2
    assert run("disable", "nightly", "--reason", "holiday")[0] == 0
    assert listed()["nightly"]["enabled"] is False
    assert listed()["nightly"]["runs"] is None
    assert run("enable", "nightly")[0] == 0
    code, out = run("history", "nightly", "--json")
    assert code == 0
    actions = [json.loads(line)["action"] for line in out.splitlines()]
    assert actions == ["enable", "disable", "edit", "add"]
    assert json.loads(out.splitlines()[1])["reason"] == "holiday"
    assert run("remove", "nightly")[0] == 0
    assert "nightly" not in listed()
    assert db.entries_version(CLUSTER) == 5


@pytest.mark.parametrize(("args", "names"), [
    (["--task", "live.job", "--cron", "0 3 * * *"], "--cron: cron '0 3 * * *' has 5 fields"),
    (["--task", "live.job", "--crontab", "0 0 3 * * *"], "--crontab: crontab"),
    (["--task", "live.job", "--cron", "0 0 3 * * *", "--tz", "Mars/Olympus"], "--tz"),
    (["--task", "evil.tasks.rm", "--every", "60"], "--task: 'evil.tasks.rm' is not allowed"),
    (["--task", "live.job", "--every", "0"], "more than 0 seconds"),
    (["--task", "live.job", "--every", "60", "--args-json", "{nope"], "--args-json"),
    (["--task", "live.job", "--every", "60", "--kwargs-json", "[1]"], "--kwargs-json"),
    (["--task", "live.job", "--every", "60", "--options-json", '{"placement": "x"}'],
     "--options-json"),
    (["--task", "live.job", "--every", "60", "--effective", "2030-01-01T00:00"], "--effective"),
    (["--task", "live.job", "--every", "60", "--cron", "0 0 3 * * *"], "not --cron and"),
    (["--every", "60"], "--task is required"),
    (["--task", "live.job"], "give the schedule"),
])
def test_bad_input_names_the_option_and_writes_nothing(db: PostgresClaimStore, args: list,
                                                       names: str) -> None:
    code, out = run("add", "job", *args)
    assert code == 2, out
    assert names in out
    assert db.entries_version(CLUSTER) == 0


def test_conflicts_and_missing_entries_exit_1(db: PostgresClaimStore) -> None:
    code, out = run("add", "report", "--task", "live.job", "--every", "60")
    assert code == 1 and "schedule override report" in out  # a code entry's name
    assert run("add", "job", "--task", "live.job", "--every", "60")[0] == 0
    code, out = run("add", "job", "--task", "live.job", "--every", "60")
    assert code == 1 and "exists" in out
    code, out = run("edit", "job", "--every", "30", "--revision", "7")
    assert code == 1 and "revision 1, not 7" in out
    code, out = run("remove", "nope")
    assert code == 1 and "no database entry is named 'nope'" in out
    assert db.entries_version(CLUSTER) == 1


def test_export_then_import_is_idempotent_one_bump_per_file(db: PostgresClaimStore,
                                                            tmp_path) -> None:
    for name in ("a", "b", "c"):
        assert run("add", name, "--task", "live.job", "--every", "60")[0] == 0
    code, out = run("export")
    assert code == 0
    data = json.loads(out)
    assert sorted(data["entries"]) == ["a", "b", "c"]
    path = tmp_path / "entries.json"
    path.write_text(json.dumps(data))
    code, out = run("import", str(path), "--json")
    assert code == 0 and json.loads(out)["version"] is None  # nothing changed
    assert db.entries_version(CLUSTER) == 3
    data["entries"]["a"]["schedule"] = {"every": 30}
    data["entries"]["d"] = {"task": "live.job", "schedule": {"crontab": "0 4 * * *"}}
    del data["entries"]["c"]
    yaml_path = tmp_path / "entries.yaml"
    code, out = run("export", "--yaml")
    assert code == 0 and "entries:" in out
    path.write_text(json.dumps(data))
    code, out = run("import", str(path), "--dry-run", "--prune")
    assert code == 0 and "would add 1, change 1, remove 1" in out
    assert db.entries_version(CLUSTER) == 3
    code, out = run("import", str(path), "--prune", "--reason", "release 42")
    assert code == 0 and "version 4" in out  # one bump for three changes
    assert sorted(listed()) == ["a", "b", "d", "poll", "report"]
    assert {r.reason for r in db.entry_changes(CLUSTER, 3).revisions} == {"release 42"}
    assert run("import", str(path), "--prune")[1].startswith("import (version None)")
    yaml_path.write_text("entries:\n  e: {task: live.job, schedule: {every: 5}}\n")
    code, out = run("import", str(yaml_path))
    assert code == 0 and "did add 1" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"entries": {"x": {"task": "live.job",
                                                 "schedule": {"every": -1}}}}))
    code, out = run("import", str(bad))
    assert code == 2 and "every" in out
    assert db.entries_version(CLUSTER) == 5


def test_override_replaces_a_code_entry_and_remove_brings_it_back(db: PostgresClaimStore
                                                                  ) -> None:
    code, out = run("override", "report", "--crontab", "30 * * * *", "--reason", "later")
    assert code == 0, out
    entry = listed()["report"]
    assert (entry["source"], entry["overrides"], entry["runs"], entry["task"]) == (
        "database", True, "database", "live.report")  # the code entry's task, kept
    assert entry["schedule"] == "crontab 30 * * * *"
    code, out = run("override", "job")
    assert code == 2 and "no code entry" in out
    assert run("remove", "report")[0] == 0
    assert listed()["report"]["source"] == "code"


def test_a_change_commits_with_the_callers_transaction(db: PostgresClaimStore,
                                                       pg_dsn: str) -> None:
    engine = create_engine(db.engine.url)
    try:
        with engine.connect() as conn:
            trans = conn.begin()
            conn.execute(text("SELECT 1"))
            live.add_entry(proj_live.app, "outbox", "live.job", {"every": 60},
                           connection=conn, reason="with my order")
            trans.rollback()
        assert db.entries_version(CLUSTER) == 0
        with engine.begin() as conn:
            live.add_entry(proj_live.app, "outbox", "live.job", {"every": 60},
                           connection=conn)
        assert db.entries_version(CLUSTER) == 1
    finally:
        engine.dispose()
    with psycopg.connect(pg_dsn) as pconn:
        live.edit_entry(proj_live.app, "outbox", schedule={"every": 30}, connection=pconn)
        pconn.rollback()
    assert live.get_entry(proj_live.app, "outbox").schedule == "every 60s"
    with psycopg.connect(pg_dsn) as pconn:
        pconn.execute("SELECT 1")
        live.edit_entry(proj_live.app, "outbox", schedule={"every": 30}, connection=pconn,
                        revision=1)
        with pytest.raises(EntryConflict):  # refused in its savepoint: the rest goes on
            live.edit_entry(proj_live.app, "outbox", schedule={"every": 20},
                            connection=pconn, revision=1)
    assert live.get_entry(proj_live.app, "outbox").schedule == "every 30s"


def test_the_api_checks_before_it_writes(db: PostgresClaimStore) -> None:
    with pytest.raises(ConfigurationError, match="^effective: .* no time zone"):
        live.add_entry(proj_live.app, "x", "live.job", {"every": 5},
                       effective=datetime(2030, 1, 1))
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    entry = live.add_entry(proj_live.app, "x", "live.job", '{"every": 5}', effective=later)
    assert abs((entry.effective_at - later).total_seconds()) < 0.01
    bulk = live.apply_changes(proj_live.app, [
        live.Change("add", "y", "live.job", {"every": 7}),
        live.Change("disable", "x"),
    ], reason="bulk")
    assert bulk.version == 2 and [e.revision for e in bulk.entries if e] == [2, 2]

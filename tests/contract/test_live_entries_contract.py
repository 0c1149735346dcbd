"""The database entries' contract (live schedules), run against every backend: memory,
PostgreSQL (both claims layouts), SQLite and MariaDB (the real servers).

Writes (one version per write, conflicts, effective times), the change feed the nodes
load, and the revision check of the claims; on the SQL backends also raw SQL edits (the
triggers) and a write on the caller's connection."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from sqlalchemy import create_engine, event, text

from celery_elarion_beat.config.live_entries import EntryDefinition
from celery_elarion_beat.config.settings import DEFAULT_CLUSTER
from celery_elarion_beat.exceptions import (
    ConfigurationError,
    EntryConflict,
    EntryNotFound,
)
from celery_elarion_beat.store.entry_records import EntryChange
from celery_elarion_beat.store.interface import ClaimStore
from celery_elarion_beat.store.records import ClaimRequest

#: the stores' cluster (make_store()): the one whose entries their claims check
CLUSTER = DEFAULT_CLUSTER


def definition(task: str = "proj.tasks.report", every: float | None = None,
               cron: str = "0 */5 * * * *", args: tuple = (), enabled: bool = True
               ) -> EntryDefinition:
    schedule = {"every": every} if every is not None else {"cron": cron}
    return EntryDefinition.of(task, schedule, args, {"days": 7}, {"queue": "q"}, enabled)


def add(store: ClaimStore, name: str, **kw) -> int:
    wrote = store.write_entries(CLUSTER, [EntryChange("add", name, definition(**kw))],
                                "alice@host (cli)", "a reason")
    assert wrote.version is not None
    return wrote.version


def sql_store(store: ClaimStore) -> bool:
    return getattr(store, "engine", None) is not None


def test_an_add_is_one_revision_and_one_version(make_store) -> None:
    store = make_store()
    assert store.entries_version(CLUSTER) == 0
    wrote = store.write_entries(CLUSTER, [EntryChange("add", "report", definition())],
                                "alice@host (cli)", "nightly numbers")
    assert wrote.version == 1 == store.entries_version(CLUSTER)
    (entry,) = wrote.entries
    assert entry is not None and entry.revision == 1 and entry.name == "report"
    assert entry.definition == definition()
    assert entry.actor == "alice@host (cli)" and entry.reason == "nightly numbers"
    assert entry.effective_at.tzinfo is not None
    snapshot = store.live_entries(CLUSTER)
    assert snapshot.version == 1 and snapshot.entries == [entry]
    (rev,) = store.entry_history(CLUSTER, "report")
    assert (rev.action, rev.revision, rev.actor) == ("add", 1, "alice@host (cli)")
    assert rev.definition == definition()


def test_a_bulk_write_bumps_the_version_once(make_store) -> None:
    store = make_store()
    add(store, "a")
    wrote = store.write_entries(CLUSTER, [
        EntryChange("add", "b", definition()), EntryChange("add", "c", definition(every=30)),
        EntryChange("edit", "a", definition(task="proj.tasks.other"))], "bob", "import")
    assert wrote.version == 2 == store.entries_version(CLUSTER)
    assert [e.revision for e in wrote.entries if e] == [2, 2, 2]
    changes = store.entry_changes(CLUSTER, 1)
    assert changes.version == 2
    assert [(r.name, r.action, r.revision) for r in changes.revisions] == [
        ("a", "edit", 2), ("b", "add", 2), ("c", "add", 2)]


def test_a_stale_revision_is_refused_and_nothing_is_written(make_store) -> None:
    store = make_store()
    add(store, "report")
    store.write_entries(CLUSTER, [EntryChange("edit", "report", definition(args=(1,)),
                                              expected=1)], "alice")
    with pytest.raises(EntryConflict) as refused:
        store.write_entries(CLUSTER, [
            EntryChange("add", "other", definition()),
            EntryChange("edit", "report", definition(args=(2,)), expected=1)], "bob")
    assert refused.value.current == 2
    assert store.entries_version(CLUSTER) == 2  # the add of 'other' went with it
    assert [e.name for e in store.live_entries(CLUSTER).entries] == ["report"]


def test_names_taken_and_missing_are_refused(make_store) -> None:
    store = make_store()
    add(store, "report")
    with pytest.raises(EntryConflict):
        store.write_entries(CLUSTER, [EntryChange("add", "report", definition())], "a")
    with pytest.raises(EntryNotFound):
        store.write_entries(CLUSTER, [EntryChange("edit", "nope", definition())], "a")
    with pytest.raises(EntryNotFound):
        store.write_entries(CLUSTER, [EntryChange("remove", "nope")], "a")
    with pytest.raises(ConfigurationError, match="changed twice"):
        store.write_entries(CLUSTER, [EntryChange("remove", "report"),
                                      EntryChange("remove", "report")], "a")
    assert store.entries_version(CLUSTER) == 1


def test_a_write_that_changes_nothing_writes_nothing(make_store) -> None:
    store = make_store()
    add(store, "report")
    again = store.write_entries(CLUSTER, [EntryChange("edit", "report", definition())], "a")
    assert again.version is None and again.entries[0] is not None
    enabled = store.write_entries(CLUSTER, [EntryChange("enable", "report", definition())],
                                  "a")
    assert enabled.version is None
    assert store.entries_version(CLUSTER) == 1


def test_enable_disable_and_remove_are_named_in_the_history(make_store) -> None:
    store = make_store()
    add(store, "report")
    store.write_entries(CLUSTER, [EntryChange("disable", "report",
                                              definition(enabled=False))], "a", "holiday")
    store.write_entries(CLUSTER, [EntryChange("enable", "report", definition())], "a")
    store.write_entries(CLUSTER, [EntryChange("remove", "report")], "a", "gone")
    history = store.entry_history(CLUSTER, "report")
    assert [(r.action, r.revision) for r in history] == [
        ("remove", 4), ("enable", 3), ("disable", 2), ("add", 1)]
    assert history[0].reason == "gone" and history[0].definition == definition()
    assert store.live_entries(CLUSTER).entries == []


def test_a_delete_and_a_recreate_are_two_changes_and_revisions_never_repeat(make_store
                                                                            ) -> None:
    store = make_store()
    add(store, "report")
    store.write_entries(CLUSTER, [EntryChange("remove", "report")], "a")
    store.write_entries(CLUSTER, [EntryChange("add", "report", definition(args=(9,)))], "a")
    changes = store.entry_changes(CLUSTER, 1)
    assert [(r.action, r.revision) for r in changes.revisions] == [("remove", 2), ("add", 3)]
    (entry,) = store.live_entries(CLUSTER).entries
    assert entry.revision == 3 and entry.definition.args == (9,)


def test_effective_times_in_the_past_are_refused_and_future_ones_kept(make_store) -> None:
    store = make_store()
    add(store, "report")
    now = store.clock()
    with pytest.raises(ConfigurationError, match="effective"):
        store.write_entries(CLUSTER, [EntryChange("edit", "report", definition(args=(1,)),
                                                  effective_at=now - timedelta(hours=1))], "a")
    later = now + timedelta(minutes=10)
    wrote = store.write_entries(CLUSTER, [EntryChange("edit", "report", definition(args=(1,)),
                                                      effective_at=later)], "a")
    entry = wrote.entries[0]
    assert entry is not None and abs((entry.effective_at - later).total_seconds()) < 0.001
    (rev, _) = store.entry_history(CLUSTER, "report")
    assert abs((rev.effective_at - later).total_seconds()) < 0.001


def test_clusters_never_see_each_other(make_store) -> None:
    store = make_store()
    add(store, "report")
    other = store.write_entries("svc_b", [EntryChange("add", "report", definition(every=5))],
                                "b")
    assert other.version == 1 and store.entries_version(CLUSTER) == 1
    assert store.live_entries("svc_b").entries[0].definition.schedule.kind == "every"
    assert store.live_entries(CLUSTER).entries[0].definition.schedule.kind == "cron"


# -- the claims' revision check --------------------------------------------------------


def claim(store: ClaimStore, job: str, slot: datetime, revision: int | None,
          node: str = "node-a"):
    request = ClaimRequest.for_slot(job, slot, str(uuid.uuid4()), revision=revision)
    (result,) = store.claim(node, [request])
    return result


def test_a_claim_under_the_governing_revision_wins_and_records_it(make_store) -> None:
    store = make_store()
    add(store, "report")
    slot = store.clock().replace(microsecond=0) + timedelta(seconds=1)
    won = claim(store, "report", slot, revision=1)
    assert won.won and not won.stale
    (row,) = store.find_claims(job="report")
    assert row.revision == 1
    # a code entry's claim carries no revision: unchanged
    assert claim(store, "code-entry", slot, revision=None).won
    assert store.find_claims(job="code-entry")[0].revision is None


def test_a_stale_revision_is_refused_and_writes_nothing(make_store) -> None:
    store = make_store()
    add(store, "report")
    store.write_entries(CLUSTER, [EntryChange("edit", "report", definition(args=(1,)))], "a")
    slot = store.clock().replace(microsecond=0) + timedelta(seconds=1)
    refused = claim(store, "report", slot, revision=1)
    assert refused.stale and not refused.won
    assert store.find_claims(job="report") == []
    assert claim(store, "report", slot, revision=2).won  # the node re-decides: wins


def test_before_a_future_edit_the_old_revision_governs(make_store) -> None:
    store = make_store()
    add(store, "report")
    now = store.clock()
    edit_at = now.replace(microsecond=0) + timedelta(minutes=10)
    store.write_entries(CLUSTER, [EntryChange("edit", "report", definition(args=(1,)),
                                              effective_at=edit_at)], "a")
    before, after = edit_at - timedelta(seconds=1), edit_at
    assert claim(store, "report", before, revision=2).stale
    assert claim(store, "report", before, revision=1).won
    assert claim(store, "report", after, revision=1).stale
    assert claim(store, "report", after, revision=2).won


def test_a_removed_entry_claims_nothing_after_its_removal(make_store) -> None:
    store = make_store()
    add(store, "report")
    store.write_entries(CLUSTER, [EntryChange("remove", "report")], "a")
    slot = store.clock().replace(microsecond=0) + timedelta(seconds=1)
    assert claim(store, "report", slot, revision=1).stale


def test_a_stale_window_claim_is_refused(make_store) -> None:
    store = make_store()
    add(store, "poll", every=10)
    store.write_entries(CLUSTER, [EntryChange("edit", "poll", definition(every=20))], "a")
    request = ClaimRequest.for_window("poll", timedelta(seconds=9), str(uuid.uuid4()),
                                      revision=1)
    (result,) = store.claim("node-a", [request])
    assert result.stale and store.find_claims(job="poll") == []
    request = ClaimRequest.for_window("poll", timedelta(seconds=9), str(uuid.uuid4()),
                                      revision=2)
    (result,) = store.claim("node-a", [request])
    assert result.won and store.find_claims(job="poll")[0].revision == 2


# -- the SQL backends: raw SQL and the caller's connection ---------------------------


def _raw(store, statement: str, **params) -> None:
    engine = create_engine(store.engine.url)
    try:
        with engine.begin() as conn:
            conn.execute(text(statement), params)
    finally:
        engine.dispose()


def _caller_engine(store):
    """An application's engine on the claims database (pysqlite needs SQLAlchemy's
    documented recipe for real transactions and savepoints)."""
    engine = create_engine(store.engine.url)
    if engine.dialect.name == "sqlite":
        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection, _record) -> None:
            dbapi_connection.isolation_level = None

        @event.listens_for(engine, "begin")
        def _begin(conn) -> None:
            conn.exec_driver_sql("BEGIN")
    return engine


def _key(store, value: str):
    return value.encode() if store.engine.dialect.name in ("mysql", "mariadb") else value


def test_a_raw_sql_update_is_a_revision_and_a_version(make_store) -> None:
    store = make_store()
    if not sql_store(store):
        pytest.skip("raw SQL needs a SQL database")  # the memory store has no SQL
    add(store, "report")
    t = store._quoted(store.entries)
    _raw(store, f"UPDATE {t} SET task = 'proj.tasks.other' WHERE name = :n",
         n=_key(store, "report"))
    assert store.entries_version(CLUSTER) == 2
    (entry,) = store.live_entries(CLUSTER).entries
    assert entry.revision == 2 and entry.definition.task == "proj.tasks.other"
    assert entry.actor.startswith("sql")
    rev = store.entry_changes(CLUSTER, 1).revisions[0]
    assert (rev.action, rev.revision) == ("edit", 2) and rev.actor.startswith("sql")
    assert rev.effective_at >= entry.updated_at - timedelta(seconds=1)
    _raw(store, f"UPDATE {t} SET enabled = :off WHERE name = :n", off=False,
         n=_key(store, "report"))
    assert store.entry_changes(CLUSTER, 2).revisions[0].action == "disable"


def test_a_raw_delete_and_insert_in_one_transaction_are_both_seen(make_store) -> None:
    store = make_store()
    if not sql_store(store):
        pytest.skip("raw SQL needs a SQL database")
    add(store, "report")
    t = store._quoted(store.entries)
    engine = create_engine(store.engine.url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {t} WHERE name = :n"), {"n": _key(store, "report")})
            conn.execute(text(
                f"INSERT INTO {t} (cluster, name, task, schedule, args, kwargs, options, "
                "enabled, overrides, restart, revision) VALUES (:c, :n, 'proj.tasks.report', "
                "'{\"every\": 60}', '[]', '{}', '{}', :on, :off, :off, 0)"),
                {"c": _key(store, CLUSTER), "n": _key(store, "report"), "on": True,
                 "off": False})
    finally:
        engine.dispose()
    changes = store.entry_changes(CLUSTER, 1)
    assert [(r.action, r.revision) for r in changes.revisions] == [("remove", 2), ("add", 3)]
    (entry,) = store.live_entries(CLUSTER).entries
    assert entry.revision == 3 and entry.definition.schedule.every == 60
    slot = store.clock().replace(microsecond=0) + timedelta(seconds=1)
    assert claim(store, "report", slot, revision=1).stale


def test_a_write_on_the_callers_connection_commits_with_it(make_store) -> None:
    store = make_store()
    if not sql_store(store):
        pytest.skip("a caller's connection needs a SQL database")
    add(store, "report")  # the tables exist
    engine = _caller_engine(store)
    try:
        with engine.connect() as conn:
            trans = conn.begin()
            store.write_entries(CLUSTER, [EntryChange("add", "kept", definition())], "a",
                                connection=conn)
            with pytest.raises(EntryConflict):  # refused: the caller's transaction goes on
                store.write_entries(CLUSTER, [EntryChange("add", "kept", definition())],
                                    "a", connection=conn)
            if store.engine.dialect.name != "sqlite":  # (SQLite: the caller holds its lock)
                assert store.entries_version(CLUSTER) == 1  # not committed yet
            trans.rollback()
        assert store.entries_version(CLUSTER) == 1
        with engine.begin() as conn:
            wrote = store.write_entries(CLUSTER, [EntryChange("add", "kept", definition())],
                                        "a", connection=conn)
        assert wrote.version == 2 == store.entries_version(CLUSTER)
    finally:
        engine.dispose()

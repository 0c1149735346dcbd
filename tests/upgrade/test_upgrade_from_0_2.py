"""Tables of 0.2, upgraded: the release before clusters makes them and writes a row of
each kind (:mod:`.fill_0_2`, run by that release: :mod:`.old_release`), then this
version starts on them, and ``init-db`` finishes the upgrade. On every SQL backend:
PostgreSQL (both claims layouts), SQLite and MariaDB.

* beat's start adds the cluster column (its default: the app that starts) and keeps
  the keys of 0.2, so nodes of 0.2 go on claiming; the census says the tables still
  need ``init-db`` and names the node of 0.2 still alive;
* ``init-db`` refuses while that node is alive (``--force`` does it anyway), and
  once it is gone swaps every key for one that starts with the cluster;
* every row of 0.2 is kept, in the cluster of the app that upgraded; another app
  then wins the same slot in its own cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from celery_elarion_beat import ClaimRequest, Settings, UpgradeRefused, open_store
from celery_elarion_beat.store.interface import ClaimStore
from celery_elarion_beat.testing._harness import claims_tables, drop_tables
from tests.upgrade.old_release import old_env

SLOT = datetime(2026, 11, 29, 3, tzinfo=timezone.utc)
FILL = Path(__file__).with_name("fill_0_2.py")
A, B = "svc_a", "svc_b"
#: the node of 0.2 counts as alive this long after its one heartbeat (long: a loaded
#: machine must not let it die before the census), then as gone after GONE
NODE_TIMEOUT = 300.0
GONE = 0.5

BACKENDS = [pytest.param("postgres", marks=pytest.mark.postgres),
            pytest.param("postgres-partitioned", marks=pytest.mark.postgres),
            pytest.param("sqlite", marks=pytest.mark.sqlite),
            pytest.param("mysql", marks=pytest.mark.mysql)]


@pytest.fixture(params=BACKENDS)
def tables_of_0_2(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The settings of a claims table that the release before clusters made and filled."""
    table = f"up_{uuid.uuid4().hex[:12]}"
    layout = "partitioned" if request.param == "postgres-partitioned" else "plain"
    if request.param.startswith("postgres"):
        dsn = request.getfixturevalue("pg_dsn")
    elif request.param == "mysql":
        dsn = request.getfixturevalue("mysql_dsn")
    else:
        dsn = f"sqlite:///{tmp_path / 'claims.db'}"
    filled = subprocess.run([sys.executable, str(FILL), dsn, table, layout],
                            capture_output=True, text=True, timeout=120, env=old_env())
    try:
        assert filled.returncode == 0, filled.stdout + filled.stderr
        yield {"elarion_beat_dsn": dsn, "elarion_beat_table": table,
               "elarion_beat_claims_layout": layout,
               "elarion_beat_heartbeat_interval": 1.0,
               "elarion_beat_node_timeout": NODE_TIMEOUT}
    finally:
        if not dsn.startswith("sqlite"):
            drop_tables(dsn, *claims_tables(table))


#: the tables that came after 0.2
AFTER_0_2 = ("_foreign_beats", "_entries", "_revisions", "_versions")


def store_of(values: dict[str, Any], cluster: str) -> ClaimStore:
    return open_store(Settings.from_mapping({**values, "elarion_beat_cluster": cluster}))


def test_init_db_upgrades_tables_of_0_2_keeping_every_row_in_its_cluster(
        tables_of_0_2: dict[str, Any]) -> None:
    a = store_of(tables_of_0_2, A)
    b: ClaimStore | None = None
    try:
        # beat's start: the column comes, the keys of 0.2 stay (nodes of 0.2 claim on)
        a.ensure_schema()
        census = a.census(timedelta(seconds=NODE_TIMEOUT))
        assert len(census.legacy) == 5 and census.old_nodes == ("old-node",), census
        (lost,) = a.claim("new-node", [ClaimRequest.for_slot("nightly", SLOT, "t-9")])
        assert not lost.won and (lost.winner, lost.winner_task_id) == ("old-node", "t-1")
        (fresh,) = a.claim("new-node", [ClaimRequest.for_slot(
            "nightly", SLOT + timedelta(days=2), "t-10")])
        assert fresh.won
        # init-db refuses while the node of 0.2 heartbeats, and says who and what to do
        with pytest.raises(UpgradeRefused, match=r"old-node.*--force"):
            a.create_schema()
        assert len(a.census(timedelta(seconds=NODE_TIMEOUT)).legacy) == 5
        # the node of 0.2 stops: an app whose node timeout its last heartbeat outlived
        a.close()
        a = store_of({**tables_of_0_2, "elarion_beat_heartbeat_interval": GONE / 2,
                            "elarion_beat_node_timeout": GONE}, A)
        deadline = time.monotonic() + 30
        while a.census(timedelta(seconds=GONE)).old_nodes:
            assert time.monotonic() < deadline, "the node of 0.2 never counted as dead"
            time.sleep(0.1)
        upgraded = a.create_schema()
        # every table of 0.2 (the foreign beats table came after clusters, the database
        # entries' tables with live schedules: made with them, not upgraded)
        assert sorted(upgraded) == sorted(t for t in claims_tables(
            tables_of_0_2["elarion_beat_table"]) if not t.endswith(AFTER_0_2))
        assert a.census(timedelta(seconds=NODE_TIMEOUT)).legacy == ()
        assert a.create_schema() == ()  # nothing left to do
        # the tables are now exactly the ones a fresh init-db makes (as Alembic compares)
        with a.engine.connect() as conn:  # type: ignore[attr-defined]
            ours = set(claims_tables(tables_of_0_2["elarion_beat_table"]))
            context = MigrationContext.configure(conn, opts={
                "compare_type": True,  # this test's tables only: the database is shared
                "include_name": lambda name, kind, _: kind != "table" or name in ours})
            assert compare_metadata(context, a.metadata) == []  # type: ignore[attr-defined]

        # every row of 0.2 is kept, in the cluster of the app that upgraded
        rows = {(r.job, r.occurrence): r for r in a.find_claims()}
        assert rows[("nightly", SLOT)].state == "published"
        assert rows[("nightly", SLOT)].cluster == A and rows[("nightly", SLOT)].node == "old-node"
        assert {job for job, _ in rows} == {"nightly", "poll"} and len(rows) == 4
        assert [p.job for p in a.pauses()[1]] == ["report"]
        assert [e.action for e in a.audit()] == ["pause"]
        assert [o.key for o in a.one_offs()] == ["invoice-42"]
        assert [n.node for n in a.nodes()[1]] == []  # 0.2's heartbeat rows go with it

        # another app now has keys of its own in the same tables
        b = store_of(tables_of_0_2, B)
        (won,) = b.claim("node-b", [ClaimRequest.for_slot("nightly", SLOT, "t-b")])
        assert won.won and [r.task_id for r in b.find_claims()] == ["t-b"]
        assert b.pauses()[1] == [] and b.one_offs() == []
        (again,) = a.claim("new-node", [ClaimRequest.for_slot("nightly", SLOT, "t-11")])
        assert not again.won and again.winner == "old-node"
    finally:
        a.close()
        if b is not None:
            b.close()


@pytest.mark.sqlite
def test_init_db_force_upgrades_under_a_live_node_of_0_2(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'claims.db'}"
    filled = subprocess.run([sys.executable, str(FILL), dsn, "claims", "plain"],
                            capture_output=True, text=True, timeout=120, env=old_env())
    assert filled.returncode == 0, filled.stdout + filled.stderr
    store = store_of({"elarion_beat_dsn": dsn, "elarion_beat_table": "claims"}, A)
    try:
        assert store.census(timedelta(minutes=5)).old_nodes == ("old-node",)
        with pytest.raises(UpgradeRefused):
            store.create_schema()
        assert len(store.create_schema(force=True)) == 5
        census = store.census(timedelta(minutes=5))
        assert census.legacy == () and census.old_nodes == ()
    finally:
        store.close()


@pytest.mark.sqlite
def test_tables_of_0_2_shared_by_two_apps_are_reported_with_the_command(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Two apps of this version on tables still keyed as 0.2 keys them: their claims
    collide (one app's claim of a slot takes the other's) until init-db. Beat warns
    at start (shared-table) and the census says so, naming init-db."""
    import logging

    from celery_elarion_beat.beat.clusters import report_clusters
    from celery_elarion_beat.store.records import NodeState

    dsn = f"sqlite:///{tmp_path / 'claims.db'}"
    filled = subprocess.run([sys.executable, str(FILL), dsn, "claims", "plain"],
                            capture_output=True, text=True, timeout=120, env=old_env())
    assert filled.returncode == 0, filled.stdout + filled.stderr
    values = {"elarion_beat_dsn": dsn, "elarion_beat_table": "claims"}
    a, b = store_of(values, A), store_of(values, B)
    try:
        a.ensure_schema()
        assert not a.census(timedelta(minutes=5)).colliding  # one app so far
        b.heartbeat(NodeState(node="node-1", boot_id="b", version="0.3", fingerprint="f"))
        (taken,) = b.claim("node-1", [ClaimRequest.for_slot("nightly", SLOT, "t-b")])
        assert not taken.won and taken.winner == "old-node"  # the collision: svc_a's row
        census = a.census(timedelta(minutes=5))
        assert census.colliding and census.others == (B,)
        settings = Settings.from_mapping({**values, "elarion_beat_cluster": A})
        with caplog.at_level(logging.WARNING):
            report_clusters(settings, a)
        (line,) = [r for r in caplog.records if getattr(r, "action", "") == "shared-table"]
        assert "svc_a, svc_b" in line.getMessage() and "init-db" in line.getMessage()
        a.create_schema(force=True)  # the old node's heartbeat is recent: forced
        assert not a.census(timedelta(minutes=5)).colliding
        (won,) = b.claim("node-1", [ClaimRequest.for_slot("nightly", SLOT, "t-b2")])
        assert won.won
    finally:
        a.close()
        b.close()

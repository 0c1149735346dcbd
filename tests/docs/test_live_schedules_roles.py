"""docs/howto/database-role.md, "Live schedules": the grants are enough, and no more.

The page's blocks run as written (the roles of its PostgreSQL and MariaDB sections,
then the live schedules' grants, with role names of this test only) over tables made
by the owner with ``elarion_beat_db_entries`` on (the triggers too). The operators'
role then writes entries (add, edit, disable, remove: the triggers write the revisions
as it) and reads the history; the beat role reads the entries, the version and the
changes, claims an occurrence under its revision (the versions row read ``FOR SHARE``)
and has a stale one refused, and is refused writing an entry or bumping the version.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from celery_elarion_beat import ClaimRequest, Settings, open_store
from celery_elarion_beat.config.live_entries import EntryDefinition
from celery_elarion_beat.store.entry_records import EntryChange
from tests.docs.test_database_role import refused, rename, sql_blocks

PAGE = Path(__file__).resolve().parents[2] / "docs" / "howto" / "database-role.md"


def live_blocks(dialect: str) -> list[str]:
    """The statements of the live schedules' ```sql block for *dialect*."""
    section = PAGE.read_text().split("\n## Live schedules (database entries)\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    body = section.split(f"\n### {dialect}\n", 1)[1].split("\n### ", 1)[0]
    (block,) = re.findall(r"```sql\n(.*?)```", body, re.S)
    return [s.strip() for s in block.split(";") if s.strip()]


def definition(**kw: Any) -> EntryDefinition:
    return EntryDefinition.of("proj.tasks.report", {"cron": "0 */5 * * * *"}, **kw)


def exercise(beat: dict[str, Any], operator: dict[str, Any]) -> None:
    """The operators write entries; beat follows them and claims under their revision."""
    live = {"elarion_beat_create_table": False, "elarion_beat_db_entries": True}
    ops = open_store(Settings.from_mapping({**operator, **live}))
    node = open_store(Settings.from_mapping({**beat, **live}))
    cluster = node.cluster  # the app's: the one beat's claims check
    try:
        ops.write_entries(cluster, [EntryChange("add", "report", definition())], "alice")
        ops.write_entries(cluster, [EntryChange("edit", "report", definition(args=(1,)))],
                          "alice", "one more")
        ops.write_entries(cluster, [EntryChange("add", "gone", definition())], "alice")
        ops.write_entries(cluster, [EntryChange("disable", "gone",
                                               definition(enabled=False))], "alice")
        ops.write_entries(cluster, [EntryChange("remove", "gone")], "alice")
        assert [r.action for r in ops.entry_history(cluster)] == [
            "remove", "disable", "add", "edit", "add"]
        assert node.entries_version(cluster) == 5
        snapshot = node.live_entries(cluster)
        assert [(e.name, e.revision) for e in snapshot.entries] == [("report", 2)]
        assert [r.revision for r in node.entry_changes(cluster, 2).revisions] == [3, 4, 5]
        due = node.clock().replace(microsecond=0) + timedelta(minutes=5)
        (stale,) = node.claim("node-1", [ClaimRequest.for_slot(
            "report", due, "t-1", revision=1)])
        assert stale.stale
        (won,) = node.claim("node-1", [ClaimRequest.for_slot(
            "report", due, "t-2", revision=2)])
        assert won.won and node.find_claims(job="report")[0].revision == 2
    finally:
        ops.close()
        node.close()


def test_postgresql_live_schedule_grants(pg_dsn: str, pg_scratch: tuple[Engine, str, str]
                                         ) -> None:
    admin, schema, role = pg_scratch
    owner = open_store(Settings.from_mapping({
        "elarion_beat_dsn": pg_dsn, "elarion_beat_schema": schema,
        "elarion_beat_db_entries": True}))
    owner.create_schema()  # type: ignore[attr-defined]
    owner.close()
    with admin.connect() as conn:
        conn.execute(text(f'SET search_path TO "{schema}"'))
        for statement in sql_blocks("PostgreSQL") + live_blocks("PostgreSQL"):
            conn.execute(text(rename(statement, role, schema)))

    def dsn(name: str) -> str:
        return make_url(pg_dsn).set(username=name, password="change-me").render_as_string(
            hide_password=False)

    operator = role.replace("elarion_beat", "elarion_operator", 1)
    exercise({"elarion_beat_dsn": dsn(role), "elarion_beat_schema": schema},
             {"elarion_beat_dsn": dsn(operator), "elarion_beat_schema": schema})
    engine = create_engine(make_url(dsn(role)).set(drivername="postgresql+psycopg"))
    try:
        refused(engine, f'INSERT INTO "{schema}".elarion_scheduler_entries (cluster, name, task, '
                        "schedule, args, kwargs, options) VALUES ('p', 'x', 't', '{}', '[]', "
                        "'{}', '{}')")
        refused(engine, f'UPDATE "{schema}".elarion_scheduler_versions SET version = 0')
        refused(engine, f'DELETE FROM "{schema}".elarion_scheduler_revisions')
    finally:
        engine.dispose()


def test_mariadb_live_schedule_grants(mysql_dsn: str,
                                      mysql_scratch: tuple[Engine, str, str]) -> None:
    admin, database, user = mysql_scratch
    owner_dsn = make_url(mysql_dsn).set(database=database).render_as_string(hide_password=False)
    owner = open_store(Settings.from_mapping({"elarion_beat_dsn": owner_dsn,
                                              "elarion_beat_db_entries": True}))
    owner.create_schema()  # type: ignore[attr-defined]
    owner.close()
    try:
        with admin.connect() as conn:
            for statement in (sql_blocks("MariaDB and MySQL")
                              + live_blocks("MariaDB and MySQL")):
                conn.execute(text(rename(statement, user)))
    finally:
        admin.dispose()
    as_user = make_url(mysql_dsn).set(username=user, password="change-me", database=database)
    operator = as_user.set(username=user.replace("elarion_beat", "elarion_operator", 1))
    exercise({"elarion_beat_dsn": as_user.render_as_string(hide_password=False)},
             {"elarion_beat_dsn": operator.render_as_string(hide_password=False)})
    engine = create_engine(as_user.set(drivername="mysql+pymysql"))
    try:
        refused(engine, "INSERT INTO elarion_scheduler_entries (cluster, name, task, schedule, "
                        "args, kwargs, options) VALUES ('p', 'x', 't', '{}', '[]', '{}', '{}')")
        refused(engine, "UPDATE elarion_scheduler_versions SET version = 0")
    finally:
        engine.dispose()

"""The database entries' triggers: every write is a revision and a version bump.

The triggers on the entries table make a change visible to every node whoever wrote
it: the API, the CLI, a Django admin, or a raw ``UPDATE``/``DELETE`` in a SQL shell.
For each row written they

1. take the cluster's next version from the versions table (an ``UPDATE`` of its one
   row: the lock gives the versions in commit order). Inside a write of the API,
   which bumped the row once and set ``batch = 1`` in its own transaction, they use
   that version instead (one version for the whole write), and its ``actor``,
   ``reason`` and ``at``;
2. stamp the row: ``revision`` (that version), ``updated_at``, ``actor`` (a raw
   statement: ``sql:<role>``) and, for a raw statement, ``effective_at`` (now, unless
   it sets a later one) and ``restart`` (false);
3. write the revision row (the audit and the change feed), with the action
   (``add``/``override``, ``edit``, ``enable``/``disable``, ``remove``);
4. on PostgreSQL, ``pg_notify(<channel>, <cluster>)``: delivered when the
   transaction commits, to the LISTEN connection every node holds.

A rename (an ``UPDATE`` of ``cluster`` or ``name``) is refused: delete the row and
insert the new one. PostgreSQL's trigger function keeps the ``search_path`` it was
created with (a migration that ran with the tables' schema first finds them whatever
the writer's own path). On SQLite, a raw ``UPDATE`` that sets ``revision`` itself is not
seen (the trigger fires only for updates that leave it alone, its own included).

:func:`entry_trigger_ddl` gives the statements for a dialect and a claims table
(the store runs them, and so does the Alembic example); :func:`has_entry_triggers`
checks that they exist.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from ..config.names import TABLE_MAX
from ..config.settings import DEFAULT_TABLE, related_table

__all__ = ["entries_channel", "entry_trigger_ddl", "entry_trigger_names",
           "has_entry_triggers"]


def entries_channel(entries: str, schema: str | None = None) -> str:
    """The NOTIFY channel of the entries table *entries* (PostgreSQL; 63 bytes at most)."""
    return f"elarion:{schema}.{entries}"[:63] if schema else f"elarion:{entries}"[:63]


def _quote(dialect: str, name: str, schema: str | None) -> str:
    mark = "`" if dialect in ("mysql", "mariadb") else '"'
    quoted = f"{mark}{name}{mark}"
    return f"{mark}{schema}{mark}.{quoted}" if schema else quoted

_COLUMNS = ("cluster, revision, name, action, task, schedule, args, kwargs, options, "
            "enabled, effective_at, at, actor, reason, overrides, code_digest, restart")


def entry_trigger_names(entries: str) -> dict[str, str]:
    """The names of the triggers (and PostgreSQL's function) of the entries table
    named *entries* (unqualified)."""
    return {"function": f"{entries}_revise"[:63], "trigger": f"{entries}_revise"[:63],
            "insert": f"{entries}_ins"[:63], "update": f"{entries}_upd"[:63],
            "delete": f"{entries}_del"[:63]}


def entry_trigger_ddl(dialect: str, table: str = DEFAULT_TABLE,
                      schema: str | None = None) -> list[str]:
    """The statements that create the triggers of the entries table that goes with the
    claims table *table* (``elarion_beat_table``) in *schema* (``elarion_beat_schema``),
    for *dialect* (``postgresql``, ``mysql``/``mariadb`` or ``sqlite``): what beat runs
    when it creates the tables, and what a migration runs (examples/alembic)."""
    plain = related_table(table, "entries", TABLE_MAX)
    names = entry_trigger_names(plain)
    entries = _quote(dialect, plain, schema)
    revisions = _quote(dialect, related_table(table, "revisions", TABLE_MAX), schema)
    versions = _quote(dialect, related_table(table, "versions", TABLE_MAX), schema)
    prefix = f'"{schema}".' if schema else ""
    if dialect == "postgresql":
        return _postgres(entries, revisions, versions, entries_channel(plain, schema), prefix,
                         names)
    if dialect in ("mysql", "mariadb"):
        return _mysql(entries, revisions, versions, names)
    if dialect == "sqlite":
        return _sqlite(entries, revisions, versions, names)
    raise ValueError(f"no entry triggers for the dialect {dialect!r}")


def has_entry_triggers(conn: Connection, dialect: str, entries_plain: str,
                       schema: str | None) -> bool:
    """Whether the triggers of the entries table *entries_plain* exist."""
    names = entry_trigger_names(entries_plain)
    if dialect == "postgresql":
        query = ("SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                 "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE t.tgname = :name "
                 "AND c.relname = :table AND n.nspname = COALESCE(:schema, current_schema())")
        found = conn.execute(text(query), {"name": names["trigger"], "table": entries_plain,
                                           "schema": schema}).scalar()
        return bool(found)
    wanted = [names["insert"], names["update"], names["delete"]]
    if dialect in ("mysql", "mariadb"):
        query = ("SELECT count(*) FROM information_schema.triggers WHERE trigger_schema = "
                 "COALESCE(:schema, DATABASE()) AND event_object_table = :table")
        found = conn.execute(text(query), {"table": entries_plain, "schema": schema}).scalar()
        return int(found or 0) >= len(wanted)
    rows = conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'trigger' "
                             "AND tbl_name = :table"), {"table": entries_plain}).scalars()
    return set(wanted) <= set(rows)


def _pg_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _postgres(entries: str, revisions: str, versions: str, channel: str, prefix: str,
              names: dict[str, str]) -> list[str]:
    function = prefix + _pg_quote(names["function"])
    trigger = _pg_quote(names["trigger"])
    channel_sql = "'" + channel.replace("'", "''") + "'"
    body = f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $elarion$
DECLARE
  c text; v bigint; b integer; a text; r text; at_ timestamptz; act text;
BEGIN
  IF TG_OP = 'DELETE' THEN c := OLD.cluster; ELSE c := NEW.cluster; END IF;
  IF TG_OP = 'UPDATE' AND (NEW.cluster IS DISTINCT FROM OLD.cluster
                           OR NEW.name IS DISTINCT FROM OLD.name) THEN
    RAISE EXCEPTION 'celery-elarion-beat: a database entry cannot be renamed; delete it '
                    'and insert the new one';
  END IF;
  SELECT x.version, x.batch, x.actor, x.reason, x.at INTO v, b, a, r, at_
    FROM {versions} AS x WHERE x.cluster = c;
  IF b IS DISTINCT FROM 1 THEN
    INSERT INTO {versions} AS x (cluster, version, batch) VALUES (c, 1, 0)
      ON CONFLICT (cluster) DO UPDATE SET version = x.version + 1
      RETURNING x.version INTO v;
    at_ := clock_timestamp();  -- after the version row's lock: no claim commits later
    a := 'sql:' || session_user;
    r := '';
  END IF;
  IF TG_OP = 'DELETE' THEN
    INSERT INTO {revisions} ({_COLUMNS}) VALUES
      (c, v, OLD.name, 'remove', OLD.task, OLD.schedule, OLD.args, OLD.kwargs, OLD.options,
       OLD.enabled, at_, at_, a, r, OLD.overrides, OLD.code_digest, false);
    PERFORM pg_notify({channel_sql}, c);
    RETURN OLD;
  END IF;
  IF b IS DISTINCT FROM 1 THEN
    NEW.restart := false;
    IF NEW.effective_at IS NULL OR NEW.effective_at < at_
       OR (TG_OP = 'UPDATE' AND NEW.effective_at = OLD.effective_at) THEN
      NEW.effective_at := at_;
    END IF;
  ELSIF NEW.effective_at IS NULL OR NEW.effective_at < at_ THEN
    NEW.effective_at := at_;
  END IF;
  NEW.revision := v;
  NEW.updated_at := at_;
  NEW.actor := a;
  NEW.reason := r;
  IF TG_OP = 'INSERT' THEN
    act := CASE WHEN NEW.overrides THEN 'override' ELSE 'add' END;
  ELSIF NEW.overrides AND NOT OLD.overrides THEN
    act := 'override';
  ELSIF NEW.enabled IS DISTINCT FROM OLD.enabled AND NEW.task = OLD.task
        AND NEW.schedule = OLD.schedule AND NEW.args = OLD.args AND NEW.kwargs = OLD.kwargs
        AND NEW.options = OLD.options THEN
    act := CASE WHEN NEW.enabled THEN 'enable' ELSE 'disable' END;
  ELSE
    act := 'edit';
  END IF;
  INSERT INTO {revisions} ({_COLUMNS}) VALUES
    (c, v, NEW.name, act, NEW.task, NEW.schedule, NEW.args, NEW.kwargs, NEW.options,
     NEW.enabled, NEW.effective_at, at_, a, r, NEW.overrides, NEW.code_digest, NEW.restart);
  PERFORM pg_notify({channel_sql}, c);
  RETURN NEW;
END
$elarion$"""
    return [body,
            f"DROP TRIGGER IF EXISTS {trigger} ON {entries}",
            f"CREATE TRIGGER {trigger} BEFORE INSERT OR UPDATE OR DELETE ON {entries} "
            f"FOR EACH ROW EXECUTE FUNCTION {function}()"]


#: MariaDB/MySQL: the time now, read when the trigger runs (UTC_TIMESTAMP() is the
#: statement's start, before the version row's lock was granted), in UTC.
_MYSQL_NOW = ("DATE_ADD('1970-01-01 00:00:00.000000', "
              "INTERVAL UNIX_TIMESTAMP(SYSDATE(6)) SECOND)")


def _mysql(entries: str, revisions: str, versions: str, names: dict[str, str]) -> list[str]:
    def head(row: str) -> str:
        return f"""
  DECLARE b INT DEFAULT 0;
  DECLARE v BIGINT DEFAULT 0;
  DECLARE a TEXT DEFAULT '';
  DECLARE r TEXT DEFAULT '';
  DECLARE n DATETIME(6);
  SET b = COALESCE((SELECT x.batch FROM {versions} AS x WHERE x.cluster = {row}.cluster), 0);
  IF b = 1 THEN
    SELECT x.version, x.actor, x.reason, x.at INTO v, a, r, n
      FROM {versions} AS x WHERE x.cluster = {row}.cluster;
  ELSE
    INSERT INTO {versions} (cluster, version, batch) VALUES ({row}.cluster, 1, 0)
      ON DUPLICATE KEY UPDATE version = version + 1;
    SELECT x.version INTO v FROM {versions} AS x WHERE x.cluster = {row}.cluster;
    SET n = {_MYSQL_NOW};
    SET a = CONCAT('sql:', USER());
    SET r = '';
  END IF;"""

    def stamp(update: bool) -> str:
        same = " OR NEW.effective_at = OLD.effective_at" if update else ""
        return f"""
  IF b <> 1 THEN
    SET NEW.restart = 0;
    IF NEW.effective_at IS NULL OR NEW.effective_at < n{same} THEN
      SET NEW.effective_at = n;
    END IF;
  ELSEIF NEW.effective_at IS NULL OR NEW.effective_at < n THEN
    SET NEW.effective_at = n;
  END IF;
  SET NEW.revision = v, NEW.updated_at = n, NEW.actor = a, NEW.reason = r;"""

    def record(row: str, action: str, effective: str, restart: str) -> str:
        return f"""
  INSERT INTO {revisions} ({_COLUMNS}) VALUES
    ({row}.cluster, v, {row}.name, {action}, {row}.task, {row}.schedule, {row}.args,
     {row}.kwargs, {row}.options, {row}.enabled, {effective}, n, a, r, {row}.overrides,
     {row}.code_digest, {restart});"""

    q = names
    added = record("NEW", "IF(NEW.overrides, 'override', 'add')", "NEW.effective_at",
                   "NEW.restart")
    insert = (f"CREATE TRIGGER `{q['insert']}` BEFORE INSERT ON {entries} FOR EACH ROW\n"
              f"BEGIN{head('NEW')}{stamp(False)}{added}\nEND")
    changed = ("CASE WHEN NEW.overrides AND NOT OLD.overrides THEN 'override' "
               "WHEN NEW.enabled <> OLD.enabled AND NEW.task = OLD.task "
               "AND NEW.schedule = OLD.schedule AND NEW.args = OLD.args "
               "AND NEW.kwargs = OLD.kwargs AND NEW.options = OLD.options "
               "THEN IF(NEW.enabled, 'enable', 'disable') ELSE 'edit' END")
    rename = ("\n  IF NEW.cluster <> OLD.cluster OR NEW.name <> OLD.name THEN\n"
              "    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'celery-elarion-beat: a database "
              "entry cannot be renamed; delete it and insert the new one';\n  END IF;")
    update = (f"CREATE TRIGGER `{q['update']}` BEFORE UPDATE ON {entries} FOR EACH ROW\n"
              f"BEGIN{head('NEW')}{rename}{stamp(True)}"
              f"{record('NEW', changed, 'NEW.effective_at', 'NEW.restart')}\nEND")
    removed = record("OLD", "'remove'", "n", "0")
    delete = (f"CREATE TRIGGER `{q['delete']}` BEFORE DELETE ON {entries} FOR EACH ROW\n"
              f"BEGIN{head('OLD')}{removed}\nEND")
    return [f"DROP TRIGGER IF EXISTS `{q['insert']}`", f"DROP TRIGGER IF EXISTS `{q['update']}`",
            f"DROP TRIGGER IF EXISTS `{q['delete']}`", insert, update, delete]


#: SQLite: the time now, as SQLAlchemy stores a DateTime there (microseconds).
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now') || '000'"


def _sqlite(entries: str, revisions: str, versions: str, names: dict[str, str]) -> list[str]:
    def ver(column: str, row: str = "NEW") -> str:
        return f"(SELECT x.{column} FROM {versions} AS x WHERE x.cluster = {row}.cluster)"

    def bump(row: str) -> str:
        return f"""
  INSERT OR IGNORE INTO {versions} (cluster, version, batch) VALUES ({row}.cluster, 0, 0);
  UPDATE {versions} SET version = version + 1, at = {_SQLITE_NOW}, actor = 'sql', reason = ''
    WHERE cluster = {row}.cluster AND batch = 0;"""

    def stamp(update: bool) -> str:
        kept = "NEW.effective_at = OLD.effective_at" if update else "0"
        return f"""
  UPDATE {entries} SET revision = {ver('version')}, updated_at = {ver('at')},
    actor = {ver('actor')}, reason = {ver('reason')},
    restart = CASE WHEN {ver('batch')} = 1 THEN NEW.restart ELSE 0 END,
    effective_at = CASE WHEN NEW.effective_at IS NULL OR NEW.effective_at < {ver('at')}
                        THEN {ver('at')}
                        WHEN {ver('batch')} <> 1 AND ({kept}) THEN {ver('at')}
                        ELSE NEW.effective_at END
    WHERE cluster = NEW.cluster AND name = NEW.name;"""

    def record(action: str) -> str:
        return f"""
  INSERT INTO {revisions} ({_COLUMNS})
    SELECT cluster, revision, name, {action}, task, schedule, args, kwargs, options, enabled,
           effective_at, updated_at, actor, reason, overrides, code_digest, restart
    FROM {entries} WHERE cluster = NEW.cluster AND name = NEW.name;"""

    q = names
    added = record("CASE WHEN overrides THEN 'override' ELSE 'add' END")
    insert = (f'CREATE TRIGGER "{q["insert"]}" AFTER INSERT ON {entries} FOR EACH ROW BEGIN'
              f"{bump('NEW')}{stamp(False)}{added}\nEND")
    changed = ("CASE WHEN NEW.overrides AND NOT OLD.overrides THEN 'override' "
               "WHEN NEW.enabled <> OLD.enabled AND NEW.task = OLD.task "
               "AND NEW.schedule = OLD.schedule AND NEW.args = OLD.args "
               "AND NEW.kwargs = OLD.kwargs AND NEW.options = OLD.options "
               "THEN CASE WHEN NEW.enabled THEN 'enable' ELSE 'disable' END ELSE 'edit' END")
    rename = ("\n  SELECT RAISE(ABORT, 'celery-elarion-beat: a database entry cannot be "
              "renamed; delete it and insert the new one') WHERE NEW.cluster <> OLD.cluster "
              "OR NEW.name <> OLD.name;")
    update = (f'CREATE TRIGGER "{q["update"]}" AFTER UPDATE ON {entries} FOR EACH ROW '
              f"WHEN NEW.revision = OLD.revision BEGIN{rename}{bump('NEW')}{stamp(True)}"
              f"{record(changed)}\nEND")
    delete = (f'CREATE TRIGGER "{q["delete"]}" AFTER DELETE ON {entries} FOR EACH ROW BEGIN'
              f"{bump('OLD')}"
              f"""
  INSERT INTO {revisions} ({_COLUMNS}) VALUES
    (OLD.cluster, {ver('version', 'OLD')}, OLD.name, 'remove', OLD.task, OLD.schedule,
     OLD.args, OLD.kwargs, OLD.options, OLD.enabled, {ver('at', 'OLD')}, {ver('at', 'OLD')},
     {ver('actor', 'OLD')}, {ver('reason', 'OLD')}, OLD.overrides, OLD.code_digest, 0);
END""")
    return [f'DROP TRIGGER IF EXISTS "{q["insert"]}"', f'DROP TRIGGER IF EXISTS "{q["update"]}"',
            f'DROP TRIGGER IF EXISTS "{q["delete"]}"', insert, update, delete]

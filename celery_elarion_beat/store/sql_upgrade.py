"""Finishing the upgrade of tables made before clusters (``init-db``): their keys and
indexes become the declared ones, each led by the ``cluster`` column.

:func:`key_gaps` compares what the database has with what :mod:`.schema` declares
(the primary key, the unique constraint of the one-offs, every index), by name. The
backends swap what differs (``SqlBase._swap_keys``), each the cheapest way it has:

* PostgreSQL, a plain table: each new key is built first, ``CONCURRENTLY`` under a
  temporary name (the claims go on meanwhile), then swapped in, in one short
  transaction: ``ADD PRIMARY KEY USING INDEX`` / ``UNIQUE USING INDEX``, or the old
  index dropped and the new one renamed (:func:`pg_build`, :func:`pg_swap`). A
  partitioned table is swapped in one transaction (an index of a partitioned table
  cannot be built concurrently): the claims wait while it builds.
* MariaDB/MySQL: one ``ALTER TABLE`` per table (InnoDB rebuilds it online).
* SQLite: the table is rebuilt (created anew, filled, renamed), as SQLite alters no key.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from sqlalchemy import Index, Table, UniqueConstraint, inspect
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.schema import CreateIndex

__all__ = ["INDEX", "PRIMARY", "UNIQUE", "KeyGap", "by_table", "copy_rows_sql", "key_gaps",
           "mysql_swap", "pg_build", "pg_swap", "temporary_name"]

PRIMARY = "primary key"
UNIQUE = "unique"
INDEX = "index"


@dataclass(frozen=True)
class KeyGap:
    """A key or index of *table* that differs from its declaration: *kind*, its
    declared *name* and *columns*, and the name it has in the database (*found*;
    None when it is missing)."""

    table: Table
    kind: str
    name: str
    columns: tuple[str, ...]
    found: str | None
    index: Index | None = None

    @property
    def unique(self) -> bool:
        return self.kind in (PRIMARY, UNIQUE)


def key_gaps(conn: Connection, tables: tuple[Table, ...], schema: str | None) -> list[KeyGap]:
    """The keys and indexes of the existing *tables* whose columns differ from the
    declared ones (a table of 0.2: none leads with ``cluster``)."""
    inspector = inspect(conn)
    gaps: list[KeyGap] = []
    for table in tables:
        if not inspector.has_table(table.name, schema=schema):
            continue
        pk = inspector.get_pk_constraint(table.name, schema=schema)
        declared = tuple(c.name for c in table.primary_key.columns)
        found_pk = tuple(pk.get("constrained_columns") or ())
        if found_pk != declared:  # (MariaDB names no primary key: it is PRIMARY)
            gaps.append(KeyGap(table, PRIMARY, str(table.primary_key.name), declared,
                               (pk.get("name") or "PRIMARY") if found_pk else None))
        indexes = {i["name"]: tuple(i["column_names"])
                   for i in inspector.get_indexes(table.name, schema=schema)}
        uniques = {u["name"]: tuple(u["column_names"])
                   for u in inspector.get_unique_constraints(table.name, schema=schema)}
        for constraint in table.constraints:
            if isinstance(constraint, UniqueConstraint):
                name = str(constraint.name)
                columns = tuple(c.name for c in constraint.columns)
                found = uniques.get(name, indexes.get(name))
                if found != columns:
                    gaps.append(KeyGap(table, UNIQUE, name, columns,
                                       name if found is not None else None))
        for index in table.indexes:
            name = str(index.name)
            columns = tuple(c.name for c in index.columns)
            if indexes.get(name) != columns:
                gaps.append(KeyGap(table, INDEX, name, columns,
                                   name if name in indexes else None, index))
    return gaps


def temporary_name(gap: KeyGap) -> str:
    """The name a new key is built under before it is swapped in (an identifier of
    at most 63 characters, one per table and key)."""
    crc = zlib.crc32(f"{gap.table.schema}.{gap.table.name}.{gap.name}".encode())
    return f"elarion_new_{crc:08x}"


def _columns(gap: KeyGap, dialect: Dialect) -> str:
    quote = dialect.identifier_preparer.quote
    return ", ".join(quote(c) for c in gap.columns)


def _where(gap: KeyGap, dialect: Dialect) -> str:
    """The partial index's condition, as DDL (PostgreSQL)."""
    where = gap.index.dialect_options["postgresql"]["where"] if gap.index is not None \
        else None
    if where is None:
        return ""
    return " WHERE " + str(where.compile(dialect=dialect,
                                         compile_kwargs={"literal_binds": True}))


def _qualified(name: str, table: Table, dialect: Dialect) -> str:
    prep = dialect.identifier_preparer
    quoted = prep.quote(name)
    return f"{prep.quote_schema(table.schema)}.{quoted}" if table.schema else quoted


def pg_build(gap: KeyGap, table_sql: str, dialect: Dialect) -> list[str]:
    """PostgreSQL, outside a transaction: build *gap*'s new key concurrently under its
    temporary name (dropping a half-built one of an earlier attempt first)."""
    temp = dialect.identifier_preparer.quote(temporary_name(gap))
    unique = "UNIQUE " if gap.unique else ""
    return [f"DROP INDEX CONCURRENTLY IF EXISTS "
            f"{_qualified(temporary_name(gap), gap.table, dialect)}",
            f"CREATE {unique}INDEX CONCURRENTLY {temp} ON {table_sql} "
            f"({_columns(gap, dialect)}){_where(gap, dialect)}"]


def pg_swap(gap: KeyGap, table_sql: str, dialect: Dialect, built: bool) -> list[str]:
    """PostgreSQL, in the swap's transaction: the old key out, the new one in (the one
    :func:`pg_build` made when *built*, else built here)."""
    prep = dialect.identifier_preparer
    name = prep.quote(gap.name)
    temp = prep.quote(temporary_name(gap))
    out = []
    if gap.kind in (PRIMARY, UNIQUE):
        kind = "PRIMARY KEY" if gap.kind == PRIMARY else "UNIQUE"
        drop = f"DROP CONSTRAINT {prep.quote(gap.found)}, " if gap.found else ""
        using = f"USING INDEX {temp}" if built else f"({_columns(gap, dialect)})"
        out.append(f"ALTER TABLE {table_sql} {drop}ADD CONSTRAINT {name} {kind} {using}")
        return out
    if gap.found:
        out.append(f"DROP INDEX {_qualified(gap.found, gap.table, dialect)}")
    if built:
        out.append(f"ALTER INDEX {_qualified(temporary_name(gap), gap.table, dialect)} "
                   f"RENAME TO {name}")
    elif gap.index is not None:
        out.append(str(CreateIndex(gap.index).compile(dialect=dialect)))
    return out


def mysql_swap(gaps: list[KeyGap], table_sql: str, dialect: Dialect) -> str:
    """MariaDB/MySQL: one ``ALTER TABLE`` that swaps every key of one table."""
    quote = dialect.identifier_preparer.quote
    parts: list[str] = []
    for gap in gaps:
        columns = _columns(gap, dialect)
        if gap.kind == PRIMARY:
            if gap.found is not None:
                parts.append("DROP PRIMARY KEY")
            parts.append(f"ADD PRIMARY KEY ({columns})")
            continue
        if gap.found is not None:
            parts.append(f"DROP INDEX {quote(gap.found)}")
        unique = "UNIQUE " if gap.unique else ""
        parts.append(f"ADD {unique}INDEX {quote(gap.name)} ({columns})")
    return f"ALTER TABLE {table_sql} " + ", ".join(parts)


def by_table(gaps: list[KeyGap]) -> dict[str, tuple[Table, list[KeyGap]]]:
    """*gaps* grouped by table name, in the order the tables come."""
    out: dict[str, tuple[Table, list[KeyGap]]] = {}
    for gap in gaps:
        out.setdefault(gap.table.name, (gap.table, []))[1].append(gap)
    return out


def copy_rows_sql(table: Table, source: str, target: str, present: set[str],
                  dialect: Dialect) -> str:
    """``INSERT INTO target (...) SELECT ... FROM source``: the columns *present* in the
    old table (SQLite's rebuild)."""
    quote = dialect.identifier_preparer.quote
    columns = ", ".join(quote(c.name) for c in table.columns if c.name in present)
    return f"INSERT INTO {target} ({columns}) SELECT {columns} FROM {source}"


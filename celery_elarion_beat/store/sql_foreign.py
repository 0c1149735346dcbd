"""Foreign beats on a SQL database: the senders the workers saw
(:class:`~.interface.ForeignBeats`, SQLAlchemy Core, every dialect).

One row per sender and task. A worker adds its sightings with an ``UPDATE`` of the
row (the count grows in the statement, so two workers never lose each other's); a
row that is not there yet is inserted in a savepoint, and when another worker
inserted it meanwhile, updated after all. (MariaDB and MySQL lock the gap an
``UPDATE`` of no row looked at, so two workers doing that at once deadlock: there the
backend overrides :meth:`SqlForeignBeats._add_sightings` with one
``INSERT … ON DUPLICATE KEY UPDATE``.) Rows are written in key order, so two workers
recording several senders never wait for each other in a circle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

from sqlalchemy import exc as sa_exc
from sqlalchemy import select
from sqlalchemy.engine import Connection

from ..exceptions import SchemaMissing
from ..schedules.clock import as_utc
from .foreign_records import ForeignBeat, ForeignSighting
from .sql_base import SqlBase

__all__ = ["SqlForeignBeats", "missing_foreign_beats_message"]


class SqlForeignBeats(SqlBase):
    """Foreign beats on a SQL database (:class:`~.interface.ForeignBeats`)."""

    @contextlib.contextmanager
    def _fb_translated(self) -> Iterator[None]:
        try:
            with self._translated():
                yield
        except SchemaMissing as exc:
            raise SchemaMissing(missing_foreign_beats_message(self.foreign_beats_table)) from exc

    def record_foreign_beats(self, sightings: Sequence[ForeignSighting],
                             retention: timedelta | None = None) -> None:
        if not sightings and retention is None:
            return
        with self._fb_translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                now = self._param_time(self._db_now(conn))
                self._add_sightings(conn, sorted(sightings, key=lambda s: (s.origin, s.task)),
                                    now)
                if retention is not None:
                    t = self.foreign_beats_table
                    conn.execute(t.delete().where(
                        self._mine(t), t.c.last_seen < self._param_time(as_utc(now) - retention)))

    def _add_sightings(self, conn: Connection, sightings: Sequence[ForeignSighting],
                       now: datetime) -> None:
        """Add each of *sightings* to its row, inserting the rows not there yet (a
        dialect hook: see the module)."""
        for seen in sightings:
            if self._add_sighting(conn, seen, now):
                continue
            try:
                with conn.begin_nested():
                    conn.execute(self.foreign_beats_table.insert().values(
                        cluster=self.cluster, origin=seen.origin, task_name=seen.task,
                        entry=seen.entry,
                        messages=seen.count, first_seen=now, last_seen=now, worker=seen.worker))
            except sa_exc.IntegrityError:  # another worker inserted it meanwhile
                self._add_sighting(conn, seen, now)

    def _add_sighting(self, conn: Connection, seen: ForeignSighting, now: datetime) -> bool:
        """Add *seen* to its row; False when there is no row yet."""
        t = self.foreign_beats_table
        result = conn.execute(t.update().where(
            self._mine(t), t.c.origin == seen.origin, t.c.task_name == seen.task,
        ).values(messages=t.c.messages + seen.count, last_seen=now, entry=seen.entry,
                 worker=seen.worker))
        return bool(result.rowcount)

    def foreign_beats(self, within: timedelta | None = None) -> tuple[datetime, list[ForeignBeat]]:
        t = self.foreign_beats_table
        with self._fb_translated(), self.engine.begin() as conn:
            self.round_trips += 1
            now = self._db_now(conn)
            query = select(t).where(self._mine(t)).order_by(
                t.c.last_seen.desc(), t.c.origin, t.c.task_name)
            if within is not None:
                query = query.where(t.c.last_seen >= self._param_time(now - within))
            rows = conn.execute(query).mappings().all()
        return now, [ForeignBeat(r["origin"], r["task_name"], r["entry"], int(r["messages"]),
                                 as_utc(r["first_seen"]), as_utc(r["last_seen"]), r["worker"])
                     for r in rows]


def missing_foreign_beats_message(table: object) -> str:
    schema, name = getattr(table, "schema", None), getattr(table, "name", str(table))
    shown = f"{schema}.{name}" if schema else name
    return (f"the foreign beats table {shown} does not exist: run `celery -A proj "
            "elarion-beat init-db`, add celery_elarion_beat.foreign_beats_table(metadata) to "
            "your migrations (examples/alembic/versions/0009_elarion_beat_foreign_beats.py), "
            "or set elarion_beat_create_table = True")

"""Beat nodes on a SQL database: heartbeats and the node list
(:class:`~.interface.Nodes`, SQLAlchemy Core, every dialect).

A node's row is keyed by its cluster and name: two apps on the same hosts (the same
node names) have rows of their own. The list of a cluster's nodes includes the rows
of nodes of 0.2 (cluster ``''``, :data:`~.clusters.LEGACY_NODE`) while there are
any: they are the nodes a rolling upgrade has still to reach.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    case,
    literal,
    or_,
    select,
)
from sqlalchemy.engine import Connection

from ..schedules.clock import as_utc
from .clusters import LEGACY_NODE
from .records import (
    NodeState,
)
from .sql_base import SqlBase

__all__ = ["SqlNodes", "node_state", "dump_counts", "load_counts"]


class SqlNodes(SqlBase):
    """Beat nodes on a SQL database: heartbeats and the node list"""

    def heartbeat(self, state: NodeState, retention: timedelta | None = None,
                  live_within: timedelta | None = None) -> tuple[datetime, list[NodeState]]:
        nodes = self.nodes_table
        with self._translated():
            self._ready()
            with self.engine.begin() as conn:
                self.round_trips += 1
                now = self._db_now(conn)
                written = (state.node, state.boot_id, state.fingerprint)
                # the entries (a digest each: megabytes at 100,000 entries) are written
                # when they changed, not with every heartbeat
                if written != self._node_written or not self._touch_node(conn, state, now):
                    self._upsert_node(conn, {
                        "node": state.node, "boot_id": state.boot_id, "version": state.version,
                        "fingerprint": state.fingerprint, "host": state.host, "pid": state.pid,
                        "entries": json.dumps(state.entries, sort_keys=True),
                        "counts": dump_counts(state.counts),
                        "started_at": self._param_time(now), "last_seen": self._param_time(now),
                        "entries_version": state.entries_version,
                    })
                if retention is not None:
                    conn.execute(nodes.delete().where(
                        self._mine_or_legacy(),
                        nodes.c.last_seen < self._param_time(now - retention)))
                # only what the heartbeat needs: no counts, and a node's entries only
                # when its schedule differs from this node's
                entries = case((nodes.c.fingerprint == state.fingerprint, literal("{}")),
                               else_=nodes.c.entries)
                query = (select(*[c for c in nodes.c if c.name not in ("entries", "counts")],
                                entries.label("entries"), literal("[]").label("counts"))
                         .where(self._mine_or_legacy()).order_by(nodes.c.node))
                if live_within is not None:
                    query = query.where(nodes.c.last_seen >= self._param_time(now - live_within))
                rows = conn.execute(query).mappings().all()
        self._node_written = written  # committed
        return now, [node_state(row) for row in rows]

    def _mine_or_legacy(self) -> Any:
        """This cluster's node rows, and those of nodes of 0.2 (see the module's doc)."""
        c = self.nodes_table.c
        return or_(c.cluster == self.cluster, c.cluster == LEGACY_NODE)

    def _upsert_node(self, conn: Connection, values: dict[str, Any]) -> None:
        """Insert or update the node row; keep started_at while boot_id is unchanged."""
        nodes = self.nodes_table
        row = {**values, "cluster": self.cluster}
        key = (self._mine(nodes), nodes.c.node == values["node"])
        started = case((nodes.c.boot_id == values["boot_id"], nodes.c.started_at),
                       else_=values["started_at"])
        changed = {k: v for k, v in row.items() if k not in ("started_at", "cluster", "node")}
        for _ in range(2):  # a racer of the same name may insert between the two
            # started_at first: MySQL evaluates the SET list left to right, and the CASE
            # must see the boot id of before
            if conn.execute(nodes.update().where(*key).ordered_values(
                    (nodes.c.started_at, started), *((nodes.c[k], v) for k, v in changed.items()))
                            ).rowcount:
                return
            if self._insert_or_skip(conn, nodes, row):
                return
            if self._legacy is None or nodes.name in self._legacy:
                # a table of 0.2, keyed by the name alone: the row of this name (a node of
                # 0.2, or of another cluster) becomes this node's, as 0.2 shared it
                conn.execute(nodes.update().where(nodes.c.node == values["node"])
                             .values(**row))
                return

    def _touch_node(self, conn: Connection, state: NodeState, now: datetime) -> bool:
        """The heartbeat of a node whose row holds its entries already: last seen and
        counts only. False when the row is gone or another process wrote it since."""
        nodes = self.nodes_table
        result = conn.execute(nodes.update().where(
            self._mine(nodes), nodes.c.node == state.node, nodes.c.boot_id == state.boot_id,
            nodes.c.fingerprint == state.fingerprint,
        ).values(last_seen=self._param_time(now), counts=dump_counts(state.counts),
                 version=state.version, host=state.host, pid=state.pid,
                 entries_version=state.entries_version))
        return bool(result.rowcount)

    def clock(self) -> datetime:
        with self._translated(), self.engine.connect() as conn:
            self.round_trips += 1
            now = self._db_now(conn)
            conn.rollback()
            return now

    def nodes(self) -> tuple[datetime, list[NodeState]]:
        with self._translated(), self.engine.begin() as conn:
            self.round_trips += 1
            now = self._db_now(conn)
            rows = conn.execute(select(self.nodes_table).where(self._mine_or_legacy())
                                .order_by(self.nodes_table.c.node)).mappings().all()
        return now, [node_state(row) for row in rows]


def node_state(row: Any) -> NodeState:
    return NodeState(
        node=row["node"], boot_id=row["boot_id"], version=row["version"],
        fingerprint=row["fingerprint"], entries=json.loads(row["entries"] or "{}"),
        counts=load_counts(row["counts"]), host=row["host"], pid=row["pid"],
        started_at=as_utc(row["started_at"]), last_seen=as_utc(row["last_seen"]),
        cluster=row.get("cluster") or "", entries_version=row.get("entries_version"))


def dump_counts(counts: Mapping[tuple[str, str, str], int]) -> str:
    """Outcome counts as JSON rows ``[job, outcome, reason, n]``: any job name survives."""
    return json.dumps(sorted([*key, n] for key, n in counts.items()))


def load_counts(text: str | None) -> dict[tuple[str, str, str], int]:
    """Read :func:`dump_counts`, and the ``{"job|outcome|reason": n}`` rows of 0.1."""
    data = json.loads(text or "[]")
    if isinstance(data, dict):
        old: dict[tuple[str, str, str], int] = {}
        for key, n in data.items():  # 0.1 joined the key with "|" (lossy for "|" in names)
            job, outcome, reason = (key.rsplit("|", 2) + ["", ""])[:3]
            old[(job, outcome, reason)] = int(n)
        return old
    return {(str(job), str(outcome), str(reason)): int(n) for job, outcome, reason, n in data}

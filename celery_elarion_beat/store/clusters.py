"""Clusters: several apps (or deployments) in one set of tables, told apart by the
``cluster`` column (``elarion_beat_cluster``). Value types and messages, no I/O.

Every row the library writes names its cluster, and every key starts with it, so two
apps that share a database never claim, pause, report, purge, lease or compare each
other's rows. Tables made before clusters (0.2) get the column from the first node
of this version that starts (``elarion_beat_create_table``) with the starting app's
cluster as its default, and keep their old keys until ``init-db`` finishes the
upgrade (:class:`ClusterCensus` says where a store's tables stand):

* meanwhile nodes of 0.2 and of this version run side by side: the old ones write
  rows that land in the default cluster, and both still serialize window claims on
  the old lock (this version takes both its own and the old one);
* a table shared by several apps keeps mixing them until then (their slots collide
  on the old key): :func:`shared_message` says so, with the command;
* ``init-db`` swaps the keys once no live node of 0.2 is left (a 0.2 node's claim
  names the old key, which is gone afterwards); its ``--force`` does it anyway.

A node of 0.2 heartbeats into a table that has the column without naming its
cluster: its row has the cluster :data:`LEGACY_NODE` (``''``), which is how
``init-db`` and ``status`` find the nodes still to upgrade.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LEGACY_NODE", "ClusterCensus", "legacy_message", "shared_message",
           "upgrade_refused_message"]

#: The nodes-table cluster of a node of a version before clusters (0.2).
LEGACY_NODE = ""


@dataclass(frozen=True)
class ClusterCensus:
    """Where the tables of a store stand, as seen from its *cluster*.

    *legacy*: the tables whose keys do not start with the cluster yet (made by 0.2,
    their column added since): ``init-db`` finishes their upgrade. *clusters*: the
    clusters with a node in the nodes table or a claim made lately (this one
    included once it wrote any). *old_nodes*: the live nodes of a version before
    clusters (heartbeat rows without a cluster).
    """

    cluster: str
    legacy: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()
    old_nodes: tuple[str, ...] = ()

    @property
    def others(self) -> tuple[str, ...]:
        """The clusters besides this one that have rows in the tables."""
        return tuple(c for c in self.clusters if c != self.cluster)

    @property
    def colliding(self) -> bool:
        """Several apps in tables that still have the keys of 0.2: their claims meet."""
        return bool(self.legacy) and bool(self.others)

    def as_dict(self) -> dict[str, object]:
        return {"cluster": self.cluster, "legacy_tables": list(self.legacy),
                "clusters": list(self.clusters), "old_nodes": list(self.old_nodes),
                "colliding": self.colliding}


def legacy_message(census: ClusterCensus, table: str) -> str:
    """The tables were made before clusters: how to finish their upgrade."""
    waiting = (f" (nodes of an older version still running: {', '.join(census.old_nodes)};"
               " upgrade them first)" if census.old_nodes else "")
    return (f"the tables of {table} ({', '.join(census.legacy)}) still have the keys of "
            "celery-elarion-beat 0.2: they work, but apps that share them are not kept "
            "apart until `celery -A proj elarion-beat init-db` finishes the upgrade; run "
            f"it once every node runs this version{waiting} (docs/howto/several-apps.md)")


def shared_message(census: ClusterCensus, table: str) -> str:
    """Several apps in tables with the keys of 0.2: they take each other's slots."""
    apps = ", ".join(sorted({census.cluster, *census.others}))
    return (f"the claims table {table} is shared by the apps (clusters) {apps} and still "
            "has the keys of celery-elarion-beat 0.2: their claims collide (an app skips "
            "slots another app claimed, and their pauses and one-offs mix); once every "
            "node of every app runs this version, run `celery -A proj elarion-beat "
            "init-db` to give each app its own keys (docs/howto/several-apps.md)")


def upgrade_refused_message(table: str, old_nodes: tuple[str, ...], timeout: float) -> str:
    """``init-db`` will not swap the keys under a live node of 0.2."""
    return (f"init-db did not finish the upgrade of {table}: the nodes "
            f"{', '.join(old_nodes)} heartbeat (within elarion_beat_node_timeout, "
            f"{timeout:g}s) from a version before clusters, and their claims need the old "
            "keys; upgrade them and run init-db again, or run `init-db --force` to finish "
            "now (those nodes then fail every claim until upgraded)")

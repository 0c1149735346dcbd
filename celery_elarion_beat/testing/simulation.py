"""``simulate``: every occurrence a cluster would send from your schedule, in a span.

::

    from celery_elarion_beat.testing import simulate
    from proj.celery import app

    sent = simulate(app, "2026-03-28", "2026-03-30")   # Europe/Berlin's spring forward
    assert [o.slot for o in sent if o.job == "nightly-report"] == [...]

The app is used as it is (its ``beat_schedule``, ``timezone``, ``elarion_beat_*``
settings) but never changed, and nothing leaves the process: see
:class:`~celery_elarion_beat.testing.Cluster`. With ``elarion_beat_db_entries`` the
app's database entries (live schedules) run too: read once from its claims database
(or given as *db_entries*), as they are now, from the span's start.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from ..config.live_entries import live_cluster
from ..config.settings import Settings
from ..schedules.slots import is_slotted
from ..store.entry_records import EntryChange, StoredEntry
from ..store.registry import app_store
from .beat_clock import BeatClock, moment
from .cluster import MIN_STEP, Cluster, SimulatedOccurrence

__all__ = ["simulate"]


def simulate(app: Any, start: datetime | date | str, end: datetime | date | str,
             nodes: int = 3, tz: tzinfo | str | None = None,
             max_wakeups: int = 1_000_000,
             db_entries: Iterable[StoredEntry] | None = None) -> list[SimulatedOccurrence]:
    """Every message *nodes* beat nodes of *app* send from *start* until *end*.

    The nodes start at *start*, as after a deploy, and run until just before *end*:
    the exact slots of cron-like schedules (``crontab``, ``cron``, ``solar``) in
    ``[start, end)``, a slot at *start* included; interval entries count from *start*
    (their first run is one interval later). *start* and *end* are datetimes, dates or ISO
    strings; those without an offset are wall times in *tz* (an IANA name or tzinfo;
    default the app's ``timezone``). Time jumps from one wake-up beat asks for to the
    next; *max_wakeups* caps the ticks (:class:`~.cluster.SimulationError` beyond).

    No task runs: each claimed occurrence is recorded as run at once and succeeded
    (so ``overlap`` options never find a previous run unfinished).

    The answer is in the order sent: an every-node entry's occurrence once per node,
    any other occurrence once, by the node that won its claim.
    """
    zone = ZoneInfo(tz) if isinstance(tz, str) else tz or app.timezone
    first, last = moment(start, zone), moment(end, zone)
    if last <= first:
        raise ValueError(f"simulate: end ({last.isoformat()}) must be after start "
                         f"({first.isoformat()})")
    settings = Settings.from_app(app)
    rows = list(db_entries) if db_entries is not None else (
        app_store(app).live_entries(live_cluster(settings, app)).entries
        if settings.db_entries else [])
    with Cluster(app, nodes, BeatClock(first), finish_runs=True) as cluster:
        if rows:  # the database entries as they are now, from the span's start on
            node = cluster.nodes[0]
            node.store.write_entries(live_cluster(node.settings, cluster.app), [
                EntryChange("override" if row.overrides else "add", row.name, row.definition,
                            restart=row.restart, code_digest=row.code_digest)
                for row in rows], "simulate")
            for each in cluster.nodes:
                if each.live is not None:
                    each.live.follow(each.schedule, first)
                    each.live.promote(each.schedule, first)
        if not len(cluster.nodes[0].schedule):
            return []  # nothing to send (beat would only wake for its own upkeep)
        for node in cluster.nodes:  # as if beat had run before: a slot at start is due
            for entry in node.schedule.values():
                if is_slotted(entry.schedule):
                    entry.last_run_at = first - MIN_STEP
        cluster.run_until(last, inclusive=False, max_wakeups=max_wakeups)
        return cluster.sent()

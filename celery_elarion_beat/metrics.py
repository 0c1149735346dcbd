"""Prometheus counters of beat's events, for Flower's ``/metrics`` and the exporter.

Both Flower (:mod:`celery_elarion_beat.flower`) and the stand-alone exporter
(:mod:`celery_elarion_beat.exporter`) feed every ``elarion-*`` event they
receive to :func:`counters_for` (Flower also to a :class:`~.board.Board`). The
counters are
``elarion_beat_occurrences_total{job,outcome,reason}`` (cluster-wide, per job),
``elarion_beat_node_occurrences_total{node,outcome,reason}`` (per node) and
``elarion_beat_drift_events_total{node}``: jobs and nodes never multiply, and a
node's series are dropped once no event of it arrived for ``stale_after``
seconds (a pod name of a past rollout does not stay a series for ever).

Counts start when the monitor starts and only cover the events it received:
events are fire-and-forget (beat never buffers them), so the claims table
(``celery -A proj elarion-beat claims``) stays the record of what was sent.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .events import DISPATCHED, DRIFT, EVENT_TYPES, ORPHANED, event_text, event_time

__all__ = ["DEFAULT_STALE_AFTER", "OccurrenceCounters", "counters_for"]

#: Seconds without an event after which a node's series are dropped (a day).
DEFAULT_STALE_AFTER = 24 * 3600.0


@dataclass
class _NodeSeries:
    """The per-node series of one node, and when it was last heard from."""

    last_seen: float
    outcomes: set[tuple[str, str]] = field(default_factory=set)
    drift: bool = False


class OccurrenceCounters:
    """``elarion_beat_occurrences_total{job,outcome,reason}`` (cluster-wide, per job),
    ``elarion_beat_node_occurrences_total{node,outcome,reason}`` and
    ``elarion_beat_drift_events_total{node}`` and
    ``elarion_beat_orphan_events_total{job,action}``; thread-safe.

    The series number at most jobs x outcomes + nodes x (outcomes + 1): job and node
    are never labels of one series. A node's series are removed when no event of it
    was seen for *stale_after* seconds, measured on the events' own times (when the
    monitor received them, see ``event_time``): the check runs on every event, so a node
    goes when a later event of another node shows it silent for that long.
    (A heap of the nodes' last-seen times finds them in O(log nodes) per event.)
    """

    def __init__(self, registry: Any = None,
                 stale_after: float = DEFAULT_STALE_AFTER) -> None:
        from prometheus_client import REGISTRY
        from prometheus_client import Counter as PromCounter

        if not stale_after > 0:
            raise ValueError(f"stale_after must be more than 0 seconds, not {stale_after!r}")
        registry = REGISTRY if registry is None else registry
        self.stale_after = float(stale_after)
        self.occurrences = PromCounter(
            "elarion_beat_occurrences", "Due occurrences of each job, cluster-wide, by "
            "outcome (dispatched | skipped, one per node that skipped) and skip reason, "
            "from elarion-* events", ["job", "outcome", "reason"], registry=registry)
        self.node_occurrences = PromCounter(
            "elarion_beat_node_occurrences", "Due occurrences per beat node (all jobs), by "
            "outcome and skip reason; dropped once the node is silent for a while",
            ["node", "outcome", "reason"], registry=registry)
        self.drift = PromCounter(
            "elarion_beat_drift_events", "elarion-drift events (the node's schedule "
            "differs from another live node's)", ["node"], registry=registry)
        self.orphans = PromCounter(
            "elarion_beat_orphan_events", "elarion-orphaned events: a claim not published "
            "within elarion_beat_publish_timeout, by action (reported | taken-over); each "
            "live node reports an orphan once", ["job", "action"], registry=registry)
        self._nodes: dict[str, _NodeSeries] = {}
        #: (last seen, node), earliest first; entries outdated by a later event stay
        #: until popped or compacted away
        self._heap: list[tuple[float, str]] = []
        self._latest = float("-inf")
        self._lock = threading.Lock()

    def observe(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind not in EVENT_TYPES:
            return
        seen = event_time(event)
        node = event_text(event.get("node"))
        with self._lock:
            series = self._heard_from(node, seen)
            if kind == DRIFT:
                self.drift.labels(node).inc()
                series.drift = True
            elif kind == ORPHANED:
                self.orphans.labels(event_text(event.get("job")),
                                    event_text(event.get("action"))).inc()
            else:
                if kind == DISPATCHED:
                    outcome, reason = "dispatched", ""
                else:
                    outcome, reason = "skipped", event_text(event.get("reason"))
                self.occurrences.labels(event_text(event.get("job")), outcome, reason).inc()
                self.node_occurrences.labels(node, outcome, reason).inc()
                series.outcomes.add((outcome, reason))
            self._expire()

    def _heard_from(self, node: str, seen: float) -> _NodeSeries:
        self._latest = max(self._latest, seen)
        series = self._nodes.get(node)
        if series is None:
            series = self._nodes[node] = _NodeSeries(seen)
        elif seen > series.last_seen:
            series.last_seen = seen
        else:
            return series
        heapq.heappush(self._heap, (seen, node))
        if len(self._heap) > 2 * len(self._nodes) + 64:  # drop the outdated entries
            self._heap = [(s.last_seen, n) for n, s in self._nodes.items()]
            heapq.heapify(self._heap)
        return series

    def _expire(self) -> None:
        """Drop the series of the nodes silent for more than ``stale_after`` seconds."""
        cutoff = self._latest - self.stale_after
        while self._heap and self._heap[0][0] < cutoff:
            _, node = heapq.heappop(self._heap)
            series = self._nodes.get(node)
            if series is None or series.last_seen >= cutoff:
                continue  # gone already, or heard from again since this entry
            del self._nodes[node]
            removals: list[tuple[Any, tuple[str, ...]]] = [
                (self.node_occurrences, (node, *labels)) for labels in series.outcomes]
            if series.drift:
                removals.append((self.drift, (node,)))
            for metric, labels in removals:
                with contextlib.suppress(KeyError):  # already gone: nothing to drop
                    metric.remove(*labels)


_COUNTERS: weakref.WeakKeyDictionary[Any, OccurrenceCounters] = weakref.WeakKeyDictionary()
_COUNTERS_LOCK = threading.Lock()


def counters_for(registry: Any = None) -> OccurrenceCounters:
    """The counters registered in *registry* (default: prometheus_client's, Flower's)."""
    from prometheus_client import REGISTRY

    registry = REGISTRY if registry is None else registry
    with _COUNTERS_LOCK:
        counters = _COUNTERS.get(registry)
        if counters is None:
            counters = _COUNTERS[registry] = OccurrenceCounters(registry)
        return counters

"""What a monitor makes of beat's events: Prometheus counters and a board of occurrences.

Both Flower's page (:mod:`celery_elarion_beat.flower`) and the stand-alone
exporter (:mod:`celery_elarion_beat.exporter`) feed every ``elarion-*`` event
they receive to :func:`counters_for` and, in Flower, to a :class:`Board` (the
recent occurrences per job, counts per node). The counters are
``elarion_beat_occurrences_total{job,outcome,reason}`` (cluster-wide, per job),
``elarion_beat_node_occurrences_total{node,outcome,reason}`` (per node) and
``elarion_beat_drift_events_total{node}``: jobs and nodes never multiply, and a
node's series are dropped once no event of it arrived for ``stale_after``
seconds (a pod name of a past rollout does not stay a series for ever).

Counts start when the monitor starts and only cover the events it received:
events are fire-and-forget (beat never buffers them), so the claims table
(``celery -A proj elarion-beat claims``) stays the record of what was sent.
Memory is bounded: at most ``per_job`` occurrences per job, ``max_jobs`` jobs and
``max_nodes`` nodes are kept (the least recently updated go first).
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
import weakref
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

__all__ = ["DEFAULT_STALE_AFTER", "EVENT_TYPES", "Board", "OccurrenceCounters", "counters_for",
           "is_elarion"]

DISPATCHED = "elarion-dispatched"
SKIPPED = "elarion-skipped"
DRIFT = "elarion-drift"
#: every event type beat sends (see :mod:`celery_elarion_beat.events`)
EVENT_TYPES = (DISPATCHED, SKIPPED, DRIFT)
#: Seconds without an event after which a node's series are dropped (a day).
DEFAULT_STALE_AFTER = 24 * 3600.0


def is_elarion(event: Mapping[str, Any]) -> bool:
    return event.get("type") in EVENT_TYPES


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seen(event: Mapping[str, Any]) -> float:
    """When the monitor received *event* (its own clock), else when it was sent."""
    for key in ("local_received", "timestamp"):
        value = event.get(key)
        if isinstance(value, (int, float)):
            return float(value)
    return time.time()


@dataclass
class _NodeSeries:
    """The per-node series of one node, and when it was last heard from."""

    last_seen: float
    outcomes: set[tuple[str, str]] = field(default_factory=set)
    drift: bool = False


class OccurrenceCounters:
    """``elarion_beat_occurrences_total{job,outcome,reason}`` (cluster-wide, per job),
    ``elarion_beat_node_occurrences_total{node,outcome,reason}`` and
    ``elarion_beat_drift_events_total{node}``; thread-safe.

    The series number at most jobs x outcomes + nodes x (outcomes + 1): job and node
    are never labels of one series. A node's series are removed when no event of it
    was seen for *stale_after* seconds, measured on the events' own times (when the
    monitor received them, see ``_seen``): the check runs on every event, so a node
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
        seen = _seen(event)
        node = _text(event.get("node"))
        with self._lock:
            series = self._heard_from(node, seen)
            if kind == DRIFT:
                self.drift.labels(node).inc()
                series.drift = True
            else:
                if kind == DISPATCHED:
                    outcome, reason = "dispatched", ""
                else:
                    outcome, reason = "skipped", _text(event.get("reason"))
                self.occurrences.labels(_text(event.get("job")), outcome, reason).inc()
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


@dataclass
class _Occurrence:
    job: str
    at: str
    occurrence: str | None
    placement: str | None = None
    claim: str | None = None
    winner: str | None = None
    task_id: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "at": self.at, "occurrence": self.occurrence,
                "placement": self.placement, "claim": self.claim, "winner": self.winner,
                "task_id": self.task_id,
                "skipped": [{"node": n, "reason": r} for n, r in sorted(self.skipped.items())]}


@dataclass
class _Job:
    name: str
    task_name: str | None = None
    dispatched: int = 0
    skipped: int = 0
    updated: float = 0.0
    occurrences: dict[str, _Occurrence] = field(default_factory=dict)


@dataclass
class _Node:
    name: str
    dispatched: int = 0
    skipped: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    last_seen: float = 0.0
    drift: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.name, "dispatched": self.dispatched, "skipped": self.skipped,
                "reasons": dict(sorted(self.reasons.items())), "last_seen": _iso(self.last_seen),
                "last_seen_ts": self.last_seen, "drift": self.drift}


class Board:
    """Recent occurrences per job and counts per node; thread-safe."""

    def __init__(self, per_job: int = 20, max_jobs: int = 200, max_nodes: int = 200) -> None:
        self.per_job = per_job
        self.max_jobs = max_jobs
        self.max_nodes = max_nodes
        self.events = 0
        self._jobs: dict[str, _Job] = {}
        self._nodes: dict[str, _Node] = {}
        self._lock = threading.Lock()

    def observe(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind not in EVENT_TYPES:
            return
        seen = _seen(event)
        with self._lock:
            self.events += 1
            node = self._node(_text(event.get("node")) or _text(event.get("hostname")), seen)
            if kind == DRIFT:
                differing = event.get("differing")
                node.drift = dict(differing) if isinstance(differing, Mapping) else {}
                return
            job = self._job(_text(event.get("job")), seen)
            job.task_name = event.get("task_name") or job.task_name
            occ = self._occurrence(job, event, node.name, seen)
            if kind == DISPATCHED:
                node.dispatched += 1
                job.dispatched += 1
                occ.winner, occ.task_id = node.name, event.get("task_id")
            else:
                reason = _text(event.get("reason")) or "unknown"
                node.skipped += 1
                node.reasons[reason] += 1
                job.skipped += 1
                occ.skipped[node.name] = reason
                if occ.winner is None and event.get("winner"):
                    occ.winner = str(event["winner"])

    def _node(self, name: str, seen: float) -> _Node:
        node = self._nodes.pop(name, None) or _Node(name)
        self._nodes[name] = node  # most recently updated last
        node.last_seen = max(node.last_seen, seen)
        while len(self._nodes) > self.max_nodes:
            del self._nodes[next(iter(self._nodes))]
        return node

    def _job(self, name: str, seen: float) -> _Job:
        job = self._jobs.pop(name, None) or _Job(name)
        self._jobs[name] = job
        job.updated = seen
        while len(self._jobs) > self.max_jobs:
            del self._jobs[next(iter(self._jobs))]
        return job

    def _occurrence(self, job: _Job, event: Mapping[str, Any], node: str,
                    seen: float) -> _Occurrence:
        occurrence = event.get("occurrence")
        if occurrence:
            key = at = str(occurrence)
        elif event.get("task_id"):  # an every-node run: no claim, one row per node
            key, at = f"task:{event['task_id']}", _iso(seen)
        else:  # a skip that never got as far as a claim
            key, at = f"{node}@{seen!r}", _iso(seen)
        occ = job.occurrences.get(key)
        if occ is None:
            occ = job.occurrences[key] = _Occurrence(
                job.name, at, str(occurrence) if occurrence else None,
                event.get("placement"), event.get("claim"))
            while len(job.occurrences) > self.per_job:
                oldest = min(job.occurrences, key=lambda k: job.occurrences[k].at)
                del job.occurrences[oldest]
        return occ

    def snapshot(self) -> dict[str, Any]:
        """Everything the page shows, as JSON-ready data: newest occurrences first."""
        with self._lock:
            jobs = [{"job": j.name, "task_name": j.task_name, "dispatched": j.dispatched,
                     "skipped": j.skipped, "updated": _iso(j.updated),
                     "occurrences": [o.as_dict() for o in sorted(
                         j.occurrences.values(), key=lambda o: o.at, reverse=True)]}
                    for j in sorted(self._jobs.values(), key=lambda j: j.name)]
            nodes = [n.as_dict() for n in sorted(self._nodes.values(), key=lambda n: n.name)]
            return {"jobs": jobs, "nodes": nodes, "events": self.events,
                    "now": _iso(time.time()), "now_ts": time.time()}

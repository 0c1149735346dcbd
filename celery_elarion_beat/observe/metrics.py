"""Prometheus metrics of beat's events, for Flower's ``/metrics`` and the exporter.

Both Flower (:mod:`celery_elarion_beat.flower`) and the stand-alone exporter
(:mod:`celery_elarion_beat.exporter`) feed every ``elarion-*`` event they
receive to :func:`counters_for` (Flower also to a :class:`~..flower.board.Board`). The
counters are
``elarion_beat_occurrences_total{job,outcome,reason}`` (cluster-wide, per job),
``elarion_beat_node_occurrences_total{node,outcome,reason}`` (per node),
``elarion_beat_drift_events_total{node}``,
``elarion_beat_orphan_events_total{job,action}``,
``elarion_beat_one_offs_total{task,outcome}`` (durable one-offs) and
``elarion_beat_foreign_beat_messages_total{origin,task}`` (messages of a beat that
claims nothing, from the workers); the histograms are
``elarion_beat_lateness_seconds{job,outcome}`` (slot to publish, from the
beats) and ``elarion_beat_runtime_seconds{job,outcome}`` (start to finish, from
the workers' ``elarion-run`` events); the gauges are
``elarion_beat_node_last_seen_timestamp_seconds{node}`` (when the node's last event
arrived; heartbeats keep it fresh) and ``elarion_beat_clock_skew_seconds{node}``
(from ``elarion-heartbeat`` events). Jobs and nodes never multiply, and a
node's series are dropped once no event of it arrived for ``stale_after``
seconds (a pod name of a past rollout does not stay a series for ever).

A ``cluster`` label (the app, ``elarion_beat_cluster``, that the events name) is
only exported once the monitor has heard of a second cluster: a monitor of one app
has the series it had before clusters, and no more. From then on each event counts
under its own cluster (the counts before stay in the series without the label, so
``sum by (job)`` stays continuous), and the per-node series without it are dropped
(two apps may have nodes of the same name). Inside, every metric has the label,
empty until then; the collector registered leaves an empty ``cluster`` out.

Counts start when the monitor starts and only cover the events it received:
events are fire-and-forget (beat never buffers them), so the claims table
(``celery -A proj elarion-beat claims``) stays the record of what was sent.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import threading
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..store.states import RETRIED, RUN_FAILED, SUCCEEDED
from .events import (
    BATCH,
    DISPATCHED,
    DRIFT,
    EVENT_TYPES,
    FOREIGN_BEAT,
    HEARTBEAT,
    ONE_OFF,
    ORPHANED,
    RUN,
    event_text,
    event_time,
    expand,
)

__all__ = ["DEFAULT_STALE_AFTER", "FINISHED_RUNS", "LATENESS_BUCKETS", "RUNTIME_BUCKETS",
           "OccurrenceCounters", "counters_for", "event_seconds", "lateness_outcome"]

#: Seconds without an event after which a node's series are dropped (a day).
DEFAULT_STALE_AFTER = 24 * 3600.0
#: ``elarion_beat_lateness_seconds`` buckets: 10 ms to 30 min (then ``+Inf``).
LATENESS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    300.0, 1800.0)
#: ``elarion_beat_runtime_seconds`` buckets: 10 ms to 2 h (then ``+Inf``).
RUNTIME_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0,
                   3600.0, 7200.0)
#: The run states of ``elarion-run`` events that end a run (and carry its runtime).
FINISHED_RUNS = (SUCCEEDED, RUN_FAILED, RETRIED)


def event_seconds(value: Any) -> float | None:
    """A duration field of an event (``lateness``, ``runtime``) in seconds, or None
    when it is missing, not a number, negative or not finite (never raises)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    seconds = float(value)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def lateness_outcome(event: Mapping[str, Any]) -> str:
    """The ``outcome`` label of a dispatched occurrence's lateness: ``takeover`` (an
    orphan published by another node), ``catch-up`` (a replayed missed slot), else
    ``dispatched``."""
    takeover = event.get("takeover")
    if isinstance(takeover, (int, float)) and not isinstance(takeover, bool) and takeover > 0:
        return "takeover"
    return "catch-up" if event.get("catch_up") else "dispatched"


@dataclass
class _NodeSeries:
    """The per-node series of one node (of one cluster), and when it was last heard
    from."""

    last_seen: float
    outcomes: set[tuple[str, str]] = field(default_factory=set)
    drift: bool = False
    skew: bool = False


class OccurrenceCounters:
    """``elarion_beat_occurrences_total{job,outcome,reason}`` (cluster-wide, per job),
    ``elarion_beat_node_occurrences_total{node,outcome,reason}``,
    ``elarion_beat_drift_events_total{node}`` and
    ``elarion_beat_orphan_events_total{job,action}``,
    ``elarion_beat_one_offs_total{task,outcome}``,
    ``elarion_beat_foreign_beat_messages_total{origin,task}``, two histograms and two
    gauges; thread-safe.

    * ``elarion_beat_one_offs_total{task,outcome}``: durable one-offs a beat node leased,
      by task name and outcome (``published`` or ``failed``: it will not be sent), from
      the per-task counts of ``elarion-one-off`` events.
    * ``elarion_beat_foreign_beat_messages_total{origin,task}``: beat messages without the
      library's headers the workers saw (a stock beat among the replicas: each is a
      duplicate), by sender (``origin``, ``gen<pid>@<host>``) and task, from the
      ``count`` of ``elarion-foreign-beat`` events. A sender's series are dropped with
      the nodes' (silent for ``stale_after``).

    * ``elarion_beat_lateness_seconds{job,outcome}``: seconds from an exact slot to
      the broker accepting its message, from the ``lateness`` of ``elarion-dispatched``
      events (windows and every-node runs have none). ``outcome`` is ``dispatched``,
      ``catch-up`` (a replayed missed slot) or ``takeover`` (an orphan published by
      another node). Buckets :data:`LATENESS_BUCKETS`: 0.01, 0.025, 0.05, 0.1, 0.25,
      0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800 s (10 ms to 30 min).
    * ``elarion_beat_runtime_seconds{job,outcome}``: a run's seconds from start to
      finish as its worker measured them, from the ``runtime`` of ``elarion-run``
      events; ``outcome`` is the run's state, ``succeeded``, ``failed`` or
      ``retried``. Buckets :data:`RUNTIME_BUCKETS`: 0.01, 0.05, 0.1, 0.5, 1, 5, 10,
      30, 60, 300, 900, 1800, 3600, 7200 s (10 ms to 2 h).

    * ``elarion_beat_node_last_seen_timestamp_seconds{node}``: Unix time the node's
      last event arrived (``event_time``: the monitor's clock); every beat sends an
      ``elarion-heartbeat`` per ``elarion_beat_heartbeat_interval``, so a node that stops
      moving it is gone. A clean stop (``stopping: true``) removes it at once.
    * ``elarion_beat_clock_skew_seconds{node}``: the node's clock minus the database
      clock, from its last heartbeat that measured it; removed with a clean stop too.

    A missing, negative or non-finite duration is not observed. ``elarion-run``
    events come from the workers: they are not occurrences (no counter moves) and
    their ``node`` (the beat node that sent the message) is not heard from by them.

    The series number at most jobs x outcomes + nodes x (outcomes + 3) + tasks x 2 counters
    and gauges (tasks: the task names of the one-offs; a one-off's own id is never a
    label), plus foreign senders x their tasks (none in a healthy cluster), and jobs x 6
    histograms (3 outcomes each; a histogram is its buckets + 3 samples): job, task and
    node are never labels of one series. A node's series are
    removed when no event of it was seen for *stale_after* seconds, measured on the
    events' own times (when the monitor received them, see ``event_time``): the check
    runs on every event, so a node goes when a later event of another node shows it
    silent for that long. (A heap of the nodes' last-seen times finds them in
    O(log nodes) per event.)
    """

    def __init__(self, registry: Any = None,
                 stale_after: float = DEFAULT_STALE_AFTER) -> None:
        from prometheus_client import REGISTRY, Gauge, Histogram
        from prometheus_client import Counter as PromCounter

        if not stale_after > 0:
            raise ValueError(f"stale_after must be more than 0 seconds, not {stale_after!r}")
        registry = REGISTRY if registry is None else registry
        self.stale_after = float(stale_after)
        self._registry = registry
        registry = None  # each metric is exported through _Exported, below
        self.occurrences = PromCounter(
            "elarion_beat_occurrences", "Due occurrences of each job, cluster-wide, by "
            "outcome (dispatched | skipped, one per node that skipped) and skip reason, "
            "from elarion-* events", ["cluster", "job", "outcome", "reason"],
            registry=registry)
        self.node_occurrences = PromCounter(
            "elarion_beat_node_occurrences", "Due occurrences per beat node (all jobs), by "
            "outcome and skip reason; dropped once the node is silent for a while",
            ["cluster", "node", "outcome", "reason"], registry=registry)
        self.drift = PromCounter(
            "elarion_beat_drift_events", "elarion-drift events (the node's schedule "
            "differs from another live node's)", ["cluster", "node"], registry=registry)
        self.orphans = PromCounter(
            "elarion_beat_orphan_events", "elarion-orphaned events: a claim not published "
            "within elarion_beat_publish_timeout, by action (reported | taken-over); each "
            "live node reports an orphan once", ["cluster", "job", "action"],
            registry=registry)
        self.lateness = Histogram(
            "elarion_beat_lateness_seconds", "Seconds from an exact slot to the broker "
            "accepting its message, per job, by outcome (dispatched | catch-up | takeover)",
            ["cluster", "job", "outcome"], buckets=LATENESS_BUCKETS, registry=registry)
        self.runtime = Histogram(
            "elarion_beat_runtime_seconds", "Seconds from a run's start to its finish on "
            "the worker, per job, by outcome (succeeded | failed | retried), from "
            "elarion-run events", ["cluster", "job", "outcome"], buckets=RUNTIME_BUCKETS,
            registry=registry)
        self.one_offs = PromCounter(
            "elarion_beat_one_offs", "Durable one-offs beat nodes leased, by task and outcome "
            "(published | failed: it will not be sent), from elarion-one-off events",
            ["cluster", "task", "outcome"], registry=registry)
        self.foreign = PromCounter(
            "elarion_beat_foreign_beat_messages", "Beat messages sent by a beat that claims "
            "nothing (no elarion headers: every one is sent twice), as the workers saw them, "
            "by sender (origin, gen<pid>@<host>) and task, from elarion-foreign-beat events",
            ["cluster", "origin", "task"], registry=registry)
        self.last_seen = Gauge(
            "elarion_beat_node_last_seen_timestamp_seconds", "Unix time the beat node's "
            "last elarion-* event arrived (heartbeats every elarion_beat_heartbeat_interval); "
            "removed when the node stops cleanly", ["cluster", "node"], registry=registry)
        self.skew = Gauge(
            "elarion_beat_clock_skew_seconds", "The beat node's clock minus the database "
            "clock, from its last elarion-heartbeat event that measured it",
            ["cluster", "node"], registry=registry)
        #: (cluster label, node) -> its series
        self._nodes: dict[tuple[str, str], _NodeSeries] = {}
        #: foreign senders (cluster label, origin) -> (last seen, their tasks): few,
        #: checked in full
        self._senders: dict[tuple[str, str], tuple[float, set[str]]] = {}
        #: (last seen, (cluster label, node)), earliest first; entries outdated by a later
        #: event stay until popped or compacted away
        self._heap: list[tuple[float, tuple[str, str]]] = []
        #: the clusters heard of (the label is empty until there are two)
        self._clusters: set[str] = set()
        self._registry.register(_Exported([
            self.occurrences, self.node_occurrences, self.drift, self.orphans, self.lateness,
            self.runtime, self.one_offs, self.foreign, self.last_seen, self.skew]))
        self._latest = float("-inf")
        self._lock = threading.Lock()

    def observe(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind not in EVENT_TYPES:
            return
        if kind == BATCH:  # one tick's outcomes of one node: each counts as its own event
            for item in expand(event):
                self.observe(item)
            return
        seen = event_time(event)
        node = event_text(event.get("node"))
        job = event_text(event.get("job"))
        with self._lock:
            cluster = self._cluster(event)
            if kind == FOREIGN_BEAT:  # a worker's: news of a sender that is no node of ours
                self._latest = max(self._latest, seen)
                self._foreign(cluster, event, seen)
                self._expire()
                return
            if kind == RUN:  # a worker's: neither an occurrence nor news of a beat node
                self._latest = max(self._latest, seen)
                state = event_text(event.get("state"))
                runtime = event_seconds(event.get("runtime"))
                if state in FINISHED_RUNS and runtime is not None:
                    self.runtime.labels(cluster, job, state).observe(runtime)
                self._expire()
                return
            if kind == DISPATCHED and event.get("manual"):
                # an operator's run (``elarion-beat trigger``): no beat node sent it
                self._latest = max(self._latest, seen)
                self.occurrences.labels(cluster, job, "dispatched", "manual").inc()
                return
            key = (cluster, node)
            series = self._heard_from(key, seen)
            if kind == HEARTBEAT:
                self._heartbeat(key, series, event)
            elif kind == DRIFT:
                self.drift.labels(*key).inc()
                series.drift = True
            elif kind == ORPHANED:
                self.orphans.labels(cluster, job, event_text(event.get("action"))).inc()
            elif kind == ONE_OFF:
                for outcome in ("published", "failed"):
                    for task, count in _task_counts(event.get(outcome)):
                        self.one_offs.labels(cluster, task, outcome).inc(count)
            else:
                if kind == DISPATCHED:
                    outcome, reason = "dispatched", ""
                    lateness = event_seconds(event.get("lateness"))
                    if lateness is not None:
                        self.lateness.labels(cluster, job, lateness_outcome(event)).observe(
                            lateness)
                else:
                    outcome, reason = "skipped", event_text(event.get("reason"))
                self.occurrences.labels(cluster, job, outcome, reason).inc()
                self.node_occurrences.labels(*key, outcome, reason).inc()
                series.outcomes.add((outcome, reason))
            self._expire()

    def _foreign(self, cluster: str, event: Mapping[str, Any], seen: float) -> None:
        """An ``elarion-foreign-beat`` event: *count* messages of one sender and task."""
        count = event.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            return
        origin, task = event_text(event.get("origin")), event_text(event.get("task_name"))
        self.foreign.labels(cluster, origin, task).inc(count)
        last, tasks = self._senders.get((cluster, origin), (seen, set()))
        tasks.add(task)
        self._senders[(cluster, origin)] = (max(last, seen), tasks)

    @property
    def clusters(self) -> frozenset[str]:
        """The clusters heard of so far."""
        return frozenset(self._clusters)

    def _cluster(self, event: Mapping[str, Any]) -> str:
        """The ``cluster`` label of *event*: its cluster once two were heard of, else
        empty. The second cluster drops the per-node series without one."""
        name = event_text(event.get("cluster"))
        if name and name not in self._clusters:
            self._clusters.add(name)
            if len(self._clusters) == 2:
                for key in [key for key in self._nodes if key[0] == ""]:
                    self._drop(key, self._nodes.pop(key))
        return name if len(self._clusters) > 1 else ""

    def _heartbeat(self, key: tuple[str, str], series: _NodeSeries,
                   event: Mapping[str, Any]) -> None:
        if event.get("stopping"):  # a clean stop: nobody should wait for this node
            for gauge in (self.last_seen, self.skew):
                with contextlib.suppress(KeyError):
                    gauge.remove(*key)
            series.skew = False
            return
        skew = event.get("skew")
        if isinstance(skew, (int, float)) and not isinstance(skew, bool) \
                and math.isfinite(skew):
            self.skew.labels(*key).set(float(skew))
            series.skew = True

    def _heard_from(self, key: tuple[str, str], seen: float) -> _NodeSeries:
        self._latest = max(self._latest, seen)
        series = self._nodes.get(key)
        if series is None:
            series = self._nodes[key] = _NodeSeries(seen)
        elif seen > series.last_seen:
            series.last_seen = seen
        else:
            return series
        self.last_seen.labels(*key).set(seen)
        heapq.heappush(self._heap, (seen, key))
        if len(self._heap) > 2 * len(self._nodes) + 64:  # drop the outdated entries
            self._heap = [(s.last_seen, k) for k, s in self._nodes.items()]
            heapq.heapify(self._heap)
        return series

    def _expire(self) -> None:
        """Drop the series of the nodes silent for more than ``stale_after`` seconds."""
        cutoff = self._latest - self.stale_after
        for sender in [o for o, (last, _) in self._senders.items() if last < cutoff]:
            for task in self._senders.pop(sender)[1]:
                with contextlib.suppress(KeyError):
                    self.foreign.remove(*sender, task)
        while self._heap and self._heap[0][0] < cutoff:
            _, key = heapq.heappop(self._heap)
            series = self._nodes.get(key)
            if series is None or series.last_seen >= cutoff:
                continue  # gone already, or heard from again since this entry
            del self._nodes[key]
            self._drop(key, series)

    def _drop(self, key: tuple[str, str], series: _NodeSeries) -> None:
        """Remove every series of the node *key* (cluster label, node)."""
        removals: list[tuple[Any, tuple[str, ...]]] = [
            (self.node_occurrences, (*key, *labels)) for labels in series.outcomes]
        if series.drift:
            removals.append((self.drift, key))
        if series.skew:
            removals.append((self.skew, key))
        removals.append((self.last_seen, key))
        for metric, labels in removals:
            with contextlib.suppress(KeyError):  # already gone: nothing to drop
                metric.remove(*labels)


class _Exported:
    """The collector of the metrics: their samples, an empty ``cluster`` label left out
    (see the module's doc)."""

    def __init__(self, metrics: list[Any]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        for metric in self._metrics:
            for family in metric.collect():
                family.samples = [
                    sample._replace(labels={k: v for k, v in sample.labels.items()
                                            if k != "cluster" or v})
                    for sample in family.samples]
                yield family


def _task_counts(value: Any) -> list[tuple[str, int]]:
    """The (task, count) pairs of an ``elarion-one-off`` event's ``published`` or
    ``failed`` mapping; anything malformed (not a mapping, a count that is not a
    positive integer) is left out, never raised."""
    if not isinstance(value, Mapping):
        return []
    return [(event_text(task), count) for task, count in value.items()
            if isinstance(count, int) and not isinstance(count, bool) and count > 0]


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

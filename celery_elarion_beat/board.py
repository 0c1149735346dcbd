"""The Beat page's data: recent occurrences per job and counts per node.

Flower (:mod:`celery_elarion_beat.flower`) feeds every ``elarion-*`` event it
receives to a :class:`Board`; the page polls :meth:`Board.snapshot`. Counts start
when Flower starts and cover only the events it received (beat never buffers
events), so the claims table stays the record of what was sent. Memory is
bounded: at most ``per_job`` occurrences per job, ``max_jobs`` jobs and
``max_nodes`` nodes are kept (the least recently updated go first).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .events import DISPATCHED, DRIFT, EVENT_TYPES, ORPHANED, event_text, event_time

__all__ = ["Board"]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    #: catch-up, takeover and orphan notes, in the order they arrived (each once)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "at": self.at, "occurrence": self.occurrence,
                "placement": self.placement, "claim": self.claim, "winner": self.winner,
                "task_id": self.task_id, "notes": list(self.notes),
                "skipped": [{"node": n, "reason": r} for n, r in sorted(self.skipped.items())]}


@dataclass
class _Job:
    name: str
    task_name: str | None = None
    dispatched: int = 0
    skipped: int = 0
    orphaned: int = 0
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
        seen = event_time(event)
        with self._lock:
            self.events += 1
            name = event_text(event.get("node")) or event_text(event.get("hostname"))
            node = self._node(name, seen)
            if kind == DRIFT:
                differing = event.get("differing")
                node.drift = dict(differing) if isinstance(differing, Mapping) else {}
                return
            job = self._job(event_text(event.get("job")), seen)
            job.task_name = event.get("task_name") or job.task_name
            occ = self._occurrence(job, event, node.name, seen)
            if kind == ORPHANED:
                self._orphaned(job, occ, event)
                return
            if event.get("catch_up"):
                occ.note("catch-up")
            if kind == DISPATCHED:
                node.dispatched += 1
                job.dispatched += 1
                occ.winner, occ.task_id = node.name, event.get("task_id")
                if event.get("takeover"):
                    occ.note(f"taken over by {node.name} (takeover {event['takeover']})")
            else:
                reason = event_text(event.get("reason")) or "unknown"
                node.skipped += 1
                node.reasons[reason] += 1
                job.skipped += 1
                occ.skipped[node.name] = reason
                if occ.winner is None and event.get("winner"):
                    occ.winner = str(event["winner"])

    @staticmethod
    def _orphaned(job: _Job, occ: _Occurrence, event: Mapping[str, Any]) -> None:
        """An orphan event: claimed by *holder*, never published (counted once)."""
        holder = event_text(event.get("holder")) or "?"
        if not any(note.startswith("orphaned") for note in occ.notes):
            job.orphaned += 1
        if event.get("action") == "taken-over":
            occ.note(f"orphaned (claimed by {holder}, never published)")
        else:
            error = event_text(event.get("publish_error"))
            occ.note(f"orphaned: claimed by {holder}, never published"
                     + (f" ({error})" if error else "") + ", not sent again")
        occ.task_id = occ.task_id or event.get("task_id")

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
                     "skipped": j.skipped, "orphaned": j.orphaned, "updated": _iso(j.updated),
                     "occurrences": [o.as_dict() for o in sorted(
                         j.occurrences.values(), key=lambda o: o.at, reverse=True)]}
                    for j in sorted(self._jobs.values(), key=lambda j: j.name)]
            nodes = [n.as_dict() for n in sorted(self._nodes.values(), key=lambda n: n.name)]
            return {"jobs": jobs, "nodes": nodes, "events": self.events,
                    "now": _iso(time.time()), "now_ts": time.time()}

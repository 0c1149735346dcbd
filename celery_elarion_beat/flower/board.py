"""The Beat page's data: recent occurrences per job, how their runs went, counts per node.

Flower (:mod:`celery_elarion_beat.flower`) feeds every ``elarion-*`` event it
receives to a :class:`Board`; the page polls :meth:`Board.snapshot`. Counts start
when Flower starts and cover only the events it received (beat never buffers
events), so the claims table stays the record of what was sent. Memory is
bounded: at most ``per_job`` occurrences per job, ``max_jobs`` jobs and
``max_nodes`` nodes are kept (the least recently updated go first), the last
:data:`RUNTIMES` runtimes per job and ``max_jobs * per_job`` task ids.

Each occurrence has a ``state``, from the events received so far, the first rule
that applies:

1. ``running``, ``succeeded``, ``failed`` or ``retried``: what the workers'
   ``elarion-run`` events say of its task. A run event belongs to the occurrence
   whose dispatched (or orphan) event carried its ``task_id``; else to the
   occurrence its ``occurrence`` names (a cluster run), or to the row ``task:<id>``
   (an every-node run, whose ``occurrence`` is its start on the worker). The latest
   transition wins, ordered by the events' send times: an event sent before the one
   shown is ignored (it arrived late), and ``running`` never replaces ``succeeded``
   or ``failed`` (only ``retried``: the task runs again under the same id);
2. ``published``: a node's ``elarion-dispatched`` event arrived (no run yet);
3. ``orphaned``: an ``elarion-orphaned`` event arrived (claimed, never published);
4. ``paused``: a node skipped it ``paused`` (``elarion-beat pause``, or the
   Flower page's Pause button: the cluster decided not to send it);
5. ``skipped``: a node skipped it ``still-running`` (``overlap: skip``: the cluster
   decided not to send it; other nodes see that claim and skip it too);
6. ``missed``: the node that won the claim skipped it ``publish-error``;
7. ``claimed``: a node skipped it ``claimed-elsewhere``: another node holds the
   claim, and its own event (dispatched, or a skip) has not arrived yet;
8. ``missed``: the only skips are ``claim-error``, ``invalid-entry`` or
   ``clock-fenced`` (no node could claim it).

``runtime`` (seconds, worker-measured) comes with a finished run, ``lateness``
(seconds from the slot to the broker accepting the message; exact slots only) with
the dispatched event, ``worker`` (the worker's host name) and ``exception`` (its
type, for ``failed`` and ``retried``) with the run events. Per job, ``runtimes``
holds the runtimes of the last :data:`RUNTIMES` finished runs, oldest first, and
``runtime_states`` how each ended (the page draws them as a sparkline). Durations
that are missing, negative or not finite are left out. A run an operator triggered
(``elarion-beat trigger``, the page's Run now: a dispatched event with ``manual``)
is an occurrence of its job noted "run by hand", won by the operator, and no beat
node's: the node counts leave it out. ``elarion-heartbeat`` and ``elarion-one-off``
events are news of their node only (its ``last_seen``): they are no occurrences.
``elarion-foreign-beat`` events (a worker saw messages of a beat that claims nothing)
are no node's either: ``foreign_beats`` lists their senders (``origin``, host, each
task with its entry and count, last seen, the worker that saw them), at most
``max_nodes`` of them, which the page shows above everything else.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..config.parsers import format_duration
from ..config.placement import Placement
from ..observe.events import (
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
from ..observe.metrics import FINISHED_RUNS, event_seconds
from ..observe.outcome import SkipReason
from ..store.states import (
    PUBLISHED,
    RETRIED,
    RUN_FAILED,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
)

__all__ = ["CLAIMED", "MISSED", "ORPHANED_STATE", "PAUSED_STATE", "RUNTIMES", "STATES", "Board"]

#: ``state`` of an occurrence a node claimed, whose own event has not arrived yet.
CLAIMED = "claimed"
#: ``state`` of an occurrence nobody could send (a claim or publish error).
MISSED = "missed"
#: ``state`` of an occurrence claimed and never published.
ORPHANED_STATE = "orphaned"
#: ``state`` of an occurrence not sent because its job was paused.
PAUSED_STATE = "paused"
#: Every ``state`` an occurrence can be in.
STATES = (PUBLISHED, RUNNING, SUCCEEDED, RUN_FAILED, RETRIED, ORPHANED_STATE, MISSED,
          PAUSED_STATE, SKIPPED, CLAIMED)
#: How many recent runtimes each job keeps (its sparkline).
RUNTIMES = 30
_RUN_STATES = (RUNNING, *FINISHED_RUNS)
_TERMINAL = (SUCCEEDED, RUN_FAILED)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(seconds: float | None) -> str | None:
    """A duration as the page shows it (``340ms``, ``1.3s``, ``1m16s``), or None: the
    package's one formatter, so the page writes durations as the CLI does."""
    return None if seconds is None else format_duration(seconds, approximate=True)


def _sent_at(event: Mapping[str, Any]) -> float:
    """When *event* was sent (the sender's clock), else when it was received."""
    value = event.get("timestamp")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return event_time(event)


@dataclass
class _Occurrence:
    job: str
    key: str
    at: str
    occurrence: str | None
    placement: str | None = None
    claim: str | None = None
    winner: str | None = None
    task_id: str | None = None
    dispatched: bool = False
    orphaned: bool = False
    lateness: float | None = None
    run_state: str | None = None
    run_at: float = float("-inf")
    runtime: float | None = None
    worker: str | None = None
    exception: str | None = None
    #: the last finish counted in the job's runtimes (state, send time): once each
    counted: tuple[str, float] | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    #: catch-up, takeover and orphan notes, in the order they arrived (each once)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    @property
    def state(self) -> str:
        """Where the occurrence stands (the rules are in the module's docstring)."""
        if self.run_state is not None:
            return self.run_state
        if self.dispatched:
            return PUBLISHED
        if self.orphaned:
            return ORPHANED_STATE
        reasons = set(self.skipped.values())
        if SkipReason.PAUSED.value in reasons:
            return PAUSED_STATE
        if SkipReason.STILL_RUNNING.value in reasons:
            return SKIPPED
        if SkipReason.PUBLISH_ERROR.value in reasons:
            return MISSED
        if SkipReason.CLAIMED_ELSEWHERE.value in reasons or not reasons:
            return CLAIMED
        return MISSED  # claim-error, invalid-entry, clock-fenced (or a newer beat's reason)

    def run(self, state: str, sent: float) -> bool:
        """Whether a run transition to *state* sent at *sent* replaces the one shown."""
        if self.run_state is None:
            return True
        if sent < self.run_at:
            return False  # sent before the transition shown: it arrived late
        return not (state == RUNNING and self.run_state in _TERMINAL)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "at": self.at, "occurrence": self.occurrence,
                "placement": self.placement, "claim": self.claim, "winner": self.winner,
                "task_id": self.task_id, "state": self.state, "lateness": self.lateness,
                "runtime": self.runtime, "lateness_text": _text(self.lateness),
                "runtime_text": _text(self.runtime), "worker": self.worker,
                "exception": self.exception,
                "notes": list(self.notes),
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
    #: (runtime, run state) of the last finished runs, oldest first
    runtimes: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=RUNTIMES))


@dataclass
class _Node:
    name: str
    dispatched: int = 0
    skipped: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    last_seen: float = 0.0
    drift: dict[str, Any] = field(default_factory=dict)

    def as_dict(self, now: float) -> dict[str, Any]:
        return {"node": self.name, "dispatched": self.dispatched, "skipped": self.skipped,
                "reasons": dict(sorted(self.reasons.items())), "last_seen": _iso(self.last_seen),
                "last_seen_ts": self.last_seen,
                "last_seen_ago": _text(max(0.0, round(now - self.last_seen))),
                "drift": self.drift}


class Board:
    """Recent occurrences per job and counts per node, per cluster; thread-safe.

    The events of each cluster (``elarion_beat_cluster``: the app that sent them) are
    kept apart: two apps whose events share a broker never mix their jobs or their
    nodes of one name. Events without a cluster (beats before clusters) count for
    every cluster's view (:meth:`snapshot`)."""

    #: Clusters kept at most (the least recently updated go first).
    MAX_CLUSTERS = 20

    def __init__(self, per_job: int = 20, max_jobs: int = 200, max_nodes: int = 200) -> None:
        self.per_job = per_job
        self.max_jobs = max_jobs
        self.max_nodes = max_nodes
        self.events = 0
        self._spaces: OrderedDict[str, _Space] = OrderedDict()
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
        with self._lock:
            self.events += 1
            self._space(event_text(event.get("cluster"))).observe(kind, event, seen)

    def _space(self, cluster: str) -> _Space:
        space = self._spaces.pop(cluster, None) or _Space(self.per_job, self.max_jobs,
                                                            self.max_nodes)
        self._spaces[cluster] = space  # most recently updated last
        while len(self._spaces) > self.MAX_CLUSTERS:
            del self._spaces[next(iter(self._spaces))]
        return space

    @property
    def clusters(self) -> list[str]:
        """The clusters whose events arrived (``''``: events of beats before clusters)."""
        with self._lock:
            return sorted(self._spaces)

    def snapshot(self, cluster: str | None = None) -> dict[str, Any]:
        """Everything the page shows, as JSON-ready data: newest occurrences first; of
        *cluster* (and of beats before clusters) when given, else of every cluster."""
        now = time.time()
        with self._lock:
            spaces = [space for name, space in self._spaces.items()
                      if cluster is None or name in (cluster, "")]
            jobs = [{"job": j.name, "task_name": j.task_name, "dispatched": j.dispatched,
                     "skipped": j.skipped, "orphaned": j.orphaned, "updated": _iso(j.updated),
                     "runtimes": [r for r, _ in j.runtimes],
                     "runtimes_text": [_text(r) for r, _ in j.runtimes],
                     "max_runtime_text": _text(max((r for r, _ in j.runtimes), default=None)),
                     "runtime_states": [s for _, s in j.runtimes],
                     "occurrences": [o.as_dict() for o in sorted(
                         j.occurrences.values(), key=lambda o: o.at, reverse=True)]}
                    for j in sorted((j for space in spaces for j in space._jobs.values()),
                                    key=lambda j: j.name)]
            nodes = [n.as_dict(now) for n in sorted(
                (n for space in spaces for n in space._nodes.values()), key=lambda n: n.name)]
            foreign = [{**f, "count": sum(t["count"] for t in f["tasks"].values()),
                        "last_seen": _iso(f["last_seen_ts"]),
                        "last_seen_ago": _text(max(0.0, round(now - f["last_seen_ts"]))),
                        "tasks": sorted(f["tasks"].values(), key=lambda t: t["task"])}
                       for space in spaces for f in reversed(space._foreign.values())]
            foreign.sort(key=lambda f: f["last_seen_ts"], reverse=True)
            return {"jobs": jobs, "nodes": nodes, "foreign_beats": foreign,
                    "events": self.events, "cluster": cluster,
                    "clusters": sorted(c for c in self._spaces if c),
                    "now": _iso(now), "now_ts": now}

class _Space:
    """The jobs and nodes of one cluster (under the board's lock)."""

    def __init__(self, per_job: int, max_jobs: int, max_nodes: int) -> None:
        self.per_job = per_job
        self.max_jobs = max_jobs
        self.max_nodes = max_nodes
        self._jobs: dict[str, _Job] = {}
        self._nodes: dict[str, _Node] = {}
        #: task id -> (job, occurrence key), most recent last; max_jobs * per_job of them
        self._tasks: OrderedDict[str, tuple[str, str]] = OrderedDict()
        #: foreign senders (origin) -> what the page shows of them, most recent last
        self._foreign: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def observe(self, kind: Any, event: Mapping[str, Any], seen: float) -> None:
        if kind == RUN:  # a worker's: its node is the beat node that sent the task
            self._run(event, seen)
            return
        if kind == FOREIGN_BEAT:  # a worker's: a sender that is no node of ours
            self._foreign_beat(event, seen)
            return
        name = event_text(event.get("node")) or event_text(event.get("hostname"))
        manual = kind == DISPATCHED and bool(event.get("manual"))
        # a run by hand names its operator, no beat node: it counts for the job only
        node = _Node(name) if manual else self._node(name, seen)
        if kind in (HEARTBEAT, ONE_OFF):  # news of the node only: it is alive (the
            return  # one-offs card reads the one-offs' rows, :mod:`.one_offs`)
        if kind == DRIFT:
            differing = event.get("differing")
            node.drift = dict(differing) if isinstance(differing, Mapping) else {}
            return
        job = self._job(event_text(event.get("job")), seen)
        job.task_name = event.get("task_name") or job.task_name
        occ = self._occurrence(job, event, self._key(event, node.name, seen))
        if kind == ORPHANED:
            self._orphaned(job, occ, event)
            self._remember(job, occ)
            return
        if event.get("catch_up"):
            occ.note("catch-up")
        if manual:
            occ.note("run by hand")
        if kind == DISPATCHED:
            node.dispatched += 1
            job.dispatched += 1
            occ.winner, occ.task_id, occ.dispatched = node.name, event.get("task_id"), True
            lateness = event_seconds(event.get("lateness"))
            occ.lateness = occ.lateness if lateness is None else lateness
            self._remember(job, occ)
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

    def _run(self, event: Mapping[str, Any], seen: float) -> None:
        """A worker's ``elarion-run`` event: the run of an occurrence's task."""
        state = event_text(event.get("state"))
        if state not in _RUN_STATES:
            return
        task_id = event_text(event.get("task_id"))
        known = self._tasks.get(task_id) if task_id else None
        job = self._job(known[0] if known else event_text(event.get("job")), seen)
        if known is not None and known[1] in job.occurrences:
            key = known[1]
        elif task_id and (event.get("placement") == Placement.EVERY_NODE.value
                          or not event.get("occurrence")):
            key = f"task:{task_id}"
        else:
            key = event_text(event.get("occurrence"))
            if not key:
                return  # names no occurrence: nothing to attach it to
        occ = self._occurrence(job, event, (key, event_text(event.get("occurrence")) or _iso(seen)))
        occ.task_id = occ.task_id or task_id or None
        self._remember(job, occ)
        sent = _sent_at(event)
        runtime = event_seconds(event.get("runtime")) if state in FINISHED_RUNS else None
        if runtime is not None and occ.counted != (state, sent):
            occ.counted = (state, sent)
            job.runtimes.append((runtime, state))
        if not occ.run(state, sent):
            return
        occ.run_state, occ.run_at = state, sent
        occ.worker = event_text(event.get("worker")) or occ.worker
        occ.runtime = runtime
        occ.exception = None
        if state != RUNNING:
            occ.exception = event_text(event.get("exception")) or None

    @staticmethod
    def _orphaned(job: _Job, occ: _Occurrence, event: Mapping[str, Any]) -> None:
        """An orphan event: claimed by *holder*, never published (counted once)."""
        holder = event_text(event.get("holder")) or "?"
        if not occ.orphaned:
            job.orphaned += 1
            occ.orphaned = True
        if event.get("action") == "taken-over":
            occ.note(f"orphaned (claimed by {holder}, never published)")
        else:
            error = event_text(event.get("publish_error"))
            occ.note(f"orphaned: claimed by {holder}, never published"
                     + (f" ({error})" if error else "") + ", not sent again")
        occ.task_id = occ.task_id or event.get("task_id")

    def _remember(self, job: _Job, occ: _Occurrence) -> None:
        """Map the occurrence's task id to it, for the run events of that task."""
        if not occ.task_id or job.occurrences.get(occ.key) is not occ:
            return  # no task, or already pushed out by newer occurrences
        self._tasks[str(occ.task_id)] = (job.name, occ.key)
        self._tasks.move_to_end(str(occ.task_id))
        while len(self._tasks) > self.max_jobs * self.per_job:
            self._tasks.popitem(last=False)

    def _foreign_beat(self, event: Mapping[str, Any], seen: float) -> None:
        count = event.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            return
        origin = event_text(event.get("origin"))
        sender = self._foreign.pop(origin, None) or {
            "origin": origin, "host": event_text(event.get("host")), "tasks": {}}
        self._foreign[origin] = sender
        task = event_text(event.get("task_name"))
        held = sender["tasks"].setdefault(task, {"task": task, "entry": None, "count": 0})
        held["count"] += count
        held["entry"] = event.get("entry") or held["entry"]
        sender["last_seen_ts"] = max(sender.get("last_seen_ts", seen), seen)
        sender["worker"] = event_text(event.get("worker"))
        while len(self._foreign) > self.max_nodes:
            del self._foreign[next(iter(self._foreign))]

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

    @staticmethod
    def _key(event: Mapping[str, Any], node: str, seen: float) -> tuple[str, str]:
        """The occurrence key and time of a beat's event."""
        occurrence = event.get("occurrence")
        if occurrence:
            return str(occurrence), str(occurrence)
        if event.get("task_id"):  # an every-node run: no claim, one row per node
            return f"task:{event['task_id']}", _iso(seen)
        return f"{node}@{seen!r}", _iso(seen)  # a skip that never got as far as a claim

    def _occurrence(self, job: _Job, event: Mapping[str, Any],
                    key_at: tuple[str, str]) -> _Occurrence:
        key, at = key_at
        occ = job.occurrences.get(key)
        if occ is None:
            occurrence = None if key.startswith("task:") else event.get("occurrence")
            occ = job.occurrences[key] = _Occurrence(
                job.name, key, at, str(occurrence) if occurrence else None,
                event.get("placement"), event.get("claim"))
            while len(job.occurrences) > self.per_job:
                oldest = min(job.occurrences, key=lambda k: job.occurrences[k].at)
                del job.occurrences[oldest]
        return occ


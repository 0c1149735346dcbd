"""Beat replicas as separate processes, released together by one exact slot.

Each replica is a forked process that builds its own app and scheduler (own node
name, own broker and database connections) on the real Redis broker and the real
PostgreSQL claims table, then runs beat's own loop (``sleep(tick())``, as
``celery.beat.Service.start`` does). Every entry is a ``cron`` entry with a slot
at the same instant, so the replicas are released together by the clock itself:
nothing but the schedule says when to go.

Kinds of replica:

* ``elarion``: :class:`celery_elarion_beat.ClaimingScheduler` as shipped (its
  settings, e.g. ``elarion_beat_claim_chunk``, come from the app conf);
* ``stock``: ``celery.beat.Scheduler``, uncoordinated (every replica sends all).

A node's starting chunk comes from its rank among the live nodes that its last
heartbeat saw (``Maintenance.live_nodes``). A replica heartbeats once at start-up
and then every ``elarion_beat_heartbeat_interval``; replicas started together see
only the nodes that heartbeated before them until their next heartbeat. With
``warmup`` set (seconds, the heartbeat interval used) the replicas run with that
short heartbeat interval and the slot is placed so that every replica has
heartbeated again after the last one started; the run is repeated (with a longer
lead) if some replica still did not see all the others at the slot.

Each replica reports its ticks, its claim calls (rows asked, rows won, seconds,
round trips), the live nodes and starting chunk of every batch it split into
chunks, its heartbeats, its Celery events (sent, dropped, time to drain the
event queue) and, when asked, the instant each task message was published
(Celery's ``after_task_publish`` signal, in the replica itself).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from celery_elarion_beat.testing._harness import claims_tables, drop_tables, read_claims

from .common import (
    PG_DSN,
    QueueReader,
    cron_at,
    drop_queue,
    make_app,
    message_headers,
    names,
    queue_length,
)

_FORK = multiprocessing.get_context("fork")
TASK = "bench.noop"


@dataclass
class Spec:
    kind: str
    node: str
    rank: int
    replicas: int
    table: str
    queue: str
    entries: int
    expr: str                 # the cron expression of every entry
    expected: int             # outcomes (dispatched + skipped) after which the replica stops
    end_ts: float             # ... or this instant, whichever comes first
    conf: dict[str, Any] = field(default_factory=dict)
    hook_publish: bool = False


def _entries(spec: Spec) -> dict[str, Any]:
    from celery_elarion_beat import cron

    schedule = cron(spec.expr)
    return {f"job-{i:05}": {"task": TASK, "schedule": schedule, "args": (i,)}
            for i in range(spec.entries)}


def _build(spec: Spec) -> tuple[Any, Any]:
    from celery.beat import Scheduler

    app = make_app(spec.queue, entries=_entries(spec), table=spec.table, node=spec.node,
                   main=f"bench-{spec.node}", **spec.conf)
    if spec.kind == "stock":
        counter = {"sent": 0}

        class CountingScheduler(Scheduler):  # type: ignore[misc]
            def apply_entry(self, entry: Any, producer: Any = None) -> None:
                counter["sent"] += 1
                super().apply_entry(entry, producer=producer)

        scheduler = CountingScheduler(app)
        scheduler.bench_counter = counter
    else:
        from celery_elarion_beat import ClaimingScheduler

        scheduler = ClaimingScheduler(app)
    return app, scheduler


def _outcomes(spec: Spec, scheduler: Any) -> tuple[int, int]:
    """(dispatched, skipped) so far."""
    if spec.kind == "stock":
        return scheduler.bench_counter["sent"], 0
    from celery_elarion_beat import Outcome

    rec = scheduler.recorder
    return rec.total(Outcome.DISPATCHED), rec.total(Outcome.SKIPPED)


def _replica_main(spec: Spec, conn: Any) -> None:
    try:
        built = time.time()
        app, scheduler = _build(spec)
        claims: list[dict[str, Any]] = []
        splits: list[dict[str, Any]] = []      # every batch cut into chunks: live nodes, start
        heartbeats: list[dict[str, Any]] = []  # start, seconds, live nodes seen
        published: list[tuple[str, str | None, str | None, float]] = []
        if spec.kind != "stock":
            store = scheduler.store
            original = store.claim

            def timed_claim(node: str, requests: Any) -> Any:
                t0, trips0 = time.time(), store.round_trips
                answers = original(node, requests)
                if any(r.job.startswith("job-") for r in requests):
                    claims.append({"start": t0, "end": time.time(), "rows": len(requests),
                                   "won": sum(1 for a in answers if a.won),
                                   "round_trips": store.round_trips - trips0})
                return answers

            store.claim = timed_claim
            _watch(scheduler, splits, heartbeats)
        if spec.hook_publish:
            from celery.signals import after_task_publish

            def on_publish(sender: Any = None, headers: Any = None, **kw: Any) -> None:
                h = headers or {}
                published.append((h.get("id"), h.get("elarion_job"),
                                  h.get("elarion_occurrence"), time.time()))

            after_task_publish.connect(on_publish, weak=False)
        scheduler.producer  # noqa: B018 - connect to the broker, as beat does at start
        first = scheduler.tick()  # populates the heap: nothing is due yet
        trips_start = scheduler.store.round_trips if spec.kind != "stock" else 0
        conn.send(("ready", {"ready": time.time(), "built": built, "first_delay": first,
                             "live_nodes": _live(scheduler)}))
        cpu_start = time.process_time()
        ticks: list[dict[str, Any]] = []
        done_at = None
        delay = first
        while True:
            now = time.time()
            if now >= spec.end_ts:
                break
            if delay > 0:
                time.sleep(min(delay, spec.end_ts - now))
            before = sum(_outcomes(spec, scheduler))
            t0 = time.time()
            delay = scheduler.tick()
            t1 = time.time()
            after = sum(_outcomes(spec, scheduler))
            if after > before:
                ticks.append({"start": t0, "end": t1, "outcomes": after - before})
            if after >= spec.expected:
                done_at = t1
                break
        cpu = time.process_time() - cpu_start
        dispatched, skipped = _outcomes(spec, scheduler)
        trips = (scheduler.store.round_trips - trips_start) if spec.kind != "stock" else 0
        events = None
        sender = getattr(scheduler, "events", None)
        if sender is not None:  # the events are sent by a thread of their own: let it finish
            drained = sender.flush(60.0)
            events = {"sent": sender.sent, "dropped": sender.dropped, "drained": drained,
                      "messages": getattr(sender, "messages", sender.sent),
                      "drained_at": time.time()}
        result = {"node": spec.node, "dispatched": dispatched, "skipped": skipped,
                  "ticks": ticks, "claims": claims, "done_at": done_at,
                  "round_trips": trips, "published": published, "pid": os.getpid(),
                  "cpu": cpu, "splits": splits, "heartbeats": heartbeats, "events": events}
        try:
            scheduler.close()
        except Exception:  # noqa: BLE001
            pass
        conn.send(("result", result))
    except BaseException:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _live(scheduler: Any) -> list[str] | None:
    maintenance = getattr(scheduler, "maintenance", None)
    return list(maintenance.live_nodes) if maintenance is not None else None


def _watch(scheduler: Any, splits: list[dict[str, Any]],
           heartbeats: list[dict[str, Any]]) -> None:
    """Record what the library decides with: the live nodes and starting chunk of
    every batch cut into chunks (:func:`celery_elarion_beat.beat.chunks.first_chunk`, in
    this replica's process only), and every heartbeat."""
    from celery_elarion_beat.beat import chunks as chunking

    decide = chunking.first_chunk

    def recorded_first_chunk(chunks: int, node: str, live: Sequence[str]) -> int:
        first = decide(chunks, node, live)
        if chunks >= 1:
            splits.append({"at": time.time(), "chunks": chunks, "first": first,
                           "live_nodes": list(live)})
        return first

    chunking.first_chunk = recorded_first_chunk
    maintenance = scheduler.maintenance
    if maintenance is None:
        return
    heartbeat = maintenance.heartbeat

    def recorded_heartbeat() -> None:
        t0 = time.time()
        try:
            heartbeat()
        finally:
            heartbeats.append({"start": t0, "seconds": time.time() - t0,
                               "live_nodes": list(maintenance.live_nodes)})

    maintenance.heartbeat = recorded_heartbeat


class ReplicaError(RuntimeError):
    pass


def run_cluster(kind: str, replicas: int, entries: int, *, tag: str, lead: float = 3.0,
                conf: dict[str, Any] | None = None, expr: str | None = None,
                duration: float | None = None, hook_publish: bool = True,
                consume: bool = False, timeout: float = 120.0, warmup: float | None = None,
                tries: int = 3) -> dict[str, Any]:
    """Run *replicas* processes of *kind* on *entries* entries; return what happened.

    Without *expr*, every entry is due at one slot ``lead`` seconds (or more) after
    the replicas were forked; each replica stops once it has an outcome for every
    entry. With *expr* (e.g. ``*/5 * * * * *``) the replicas run for *duration*
    seconds after the lead and report their publish times. With *consume*, a thread
    of this process pops every message off the queue as it arrives (BRPOP) and
    notes the instant (``received``). With *warmup* (a heartbeat interval in
    seconds), the replicas heartbeat that often and the slot comes at least two
    heartbeats after the last replica was ready, so that every replica knows every
    other one's rank at the slot (checked afterwards; the run is repeated with a
    longer lead if not).
    """
    conf = dict(conf or {})
    margin = 0.2
    if warmup:
        conf["elarion_beat_heartbeat_interval"] = warmup
        margin = 2 * warmup + 0.5
        lead += margin
    problems: list[str] = []
    for attempt in range(1, tries + 1):
        try:
            result = _run_once(kind, replicas, entries, tag=tag, lead=lead * attempt,
                               margin=margin, conf=conf, expr=expr, duration=duration,
                               hook_publish=hook_publish, consume=consume, timeout=timeout)
            if warmup and expr is None and not views_complete(result):
                raise _Late("some replica did not see every other one at the slot: "
                            + "; ".join(f"{n['node']}: {s['live_nodes']}"
                                        for n in result["nodes"] for s in n["splits"][:1]))
            result["attempts"] = attempt
            result["problems"] = problems
            result["warmup"] = warmup
            return result
        except _Late as late:
            problems.append(str(late))
            if attempt == tries:
                raise ReplicaError("; ".join(problems)) from None
    raise AssertionError("unreachable")


def views_complete(run: dict[str, Any]) -> bool:
    """Every replica's batch at the slot was split knowing every replica (its rank)."""
    names_ = {n["node"] for n in run["nodes"]}
    for n in run["nodes"]:
        for split in n["splits"][:1]:
            if split["chunks"] > 1 and set(split["live_nodes"] or ()) != names_:
                return False
    return True


class _Late(Exception):
    pass


def _receive(proc: Any, pipe: Any, deadline: float, late: str) -> Any:
    """The next report of a replica, which must come by *deadline* (``time.time()``)."""
    if not pipe.poll(max(0.1, deadline - time.time())):
        raise ReplicaError(f"replica pid {proc.pid} {late}")
    what, payload = pipe.recv()
    if what == "error":
        raise ReplicaError(f"replica failed:\n{payload}")
    return payload


def _run_once(kind: str, replicas: int, entries: int, *, tag: str, lead: float,
              margin: float, conf: dict[str, Any], expr: str | None, duration: float | None,
              hook_publish: bool, consume: bool, timeout: float) -> dict[str, Any]:
    table, queue = names(tag)
    slot = math.ceil(time.time() + lead)
    if expr is None:
        expr_, expected, end_ts = cron_at(slot), entries, slot + timeout
    else:
        expr_, expected, end_ts = expr, 1 << 62, slot + (duration or 10.0)
    specs = [Spec(kind=kind, node=f"{tag}-node-{i + 1}", rank=i, replicas=replicas, table=table,
                  queue=queue, entries=entries, expr=expr_, expected=expected, end_ts=end_ts,
                  conf=conf, hook_publish=hook_publish) for i in range(replicas)]
    procs: list[tuple[Any, Any]] = []
    consumer: QueueReader | None = None
    try:
        for spec in specs:
            parent, child = _FORK.Pipe(duplex=False)
            proc = _FORK.Process(target=_replica_main, args=(spec, child), daemon=True)
            proc.start()
            child.close()
            procs.append((proc, parent))
        if consume:  # a thread only after the forks: a forked child never inherits it
            consumer = QueueReader(queue)
            consumer.start()
        ready = [_receive(proc, pipe, slot + 60, "never became ready") for proc, pipe in procs]
        last_ready = max(r["ready"] for r in ready)
        if last_ready > slot - margin:
            raise _Late(f"replicas were ready {last_ready - slot:+.2f}s from the slot, "
                        f"{margin:g}s before it needed (lead {lead:g}s)")
        results = [_receive(proc, pipe, end_ts + 30, "did not finish") for proc, pipe in procs]
        for proc, _ in procs:
            proc.join(10)
        received: list[tuple[dict[str, Any], float]] = []
        if consumer is not None:
            received = consumer.stop()
        messages = [h for h, _ in received]
        messages += message_headers(queue) if kind != "stock" else []
        sent = len(messages) if kind != "stock" else queue_length(queue) + len(received)
        keys = Counter((h.get("elarion_job"), h.get("elarion_occurrence")) for h in messages)
        return {
            "kind": kind, "replicas": replicas, "entries": entries, "slot": slot,
            "expr": expr_, "lead": lead, "ready": ready, "nodes": results, "sent": sent,
            "distinct": len(keys), "duplicates": sum(n - 1 for n in keys.values()),
            "claims_by_node": (dict(Counter(c.node for c in read_claims(PG_DSN, table)))
                               if kind != "stock" else {}),
            "specs": [asdict(s) for s in specs[:1]],
            "received": [(h.get("elarion_job"), h.get("elarion_occurrence"), h.get("elarion_node"),
                          t) for h, t in received],
        }
    finally:
        if consumer is not None:
            consumer.stop()
        for proc, _ in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        drop_queue(queue)
        drop_tables(PG_DSN, *claims_tables(table))


# -- summaries ----------------------------------------------------------------


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Times relative to the slot; per-node wins, claims and round trips."""
    slot = run["slot"]
    nodes = run["nodes"]
    done = [n["done_at"] for n in nodes if n["done_at"] is not None]
    first_tick = [n["ticks"][0]["start"] for n in nodes if n["ticks"]]
    publishes = [p[3] for n in nodes for p in n["published"]]
    total_wins = sum(n["dispatched"] for n in nodes) or 1
    per_node = []
    for n in nodes:
        claims = n["claims"]
        split = (n.get("splits") or [None])[0]
        events = n.get("events") or {}
        beats = n.get("heartbeats") or []
        per_node.append({
            # what the node decided its batch with (None: never split a batch, or stock)
            "live_seen": len(split["live_nodes"] or []) if split else None,
            "live_nodes": split["live_nodes"] if split else None,
            "chunks": split["chunks"] if split else None,
            "first_chunk": split["first"] if split else None,
            "claims_all_won": sum(1 for c in claims if c["won"] == c["rows"]),
            "claims_all_lost": sum(1 for c in claims if c["won"] == 0),
            "events_sent": events.get("sent"), "events_dropped": events.get("dropped"),
            "event_messages": events.get("messages"),
            "events_drained": (events["drained_at"] - slot) if events.get("drained_at")
            else None,
            "heartbeats": len(beats),
            "heartbeat_s": max((b["seconds"] for b in beats), default=None),
            "node": n["node"], "dispatched": n["dispatched"], "skipped": n["skipped"],
            "share": n["dispatched"] / total_wins,
            "ticks": len(n["ticks"]),
            "claim_calls": len(claims),
            "claim_round_trips": sum(c["round_trips"] for c in claims),
            "rows_per_claim": (sum(c["rows"] for c in claims) / len(claims)) if claims else 0,
            "claim_seconds": sum(c["end"] - c["start"] for c in claims),
            "first_tick_lag": (n["ticks"][0]["start"] - slot) if n["ticks"] else None,
            "cpu": n["cpu"],
            "done": (n["done_at"] - slot) if n["done_at"] is not None else None,
            "last_publish": (max(p[3] for p in n["published"]) - slot)
            if n["published"] else None,
        })
    return {
        "kind": run["kind"], "replicas": run["replicas"], "entries": run["entries"],
        "all_done": len(done) == len(nodes),
        # the last task message published by any replica (after_task_publish)
        "time_to_all": (max(publishes) - slot) if publishes else math.nan,
        # every replica has an outcome for every entry (losers' skips recorded too)
        "time_to_idle": (max(done) - slot) if done else math.nan,
        "first_tick_lag": (min(first_tick) - slot) if first_tick else math.nan,
        "sent": run["sent"], "distinct": run["distinct"], "duplicates": run["duplicates"],
        "missing": run["entries"] - run["distinct"] if run["kind"] != "stock" else None,
        "per_node": per_node,
        "max_share": max((p["share"] for p in per_node), default=math.nan),
        "winners": sum(1 for p in per_node if p["dispatched"]),
        "views_complete": views_complete(run) if run["kind"] != "stock" else None,
        "warmup": run.get("warmup"), "attempts": run.get("attempts", 1),
        # seconds from the last replica being ready to the slot
        "ready_lead": slot - max(r["ready"] for r in run["ready"]) if run.get("ready") else None,
        "problems": run.get("problems", []),
    }

"""2. Throughput: N entries due in the same second, on 1 and 3 replicas.

Replicas are separate processes (:mod:`benchmarks.replicas`), released together
by one exact ``cron`` slot. Measured: time from the slot to the last task message
published by any replica, duplicates and misses (read back from the Redis
queue: one message per (job, occurrence) expected), the claim calls of each node
(one chunk of ``elarion_beat_claim_chunk`` rows and one database round trip each),
the live nodes each node split its batch with, and each node's wins.

The floor is Celery's own publish: P processes (forked, each with its own
connection) publishing N/P messages with ``app.send_task`` from the same instant.
"""

from __future__ import annotations

import math
import multiprocessing
import time
import traceback
from typing import Any

from celery_elarion_beat.testing._harness import sleep_until

from . import replicas as rp
from .common import (
    Table,
    drop_queue,
    library_default,
    make_app,
    names,
    queue_length,
)

_FORK = multiprocessing.get_context("fork")


def _publisher(queue: str, count: int, start_at: float, conn: Any) -> None:
    try:
        app = make_app(queue)
        with app.producer_or_acquire() as producer:
            app.send_task(rp.TASK, (-1,), producer=producer)  # connect and declare, untimed
            sleep_until(start_at)
            t0 = time.time()
            for i in range(count):
                app.send_task(rp.TASK, (i,), producer=producer,
                              headers={"celery_beat_task": True})
            t1 = time.time()
        conn.send(("ok", {"start": t0, "end": t1, "count": count}))
    except BaseException:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def floor(total: int, processes: int) -> dict[str, Any]:
    """Publish *total* messages from *processes* processes at once; wall time and ms/msg."""
    _, queue = names("floor")
    share = math.ceil(total / processes)
    start_at = time.time() + 0.8 + 0.3 * processes
    procs = []
    try:
        for _ in range(processes):
            parent, child = _FORK.Pipe(duplex=False)
            proc = _FORK.Process(target=_publisher, args=(queue, share, start_at, child),
                                 daemon=True)
            proc.start()
            child.close()
            procs.append((proc, parent))
        done = []
        for proc, pipe in procs:
            if not pipe.poll(300):
                raise RuntimeError("a publisher did not finish")
            what, payload = pipe.recv()
            if what == "error":
                raise RuntimeError(payload)
            done.append(payload)
            proc.join(10)
        sent = queue_length(queue) - processes
        wall = max(d["end"] for d in done) - start_at
        per_msg = [1000 * (d["end"] - d["start"]) / d["count"] for d in done]
        return {"processes": processes, "total": share * processes, "sent": sent, "wall": wall,
                "ms_per_msg_per_process": sum(per_msg) / len(per_msg),
                "msgs_per_s": share * processes / wall}
    finally:
        for proc, _ in procs:
            if proc.is_alive():
                proc.kill()
        drop_queue(queue)


#: variant -> label
LABELS = {
    "defaults": "library, defaults",
    "events-off": "library, events off",
    "cold": "library, defaults, cold start (no warm-up)",
}


def configurations(with_events_off: bool = True,
                   with_cold: bool = True) -> list[tuple[str, int, dict[str, Any], bool]]:
    """(variant, replicas, app conf, warm-up) of every run.

    Warm-up (several replicas only): the replicas heartbeat every ``heartbeat``
    seconds and the slot waits until each has seen all the others, as in a
    cluster that has been running for a while. ``cold``: the replicas are
    started together just before the slot with the default heartbeat interval,
    so each knows only the nodes that heartbeated before it started.
    """
    quiet = {"elarion_beat_events": False}
    out: list[tuple[str, int, dict[str, Any], bool]] = [
        ("defaults", 1, {}, False),
        ("defaults", 3, {}, True),
    ]
    if with_events_off:
        out += [("events-off", 1, quiet, False), ("events-off", 3, quiet, True)]
    if with_cold:
        out += [("cold", 3, {}, False)]
    return out


def run(entries: int, floor_total: int, with_events_off: bool = True, with_cold: bool = True,
        heartbeat: float = 1.0, lead: float = 3.0, log: Any = print) -> dict[str, Any]:
    floors = []
    for processes in (1, 3):
        f = floor(floor_total, processes)
        floors.append(f)
        log(f"  floor: {processes} process(es) published {f['total']} in {f['wall']:.2f}s "
            f"({f['ms_per_msg_per_process']:.3f} ms/msg/process)")
    runs = []
    for variant, replicas, conf, warm in configurations(with_events_off, with_cold):
        raw = rp.run_cluster("elarion", replicas, entries, tag="tput", conf=conf,
                             lead=lead + entries / 5000 * replicas, timeout=120,
                             warmup=heartbeat if warm else None)
        summary = rp.summarize(raw)
        summary["variant"] = variant
        summary["label"] = LABELS[variant]
        runs.append(summary)
        log(f"  throughput: {summary['label']}, {replicas} replica(s): "
            f"{summary['time_to_all']:.2f}s, duplicates {summary['duplicates']}, missing "
            f"{summary['missing']}, shares {[round(p['share'], 3) for p in summary['per_node']]}"
            f", live nodes seen {[p['live_seen'] for p in summary['per_node']]}, first chunks "
            f"{[p['first_chunk'] for p in summary['per_node']]}")
    return {"entries": entries, "floors": floors, "runs": runs, "heartbeat": heartbeat,
            "claim_chunk": library_default("elarion_beat_claim_chunk"),
            "heartbeat_default": library_default("elarion_beat_heartbeat_interval")}


def tables(result: dict[str, Any]) -> list[Table]:
    n = result["entries"]
    floor_t = Table("Floor: Celery's own publish (app.send_task on Redis), no beat at all",
                    ["processes", "messages", "wall s", "ms/msg/process", "msgs/s"])
    for f in result["floors"]:
        floor_t.add(f["processes"], f["total"], f["wall"], f["ms_per_msg_per_process"],
                    f["msgs_per_s"])
    chunk = result.get("claim_chunk", "?")
    t = Table(f"Throughput: {n} cron entries due at the same second "
              f"(elarion_beat_claim_chunk {chunk}, the default)",
              ["configuration", "replicas", "time to all sent s", "goal s", "duplicates",
               "missing", "wins per node", "max share", "every node knew every rank"])
    for r in result["runs"]:
        goal = {1: "<= 10", 3: "<= 6"}.get(r["replicas"], "-")
        t.add(r["label"], r["replicas"], r["time_to_all"], goal, r["duplicates"], r["missing"],
              "/".join(str(p["dispatched"]) for p in r["per_node"]), r["max_share"],
              _views(r))
    t.notes = [
        f"warm-up (runs with several replicas except 'cold start'): the replicas run with "
        f"elarion_beat_heartbeat_interval = {result.get('heartbeat', '?')} s and the slot "
        "comes two heartbeats after the last replica started, so that every node's last "
        "heartbeat saw every other node; 'cold start': default heartbeat interval "
        f"({result.get('heartbeat_default', '?')} s), the replicas' only heartbeat before the "
        "slot is the one each makes at start-up",
    ]
    nodes = Table(f"Throughput, per node ({n} entries)",
                  ["configuration", "replicas", "node", "wins", "live nodes seen",
                   "first chunk", "claim calls (all won / all lost)", "claim s", "ticks",
                   "first tick - slot s", "done s", "CPU s", "events sent / dropped",
                   "events drained s"])
    for r in result["runs"]:
        for p in r["per_node"]:
            nodes.add(r["label"], r["replicas"], p["node"].rsplit("-", 1)[-1], p["dispatched"],
                      _or_dash(p["live_seen"]),
                      "-" if p["first_chunk"] is None else f"{p['first_chunk']} of {p['chunks']}",
                      f"{p['claim_calls']} ({p['claims_all_won']} / {p['claims_all_lost']})",
                      p["claim_seconds"], p["ticks"], p["first_tick_lag"], p["done"], p["cpu"],
                      "-" if p["events_sent"] is None
                      else f"{p['events_sent']} / {p['events_dropped']}",
                      _or_dash(p["events_drained"]))
    nodes.notes = [
        "'live nodes seen' = the live nodes (nodes table, last heartbeat) the node split its "
        "batch with; 'first chunk' = where it started (rank * chunks // live nodes); one "
        "claim call = one chunk = one database round trip",
        "'done' = the node has an outcome (sent or skipped) for every entry; 'CPU s' = the "
        "replica process's own CPU time from the slot to done; 'events drained' = its "
        "event thread has sent (or dropped) every queued event, seconds from the slot",
    ]
    ratios = _ratios(result)
    return [floor_t, t, nodes] + ([ratios] if ratios.rows else [])


def _ratios(result: dict[str, Any]) -> Table:
    """Events on against off and against Celery's publish floor, and event messages per
    occurrence (issue #15's goals: <= 1.15, <= 1.25 and <= 1.1)."""
    n = result["entries"]
    t = Table(f"Throughput ratios ({n} entries)",
              ["replicas", "events on / events off", "events on / floor",
               "event messages per occurrence"])
    runs = {(r["variant"], r["replicas"]): r for r in result["runs"]
            if r.get("variant") in ("defaults", "events-off")}
    floors = {f["processes"]: f for f in result["floors"]}
    for replicas in sorted({k[1] for k in runs}):
        on, off = runs.get(("defaults", replicas)), runs.get(("events-off", replicas))
        if on is None:
            continue
        floor = floors.get(replicas)
        messages = [p.get("event_messages") for p in on["per_node"]]
        t.add(replicas,
              "-" if off is None else round(on["time_to_all"] / off["time_to_all"], 2),
              "-" if floor is None else round(on["time_to_all"] / floor["wall"], 2),
              "-" if None in messages else round(sum(messages) / n, 4))
    t.notes = ["time to all sent, in the same run; the floor with as many publishing "
               "processes as replicas; event messages = what the replicas' event threads "
               "published (an elarion-batch is one message)"]
    return t


def _or_dash(value: Any) -> Any:
    return "-" if value is None else value


def _views(run: dict[str, Any]) -> str:
    """'yes' when every node split its batch knowing all the replicas."""
    if run["replicas"] == 1:
        return "-"
    seen = [p["live_seen"] for p in run["per_node"] if p["live_seen"] is not None]
    if not seen:
        return "-"
    return ("yes" if run.get("views_complete") else "no") + \
        f" ({'/'.join(str(p['live_seen']) for p in run['per_node'])})"

"""3. Scale-out: 1, 2, 3 and 6 replicas dispatching N entries due at the same slot.

Every entry is a ``cron`` entry with its slot at the same instant (exact-slot
claims). Compared:

* the library as it is, with its default ``elarion_beat_claim_chunk`` and with
  smaller chunks set through that setting (a node can only win whole chunks, so
  the chunk size bounds how many nodes share a batch);
* the baseline: ONE uncoordinated stock ``celery.beat.Scheduler`` with the same
  entries (the goal: never slower than this).

With several replicas, every run has a warm-up (:func:`benchmarks.replicas.run_cluster`,
``warmup``): a short heartbeat interval and a slot two heartbeats after the last
replica started, so that every node knows every other node's rank at the slot;
the live nodes each replica split its batch with are recorded and checked.

Measured: time from the slot to the last task message published by any
replica, each node's share of the wins, duplicates and misses.
"""

from __future__ import annotations

from typing import Any

from . import replicas as rp
from .common import Table, library_default

STOCK = "one stock celery beat (uncoordinated)"


def label(chunk: int | None) -> str:
    """The label of the library with claim chunk *chunk* (None: the default)."""
    if chunk is None:
        return f"library, claim chunk {library_default('elarion_beat_claim_chunk')} (default)"
    return f"library, claim chunk {chunk}"


def run(entries: int, counts: tuple[int, ...], chunks: tuple[int | None, ...] = (None,),
        lead: float = 2.0, reps: int = 1, heartbeat: float = 1.0,
        log: Any = print) -> dict[str, Any]:
    """Each configuration *reps* times; the fastest run is reported (the others' times too)."""
    runs = []
    baseline = rp.summarize(rp.run_cluster("stock", 1, entries, tag="scale", lead=lead,
                                           timeout=180))
    baseline["label"] = STOCK
    baseline["all_times"] = [baseline["time_to_all"]]
    log(f"  scale-out baseline (one stock beat): {baseline['time_to_all']:.2f}s")
    for replicas in counts:
        for chunk in chunks:
            if chunk is not None and replicas == 1:
                continue  # one replica wins every chunk whatever their size
            conf = {} if chunk is None else {"elarion_beat_claim_chunk": chunk}
            tries = []
            for _ in range(reps):
                raw = rp.run_cluster("elarion", replicas, entries, tag="scale", conf=conf,
                                     lead=lead + 0.3 * replicas + entries / 5000 * replicas,
                                     timeout=120, warmup=heartbeat if replicas > 1 else None)
                s = rp.summarize(raw)
                tries.append(s)
                log(f"  scale-out {label(chunk)} x{replicas}: {s['time_to_all']:.2f}s, shares "
                    f"{[round(p['share'], 3) for p in s['per_node']]}, live nodes seen "
                    f"{[p['live_seen'] for p in s['per_node']]}, first chunks "
                    f"{[p['first_chunk'] for p in s['per_node']]}, duplicates "
                    f"{s['duplicates']}, missing {s['missing']}")
            best = min(tries, key=lambda t: t["time_to_all"])
            best["label"] = label(chunk)
            best["chunk"] = chunk or library_default("elarion_beat_claim_chunk")
            best["default_chunk"] = chunk is None
            best["all_times"] = [t["time_to_all"] for t in tries]
            best["all_max_shares"] = [t["max_share"] for t in tries]
            best["all_views_complete"] = [t["views_complete"] for t in tries]
            best["duplicates"] = sum(t["duplicates"] for t in tries)
            best["missing"] = sum(t["missing"] or 0 for t in tries)
            runs.append(best)
    return {"entries": entries, "chunks": [c or library_default("elarion_beat_claim_chunk")
                                           for c in chunks],
            "reps": reps, "heartbeat": heartbeat, "baseline": baseline, "runs": runs}


def tables(result: dict[str, Any]) -> list[Table]:
    base = result["baseline"]["time_to_all"]
    t = Table(f"Scale-out: {result['entries']} cron entries due at one slot",
              ["configuration", "replicas", "time to all sent s", "all runs s",
               "vs one stock beat", "win share per node %", "max share %", "chunks",
               "live nodes seen", "duplicates", "missing"])
    b = result["baseline"]
    t.add(b["label"], 1, base, _times(b), 1.0, "100", 100.0, "-", "-", "-", "-")
    for r in result["runs"]:
        shares = "/".join(f"{100 * p['share']:.0f}" for p in r["per_node"])
        n_chunks = -(-r["entries"] // r["chunk"])
        seen = "/".join("-" if p["live_seen"] is None else str(p["live_seen"])
                        for p in r["per_node"])
        t.add(r["label"], r["replicas"], r["time_to_all"], _times(r), r["time_to_all"] / base,
              shares, 100 * r["max_share"], n_chunks, seen, r["duplicates"], r["missing"])
    t.notes = ["time = from the slot to the last task message published by any replica, "
               f"fastest of {result.get('reps', 1)} run(s) per configuration (all runs listed; "
               "duplicates and missing summed over them); 'vs one stock beat' < 1 is faster "
               "than one uncoordinated beat",
               "'chunks' = ceil(entries / elarion_beat_claim_chunk); a node wins whole chunks, "
               "so at most that many nodes send; 'live nodes seen' = per node, how many live "
               "nodes its last heartbeat had seen when it cut the batch into chunks (its rank "
               "is its place among them); with several replicas the runs had a warm-up with "
               f"elarion_beat_heartbeat_interval = {result.get('heartbeat', '?')} s",
               "replicas share the machine's cores with each other, Redis and PostgreSQL"]
    return [t]


def _times(run: dict[str, Any]) -> str:
    return " / ".join(f"{t:.2f}" for t in run.get("all_times", [run["time_to_all"]]))

"""4. Latency: due -> published, for N entries due at once on R replicas.

Every entry is ``cron("*/P * * * * *")`` (a slot every P seconds), and R replica
processes run beat's loop for a while, so each slot releases N entries at once.

Method: the *due* instant is the slot itself (the ``elarion_occurrence`` header
of the message, exact to the second). The *published* instant is taken twice:

* producer side: Celery's ``after_task_publish`` signal in the replica that won
  the claim (right after kombu handed the message to Redis);
* consumer side: a thread of the benchmark process blocked in ``BRPOP`` on the
  queue notes the instant each message arrives.

All processes share one host clock, so the two instants compare directly. The
latency contains beat's own wake-up (ClaimingScheduler wakes at the due time),
the ``is_due`` pass over the heap, the claim round trip(s) (one per chunk of
``elarion_beat_claim_chunk`` entries) and the messages published before this one
in the same tick. Also counted: how many nodes sent each slot's messages.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from . import replicas as rp
from .common import Table, library_default, percentile


def _ts(iso_text: str) -> float:
    return datetime.strptime(iso_text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=timezone.utc).timestamp()


def repeated(entries: int, period: int, slots: int, lead: float = 2.0,
             log: Any = print) -> dict[str, Any]:
    """One replica, *entries* entries due every *period* s: when does it take each slot?

    A batch that takes longer than a few milliseconds shows where the next slot's
    entries were put back on the heap: the first tick of each slot, relative to it.
    """
    raw = rp.run_cluster("elarion", 1, entries, tag="rep", expr=f"*/{period} * * * * *",
                         duration=period * slots - 0.5, lead=lead, hook_publish=True)
    node = raw["nodes"][0]
    by_slot: dict[int, list[dict[str, Any]]] = {}
    for t in node["ticks"]:
        by_slot.setdefault(int(t["start"] // period) * period, []).append(t)
    last_pub: dict[int, float] = {}
    for _, _, occ, at in node["published"]:
        if occ:
            slot = int(_ts(occ))
            last_pub[slot] = max(last_pub.get(slot, 0.0), at - slot)
    rows = []
    for i, (slot, ticks) in enumerate(sorted(by_slot.items()), 1):
        rows.append({"slot": i, "first_tick": ticks[0]["start"] - slot, "ticks": len(ticks),
                     "outcomes": sum(t["outcomes"] for t in ticks),
                     "busy": sum(t["end"] - t["start"] for t in ticks),
                     "last_message": last_pub.get(slot, float("nan"))})
    log("  repeated batches: " + "; ".join(
        f"slot {r['slot']}: first tick +{r['first_tick']:.3f}s, {r['ticks']} tick(s), "
        f"last message +{r['last_message']:.2f}s" for r in rows))
    return {"entries": entries, "period": period, "rows": rows}


def run(entries: int, replicas: int, period: int, slots: int, lead: float = 3.0,
        repeat_entries: int = 0, repeat_period: int = 5, repeat_slots: int = 3,
        log: Any = print) -> dict[str, Any]:
    duration = period * slots - 0.5
    raw = rp.run_cluster("elarion", replicas, entries, tag="lat", expr=f"*/{period} * * * * *",
                         duration=duration, lead=lead, consume=True, hook_publish=True)
    published = [(job, occ, at) for n in raw["nodes"] for (_, job, occ, at) in n["published"]
                 if job and occ]
    senders: dict[str, set[str]] = {}
    for n in raw["nodes"]:
        for _, job, occ, _ in n["published"]:
            if job and occ:
                senders.setdefault(occ, set()).add(n["node"])
    producer = [at - _ts(occ) for _, occ, at in published]
    consumer = [at - _ts(occ) for job, occ, _, at in raw["received"] if job and occ]
    per_slot: dict[str, int] = {}
    by_slot: dict[str, list[float]] = {}
    for _, occ, at in published:
        per_slot[occ] = per_slot.get(occ, 0) + 1
        by_slot.setdefault(occ, []).append(at - _ts(occ))
    complete = sum(1 for n in per_slot.values() if n == entries)
    firsts = [min(v) for v in by_slot.values()]
    lasts = [max(v) for v in by_slot.values()]
    winners: dict[str, int] = {}
    for node in raw["nodes"]:
        winners[node["node"]] = node["dispatched"]
    claims = [c for n in raw["nodes"] for c in n["claims"]]
    # ticks that sent or skipped something, per (node, slot): more than one = the node took
    # the slot's batch in several ticks (each tick claims its own share separately)
    node_ticks: dict[tuple[str, int], int] = {}
    for n in raw["nodes"]:
        for t in n["ticks"]:
            key = (n["node"], int(t["start"] // period) * period)
            node_ticks[key] = node_ticks.get(key, 0) + 1
    slot_keys = sorted({k[1] for k in node_ticks})
    split_slots = sorted({k[1] for k, v in node_ticks.items() if v > 1})
    first_slot = slot_keys[0] if slot_keys else None
    result = {
        "entries": entries, "replicas": replicas, "period": period, "slots": len(per_slot),
        "complete_slots": complete, "samples": len(producer), "duplicates": raw["duplicates"],
        "producer": _stats(producer), "consumer": _stats(consumer), "winners": winners,
        "claim_ms": _stats([1000 * (c["end"] - c["start"]) for c in claims]),
        "producer_samples": producer, "consumer_samples": consumer,
        "first_of_slot": _stats(firsts), "last_of_slot": _stats(lasts),
        "senders_per_slot": sorted(len(v) for v in senders.values()),
        "claim_chunk": library_default("elarion_beat_claim_chunk"),
        "claim_calls_per_slot": (len(claims) / len(per_slot)) if per_slot else float("nan"),
        "ticked_slots": len(slot_keys), "split_slots": len(split_slots),
        "first_slot_split": first_slot in split_slots if first_slot is not None else None,
        "node_slots_split": sum(1 for v in node_ticks.values() if v > 1),
        "node_slots": len(node_ticks),
    }
    if repeat_entries:
        result["repeated"] = repeated(repeat_entries, repeat_period, repeat_slots, lead=lead,
                                      log=log)
    log(f"  latency: {len(producer)} samples over {len(per_slot)} slots; producer p50 "
        f"{result['producer']['p50'] * 1000:.1f} ms p99 {result['producer']['p99'] * 1000:.1f} ms")
    return result


def _stats(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "max": max(values) if values else float("nan"),
            "min": min(values) if values else float("nan")}


def tables(result: dict[str, Any]) -> list[Table]:
    t = Table(f"Latency, due -> published: {result['entries']} entries due at once on "
              f"{result['replicas']} replicas ({result['slots']} slots, one every "
              f"{result['period']} s)",
              ["measured at", "samples", "p50 ms", "p90 ms", "p99 ms", "max ms"])
    for label, key in (("producer (after_task_publish in the winner)", "producer"),
                       ("consumer (BRPOP on the queue)", "consumer")):
        s = result[key]
        t.add(label, s["n"], s["p50"] * 1000, s["p90"] * 1000, s["p99"] * 1000, s["max"] * 1000)
    claim = result["claim_ms"]
    first, last = result["first_of_slot"], result["last_of_slot"]
    t.notes = [
        f"per slot, first message published after {first['p50'] * 1000:.0f} ms (median over "
        f"slots; max {first['max'] * 1000:.0f} ms), last after {last['p50'] * 1000:.0f} ms "
        f"(max {last['max'] * 1000:.0f} ms)",
        f"slots with every entry sent: {result['complete_slots']}/{result['slots']}; "
        f"duplicates {result['duplicates']}; wins per node "
        + ", ".join(f"{k.rsplit('-', 1)[-1]}: {v}" for k, v in result["winners"].items()),
        f"claim call (one round trip per chunk, {result['claim_chunk']} entries per chunk): "
        f"p50 {claim['p50']:.1f} ms, p99 {claim['p99']:.1f} ms; claim calls per slot, all "
        f"nodes: {result['claim_calls_per_slot']:.1f}; (node, slot) pairs taken in more than "
        f"one tick: {result.get('node_slots_split', '?')} of {result.get('node_slots', '?')}; "
        "nodes sending a slot: "
        + ", ".join(f"{k}: {v} slot(s)" for k, v in sorted(
            {k: result['senders_per_slot'].count(k)
             for k in set(result['senders_per_slot'])}.items())),
    ]
    out = [t]
    rep = result.get("repeated")
    if rep:
        r = Table(f"Latency, repeated batches: {rep['entries']} entries due every "
                  f"{rep['period']} s on one replica",
                  ["slot", "first tick after the slot s", "ticks", "entries sent",
                   "seconds in those ticks", "last message after the slot s"])
        for row in rep["rows"]:
            r.add(row["slot"], row["first_tick"], row["ticks"], row["outcomes"], row["busy"],
                  row["last_message"])
        r.notes = ["slots of the replica's loop (after start-up); 'first tick' = the first "
                   "tick that sent entries of that slot"]
        out.append(r)
    return out

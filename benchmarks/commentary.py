"""The prose of docs/benchmarks.md: methods, findings and the changes since the first run.

Every sentence that states a number or a fact about what the library did in a run
is computed from the saved results; what stays static is the method and the
mechanisms of the code the run measured (named with the function that does it).
The first full run (before the library changes it led to) is kept in
``benchmarks/results/first-run.json`` and compared with the current results in
"Changes made after the first run".
"""

from __future__ import annotations

import json
import math
from typing import Any

from .common import ROOT, library_default, median

#: the first full run, made before proposals 1-3 of its report were implemented
FIRST_RUN = ROOT / "benchmarks" / "results" / "first-run.json"


def _f(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(share: float | None) -> str:
    return "n/a" if share is None or math.isnan(share) else f"{100 * share:.0f} %"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _nproc(saved: dict[str, Any]) -> str:
    return str(saved.get("machine", {}).get("nproc", "?"))


def _cores(saved: dict[str, Any]) -> str:
    return f"{_nproc(saved)}-core"


# -- looking runs up (current and first-run formats) --------------------------


def _variant(run: dict[str, Any]) -> str:
    if "variant" in run:
        return str(run["variant"])
    label = run.get("label", "")
    if run.get("kind") != "elarion":
        return run.get("kind", "?")
    return {"library, defaults": "defaults", "library, events off": "events-off"}.get(label, "?")


def tput(saved: dict[str, Any], variant: str, replicas: int) -> dict[str, Any] | None:
    sec = saved.get("sections", {}).get("throughput")
    if not sec:
        return None
    return next((r for r in sec["runs"]
                 if _variant(r) == variant and r["replicas"] == replicas), None)


def scale_runs(saved: dict[str, Any], chunk: int | None = None) -> dict[int, dict[str, Any]]:
    """Library scale-out runs by replica count: the default chunk (None) or *chunk*."""
    sec = saved.get("sections", {}).get("scaleout")
    if not sec:
        return {}
    out = {}
    for r in sec["runs"]:
        if r.get("kind") != "elarion":
            continue
        default = r.get("default_chunk", True)  # the first run: the library's one batch
        if (chunk is None and default) or (chunk is not None and not default
                                           and r.get("chunk") == chunk):
            out[r["replicas"]] = r
    if chunk is not None:  # one replica is run with the default chunk only
        base = scale_runs(saved).get(1)
        if base and 1 not in out:
            out[1] = base
    return dict(sorted(out.items()))


def _percall_row(saved: dict[str, Any], which: str) -> dict[str, Any] | None:
    """``shared``: cron('5 4 3 ...') as 10,000 entries of one expression would use it;
    ``miss``: a croniter search per call; ``crontab``: Celery's."""
    rows = saved.get("sections", {}).get("percall", {}).get("rows", [])
    for row in rows:
        name = row["schedule"]
        if which == "shared" and name.startswith("cron('5 4 3"):
            return row  # the first run's "(library)" row: it had no memo, every call searched
        if which == "seconds" and name.startswith("cron('*/5"):
            return row
        if which == "miss" and "first sight" in name:
            return row
        if which == "steady" and "steady state" in name:
            return row
        if which == "crontab" and name.startswith("celery crontab"):
            return row
    return None


def _us(saved: dict[str, Any], which: str) -> float:
    row = _percall_row(saved, which)
    return float(row["total_us"]) if row else math.nan


def _floor(saved: dict[str, Any], processes: int) -> dict[str, Any] | None:
    for f in saved.get("sections", {}).get("throughput", {}).get("floors", []):
        if f["processes"] == processes:
            return f
    return None


def _chunk_default() -> int:
    return int(library_default("elarion_beat_claim_chunk"))


def _shares(run: dict[str, Any]) -> str:
    return "/".join(f"{100 * p['share']:.0f}" for p in run["per_node"])


def _wins(run: dict[str, Any]) -> str:
    return "/".join(str(p["dispatched"]) for p in run["per_node"])


def _spread_ok(share: float) -> bool:
    return share <= SPREAD_LIMIT


#: "wins spread": no node sends more than this share of a batch
SPREAD_LIMIT = 0.8


# -- summary ------------------------------------------------------------------


def summary(saved: dict[str, Any]) -> list[str]:
    s = saved["sections"]
    out = ["## Summary", "", "| benchmark | goal | measured | met? |", "|---|---|---|---|"]
    if "overhead" in s:
        o = s["overhead"]["summary"]
        out.append(f"| 1. overhead, {o['n']} due entries, ClaimingScheduler / stock beat "
                   f"(dispatch wall time) | <= 1.10 | {_f(o['ratio_median'], 3)} (median of "
                   f"{o['rounds']} paired rounds) | "
                   f"{'yes' if o['ratio_median'] <= 1.10 else 'no'} |")
    if "throughput" in s:
        n = s["throughput"]["entries"]
        for replicas, goal in ((1, 10.0), (3, 6.0)):
            r = tput(saved, "defaults", replicas)
            if r:
                extra = (f", wins {_wins(r)}" if replicas > 1 else "")
                out.append(f"| 2. throughput, {n} due, {replicas} replica(s), library defaults "
                           f"| <= {goal:g} s, 0 duplicates | {_f(r['time_to_all'])} s, "
                           f"{r['duplicates']} duplicates, {r['missing']} missing{extra} | "
                           f"{'yes' if r['time_to_all'] <= goal and not r['duplicates'] else 'no'}"
                           " |")
    if "scaleout" in s:
        sc = s["scaleout"]
        base = sc["baseline"]["time_to_all"]
        chunks: list[int | None] = [None] + sorted(
            {r["chunk"] for r in sc["runs"] if r.get("kind") == "elarion"
             and not r.get("default_chunk", True)}, reverse=True)
        for chunk in chunks:
            lib = scale_runs(saved, chunk)
            if not lib:
                continue
            worst = max(r["time_to_all"] for r in lib.values())
            multi = {k: r for k, r in lib.items() if k > 1}
            spread = max((r["max_share"] for r in multi.values()), default=math.nan)
            name = (f"claim chunk {_chunk_default()} (default)" if chunk is None
                    else f"claim chunk {chunk}")
            shown = lib if chunk is None else multi  # one replica is run with the default only
            out.append(
                f"| 3. scale-out, {sc['entries']} due, {name} | never slower than one stock "
                f"beat ({_f(base)} s); wins spread (no node sends more than "
                f"{_pct(SPREAD_LIMIT)}) | "
                + ", ".join(f"{_f(r['time_to_all'])} s on {k}" for k, r in shown.items())
                + "; largest share of one node "
                + ", ".join(f"{_pct(r['max_share'])} on {k}" for k, r in multi.items())
                + f" | {'yes' if worst <= base else 'no'} / "
                f"{'yes' if multi and _spread_ok(spread) else 'no'} |")
    if "latency" in s:
        lat = s["latency"]
        out.append(f"| 4. latency due -> published, {lat['entries']} due on {lat['replicas']} "
                   f"replicas | (report) | p50 {_f(1000 * lat['producer']['p50'], 0)} ms, p99 "
                   f"{_f(1000 * lat['producer']['p99'], 0)} ms | n/a |")
    if "failover" in s:
        for r in s["failover"]["scenarios"]:
            name = "ClaimingScheduler" if r["mode"] == "elarion" else "RedBeat"
            out.append(f"| 5. failover, {name}, kill {r['kill']} | 0 missed | "
                       f"{r['missed_1s']} missed, max gap {_f(r['max_gap_s'])} s | "
                       f"{'yes' if r['missed_1s'] == 0 else 'no'} |")
    out.append("")
    return out


# -- methods ------------------------------------------------------------------

METHODS = {
    "overhead": """ClaimingScheduler and stock `celery.beat.Scheduler` run in the same process
and publish to the same Redis broker (a queue of their own per run, emptied and deleted
afterwards). Both get the same interval entries (`timedelta(seconds=60)`) whose `last_run_at`
is two periods ago, so every entry is due at the first tick. Each is driven the way beat
drives it, `tick()` after `tick()`, until a tick returns a positive delay (nothing is due):
stock beat sends one entry per tick; ClaimingScheduler takes every due entry in one tick and
claims them in chunks of `elarion_beat_claim_chunk` (one PostgreSQL round trip per chunk;
window claims, a fresh claims table per run), publishing each chunk's winners. Timed: from
the first `tick()` (heap population included for both) to the return of the last; the
scheduler's construction and its broker connection are not timed. The tick only queues
ClaimingScheduler's Celery events (`EventSender`); a thread of their own publishes them, so
the time until that queue is drained (`EventSender.flush`) is reported too ("events
drained"). The arms alternate (ABC, CBA, ...) after an untimed warm-up round; the ratio is
the median of the per-round ratios. A third arm runs ClaimingScheduler with
`elarion_beat_events = False`.""",
    "throughput": """Replicas are separate processes (forked, each with its own app, node name,
broker and database connections), each running beat's own loop (`sleep(tick())`). All
entries are `cron` entries whose one slot is the same second, so the clock releases all
replicas together. Each replica sorts the due batch by job name, cuts it into chunks of
`elarion_beat_claim_chunk` and starts at chunk `rank * chunks // live nodes`, its rank
being its place among the live nodes its last heartbeat read from the nodes table
(`Maintenance.live_nodes`). A replica heartbeats at start-up and then every
`elarion_beat_heartbeat_interval` (30 s by default), so replicas started together know only
the nodes that heartbeated before them. Runs with several replicas therefore have a
**warm-up**: the replicas run with `elarion_beat_heartbeat_interval = {heartbeat} s` and
the slot comes at least two heartbeats after the last replica started, as in a cluster that
has been up for a while; the live nodes each replica split its batch with are recorded,
and a run in which some replica did not see all the others is repeated with a longer lead
({repeated}).{cold} Time = from the slot to the last task message published by any
replica (Celery's `after_task_publish` signal in the replica). Duplicates and misses are
counted from the messages read back from the Redis queue (one per (job, occurrence)
expected). Claim calls and round trips are counted in each replica (the store's
`round_trips` counter). The floor is Celery's own publish: `app.send_task` in a loop on one
connection, from 1 process and from 3 processes at once.""",
    "scaleout": """As for throughput (with the same warm-up for several replicas), with 1, 2, 3
and 6 replicas and the library's default `elarion_beat_claim_chunk` as well as smaller chunks
set through that setting; each configuration is run {reps} times (the fastest run is
reported, all times are listed). The baseline is ONE stock `celery.beat.Scheduler` process
with the same entries (uncoordinated).""",
    "latency": """R replica processes run for a while with N entries `cron("*/P * * * * *")`,
so every P seconds N entries are due at once. Due = the slot (the `elarion_occurrence`
header, exact to the second). Published = (a) Celery's `after_task_publish` signal in the
winning replica, right after kombu has handed the message to Redis; (b) the instant a
thread of the benchmark process, blocked in `BRPOP` on the queue, receives it. One host,
one clock. The latency includes beat's wake-up (ClaimingScheduler's `adjust` wakes at the due
time), the `is_due` pass over the heap, naming the occurrences, the claim round trip(s) and
the messages published before this one in the same tick. The replicas run with the library's
defaults (no warm-up: a batch of N <= `elarion_beat_claim_chunk` entries is one chunk, which
no rank changes).""",
    "failover": """Real `celery -A benchmarks.failover_app beat` processes, started and killed
with `tests/helpers/processes.py`. Both schedulers run the same app: a job due every second
plus load entries, `beat_max_loop_interval = 5` (RedBeat's default lock timeout is five times
that: 25 s; with Celery's default of 300 s it would be 1500 s). ClaimingScheduler gets
`cron("* * * * * *")` and `cron("*/5 * * * * *")` load; RedBeat cannot store a `cron`
(its JSON encoder knows only Celery's schedules) and gets 1 s and 5 s intervals, the same
rates. A thread of the benchmark process pops every message off the queue (nothing else
consumes it). Kills: `quiet` = SIGKILL the beat that sent the last 1 s message (RedBeat: the
lock holder) half-way between two load slots; `mid-batch` = SIGKILL the beat that is
publishing a load batch as soon as its first load message arrives (RedBeat: the lock holder).
Each scenario is a fresh cluster. Missed = 1 s occurrences in the window [kill - 5 s,
stop - 2 s] that were never published (ClaimingScheduler: exact slots by their
`elarion_occurrence` header; RedBeat: seconds in the window minus 1 s messages).
"Claimed, never sent" = claims in the table without a message (at-most-once losses).""",
    "percall": """In one process, no I/O: `is_due(last_run_at)` and `name_occurrence(...)` timed
for N entries (each with its own `last_run_at`, one `now`) per schedule type. A tick runs both
for every due entry, on every replica, whether the replica wins the entry or not. `cron`
keeps its recent `(slot, next)` spans per expression and zone (`cron._SpanCache`), shared by
every `cron` of that expression. The three `cron` rows are the memo's cases: all entries share
one expression; every entry has an expression of its own, in the steady state (the span of the
previous slot, where `last_run_at` lies, is known from the previous tick: one miss per due
entry); every entry has an expression no earlier call has seen (the first tick after
start-up: two misses).""",
}


def _late_slots(rep: dict[str, Any]) -> bool:
    """The repeated-batch replica took some slot after the first more than 0.1 s late."""
    rows = rep.get("rows", []) if rep else []
    return any(r["first_tick"] > 0.1 for r in rows[1:])


def _repeated(saved: dict[str, Any], section: str = "throughput") -> str:
    runs = saved["sections"].get(section, {}).get("runs", [])
    problems = [p for r in runs for p in r.get("problems", [])]
    views = [p for p in problems if "did not see" in p]
    if not problems:
        return "no run had to be repeated"
    return (f"{len(problems)} repeat(s), {len(views)} of them because a replica had not seen "
            "all the others")


def method(key: str, saved: dict[str, Any]) -> list[str]:
    text = METHODS[key]
    sizes = saved.get("sizes", {})
    if key == "throughput":
        tp = saved["sections"].get("throughput", {})
        cold = tput(saved, "cold", 3)
        text = text.format(
            heartbeat=_f(tp.get("heartbeat", sizes.get(key, {}).get("heartbeat", math.nan)), 1),
            cold=(" The \"cold start\" run has no warm-up: default heartbeat interval, the "
                  f"last replica ready {_f(cold.get('ready_lead'), 1)} s before the slot."
                  if cold else ""),
            repeated=_repeated(saved))
    elif key == "scaleout":
        text = text.format(reps=saved["sections"].get("scaleout", {}).get("reps", 1)) + \
            f" As there, a run in which some replica had not seen all the others is " \
            f"repeated (in this run: {_repeated(saved, 'scaleout')})."
    return ["**Method.** " + " ".join(text.split())]


# -- findings -----------------------------------------------------------------


def findings(key: str, saved: dict[str, Any]) -> list[str]:
    fn = {"overhead": _overhead, "throughput": _throughput, "scaleout": _scaleout,
          "latency": _latency, "failover": _failover, "percall": _percall}[key]
    try:
        return fn(saved)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError) as exc:
        return [f"(no findings: {type(exc).__name__}: {exc})"]


def _overhead(saved: dict[str, Any]) -> list[str]:
    o = saved["sections"]["overhead"]["summary"]
    faster = o["ratio_median"] < 1
    text = (
        f"**Findings.** ClaimingScheduler dispatches {o['n']} due entries in "
        f"{_f(o['elarion_median_s'], 3)} s against {_f(o['stock_median_s'], 3)} s for stock beat: "
        f"ratio {_f(o['ratio_median'], 3)} (goal <= 1.10)."
    )
    if faster:
        text += (f" It is *faster*: stock beat needs {o['stock_ticks']} ticks for them, and "
                 "every tick first compares the whole schedule with its previous copy "
                 "(`Scheduler.schedules_equal`, O(N) per tick, O(N²) per batch), while "
                 f"ClaimingScheduler takes the batch in {o['elarion_ticks']} tick(s) with "
                 f"{o['elarion_round_trips']} claim round trip(s) (chunks of "
                 f"{_chunk_default()}; median claim time {_f(1000 * o['claim_median_s'], 1)} ms).")
    if "drained_median_s" in o:
        text += (f" The tick only queues the Celery events; their thread has published them "
                 f"all {_f(o['drained_median_s'], 3)} s after the first tick (median"
                 + (f"; {o['events_dropped']} dropped" if o.get("events_dropped") else
                    "; none dropped")
                 + f"). With the events off the dispatch takes {_f(o['noevents_median_s'], 3)} s "
                 f"(ratio {_f(o['ratio_noevents_median'], 3)})")
        cost = o["elarion_median_s"] - o["noevents_median_s"]
        if cost > 0.05 * o["noevents_median_s"]:
            text += (f": the events still add {_f(1000 * cost, 0)} ms "
                     f"({_f(100 * cost / o['noevents_median_s'], 0)} %) to the dispatch. The tick "
                     "no longer waits for the broker per event, but the event thread runs in the "
                     "same process, sharing the interpreter (the GIL) with the tick.")
        else:
            text += ": with the events on the thread, the dispatch takes no measurably longer."
    out = [text]
    sweep = [r for r in saved["sections"]["overhead"].get("sweep", []) if r["n"] < o["n"]]
    if sweep:
        costly = [r for r in sweep if r["ratio"] > 1.10]
        out[0] += (" Smaller batches (second table): "
                   + ", ".join(f"{r['n']} entries: ratio {_f(r['ratio'], 2)} "
                               f"({_f(1000 * r['elarion'], 1)} ms against "
                               f"{_f(1000 * r['stock'], 1)} ms; {_f(r['ratio_noevents'], 2)} "
                               "with the events off)" for r in sweep) + ".")
        if costly:
            out[0] += (" There the fixed cost of a tick (a claim round trip and a database "
                       "connection checkout) outweighs stock beat's per-tick schedule "
                       "comparison; in absolute terms it is "
                       + ", ".join(f"{_f(1000 * (r['elarion'] - r['stock']), 1)} ms for "
                                   f"{r['n']} entries" for r in costly) + ".")
    return out


def _throughput(saved: dict[str, Any]) -> list[str]:
    sec = saved["sections"]["throughput"]
    n = sec["entries"]
    chunk = sec.get("claim_chunk", _chunk_default())
    r1, r3 = tput(saved, "defaults", 1), tput(saved, "defaults", 3)
    o1, o3 = tput(saved, "events-off", 1), tput(saved, "events-off", 3)
    cold = tput(saved, "cold", 3)
    f1, f3 = _floor(saved, 1), _floor(saved, 3)
    if not (r1 and f1):
        return []
    node1 = r1["per_node"][0]
    shared_us = _us(saved, "shared")
    out = [
        f"**Findings.** *One replica*: {n} entries in {_f(r1['time_to_all'])} s with the "
        f"library's defaults (goal <= 10 s)"
        + (f", {_f(o1['time_to_all'])} s with the events off" if o1 else "")
        + f". The floor, Celery publishing {f1['total']} messages from one process with no "
        f"beat at all, is {_f(f1['wall'])} s ({_f(f1['ms_per_msg_per_process'], 3)} ms per "
        f"message on this machine). The node woke {_f(1000 * node1['first_tick_lag'], 1)} ms "
        f"after the slot, took the whole batch in {node1['ticks']} tick(s) and claimed it in "
        f"{node1['claim_calls']} chunk(s) of up to {chunk} rows, one round trip each "
        f"({_f(node1['claim_seconds'])} s in all). Its process used {_f(node1['cpu'], 1)} "
        f"CPU-seconds: the `cron` work is small now ({_f(shared_us, 0)} us per entry when the "
        f"entries share an expression, section 6: {_f(shared_us * n / 1e6, 2)} s for {n}); "
        "the rest is the publish itself, the logging and recording of each dispatch and the "
        "event thread."
        + (f" Its event thread had sent the last of {node1['events_sent']} events "
           f"{_f(node1['events_drained'])} s after the slot." if node1.get("events_sent")
           else ""),
    ]
    if r3:
        p3 = r3["per_node"]
        seen = [p["live_seen"] for p in p3]
        text = (
            f"*Three replicas* (warm-up): {_f(r3['time_to_all'])} s with the defaults "
            f"(goal <= 6 s)"
            + (f", {_f(o3['time_to_all'])} s with the events off" if o3 else "")
            + f". Every node split its batch knowing {', '.join(map(str, seen))} live nodes "
            f"and started at chunk {', '.join(str(p['first_chunk']) for p in p3)} of "
            f"{p3[0]['chunks']}; the wins were {_wins(r3)} (largest share "
            f"{_pct(r3['max_share'])}). Each node made "
            f"{', '.join(str(p['claim_calls']) for p in p3)} claim calls; of those, "
            + ", ".join(f"{p['claims_all_won']} won whole and {p['claims_all_lost']} lost whole"
                        for p in p3)
            + ": a node that reaches a chunk another node has already claimed (or is claiming) "
            "waits for that transaction on the first conflicting row and loses the chunk in "
            "one round trip, so the nodes publish different chunks in parallel.")
        if r3["time_to_all"] > r1["time_to_all"]:
            text += (f" Three replicas are still slower than one ({_f(r3['time_to_all'])} s "
                     f"against {_f(r1['time_to_all'])} s) on this {_cores(saved)} machine: every "
                     "replica computes every entry's occurrence, and records a skip (and queues "
                     "an `elarion-skipped` event) for every entry it loses, "
                     f"{_f(sum(p['cpu'] for p in p3), 1)} CPU-seconds in all for "
                     f"{_nproc(saved)} cores shared with Redis and PostgreSQL.")
        else:
            text += (f" That is faster than one replica ({_f(r1['time_to_all'])} s), although "
                     f"the three share the {_nproc(saved)} cores with Redis and PostgreSQL "
                     f"({_f(sum(p['cpu'] for p in p3), 1)} CPU-seconds in all).")
        if f3:
            text += (f" The floor for 3 processes publishing at once on this machine is "
                     f"{_f(f3['wall'])} s.")
        out += ["", text]
    if cold:
        pc = cold["per_node"]
        incomplete = [p for p in pc if p["live_seen"] is not None
                      and p["live_seen"] < cold["replicas"]]
        text = (f"*Cold start* (three replicas started together, the last one ready "
                f"{_f(cold.get('ready_lead'), 1)} s before the slot, default heartbeat "
                "interval): the live nodes each had seen "
                f"were {', '.join(str(p['live_seen']) for p in pc)} (itself and the nodes that had "
                "heartbeated before its start-up heartbeat), so they started at chunk "
                f"{', '.join(str(p['first_chunk']) for p in pc)} of {pc[0]['chunks']}; wins "
                f"{_wins(cold)} (largest share {_pct(cold['max_share'])}), "
                f"{_f(cold['time_to_all'])} s, {cold['duplicates']} duplicates.")
        if incomplete:
            text += (" Ranks computed from different views can collide or leave gaps; they "
                     "become consistent at the next heartbeat "
                     f"({_f(sec.get('heartbeat_default'), 0)} s by default), and the chunks "
                     "are still claimed safely meanwhile (a collision costs a lost round trip, "
                     "never a duplicate).")
        out += ["", text]
    runs = sec["runs"]
    dup = sum(r["duplicates"] for r in runs)
    miss = sum(r["missing"] or 0 for r in runs)
    lags = [p["first_tick_lag"] for r in runs for p in r["per_node"]
            if p["first_tick_lag"] is not None]
    ticks = sorted({p["ticks"] for r in runs for p in r["per_node"]})
    dropped = sum(p.get("events_dropped") or 0 for r in runs for p in r["per_node"])
    out += ["", f"Duplicates: {dup} over all {len(runs)} runs; misses: {miss}. The tick "
            "that sent the replicas' batch was called "
            f"{_f(1000 * min(lags), 1)} to {_f(1000 * max(lags), 1)} ms after the slot "
            f"(median {_f(1000 * median(lags), 1)} ms; ClaimingScheduler's `adjust` wakes at "
            "the due time, not 10 ms early as stock beat"
            + ("; a negative value is a tick called just before the slot, by beat's 1 s "
               "maximum sleep, that found the entries due after its schedule comparison "
               "(`schedules_equal`, O(N)) at its start" if min(lags) < 0 else "")
            + "), and every node took the slot's batch in "
            + (_n(ticks[0], "tick") if len(ticks) == 1 else f"{ticks} ticks")
            + " (the first slot after start-up; for slots that follow a batch see section 4)"
            + f". Events dropped by a full event queue: {dropped}."]
    return out


def _scaleout(saved: dict[str, Any]) -> list[str]:
    sc = saved["sections"]["scaleout"]
    base = sc["baseline"]["time_to_all"]
    lib = scale_runs(saved)
    if not lib:
        return []
    slower = [k for k, r in lib.items() if r["time_to_all"] > base]
    default = _chunk_default()
    n = sc["entries"]
    out = [
        f"**Findings.** One uncoordinated stock beat needs {_f(base)} s for {n} "
        "entries (one entry per tick, and every tick compares the whole schedule; its entries "
        "are the library's `cron` too, so the memo speeds it up as well). With the "
        f"default chunk of {default} ({math.ceil(n / default)} chunk(s)) the library takes "
        + ", ".join(f"{_f(r['time_to_all'])} s on {k}" for k, r in lib.items())
        + " replica(s); "
        + (f"with {', '.join(map(str, slower))} replicas it is slower than one stock beat. "
           if slower else "it is never slower than one stock beat. ")
        + "Shares of the wins: "
        + "; ".join(f"{k} replicas {_shares(r)} %" for k, r in lib.items() if k > 1)
        + f". A node wins whole chunks, so at most {_n(math.ceil(n / default), 'node')} can "
        f"send a batch of {n}."
    ]
    others = sorted({r["chunk"] for r in sc["runs"] if r.get("kind") == "elarion"
                     and not r.get("default_chunk", True)}, reverse=True)
    for chunk in others:
        runs = {k: r for k, r in scale_runs(saved, chunk).items() if k > 1}
        if not runs:
            continue
        out[0] += (f" With `elarion_beat_claim_chunk = {chunk}` ({math.ceil(n / chunk)} chunks): "
                   + ", ".join(f"{_f(r['time_to_all'])} s on {k}" for k, r in runs.items())
                   + ", shares " + "; ".join(f"{k} replicas {_shares(r)} %"
                                             for k, r in runs.items()) + ".")
    views = [v for r in sc["runs"] if r["replicas"] > 1
             for v in r.get("all_views_complete", [r.get("views_complete")]) if v is not None]
    if views:
        out[0] += (f" Every node knew every other node's rank at the slot in "
                   f"{sum(1 for v in views if v)} of {len(views)} runs with several replicas.")
    best: dict[int, dict[str, Any]] = {}
    for r in sc["runs"]:
        if r.get("kind") == "elarion" and r["replicas"] > 1:
            k = r["replicas"]
            if k not in best or r["time_to_all"] < best[k]["time_to_all"]:
                best[k] = r
    one = lib.get(1)
    if one and best:
        fastest_k, fastest = min(best.items(), key=lambda kv: kv[1]["time_to_all"])
        out += [
            "",
            f"One replica takes {_f(one['time_to_all'])} s; the fastest run with several is "
            f"{_f(fastest['time_to_all'])} s ({fastest_k} replicas, {fastest['label']}). "
            f"On this {_cores(saved)} machine the replicas compete for CPU with each other, "
            "Redis and PostgreSQL: every replica computes every due entry's occurrence and "
            "records a skip and queues an event for each entry it loses, so adding replicas "
            "adds work on the same cores. On separate hosts each node's work would be its own "
            f"share of the publishing plus those per-entry costs; a rough lower bound from this "
            f"run is one replica's time divided by the number of sending nodes ("
            + ", ".join(f"{_f(one['time_to_all'] / min(k, max(1, r['winners'])))} s for {k}"
                        for k, r in best.items())
            + ").",
        ]
    return out


def _latency(saved: dict[str, Any]) -> list[str]:
    lat = saved["sections"]["latency"]
    p, c = lat["producer"], lat["consumer"]
    first, last = lat.get("first_of_slot"), lat.get("last_of_slot")
    out = [
        f"**Findings.** Due -> published: p50 {_f(1000 * p['p50'], 0)} ms, p99 "
        f"{_f(1000 * p['p99'], 0)} ms at the producer; the consumer sees the same within "
        f"{_f(1000 * abs(c['p50'] - p['p50']), 1)} ms at p50 (loopback Redis). "
    ]
    if first and last:
        out[0] += (f"Per slot, the first message leaves {_f(1000 * first['p50'], 0)} ms after "
                   f"the slot and the last {_f(1000 * last['p50'], 0)} ms after it (medians over "
                   "slots): the first figure is the wake-up, the `is_due` pass, the naming of "
                   "every due entry and the claim round trip (p50 "
                   f"{_f(lat['claim_ms']['p50'], 1)} ms); the spread up to the last one is "
                   f"publishing {lat['entries']} messages one after the other.")
        out[0] += (" The p99 is set by the slowest slots (the last message of the slowest slot "
                   f"left after {_f(1000 * last['max'], 0)} ms).")
    senders = lat.get("senders_per_slot", [])
    if senders:
        single = sum(1 for s in senders if s == 1)
        chunk = lat.get("claim_chunk", _chunk_default())
        text = (f"{lat['entries']} entries are one chunk (`elarion_beat_claim_chunk` = {chunk}): "
                "if every node took a slot's entries in one tick, every node would claim the "
                "same chunk and the first to commit would send the whole slot. "
                f"{single} of {len(senders)} slots were sent by a single node")
        if single == len(senders):
            text += "."
        else:
            text += (f"; {len(senders) - single} were sent by several nodes, with "
                     f"{_f(lat.get('claim_calls_per_slot'), 1)} claim calls per slot for "
                     f"{lat['replicas']} nodes")
            if "node_slots_split" in lat:
                text += (f": in {lat['node_slots_split']} of {lat['node_slots']} (node, slot) "
                         "pairs the node took the slot's entries in more than one tick")
            text += (". The heap time of each entry's next run is taken when the entry is "
                     "popped, before the batch is claimed and published (since commit "
                     "c1fa9b0), so a node takes a slot in one tick unless it is still busy "
                     "with an earlier batch when the slot comes due.")
        out += ["", text]
    rep = lat.get("repeated")
    if rep and rep.get("rows"):
        rows = rep["rows"]
        text = (f"*Repeated batches* (second table): one replica with {rep['entries']} entries "
                f"due every {rep['period']} s took "
                + ", ".join(f"slot {r['slot']} at +{_f(r['first_tick'], 3)} s "
                            f"({_n(r['ticks'], 'tick')}, {_f(r['busy'], 2)} s of ticks)"
                            for r in rows)
                + ".")
        if _late_slots(rep):
            text += (" The first slot after start-up was taken on time; every later one was "
                     "taken late, by up to the duration of the batch before it ("
                     + ", ".join(f"{_f(b['first_tick'], 2)} s late after a {_f(a['busy'], 2)} s "
                                 "batch" for a, b in zip(rows, rows[1:]))
                     + "): the heap times described above. A node that sends big batches "
                     "sends every later slot late.")
        out += ["", text]
    return out


def _failover(saved: dict[str, Any]) -> list[str]:
    fo = saved["sections"]["failover"]
    el = [r for r in fo["scenarios"] if r["mode"] == "elarion"]
    rb = [r for r in fo["scenarios"] if r["mode"] == "redbeat"]
    out = ["**Findings.** "]
    chunk = _chunk_default()
    if el:
        out[0] += ("ClaimingScheduler: " + "; ".join(
            f"{r['kill']} kill: {r['missed_1s']} of {r['expected_1s']} 1 s occurrences missed, "
            f"largest gap {_f(r['max_gap_s'])} s, first 1 s message {_f(r['kill_to_next_s'])} s "
            f"after the kill, {r['claimed_not_sent']} claims won but never sent"
            for r in el) + ". Every node claims every occurrence, so when one dies the others "
            "simply win the next slot; there is nothing to fail over. ")
        mid = [r for r in el if r["kill"] == "mid-batch"]
        if mid:
            lost = mid[0]["claimed_not_sent"]
            out[0] += (f"Killed while publishing a load batch, the victim left {lost} claimed "
                       "occurrence(s) unsent: a claim commits before its publish, so what a "
                       "SIGKILL interrupts is lost (at-most-once, by design). The loss is "
                       f"bounded by one chunk of the batch (`elarion_beat_claim_chunk` = {chunk}); "
                       f"the {fo['load']}-entry load batch here is "
                       + ("one chunk, so the bound is the whole batch and the count depends on "
                          "how far the victim had got in publishing it. "
                          if fo["load"] <= chunk else "several chunks. "))
    if rb:
        lock = rb[0].get("lock_timeout_s")
        out[0] += ("RedBeat: " + "; ".join(
            f"{r['kill']} kill: {r['missed_1s']} of {r['expected_1s']} missed, largest gap "
            f"{_f(r['max_gap_s'])} s" for r in rb)
            + f". A standby takes over only when the dead holder's lock expires (timeout "
            f"{_f(lock, 0) if lock else '?'} s, five times `beat_max_loop_interval`) and it next "
            "polls the lock (every `beat_max_loop_interval`), and Celery's interval schedules "
            "do not catch up the runs in between. With Celery's default "
            "`beat_max_loop_interval` (300 s) the lock timeout is 1500 s: a 25-minute gap.")
    return out


def _percall(saved: dict[str, Any]) -> list[str]:
    shared, sec_row = _percall_row(saved, "shared"), _percall_row(saved, "seconds")
    steady, miss = _percall_row(saved, "steady"), _percall_row(saved, "miss")
    ct = _percall_row(saved, "crontab")
    if not (shared and ct):
        return []
    text = (f"**Findings.** A due `cron` entry costs {_f(shared['total_us'], 0)} us of scheduler "
            "CPU when the entries share an expression"
            + (f" ({_f(sec_row['total_us'], 0)} us for a seconds-field expression)" if sec_row
               else "")
            + f", against {_f(ct['total_us'], 0)} us for Celery's `crontab`: the spans are "
            "found in the memo, and croniter runs once per expression and slot.")
    if steady:
        text += (f" When every entry has an expression of its own, each due entry misses the "
                 f"memo once per slot: {_f(steady['total_us'], 0)} us (the span around now is "
                 "searched; the span of the previous slot is still known from the previous "
                 "tick).")
    if miss:
        text += (f" An expression seen for the first time (the first tick after start-up) "
                 f"misses twice, for `last_run_at` and for now: {_f(miss['total_us'], 0)} us. "
                 "A miss finds the whole span, i.e. both the slot at or before the moment "
                 "(`get_prev`, checked with two more croniter searches) and the next instant, "
                 "even when `is_due` needs only the next instant.")
    text += " Every replica pays this for every due entry, won or lost."
    before = _first_run()
    old_us = _us(before, "shared") if before else math.nan
    if not math.isnan(old_us):
        text += (f" Before the memo (first run) every due `cron` entry cost {_f(old_us, 0)} us, "
                 "whatever its expression.")
    return [text]


# -- changes since the first run ----------------------------------------------


def _event_share(saved: dict[str, Any] | None) -> float:
    """How much the events add to the 1000-entry dispatch of section 1 (a fraction)."""
    o = (saved or {}).get("sections", {}).get("overhead", {}).get("summary")
    if not o or not o.get("noevents_median_s"):
        return math.nan
    return float(o["elarion_median_s"] / o["noevents_median_s"] - 1)


def _event_share_change(saved: dict[str, Any]) -> str:
    before, after = _event_share(_first_run()), _event_share(saved)
    if math.isnan(before) or math.isnan(after):
        return ""
    return (f"; the events added {_f(100 * before, 0)} % to the dispatch of section 1 in the "
            f"first run, when the tick published them, and add {_f(100 * after, 0)} % now")


def _first_run() -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(FIRST_RUN.read_text())
        return data
    except (OSError, ValueError):
        return None


def _same(before: dict[str, Any], saved: dict[str, Any], section: str, key: str) -> bool:
    b = before.get("sections", {}).get(section, {})
    a = saved.get("sections", {}).get(section, {})
    return bool(b) and bool(a) and b.get(key) == a.get(key)


def changes(saved: dict[str, Any]) -> list[str]:
    before = _first_run()
    out = ["## Changes made after the first run", ""]
    if before is None:
        return out + ["(the first run's results, benchmarks/results/first-run.json, are "
                      "missing: nothing to compare)"]
    when = before.get("machine", {}).get("date", "?")
    out += [
        f"The first full run ({when}, commit {before.get('machine', {}).get('commit', '?')}) "
        "ended with three proposals (\"What the library would need\"). The first two are "
        "now in the library as proposed; the third was met another way:",
        "",
        "1. **Chunked claims in a node-dependent order** (`scheduler.py`: `apply_entries`, "
        "`_first_chunk`, `adjust`). The due batch is sorted by job name and claimed in chunks "
        f"of `elarion_beat_claim_chunk` (new setting, default {_chunk_default()}), each chunk's "
        "winners published before the next claim; a node starts at chunk "
        "`rank * chunks // len(live_nodes)`, its rank coming from the nodes table "
        "(`Maintenance.live_nodes`, read by every heartbeat; fallback `crc32(node) % chunks`); "
        "`adjust` no longer wakes 10 ms early, so each node takes a slot's batch in one tick; "
        "SIGTERM is held per chunk.",
        "2. **`cron` memoizes its spans** (`cron.py`: `_SpanCache`): `(slot, next)` spans per "
        "(expression, seconds field, zone), shared by every `cron` object.",
        "3. **Events off the tick** (`events.py`: `EventSender`): instead of sending fewer "
        "events, the tick puts each event on a bounded queue (10,000) and a background thread "
        "publishes them, so the tick no longer waits for the broker per event.",
        "",
        "The benchmark prototypes of 1 and 2 (`benchmarks/proposal.py`) are gone; every number "
        "below is the library itself. Before = the first run, after = this run, same machine "
        "and sizes unless noted.",
        "",
        "| change | measure | first run | this run |",
        "|---|---|---|---|",
    ]
    rows = _change_rows(before, saved)
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    if not rows:
        out += ["| - | (no section of this run has the first run's sizes) | - | - |"]
    out += [""]
    b_share, a_share = _event_share(before), _event_share(saved)
    if not (math.isnan(b_share) or math.isnan(a_share)):
        out += [
            f"Change 3 and the events: with them on, the 1000-entry dispatch of section 1 took "
            f"{_f(100 * b_share, 0)} % longer than with them off in the first run, and "
            f"{_f(100 * a_share, 0)} % longer in this one. "
            + ("The background thread has not made the events cheaper for the dispatch here: "
               "with a broker on the same host a publish is mostly CPU, which the thread spends "
               "in the same process; what it removes is waiting on a slow or remote broker, "
               "which this machine does not have. "
               if a_share > 0.8 * b_share else
               "The background thread made the events cheaper for the dispatch. ")
            + "The ratio to stock beat moved with the machine (stock beat itself took "
            + (f"{_f(before['sections']['overhead']['summary']['stock_median_s'], 3)} s then and "
               f"{_f(saved['sections']['overhead']['summary']['stock_median_s'], 3)} s now)."),
            "",
        ]
    return out


def _change_rows(before: dict[str, Any], saved: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    if _same(before, saved, "throughput", "entries"):
        n = saved["sections"]["throughput"]["entries"]
        b3, a3 = tput(before, "defaults", 3), tput(saved, "defaults", 3)
        if b3 and a3:
            rows.append(("1", f"throughput, {n} entries, 3 replicas: time; wins per node",
                         f"{_f(b3['time_to_all'])} s; {_wins(b3)}",
                         f"{_f(a3['time_to_all'])} s; {_wins(a3)}"))
        b1, a1 = tput(before, "defaults", 1), tput(saved, "defaults", 1)
        if b1 and a1:
            pb, pa = b1["per_node"][0], a1["per_node"][0]
            rows.append(("1", f"throughput, {n} entries, 1 replica: first tick - slot; ticks; "
                         "claim calls x rows",
                         f"{_f(1000 * pb['first_tick_lag'], 1)} ms; {pb['ticks']}; "
                         f"{pb['claim_calls']} x {_f(pb['rows_per_claim'], 0)}",
                         f"{_f(1000 * pa['first_tick_lag'], 1)} ms; {pa['ticks']}; "
                         f"{pa['claim_calls']} x {_f(pa['rows_per_claim'], 0)}"))
    if _same(before, saved, "scaleout", "entries"):
        n = saved["sections"]["scaleout"]["entries"]
        bb = before["sections"]["scaleout"]["baseline"]["time_to_all"]
        ab = saved["sections"]["scaleout"]["baseline"]["time_to_all"]
        rows.append(("2", f"scale-out baseline: one stock beat, the same {n} `cron` entries",
                     f"{_f(bb)} s", f"{_f(ab)} s"))
        bl, al = scale_runs(before), scale_runs(saved)
        for k in sorted(set(bl) & set(al)):
            if k == 1:
                continue
            rows.append(("1", f"scale-out, {n} entries, {k} replicas: time; shares % "
                         f"(default chunk)",
                         f"{_f(bl[k]['time_to_all'])} s; {_shares(bl[k])}",
                         f"{_f(al[k]['time_to_all'])} s; {_shares(al[k])}"))
        rot = {r["replicas"]: r for r in before["sections"]["scaleout"]["runs"]
               if r.get("kind") == "rotated"}
        proto_chunk = before.get("sizes", {}).get("scaleout", {}).get("chunk")
        lib_small = scale_runs(saved, proto_chunk) if proto_chunk else {}
        for k in sorted(set(rot) & set(lib_small)):
            if k == 1:
                continue
            rows.append(("1", f"scale-out, {n} entries, {k} replicas, chunks of {proto_chunk}: "
                         "prototype then, library now: time; shares %",
                         f"{_f(rot[k]['time_to_all'])} s; {_shares(rot[k])}",
                         f"{_f(lib_small[k]['time_to_all'])} s; {_shares(lib_small[k])}"))
    bf = {r["kill"]: r for r in before.get("sections", {}).get("failover", {}).get(
        "scenarios", []) if r["mode"] == "elarion"}
    af = {r["kill"]: r for r in saved.get("sections", {}).get("failover", {}).get(
        "scenarios", []) if r["mode"] == "elarion"}
    if "mid-batch" in bf and "mid-batch" in af and _same(before, saved, "failover", "load"):
        rows.append(("1", "failover, kill mid-batch: claimed, never sent (the "
                     f"{saved['sections']['failover']['load']}-entry load batch is one chunk, "
                     "so chunking does not bound it; the count depends on the kill instant)",
                     str(bf["mid-batch"]["claimed_not_sent"]),
                     str(af["mid-batch"]["claimed_not_sent"])))
    bs, as_ = _us(before, "shared"), _us(saved, "shared")
    if not math.isnan(bs) and not math.isnan(as_):
        rows.append(("2", "`cron('5 4 3 * * *')`: is_due + name_occurrence per entry "
                     "(entries of one expression)", f"{_f(bs, 0)} us", f"{_f(as_, 0)} us"))
        st, mi = _us(saved, "steady"), _us(saved, "miss")
        if not math.isnan(st) and not math.isnan(mi):
            rows.append(("2", "`cron`, an expression per entry: steady state (1 miss) / first "
                         "sight (2 misses)", f"{_f(bs, 0)} us (no memo)",
                         f"{_f(st, 0)} / {_f(mi, 0)} us"))
    if _same(before, saved, "throughput", "entries"):
        b1, a1 = tput(before, "defaults", 1), tput(saved, "defaults", 1)
        if b1 and a1:
            rows.append(("2", f"throughput, {saved['sections']['throughput']['entries']} "
                         "entries, 1 replica: time; CPU-seconds",
                         f"{_f(b1['time_to_all'])} s; {_f(b1['per_node'][0]['cpu'], 1)}",
                         f"{_f(a1['time_to_all'])} s; {_f(a1['per_node'][0]['cpu'], 1)}"))
    bo = before.get("sections", {}).get("overhead", {}).get("summary")
    ao = saved.get("sections", {}).get("overhead", {}).get("summary")
    if bo and ao and bo["n"] == ao["n"]:
        rows.append(("3", f"overhead, {ao['n']} entries: events on / events off / stock "
                     "(ratio)",
                     f"{_f(bo['elarion_median_s'], 3)} / {_f(bo['noevents_median_s'], 3)} / "
                     f"{_f(bo['stock_median_s'], 3)} s ({_f(bo['ratio_median'], 3)})",
                     f"{_f(ao['elarion_median_s'], 3)} / {_f(ao['noevents_median_s'], 3)} / "
                     f"{_f(ao['stock_median_s'], 3)} s ({_f(ao['ratio_median'], 3)})"))
        bsw = {r["n"]: r for r in before["sections"]["overhead"].get("sweep", [])}
        asw = {r["n"]: r for r in saved["sections"]["overhead"].get("sweep", [])}
        for k in sorted(set(bsw) & set(asw)):
            if k >= ao["n"]:
                continue
            rows.append(("3", f"overhead, {k} entries: ratio to stock (events off)",
                         f"{_f(bsw[k]['ratio'], 2)} ({_f(bsw[k]['ratio_noevents'], 2)})",
                         f"{_f(asw[k]['ratio'], 2)} ({_f(asw[k]['ratio_noevents'], 2)})"))
    bl_, al_ = (before.get("sections", {}).get("latency"), saved.get("sections", {}).get("latency"))
    if bl_ and al_ and bl_["entries"] == al_["entries"] and bl_["replicas"] == al_["replicas"]:
        rows.append(("1-3", f"latency, {al_['entries']} due on {al_['replicas']} replicas: p50 / "
                     "p99", f"{_f(1000 * bl_['producer']['p50'], 0)} / "
                     f"{_f(1000 * bl_['producer']['p99'], 0)} ms",
                     f"{_f(1000 * al_['producer']['p50'], 0)} / "
                     f"{_f(1000 * al_['producer']['p99'], 0)} ms"))
    return rows


# -- what is still open -------------------------------------------------------


def proposals(saved: dict[str, Any]) -> list[str]:
    """Remaining proposals, each stated only when this run's numbers show the problem."""
    sec = saved["sections"]
    items: list[str] = []
    tp = sec.get("throughput")
    cold = tput(saved, "cold", 3)
    warm = tput(saved, "defaults", 3)
    if cold and any(p["live_seen"] is not None and p["live_seen"] < cold["replicas"]
                    for p in cold["per_node"]):
        items.append(
            "**Learn the other nodes sooner after a start** (`maintenance.py`, `scheduler.py`). "
            "A node's rank comes from its last heartbeat, and a node heartbeats at start-up and "
            f"then every `elarion_beat_heartbeat_interval` ({_f(tp.get('heartbeat_default'), 0)} s "
            "by default): nodes started together (a deployment, a restarted cluster) disagree "
            "about the live nodes until their second heartbeat. Measured (section 2, cold "
            f"start): live nodes seen {', '.join(str(p['live_seen']) for p in cold['per_node'])}"
            f", starting chunks {', '.join(str(p['first_chunk']) for p in cold['per_node'])}, "
            f"wins {_wins(cold)}, {_f(cold['time_to_all'])} s"
            + (f", against {_wins(warm)} and {_f(warm['time_to_all'])} s after a warm-up "
               "(one run each)" if warm else "")
            + ". Proposal: a second heartbeat a few seconds after start-up (or heartbeat more "
            "often while the live set keeps changing), so that ranks agree within seconds; no "
            "correctness issue, only how evenly the first batches are shared.")
    ov_ = sec.get("overhead", {}).get("summary")
    r1, o1 = tput(saved, "defaults", 1), tput(saved, "events-off", 1)
    r3 = tput(saved, "defaults", 3)
    if ov_ and ov_["elarion_median_s"] > 1.05 * ov_["noevents_median_s"]:
        evidence = [f"section 1: {ov_['n']} entries in {_f(ov_['elarion_median_s'], 3)} s with "
                    f"the events, {_f(ov_['noevents_median_s'], 3)} s without"]
        if r1 and o1:
            evidence.append(f"section 2, one replica: {_f(r1['time_to_all'])} s against "
                            f"{_f(o1['time_to_all'])} s")
        text = ("**Send fewer events** (`events.py`, `outcome.py`). Moving the publishing to a "
                "thread took the broker's latency out of the tick, but not the events' CPU: the "
                "thread runs in the same process and needs the interpreter lock for its Python "
                "work, so with a local broker the events still slow the dispatch down ("
                + "; ".join(evidence) + ")" + _event_share_change(saved) + ".")
        if r3 and len(r3["per_node"]) > 1:
            events = sum(p.get("events_sent") or 0 for p in r3["per_node"])
            sent = sum(p["dispatched"] for p in r3["per_node"])
            text += (f" And every node sends one `elarion-skipped` event per entry it loses: "
                     f"the {len(r3['per_node'])} nodes of section 2 sent {events} events for "
                     f"{sent} tasks.")
        text += (" Proposal (the first run's third, still open): one `elarion-skipped` event per "
                 "lost chunk (job count, first job names) instead of one per entry, and "
                 "`elarion-dispatched` batched per chunk the same way, or events opt-in.")
        items.append(text)
    before = _first_run()
    old_us = _us(before, "shared") if before else math.nan
    miss_us = _us(saved, "miss")
    if not math.isnan(old_us) and not math.isnan(miss_us) and miss_us > old_us:
        items.append(
            "**Cheaper memo misses in `cron`** (`cron.py`: `next_after`, `_span`). A miss "
            "computes the whole `(slot, next)` span, so `next_after` pays for the slot search "
            "too (`get_prev` plus two checking searches) although it needs only the next "
            f"instant: an expression seen for the first time costs {_f(miss_us, 0)} us per due "
            f"entry (section 6), more than the {_f(old_us, 0)} us of every due `cron` entry "
            "before the memo. It matters for the first tick after a start and for schedules "
            "whose entries have many different expressions (the memo keeps 4 spans for each of "
            "up to 4096 expressions and is cleared when more appear, from the code; not "
            "measured here). Proposal: on a `next_after` miss remember the partial span "
            "`(moment, next)` (every moment in it has the same answer) and search the slot only "
            "when `elarion_slot` asks for it.")
    ov = sec.get("overhead", {}).get("summary")
    if ov:
        costly = [r for r in sec["overhead"].get("sweep", [])
                  if r["n"] < ov["n"] and r["ratio"] > 1.10]
        if costly:
            small = min(costly, key=lambda r: r["n"])
            items.append(
                f"**Small batches** pay a fixed cost per tick: for {small['n']} due entries the "
                f"ratio to stock beat is {_f(small['ratio'], 2)} "
                f"({_f(1000 * small['elarion'], 1)} ms against {_f(1000 * small['stock'], 1)} "
                f"ms; {_f(small['ratio_noevents'], 2)} with the events off), the claim round "
                "trip and connection checkout of the tick. A few milliseconds per tick; no "
                "change proposed.")
    out = ["## What is still open", ""]
    if not items:
        return out + ["Nothing in this run's numbers calls for another library change."]
    out += [f"{i}. {text}" for i, text in enumerate(items, 1)]
    out += ["", "These are proposals, not implemented; none needs a schema change."]
    return out


"""5. Failover: SIGKILL one of R real ``celery beat`` processes under load.

ClaimingScheduler and RedBeat (its lock on the local Redis, default lock timeout:
five times ``beat_max_loop_interval``) run the same app
(:mod:`benchmarks.failover_app`): a job due every second plus L load entries due
every P seconds, on R beats started with ``celery -A benchmarks.failover_app beat``
(through :class:`celery_elarion_beat.testing.ProcessManager`). A thread of this
process pops every message off the queue as it arrives (nothing else consumes it)
and notes when.

Two kills, each in a fresh cluster:

* ``quiet``: half-way between two seconds, away from the load slots, SIGKILL the
  beat that sent the last every-second message (RedBeat: the lock holder);
* ``mid-batch``: SIGKILL the beat that sends a load batch as soon as its first
  load message arrives (RedBeat: the lock holder), i.e. in the middle of
  publishing the batch.

Counted in the window [kill - pre, stop - 2 s]: occurrences of the 1 s job that
were never published (exact slots for ClaimingScheduler; for RedBeat's interval,
seconds of the window minus messages), duplicates, the largest gap between two
consecutive 1 s messages and the time from the kill to the next one. For
ClaimingScheduler also the claims won but never published (at-most-once).
"""

from __future__ import annotations

import math
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from celery_elarion_beat.store.records import ClaimRow
from celery_elarion_beat.testing._harness import (
    ProcessManager,
    claims_tables,
    drop_tables,
    read_claims,
    sleep_until,
    stop_all,
    wait_until,
)

from . import failover_app as fa
from .common import (
    PG_DSN,
    PREFIX,
    REDIS_URL,
    UTC,
    QueueReader,
    Table,
    delete_redis_keys,
    drop_queue,
    run_id,
)

APP = "benchmarks.failover_app"
SCHEDULERS = {"elarion": "celery_elarion_beat.ClaimingScheduler",
              "redbeat": "redbeat.RedBeatScheduler"}


#: one message as the analysis reads it: (task, job, occurrence, node, receive time)
Message = tuple[str, str | None, str | None, str | None, float]


def _message(headers: dict[str, Any], at: float) -> Message:
    return (headers.get("task", ""), headers.get("elarion_job"),
            headers.get("elarion_occurrence"), headers.get("elarion_node"), at)


def _messages(reader: QueueReader) -> list[Message]:
    return [_message(h, at) for h, at in reader.snapshot()]


def _ts(iso_text: str) -> float:
    return datetime.strptime(iso_text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def scenario(mode: str, kill: str, *, beats: int, load: int, load_period: int,
             max_interval: float, warm: float, after: float, pre: float = 5.0,
             log: Any = print) -> dict[str, Any]:
    rid = run_id()
    queue = f"{PREFIX}.failover.{rid}"
    table = f"{PREFIX}_failover_{rid}"
    prefix = f"{PREFIX}.redbeat.{rid}:"
    env = {
        "ELARION_BENCH_MODE": mode, "ELARION_BENCH_BROKER": REDIS_URL,
        "ELARION_BENCH_QUEUE": queue, "ELARION_BENCH_PG_DSN": PG_DSN,
        "ELARION_BENCH_TABLE": table, "ELARION_BENCH_REDBEAT_PREFIX": prefix,
        "ELARION_BENCH_LOAD": str(load), "ELARION_BENCH_LOAD_PERIOD": str(load_period),
        "ELARION_BENCH_MAX_INTERVAL": str(max_interval),
    }
    workdir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-failover-{mode}-"))
    consumer = QueueReader(queue)
    consumer.start()
    pm = ProcessManager(workdir, APP, env)
    procs: dict[str, Any] = {}
    result: dict[str, Any] = {"mode": mode, "kill": kill, "beats": beats, "load": load,
                              "load_period": load_period, "max_interval": max_interval,
                              "workdir": str(workdir)}
    try:
        launched = time.time()
        for i in range(1, beats + 1):
            node = f"node-{i}"
            procs[node] = pm.beat(f"beat-{node}", env={"ELARION_BENCH_NODE": node},
                                  scheduler=SCHEDULERS[mode])
        ready_re = (r"beat: claiming occurrences in .* as node " if mode == "elarion"
                    else r"beat: Starting\.\.\.")
        for proc in procs.values():
            proc.wait_for_log(ready_re, 90)

        def beating() -> bool:
            msgs = [m for m in _messages(consumer) if m[0] == fa.HEARTBEAT_TASK]
            return len(msgs) >= 3
        wait_until(beating, 60, message="the 1 s job to be sent")
        ready = time.time()
        result["startup_s"] = ready - launched
        sleep_until(ready + warm)
        for node, proc in procs.items():
            if not proc.alive():
                raise RuntimeError(f"{node} died before the kill\n{proc.tail()}")

        def holder() -> str:
            if mode == "redbeat":
                owners = [n for n, p in procs.items() if p.lines("beat: Acquired lock")]
                if len(owners) != 1:
                    raise RuntimeError(f"RedBeat lock holders: {owners}")
                return owners[0]
            beats_ = [m for m in _messages(consumer) if m[0] == fa.HEARTBEAT_TASK and m[3]]
            return str(beats_[-1][3])

        killed: dict[str, Any] = {}
        if kill == "quiet":
            now = time.time()
            # half-way between two seconds, as far as possible from the load slots
            kill_at = math.floor(now / load_period) * load_period + load_period // 2 + 0.5
            while kill_at < now + 0.5:
                kill_at += load_period
            sleep_until(kill_at - 0.4)
            victim = holder()
            sleep_until(kill_at)
            procs[victim].kill9()
            killed = {"node": victim, "at": procs[victim].killed_at}
        else:
            fired = threading.Event()
            target = holder() if mode == "redbeat" else None
            armed_at = time.time() + 0.3

            def on_message(headers: dict[str, Any], at: float) -> None:
                msg = _message(headers, at)
                if fired.is_set() or msg[0] != fa.LOAD_TASK or msg[4] < armed_at:
                    return
                victim_ = target or msg[3]
                if victim_ is None:
                    return
                fired.set()
                proc_ = procs[victim_]
                proc_.killed_at = time.time()
                proc_.signal(signal.SIGKILL)  # not kill9(): it would wait here
                killed.update(node=victim_, at=proc_.killed_at)

            consumer.on_message = on_message
            if not fired.wait(load_period * 3 + 5):
                raise RuntimeError("no load batch arrived to kill in")
            consumer.on_message = None
            procs[killed["node"]].wait(10)
        kill_ts = float(killed["at"])
        log(f"  failover {mode}/{kill}: killed {killed['node']} at "
            f"{datetime.fromtimestamp(kill_ts, UTC).strftime('%H:%M:%S.%f')[:-3]}")
        sleep_until(kill_ts + after)
        stop_ts = time.time()
        stop_all(procs.values(), 20)
        time.sleep(1.0)
        consumer.stop()
        messages = _messages(consumer)
        claims = read_claims(PG_DSN, table) if mode == "elarion" else []
        result.update(_analyse(mode, messages, claims, kill_ts=kill_ts, stop_ts=stop_ts,
                               pre=pre, load=load, load_period=load_period,
                               victim=killed["node"]))
        result["victim"] = killed["node"]
        result["lost_load"] = result.get("claimed_not_sent")
        result["observed_after_kill_s"] = after
        if mode == "redbeat":
            result["lock_timeout_s"] = _redbeat_lock_timeout(procs)
        result["beat_times"] = [round(m[4] - kill_ts, 3) for m in messages
                                if m[0] == fa.HEARTBEAT_TASK]
        shutil.rmtree(workdir, ignore_errors=True)  # the logs are kept only when a run fails
        return result
    finally:
        consumer.stop()
        pm.stop_all(10)
        drop_queue(queue)
        drop_tables(PG_DSN, *claims_tables(table))
        delete_redis_keys(f"{prefix}*")


def _redbeat_lock_timeout(procs: dict[str, Any]) -> float | None:
    import re

    for proc in procs.values():
        found = re.search(r"\. lock -> `[^`]*` .*\(([\d.]+)s\)", proc.log())
        if found:
            return float(found.group(1))
    return None


def _analyse(mode: str, messages: list[Message], claims: list[ClaimRow], *, kill_ts: float,
             stop_ts: float, pre: float, load: int, load_period: int,
             victim: str) -> dict[str, Any]:
    start, end = kill_ts - pre, stop_ts - 2.0
    beats = [m for m in messages if m[0] == fa.HEARTBEAT_TASK]
    times = sorted(m[4] for m in beats if start <= m[4] <= end)
    gaps = [b - a for a, b in zip(times, times[1:])]
    after = [t for t in times if t > kill_ts]
    out: dict[str, Any] = {
        "window_s": end - start,
        "max_gap_s": max(gaps) if gaps else math.nan,
        "kill_to_next_s": (after[0] - kill_ts) if after else math.nan,
        "messages_1s": len(times),
    }
    if mode == "elarion":
        seen = Counter(m[2] for m in beats if m[2])
        expected = [t for t in range(math.ceil(start), math.floor(end) + 1)]
        got = {int(_ts(occ)) for occ in seen}
        missed = [t for t in expected if t not in got]
        out.update(expected_1s=len(expected), missed_1s=len(missed),
                   missed_1s_at=[round(t - kill_ts, 1) for t in missed],
                   duplicates_1s=sum(n - 1 for n in seen.values() if n > 1))
        sent_ids = {(m[1], m[2]) for m in messages if m[1]}
        unsent = [(c.job, c.occurrence) for c in claims
                  if (c.job, c.occurrence.strftime("%Y-%m-%dT%H:%M:%SZ")) not in sent_ids
                  and not c.job.startswith("elarion.")]
        # claims made while stopping the survivors are not failover losses
        lost = [(j, o) for j, o in unsent if o.timestamp() <= end]
        lost_by_victim = [c for c in claims if c.node == victim and (c.job, c.occurrence)
                          in set(lost)]
        all_load = Counter((m[1], m[2]) for m in messages if m[0] == fa.LOAD_TASK and m[2])
        out.update(claimed_not_sent=len(lost), claimed_not_sent_by_victim=len(lost_by_victim),
                   load_duplicates=sum(n - 1 for n in all_load.values() if n > 1))
    else:
        expected_n = int(math.floor(end - start))
        out.update(expected_1s=expected_n, missed_1s=max(0, expected_n - len(times)),
                   missed_1s_at=[], duplicates_1s=max(0, len(times) - expected_n))
        # load: batches that should have gone out in the window vs load messages seen
        load_msgs = [m for m in messages if m[0] == fa.LOAD_TASK and start <= m[4] <= end]
        expected_load = load * int(math.floor((end - start) / load_period))
        out.update(load_expected=expected_load, load_sent=len(load_msgs),
                   claimed_not_sent=None, claimed_not_sent_by_victim=None,
                   load_duplicates=None)
    return out


def run(*, beats: int, load: int, load_period: int, max_interval: float, warm: float,
        after_elarion: float, after_redbeat: float | None = None,
        kills: tuple[str, ...] = ("quiet", "mid-batch"), log: Any = print) -> dict[str, Any]:
    results = []
    for mode in ("elarion", "redbeat"):
        after = after_elarion if mode == "elarion" else (
            after_redbeat if after_redbeat is not None else max_interval * 5 + max_interval + 8)
        for kill in kills:
            r = scenario(mode, kill, beats=beats, load=load, load_period=load_period,
                         max_interval=max_interval, warm=warm, after=after, log=log)
            results.append(r)
            log(f"  failover {mode}/{kill}: missed {r['missed_1s']} of {r['expected_1s']} "
                f"1 s occurrences, max gap {r['max_gap_s']:.2f}s, kill -> next "
                f"{r['kill_to_next_s']:.2f}s")
    return {"beats": beats, "load": load, "load_period": load_period,
            "max_interval": max_interval, "scenarios": results}


def tables(result: dict[str, Any]) -> list[Table]:
    t = Table(f"Failover: SIGKILL 1 of {result['beats']} celery beat processes; a 1 s job "
              f"plus {result['load']} entries every {result['load_period']} s "
              f"(beat_max_loop_interval={result['max_interval']:g})",
              ["scheduler", "kill", "1 s occurrences in window", "missed", "duplicates",
               "max gap s", "kill -> next 1 s message s", "claimed, never sent"])
    for r in result["scenarios"]:
        name = ("ClaimingScheduler" if r["mode"] == "elarion"
                else f"RedBeat (lock timeout {r.get('lock_timeout_s') or '?'} s)")
        t.add(name, r["kill"], r["expected_1s"], r["missed_1s"], r["duplicates_1s"],
              r["max_gap_s"], r["kill_to_next_s"],
              "-" if r["claimed_not_sent"] is None else r["claimed_not_sent"])
    t.notes = ["window = from 5 s before the kill to 2 s before the survivors were stopped",
               "RedBeat's 1 s job is a 1 s interval (RedBeat cannot store a cron); missed = "
               "seconds in the window minus 1 s messages seen"]
    for r in result["scenarios"]:
        if r["mode"] == "elarion" and r["missed_1s"]:
            t.notes.append(f"ClaimingScheduler/{r['kill']}: missed slots at "
                           f"{r['missed_1s_at']} s from the kill")
    return [t]

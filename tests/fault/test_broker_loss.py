"""Broker loss under load: the broker (Redis, then RabbitMQ) is really stopped for 12 s.

Two beat nodes claim a few hundred every-second slots (plus an every-node entry) in
PostgreSQL and publish them to a broker of the test's own (a ``redis-server`` or a
RabbitMQ node, :mod:`tests.fault.brokers`; never the shared ones); one worker
records every run in a runs table. After ~8 s the broker is stopped (SIGTERM: its
clients' connections close), 12 s later started again on the same port (a RabbitMQ
node then takes a few seconds more to boot), and the cluster runs on for ~12 s. One
such run per broker (the module fixture :func:`outage`) is read by the tests below,
each proving one property from what the processes wrote (claim rows, the runs table,
the beats' JSON logs and stats files, the events received, /proc):

* both beats stay up, and their RSS stays bounded (nothing buffered without limit);
* the publishes that failed are recorded: claim rows ``failed`` with the error,
  ``publish-error`` records; a failed claim never runs; nothing is left ``pending``;
  nothing is published while the broker is away;
* after the restart dispatch resumes (new claims run within :data:`RESUME_BOUND`,
  the every-node entry too); beat sends each occurrence at most once, and no
  occurrence runs twice except when the broker itself redelivers a message the
  worker had taken (RabbitMQ, whose acks of the last runs before it stopped were
  lost: Celery's at-least-once worker side, ``delivery_info["redelivered"]``);
* events are dropped, not queued: none stamped while the broker was away arrives
  afterwards, and the senders keep no outbound buffer or queue.

Two properties failed before #16's fixes (their tests failed on 1c59c1c):

* :func:`test_a_dead_broker_does_not_stall_the_tick`: each won claim's publish was
  retried under Celery's ``task_publish_retry_policy`` (~0.6 s against a refused
  connection) before it failed, so a tick with N winners blocked N x 0.6 s: with 100
  winners a node, the tick claimed just before the cut blocked for the whole outage.
  Now the first broker error of a tick fails that tick's other winners at once;
* :func:`test_events_go_out_again_at_once_after_a_broker_restart` (RabbitMQ): the
  event sender's first send after a restart went out on its dead AMQP connection and
  failed, and the sender then dropped every event for its 30 s backoff although the
  broker was back. Now a send that fails on a connection that was idle is tried once
  more on a fresh one.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from celery_elarion_beat.beat.purge import PURGE_JOB
from celery_elarion_beat.observe.events import DRIFT, EventSender
from celery_elarion_beat.observe.logformat import read_json_log, record_time
from celery_elarion_beat.store.records import ClaimRow
from celery_elarion_beat.testing._harness import (
    ChildProcess,
    ProcessManager,
    claims_tables,
    drop_tables,
    read_claims,
    sleep_until,
    stop_all,
    wait_until,
)
from tests.fault import proj_broker as proj
from tests.fault.brokers import BrokerServer, RabbitNode, RedisServer
from tests.flower.support import EventCapture

# two beats of 200 entries a second each, a private broker restarted, and a 5 s tick bound; one
# module cluster per parameter
pytestmark = [pytest.mark.alone, pytest.mark.xdist_group("broker-loss")]

UTC = timezone.utc
APP = "tests.fault.proj_broker"
SCHEDULER = "tests.fault.proj_broker:TimedScheduler"
NODES = ("node-1", "node-2")
#: cluster entries, each due every second: this many claims a second for the cluster
ENTRIES = 200
BEFORE = 8.0
OUTAGE = 12.0
AFTER = 12.0
#: generous: a loaded 2-core machine may take a minute to import celery
START_TIMEOUT = 120.0
#: a claim made after the broker is back runs within this many seconds of the restart.
#: Generous: the worker reconnects on kombu's back-off (2, 4, 6, ... s between
#: attempts), a beat may still be finishing a tick that blocked on the broker, and
#: the worker may have a backlog to work through on a loaded machine.
RESUME_BOUND = 60.0
#: RSS growth of a beat over its level before the cut (the issue: "memory stays bounded")
RSS_GROWTH_LIMIT_KB = 32 * 1024
#: the longest a tick may take while the broker is away: one failing publish (Celery
#: retries it under task_publish_retry_policy: ~0.6 s) plus the claim, with room for a
#: loaded machine
TICK_BOUND = 5.0
#: an event sent after a broker restart arrives within this many seconds (well under
#: the sender's 30 s backoff)
EVENT_AFTER_RESTART = 10.0

# -- observation ----------------------------------------------------------------------


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def read_stats(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


@dataclass
class Sample:
    ts: float
    node: str
    alive: bool
    rss_kb: int | None
    stats: dict[str, Any]


class Sampler:
    """Once a second: each beat's liveness, VmRSS (/proc) and stats file."""

    def __init__(self, beats: dict[str, ChildProcess], stats: dict[str, Path]) -> None:
        self.beats = beats
        self.stats = stats
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bl-sampler")

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            for node, beat in self.beats.items():
                self.samples.append(Sample(now, node, beat.alive(), rss_kb(beat.pid),
                                           read_stats(self.stats[node])))
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def of(self, node: str, start: float = 0.0, end: float = float("inf")) -> list[Sample]:
        return [s for s in self.samples if s.node == node and start <= s.ts < end]


class EventTap(EventCapture):
    """:class:`EventCapture` whose thread reconnects after the broker went away."""

    def __init__(self, app: Any) -> None:
        super().__init__({}, app=app)
        self.connected_at: list[float] = []
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.app.connection_for_read() as conn:
                    conn.ensure_connection(max_retries=1)
                    self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on})
                    self.connected_at.append(time.time())
                    self._receiver.capture(limit=None, timeout=None, wakeup=False)
            except Exception:  # noqa: BLE001 - the broker is away: try again
                self._stop.wait(0.5)

    def beat_events(self) -> list[dict[str, Any]]:
        return [e for e in self.raw() if str(e.get("hostname", "")).startswith("beat@")]

    def stop(self) -> None:
        self._stop.set()
        super().stop()


# -- the run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRow:
    entry: str | None
    job: str | None
    occurrence: str | None
    node: str | None
    placement: str | None
    task_id: str
    redelivered: bool | None
    executed_at: datetime


@dataclass
class Outage:
    """What one broker-loss run observed."""

    kind: str
    ready: float = 0.0
    cut: float = 0.0
    #: the broker was asked to start again (it may accept connections from then on)
    restart: float = 0.0
    #: the harness found it serving again
    back: float = 0.0
    end: float = 0.0
    claims: list[ClaimRow] = field(default_factory=list)
    runs: list[RunRow] = field(default_factory=list)
    records: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    resumed: float | None = None
    alive_at_end: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


def make_runs_table(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL(proj.RUNS_TABLE_DDL).format(table=sql.Identifier(table)))


def read_runs(dsn: str, table: str) -> list[RunRow]:
    query = sql.SQL("SELECT entry, job, occurrence, node, placement, task_id, redelivered, "
                    "executed_at FROM {} ORDER BY id").format(sql.Identifier(table))
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        return [RunRow(*row) for row in conn.execute(query)]


def count_runs(dsn: str, table: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def runs_after(dsn: str, table: str, claims_table: str, since: float) -> float | None:
    """When the first run of a cluster claim made at or after *since* was recorded."""
    query = sql.SQL("SELECT min(r.executed_at) FROM {} r JOIN {} c ON c.task_id = r.task_id "
                    "WHERE c.claimed_at >= %s").format(sql.Identifier(table),
                                                       sql.Identifier(claims_table))
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        row = conn.execute(query, [datetime.fromtimestamp(since, UTC)]).fetchone()
    return row[0].timestamp() if row and row[0] is not None else None


def declare_queue(app: Any) -> None:
    """Declare the run's task queue before any beat publishes (RabbitMQ drops a
    message to an exchange no queue is bound to)."""
    with app.connection_for_write() as conn:
        app.amqp.TaskConsumer(conn).purge()


def wait_drained(dsn: str, table: str, timeout: float = 30.0) -> None:
    """Wait until the worker's runs stop growing for 3 s (or *timeout*)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = count_runs(dsn, table)
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= 3.0:
            return
        time.sleep(0.5)


def run_outage(kind: str, server: BrokerServer, workdir: Path, pg_dsn: str) -> Outage:
    """Run the cluster on *server*, stop the broker for :data:`OUTAGE` s, start it again,
    and collect what every process wrote."""
    run = uuid.uuid4().hex[:10]
    queue = f"elarion-bl-{run}"
    claims_table, runs_table = f"bl_claims_{run}", f"bl_runs_{run}"
    env = {"ELARION_ACC_BROKER": server.url, "ELARION_ACC_QUEUE": queue,
           "ELARION_ACC_CLAIMS_DSN": pg_dsn, "ELARION_ACC_CLAIMS_TABLE": claims_table,
           "ELARION_ACC_RUNS_DSN": pg_dsn, "ELARION_ACC_RUNS_TABLE": runs_table,
           "ELARION_BL_ENTRIES": str(ENTRIES), "ELARION_BEAT_LOG_FORMAT": "json"}
    stats = {node: workdir / f"stats-{node}.json" for node in NODES}
    out = Outage(kind)
    made = False
    tap: EventTap | None = None
    sampler: Sampler | None = None
    try:
        make_runs_table(pg_dsn, runs_table)
        made = True
        declare_queue(proj.make_app(env, main=f"bl-probe-{run}"))
        tap = EventTap(proj.make_app(env, main=f"bl-events-{run}")).start()
        with ProcessManager(workdir, APP, env) as pm:
            worker = pm.worker(f"bl-worker-{run}", env={"ELARION_ACC_NODE": NODES[0]})
            beats = {node: pm.beat(f"beat-{node}", scheduler=SCHEDULER,
                                   env={"ELARION_ACC_NODE": node,
                                        "ELARION_BL_STATS": str(stats[node])})
                     for node in NODES}
            worker.wait_for_log(r"\bready\.", START_TIMEOUT)
            for beat in beats.values():
                beat.wait_for_record({"action": "started"}, START_TIMEOUT)
            wait_until(lambda: count_runs(pg_dsn, runs_table) > 0, START_TIMEOUT,
                       message=lambda: f"the first run\n{pm.tails()}")
            sampler = Sampler(beats, stats).start()
            out.ready = time.time()
            sleep_until(out.ready + BEFORE)

            out.cut = server.stop()
            sleep_until(out.cut + OUTAGE)
            server.start()
            out.restart, out.back = server.started_at[-1], server.up_at[-1]

            resumed = wait_until(lambda: runs_after(pg_dsn, runs_table, claims_table, out.back),
                                 RESUME_BOUND + 30, interval=0.5,
                                 message=lambda: f"a run of a claim made after the restart\n"
                                                 f"{pm.tails()}")
            out.resumed = resumed
            sleep_until(out.back + AFTER)
            out.end = time.time()
            sampler.stop()
            out.alive_at_end = [node for node, beat in beats.items() if beat.alive()]
            stop_all(beats.values())  # a warm shutdown writes the last publish marks
            wait_drained(pg_dsn, runs_table)
            out.records = {node: read_json_log(beat.log()) for node, beat in beats.items()}
            worker.terminate()
        out.claims = [c for c in read_claims(pg_dsn, claims_table) if c.job != PURGE_JOB]
        out.runs = read_runs(pg_dsn, runs_table)
        out.samples = sampler.samples
        out.events = tap.beat_events()
        return out
    finally:
        if sampler is not None:
            sampler.stop()
        if tap is not None:
            tap.stop()
        if made:
            drop_tables(pg_dsn, runs_table, *claims_tables(claims_table))
        else:
            drop_tables(pg_dsn, *claims_tables(claims_table))


# -- what the run shows ---------------------------------------------------------------------


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def slot_claims(out: Outage) -> list[ClaimRow]:
    return [c for c in out.claims if c.kind == "slot"]


def actions(out: Outage, action: str) -> list[dict[str, Any]]:
    return [r for recs in out.records.values() for r in recs if r.get("action") == action]


def rss_figures(out: Outage) -> dict[str, dict[str, int]]:
    """Per beat: its median RSS before the cut, its highest after it, the growth (kB)."""
    figures = {}
    for node in NODES:
        before = [s.rss_kb for s in out.samples if s.node == node and s.ts < out.cut and s.rss_kb]
        later = [s.rss_kb for s in out.samples if s.node == node and s.ts >= out.cut and s.rss_kb]
        if before and later:
            base = int(statistics.median(before))
            figures[node] = {"before_kb": base, "max_kb": max(later),
                             "growth_kb": max(later) - base}
    return figures


def tick_figures(out: Outage) -> dict[str, dict[str, Any]]:
    """Per beat: the longest tick seen from the cut to the restart (finished, or still
    running at a sample), the slow ticks (start from the cut, duration), and how long one
    failing publish took (the median gap between two publish-error records)."""
    figures: dict[str, dict[str, Any]] = {}
    for node in NODES:
        mine = [s for s in out.samples if s.node == node and s.stats]
        slow = mine[-1].stats.get("slow_ticks", []) if mine else []
        finished = [d for start, d in slow if out.cut - 2 <= start < out.restart]
        running = [float(s.stats.get("tick_running_for") or 0.0) for s in mine
                   if out.cut <= s.ts <= out.restart + 2]
        errors = sorted(record_time(r) for r in out.records.get(node, [])
                        if r.get("action") == "publish-error")
        gaps = [b - a for a, b in zip(errors, errors[1:]) if b - a < 30]
        figures[node] = {
            "longest_tick_s": round(max(finished + running + [0.0]), 1),
            "slow_ticks": [(round(start - out.cut, 1), round(d, 1)) for start, d in slow
                           if out.cut - 2 <= start < out.back + 5],
            "publish_errors": len(errors),
            "one_failing_publish_s": round(statistics.median(gaps), 2) if gaps else None,
        }
    return figures


def claim_rounds(out: Outage, start: float, end: float) -> int:
    """How many distinct claim instants (to the second) fall in [start, end)."""
    return len({int(c.claimed_at.timestamp()) for c in slot_claims(out)
                if start <= c.claimed_at.timestamp() < end})


def event_figures(out: Outage) -> dict[str, Any]:
    received = [float(e.get("local_received") or 0.0) for e in out.events]
    after = [at for at in received if at >= out.back]
    during = [s.stats for s in out.samples if out.cut <= s.ts < out.restart and s.stats]
    dropped: dict[str, int | None] = {}
    for node in NODES:
        counts = [s.stats.get("dropped") or 0 for s in out.samples
                  if s.node == node and s.stats and out.cut <= s.ts < out.restart]
        dropped[node] = counts[-1] - counts[0] if counts else None
    return {
        "before_cut": sum(1 for at in received if at < out.cut),
        "after_restart": len(after),
        "first_after_restart_s": round(min(after) - out.back, 1) if after else None,
        "dropped_while_away": dropped,
        "max_event_queue": max((s.get("event_queue") or 0 for s in during), default=None),
        "max_outbound_buffer": max((s.get("outbound_buffer") or 0 for s in during),
                                   default=None),
        "events-dropped_records": len(actions(out, "events-dropped")),
    }


def measure(out: Outage) -> None:
    claims = slot_claims(out)
    failed = [c for c in claims if c.state == "failed"]
    gap = [c for c in claims if out.cut <= c.claimed_at.timestamp() < out.restart]
    runs = Counter(r.task_id for r in out.runs)
    out.figures.update({
        "resumed_after_s": round(out.resumed - out.back, 1) if out.resumed else None,
        "rss": rss_figures(out),
        "claims": {
            "total": len(claims), "failed": len(failed),
            "failed_claimed_s_from_cut": sorted({round(c.claimed_at.timestamp() - out.cut, 1)
                                                 for c in failed}),
            "claim_rounds_while_away": claim_rounds(out, out.cut, out.restart),
            "won_while_away": len(gap),
            "won_while_away_failed": sum(1 for c in gap if c.state == "failed"),
            "won_while_away_published_after_restart": sum(1 for c in gap
                                                          if c.state == "published"),
            "pending_at_end": sum(1 for c in claims if c.state not in ("published", "failed")),
        },
        "publish_error_records": len(actions(out, "publish-error")),
        "runs": {"total": len(out.runs),
                 "before_cut": sum(1 for r in out.runs if r.executed_at < utc(out.cut)),
                 "twice": sum(1 for n in runs.values() if n > 1),
                 "redelivered": sum(1 for r in out.runs if r.redelivered)},
        "events": event_figures(out),
        "ticks": tick_figures(out),
    })


def summary(out: Outage) -> str:
    lines = [f"===== broker loss: {out.kind}: cut {out.cut - out.ready:.1f}s after the start, "
             f"restarted {out.restart - out.cut:.1f}s later, serving {out.back - out.restart:.1f}s "
             f"after that, then {out.end - out.back:.1f}s more ====="]
    lines += [f"{key}: {value}" for key, value in out.figures.items()]
    return "\n".join(lines)


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def outage(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           pg_dsn: str) -> Iterator[Outage]:
    """One broker-loss run per broker, shared by the tests below (each checks one
    property of it)."""
    kind = request.param
    base = tmp_path_factory.mktemp(f"broker-loss-{kind}")
    server: BrokerServer = (RedisServer(base / "redis") if kind == "redis"
                            else RabbitNode(base / "rabbitmq", uuid.uuid4().hex[:8]))
    try:
        server.start()
        out = run_outage(kind, server, base / "procs", pg_dsn)
    finally:
        server.close()
    measure(out)
    text = summary(out)
    print("\n" + text, flush=True)
    (base / "summary.txt").write_text(text + "\n")
    yield out


# -- the proof ------------------------------------------------------------------------------


def test_beats_stay_up_and_their_memory_stays_bounded(outage: Outage) -> None:
    """Both beats live through the outage; RSS grows at most RSS_GROWTH_LIMIT_KB."""
    out = outage
    dead = [(s.node, round(s.ts - out.cut, 1)) for s in out.samples if not s.alive]
    assert not dead and out.alive_at_end == list(NODES), (dead, out.alive_at_end)
    assert any(s.ts >= out.back for s in out.samples), "no sample after the restart"
    rss = out.figures["rss"]
    assert set(rss) == set(NODES), f"no RSS samples before and after the cut: {rss}"
    for node, figures in rss.items():
        assert figures["growth_kb"] <= RSS_GROWTH_LIMIT_KB, (node, figures)


def test_claims_won_while_the_broker_is_away_are_publish_failures(outage: Outage) -> None:
    """The publishes that failed are recorded: the claim row ``failed`` with the error,
    a ``publish-error`` record; a failed claim never runs; none is left ``pending``; a
    claim won before the cut was published (or its publish fell into the outage)."""
    out = outage
    claims = slot_claims(out)
    failed = [c for c in claims if c.state == "failed"]
    assert failed, f"no claim was marked failed: the outage went unrecorded {out.figures}"
    assert all(c.publish_error for c in failed), [c for c in failed if not c.publish_error][:3]
    assert len(actions(out, "publish-error")) >= len(failed), out.figures["claims"]
    # a publish fails only once the broker is gone: within the tick in flight at the cut
    early = [c for c in failed if c.claimed_at < utc(out.cut - 3.0)]
    assert not early, [(c.job, c.claimed_at.isoformat()) for c in early[:5]]
    ran = {r.task_id for r in out.runs}
    failed_ran = [c for c in failed if c.task_id in ran]
    assert not failed_ran, [(c.job, c.occurrence.isoformat()) for c in failed_ran[:5]]
    # every claim ends published or failed (a warm shutdown writes the last marks)
    pending = [c for c in claims if c.state not in ("published", "failed")]
    assert not pending, [(c.job, c.claimed_at.isoformat(), c.state) for c in pending[:5]]
    # nothing was published while the broker was away: a claim won then either failed,
    # or went out once the broker was back (a tick still publishing at the restart)
    published_away = [c for c in claims if c.state == "published"
                      and out.cut + 1.0 <= c.claimed_at.timestamp() < out.restart
                      and c.published_at is not None and c.published_at < utc(out.restart)]
    assert not published_away, [(c.job, c.claimed_at.isoformat()) for c in published_away[:5]]


def test_dispatch_resumes_and_no_occurrence_runs_twice(outage: Outage) -> None:
    """Runs before the cut; new claims run within RESUME_BOUND of the restart, every-node
    runs too; beat sends each occurrence at most once, and no run repeats except the
    broker's own redelivery of a message the worker had taken (see the module doc)."""
    out = outage
    assert out.figures["runs"]["before_cut"] > 0, out.figures["runs"]
    assert out.resumed is not None and out.resumed - out.back <= RESUME_BOUND, \
        out.figures["resumed_after_s"]
    assert any(r.entry == proj.EVERY_NODE_JOB and r.executed_at >= utc(out.back)
               for r in out.runs), "the every-node entry never ran after the restart"
    # beat's side: each occurrence sent at most once (a send logs `dispatched`, then
    # `publish-error` if the broker refused it)
    sent: Counter[tuple[str, str]] = Counter()
    for record in actions(out, "dispatched"):
        if record.get("placement") == "cluster":
            sent[(record["job"], record["occurrence"])] += 1
    for record in actions(out, "publish-error"):
        if record.get("placement") == "cluster":
            sent[(record["job"], record["occurrence"])] -= 1
    twice_sent = {k: n for k, n in sent.items() if n > 1}
    assert not twice_sent, list(twice_sent.items())[:5]
    # the worker's side: a task id, or a slot, runs twice only when the broker
    # redelivered a message (RabbitMQ, after losing the acks of the last runs before it
    # stopped); never a second message
    claim_ids = {c.task_id for c in out.claims}
    unclaimed = [r for r in out.runs if r.entry != proj.EVERY_NODE_JOB
                 and r.task_id not in claim_ids]
    assert not unclaimed, unclaimed[:3]
    first: dict[tuple[str | None, str | None], str] = {}
    duplicates = []
    for run in out.runs:
        if run.entry == proj.EVERY_NODE_JOB:
            continue
        key = (run.entry, run.occurrence)
        if key in first and not (run.redelivered and first[key] == run.task_id):
            duplicates.append((key, first[key], run.task_id, run.redelivered))
        first.setdefault(key, run.task_id)
    assert not duplicates, duplicates[:5]


def test_events_are_dropped_not_queued(outage: Outage) -> None:
    """Events arrive before the cut; none stamped while the broker was away arrives
    afterwards; the senders keep no outbound buffer and no queue of events."""
    out = outage
    figures = out.figures["events"]
    assert figures["before_cut"] > 0, figures
    stale = [e for e in out.events if float(e.get("local_received") or 0) >= out.back
             and out.cut <= float(e.get("timestamp") or 0) < out.restart]
    assert not stale, [(e.get("type"), e.get("timestamp")) for e in stale[:5]]
    assert figures["max_outbound_buffer"] == 0, figures
    assert (figures["max_event_queue"] or 0) <= 2, figures
    # and the beats say so: the events dropped are logged (action events-dropped)
    assert figures["events-dropped_records"] >= 1, figures


def test_a_dead_broker_does_not_stall_the_tick(outage: Outage) -> None:
    """While the broker is away beat keeps ticking: no tick blocks longer than
    TICK_BOUND, it claims every second, fails those claims at once (none is sent
    late, after the restart), and drops its events."""
    out = outage
    ticks = out.figures["ticks"]
    assert all(t["longest_tick_s"] <= TICK_BOUND for t in ticks.values()), ticks
    claims = out.figures["claims"]
    assert claims["claim_rounds_while_away"] >= (out.restart - out.cut) / 2, claims
    assert claims["won_while_away_published_after_restart"] == 0, claims
    assert all(out.figures["events"]["dropped_while_away"].values()), out.figures["events"]


@pytest.mark.parametrize("kind", [
    "redis",
    "rabbitmq",
])
def test_events_go_out_again_at_once_after_a_broker_restart(kind: str, tmp_path: Path) -> None:
    """Beat's event sender (the library's EventSender, in this process) sends an event,
    the broker restarts while the sender is idle, and the next event is received
    (within EVENT_AFTER_RESTART s): a connection that broke while idle is not taken for
    a broker that is still away."""
    run = uuid.uuid4().hex[:8]
    server: BrokerServer = (RedisServer(tmp_path / "redis") if kind == "redis"
                            else RabbitNode(tmp_path / "rabbitmq", run))
    env = {"ELARION_ACC_BROKER": server.url, "ELARION_ACC_QUEUE": f"elarion-bl-{run}"}
    tap: EventTap | None = None
    sender: EventSender | None = None
    try:
        server.start()
        tap = EventTap(proj.make_app(env, main=f"bl-events-{run}")).start()
        wait_until(lambda: tap.connected_at, 30, message="the event tap to connect")
        sender = EventSender(proj.make_app(env, main=f"bl-sender-{run}"), "probe")

        def received(n: int) -> bool:
            return any(e.get("n") == n for e in tap.beat_events()) if tap else False

        def first_event() -> bool:
            # again until the tap's queue is bound; each send is out before the next try,
            # so none is still in flight when the broker stops
            if sender is not None and sender.send(DRIFT, node="probe", n=1):
                sender.flush(10)
            return received(1)

        wait_until(first_event, 30, interval=1.0, message="the first event")
        server.stop()
        server.start()
        wait_until(lambda: len(tap.connected_at) >= 2, 30, message="the tap to reconnect")
        sender.send(DRIFT, node="probe", n=2)
        sender.flush(EVENT_AFTER_RESTART)
        deadline = time.monotonic() + EVENT_AFTER_RESTART
        while not received(2) and time.monotonic() < deadline:
            sender.send(DRIFT, node="probe", n=2)
            time.sleep(0.5)
        assert received(2), (f"no event arrived within {EVENT_AFTER_RESTART}s of the "
                             f"restart: sent {sender.sent}, dropped {sender.dropped}")
    finally:
        if sender is not None:
            sender.close()
        if tap is not None:
            tap.stop()
        server.close()

"""Acceptance: every-node entries on real beat and worker processes, Redis and RabbitMQ.

An entry with ``options={"placement": "every_node"}`` is never claimed: every
node's beat sends it to its own node queue (``elarion.node.<node>``), and the
workers of that node consume it through the one-liner
``celery_elarion_beat.consume_node_queue(app)`` in the app module
(:mod:`tests.acceptance.proj_every_node`). Messages expire after at most one
period; node queues expire when unused (``elarion_beat_node_queue_expires``).

The task records every execution in a runs table: the elarion headers it came
with, the executing worker and the worker's *own* node (read from its app.conf or
environment, never from the message), and ``sent_at``, beat's clock when it
published the message (a ``BeatLazyFunc`` argument).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from amqp.exceptions import NotFound, PreconditionFailed
from kombu import Connection

from celery_elarion_beat.testing._harness import ChildProcess, sleep_until, stop_all, wait_until
from tests.acceptance import proj_every_node as proj
from tests.acceptance.cluster import even_ceil, grid, iso, summary
from tests.acceptance.every_node import (
    DISCARDED,
    START_TIMEOUT,
    EveryNodeRun,
    Run,
    discarded,
    is_rabbitmq,
    node_queue_name,
    sends,
    wait_beat_ready,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# three beats and three workers; message expiry within 0.25 s of a period
pytestmark += [pytest.mark.heavy]

PERIOD = proj.PERIOD
EVERY_NODE_JOBS = (proj.EN_INTERVAL, proj.EN_CRON)
#: how long the three-node scenario runs once every beat has sent
RUN_SECONDS = 20.0
#: per node and entry, executions may differ from window / period by this much
COUNT_SLACK = 2
#: the worker of the stale-work scenario stays down this long (> the 2 s expiry)
DOWN_SECONDS = 9.0


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("redis_url" if request.param == "redis" else "amqp_url"))


def _broker(url: str) -> str:
    return "rabbitmq" if is_rabbitmq(url) else "redis"


def iso_time(ts: float) -> str:
    """Local wall-clock time, as in the celery logs."""
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]


def _expiry_seconds(run: Run) -> float | None:
    """The message's expiry relative to its send time, from the request's `expires`."""
    if run.expires is None or run.sent_at is None:
        return None
    return datetime.fromisoformat(run.expires).timestamp() - run.sent_at


def _stop(*processes: ChildProcess | None) -> float:
    """SIGTERM all of *processes* at once, wait for each; the instant of the signal."""
    mark = time.time()
    stop_all(p for p in processes if p is not None)
    return mark


# -- 1: three nodes, each runs every every-node occurrence itself ---------------


def test_three_nodes_run_every_node_entries_on_their_own_workers(workdir: Path, pg_dsn: str,
                                                                  broker_url: str) -> None:
    run = EveryNodeRun(workdir, pg_dsn=pg_dsn, broker_url=broker_url, schedule="three")
    try:
        run.prepare()
        # node 1 gets its name through app.conf, nodes 2 and 3 through ELARION_BEAT_NODE
        nodes = [run.node(1, via_conf=True), run.node(2), run.node(3)]
        for node in nodes:
            run.start_worker(node)  # no -Q: the one-liner adds the node queue
        hostnames = {node.name: run.wait_worker_ready(node) for node in nodes}
        for node in nodes:
            run.start_beat(node)
        for node in nodes:
            assert node.beat is not None
            wait_beat_ready(node.beat)
        for node in nodes:
            assert node.beat is not None
            node.beat.wait_for_record({"action": "dispatched", "job": proj.EN_INTERVAL},
                                      START_TIMEOUT)
        start = time.time()
        warm_end = even_ceil(start + 2)
        sleep_until(start + RUN_SECONDS)
        alive = [n.name for n in nodes if n.beat and n.beat.alive() and n.worker
                 and n.worker.alive()]
        stop_mark = _stop(*(n.beat for n in nodes))
        runs = run.wait_quiet()
        _stop(*(n.worker for n in nodes))
        runs = run.runs()
        claimed = run.claimed_jobs()

        problems: list[str] = []
        lines: list[str] = []
        window = stop_mark - start
        expected = {proj.EN_INTERVAL: window / PERIOD,
                    proj.EN_CRON: float(len(grid(start, stop_mark, int(PERIOD))))}
        lines.append(f"broker {_broker(broker_url)}; window {window:.1f}s "
                     f"({iso_time(start)} .. {iso_time(stop_mark)}); expected per node: "
                     + ", ".join(f"{job} ~{n:.1f}" for job, n in expected.items()))
        if alive != [n.name for n in nodes]:
            problems.append(f"every beat and worker must be alive at the end; alive: {alive}")

        # every run: the elarion headers of an every-node message, on the sender's node only
        by_worker = {node.name: [r for r in runs if (r.worker or "").startswith(
            node.worker_prefix() + "@")] for node in nodes}
        strangers = [r for r in runs if not any(r in rs for rs in by_worker.values())]
        if strangers:
            problems.append(f"runs on unknown workers: {strangers[:5]}")
        seen: dict[str, int] = {}
        for r in runs:
            seen[r.task_id] = seen.get(r.task_id, 0) + 1
        twice = {t: n for t, n in seen.items() if n > 1}
        if twice:
            problems.append(f"task ids executed more than once: {twice}")
        expiries: list[float] = []
        for node in nodes:
            mine = by_worker[node.name]
            wrong_conf = {r.worker_node for r in mine if r.worker_node != node.name}
            if wrong_conf:
                problems.append(f"worker of {node.name} reports its own node as {wrong_conf}")
            for r in mine:
                if r.entry not in EVERY_NODE_JOBS:
                    continue
                wrong = []
                if r.node != r.worker_node:
                    wrong.append(f"elarion_node={r.node!r} but the worker is on {r.worker_node!r}")
                if r.placement != "every_node":
                    wrong.append(f"elarion_placement={r.placement!r}")
                if r.job != r.entry:
                    wrong.append(f"elarion_job={r.job!r}")
                if r.claim is not None or r.occurrence is not None:
                    wrong.append(f"elarion_claim={r.claim!r}, elarion_occurrence={r.occurrence!r}")
                if r.routing_key != node_queue_name(node.name):
                    wrong.append(f"delivered from routing key {r.routing_key!r}")
                expiry = _expiry_seconds(r)
                # the two clocks are read at the publish: a beat descheduled between
                # them on a loaded machine may add a second
                if expiry is None or not 0 < expiry <= PERIOD + 1.0:
                    wrong.append(f"expires {r.expires!r} is {expiry}s after sending, not within "
                                 f"one period ({PERIOD:g}s)")
                elif expiry is not None:
                    expiries.append(expiry)
                if wrong:
                    problems.append(f"{r.entry} run {r.task_id} on {node.name}'s worker: "
                                    + "; ".join(wrong))

        # per node and entry: about one run per period, and every send ran
        counts: dict[str, dict[str, int]] = {}
        for node in nodes:
            assert node.beat is not None
            counts[node.name] = {}
            for job in EVERY_NODE_JOBS:
                mine = [r for r in by_worker[node.name] if r.entry == job]
                in_window = [r for r in mine if r.sent_at is not None
                             and start <= r.sent_at <= stop_mark]
                sent = sends(node.beat, job)
                counts[node.name][job] = len(in_window)
                if abs(len(in_window) - expected[job]) > COUNT_SLACK:
                    problems.append(f"{node.name}: {job} ran {len(in_window)} times in the "
                                    f"window, expected {expected[job]:.1f} +- {COUNT_SLACK}")
                if not 0 <= len(sent) - len(mine) <= 1:
                    problems.append(f"{node.name}: beat dispatched {job} {len(sent)} times, its "
                                    f"worker ran {len(mine)} (more runs than sends, or lost)")
                lines.append(f"  {node.name} ({hostnames[node.name]}): {job}: {len(in_window)} "
                             f"runs in the window, {len(mine)} runs / {len(sent)} sends overall")

        # the cluster entry: every slot after the warm-up exactly once, on any worker
        cluster_runs = [r for r in runs if r.entry == proj.CLUSTER_CRON]
        by_slot: dict[str, list[Run]] = {}
        for r in cluster_runs:
            by_slot.setdefault(r.occurrence or "?", []).append(r)
        slots = [iso(s) for s in grid(warm_end, stop_mark - 2, int(PERIOD))]
        missing = [s for s in slots if s not in by_slot]
        dup = {s: [(r.task_id, r.node, r.worker) for r in rs] for s, rs in by_slot.items()
               if len(rs) > 1}
        if missing or dup:
            problems.append(f"{proj.CLUSTER_CRON}: slots missing {missing}, more than once {dup}; "
                            f"expected {slots}, executed {sorted(by_slot)}")
        bad = [r for r in cluster_runs if r.placement != "cluster" or r.claim != "slot"]
        if bad:
            problems.append(f"{proj.CLUSTER_CRON} runs with wrong headers: {bad[:3]}")
        if set(claimed) & set(EVERY_NODE_JOBS):
            problems.append(f"every-node entries were claimed: {claimed}")
        if claimed.get(proj.CLUSTER_CRON, 0) < len(slots):
            problems.append(f"{proj.CLUSTER_CRON} has {claimed.get(proj.CLUSTER_CRON, 0)} claims "
                            f"for {len(slots)} slots")
        lines.append(f"  {proj.CLUSTER_CRON}: {len(slots)} slots expected after the warm-up, "
                     f"{len(cluster_runs)} runs in all, {len(missing)} missing, {len(dup)} "
                     f"duplicated; workers: "
                     + ", ".join(f"{n.name}={sum(r in by_worker[n.name] for r in cluster_runs)}"
                                 for n in nodes))
        if expiries:
            lines.append(f"  message expiry after sending: {min(expiries):.2f}.."
                         f"{max(expiries):.2f}s; exchange of delivery: "
                         f"{sorted({str(r.exchange) for r in runs})}")
        for node in nodes:
            for process in (node.beat, node.worker):
                if process is not None and process.lines("Traceback"):
                    problems.append(f"{process.name} logged a traceback")
        lines.append("per-node counts: " + "; ".join(
            f"{n}: " + ", ".join(f"{job}={c}" for job, c in per.items())
            for n, per in counts.items()))
        if problems:
            lines.append(f"{len(problems)} PROBLEM(S):")
            lines += [f"  - {p}" for p in problems]
        text = "\n".join(lines)
        summary(workdir, f"three nodes ({_broker(broker_url)})", text)
        assert not problems, f"{text}\n{run.tails()}"
    finally:
        run.close()


# -- 2: the one-liner subscribes a real worker ---------------------------------


def test_one_liner_makes_a_worker_consume_its_node_queue(
        workdir: Path, pg_dsn: str, amqp_url: str) -> None:
    """A worker started with ``-Q <default queue>`` only also consumes its node queue."""
    run = EveryNodeRun(workdir, pg_dsn=pg_dsn, broker_url=amqp_url, schedule="single",
                       env={"ELARION_ACC_REMOTE_CONTROL": "1"})
    app = proj.make_app(run.env, main=f"elarion-en-probe-{run.run_id}")
    try:
        run.prepare()
        node = run.node(1)
        worker = run.start_worker(node, "-Q", run.queue)
        hostname = run.wait_worker_ready(node)
        assert hostname.startswith(node.worker_prefix() + "@"), worker.tail()

        # celery inspect active_queues: the node queue, as documented, beside -Q's queue
        def active() -> list[dict[str, Any]] | None:
            replies = app.control.inspect(destination=[hostname], timeout=3).active_queues()
            return cast("list[dict[str, Any]] | None", (replies or {}).get(hostname))

        queues = cast("list[dict[str, Any]]", wait_until(
            active, 45, interval=0.5,
            message=lambda: f"an active_queues reply from {hostname}\n{worker.tail()}"))
        by_name = {q["name"]: q for q in queues}
        assert set(by_name) == {run.queue, node.queue}, \
            f"{hostname} consumes {sorted(by_name)}, expected {run.queue} and {node.queue}"
        declared = by_name[node.queue]
        assert declared["exchange"]["name"] == "elarion.node", declared
        assert declared["exchange"]["type"] == "direct", declared
        assert declared["routing_key"] == node.queue, declared
        assert declared["durable"] and not declared["auto_delete"], declared
        assert declared["queue_arguments"] == {"x-expires": 3600 * 1000}, declared

        # and it really consumes it: a message routed through elarion.node runs there
        app.send_task(proj.TASK, kwargs={"entry": "direct"}, exchange="elarion.node",
                      routing_key=node.queue)
        runs = run.wait_runs(lambda rs: [r for r in rs if r.entry == "direct"], 45,
                             f"the message routed to {node.queue} to run")
        assert [r.worker for r in runs if r.entry == "direct"] == [hostname]
        summary(workdir, "one-liner", f"{hostname} consumes: "
                 + ", ".join(f"{q['name']} (exchange {q['exchange']['name']}, args "
                             f"{q['queue_arguments']})" for q in queues))
    finally:
        app.close()
        run.close()


# -- 3: stale work is dropped --------------------------------------------------


@pytest.mark.fault
def test_messages_sent_while_the_worker_is_down_expire_unexecuted(workdir: Path, pg_dsn: str,
                                                                  broker_url: str) -> None:
    rabbit = is_rabbitmq(broker_url)
    run = EveryNodeRun(workdir, pg_dsn=pg_dsn, broker_url=broker_url, schedule="single")
    try:
        run.prepare()
        node = run.node(1)
        first = run.start_worker(node)
        run.wait_worker_ready(node)
        beat = run.start_beat(node)
        wait_beat_ready(beat)
        run.wait_runs(lambda rs: len(rs) >= 2, 45, "two runs before the worker stops")

        # warm shutdown of the worker; beat keeps sending every PERIOD seconds
        first.terminate()
        assert not first.alive(), first.tail()
        down = time.time()
        probe_at = down + DOWN_SECONDS - 2.5
        sleep_until(probe_at)
        probe = _probe_node_queue(broker_url, node.queue)
        sleep_until(down + DOWN_SECONDS)
        relaunched = time.time()
        second = run.start_worker(node, suffix="-again")
        run.wait_worker_ready(node)
        ready = time.time()
        runs = run.wait_runs(
            lambda rs: len([r for r in rs if (r.sent_at or 0) > ready]) >= 3, 45,
            "three fresh runs after the restart")
        _stop(beat)
        runs = run.wait_quiet(quiet=2.0, timeout=15)
        _stop(second)
        runs = run.runs()

        # a message sent before `relaunched - PERIOD` had expired before any worker could see it
        stale_from, stale_to = down, relaunched - PERIOD - 0.5
        sent = sends(beat, proj.EN_INTERVAL)
        stale_sent = [t for t in sent if stale_from < t < stale_to]
        stale_ran = [r for r in runs if r.sent_at is not None and stale_from < r.sent_at < stale_to]
        fresh = [r for r in runs if r.sent_at is not None and r.sent_at > ready]
        dropped = discarded(second)
        problems = []
        if len(stale_sent) < 3:
            problems.append(f"beat sent only {len(stale_sent)} messages while the worker was down")
        if stale_ran:
            problems.append(f"{len(stale_ran)} stale messages ran: "
                            f"{[(r.task_id, iso_time(r.sent_at or 0)) for r in stale_ran]}")
        if len(fresh) < 3:
            problems.append(f"only {len(fresh)} fresh messages ran after the restart")
        wrong = [r for r in runs if r.node != node.name or r.worker_node != node.name]
        if wrong:
            problems.append(f"runs from or on another node: {wrong[:3]}")
        if rabbit:
            # RabbitMQ drops them itself (the `expiration` property celery sets from `expires`)
            if probe["messages"] > 2:
                problems.append(f"{probe['messages']} messages waited in {node.queue} while the "
                                "worker was down; RabbitMQ should drop them after 2 s")
        else:
            # Redis keeps them (and re-arms the queue's TTL); the worker discards them unexecuted
            if probe["messages"] < 2 or not 0 < probe["ttl"] <= 3600:
                problems.append(f"while the worker was down, {node.queue} held "
                                f"{probe['messages']} messages with TTL {probe['ttl']}")
            if len(dropped) < len(stale_sent):
                problems.append(f"the restarted worker logged {len(dropped)} "
                                f"'{DISCARDED}...' records for {len(stale_sent)} stale messages")
        text = (f"broker {_broker(broker_url)}: worker down {iso_time(down)} .. relaunched "
                f"{iso_time(relaunched)} (ready {iso_time(ready)}); beat sent {len(sent)} "
                f"messages, {len(stale_sent)} while the queue had no worker long enough to "
                f"expire them; {len(stale_ran)} of those ran; {len(fresh)} fresh runs after "
                f"the restart; node queue while down: {probe}; the restarted worker logged "
                f"{len(dropped)} 'Discarding revoked task' records")
        if problems:
            text += f"\n{len(problems)} PROBLEM(S):\n" + "\n".join(f"  - {p}" for p in problems)
        summary(workdir, f"stale work ({_broker(broker_url)})", text)
        assert not problems, f"{text}\n{run.tails()}"
    finally:
        run.close()


def _probe_node_queue(broker_url: str, name: str) -> dict[str, int]:
    """How many messages wait in the node queue (and on Redis: its TTL), touching nothing."""
    if is_rabbitmq(broker_url):
        with Connection(broker_url, connect_timeout=5) as conn:
            # passive declare: does not create it; its lease does not matter here (3600 s)
            _, messages, consumers = conn.default_channel.queue_declare(name, passive=True)
            return {"messages": messages, "consumers": consumers}
    client = redis.Redis.from_url(broker_url)
    try:
        return {"messages": int(client.llen(name)), "ttl": int(client.ttl(name))}
    finally:
        client.close()


# -- 4: node queues expire ----------------------------------------------------


def test_rabbitmq_node_queue_has_x_expires_and_disappears(
        workdir: Path, pg_dsn: str, amqp_url: str) -> None:
    """x-expires on the node queue: it outlives its worker while beat sends, then goes.

    RabbitMQ deletes a queue that had no consumer, no basic.get and no redeclaration
    for x-expires. Beat redeclares the node queue with every send (kombu never caches
    the declaration of an expiring queue), so the queue of a node whose worker is down
    stays while its beat runs, and goes once beat stops too.
    """
    expires = 3.0
    run = EveryNodeRun(workdir, pg_dsn=pg_dsn, broker_url=amqp_url, schedule="single",
                       env={"ELARION_BEAT_NODE_QUEUE_EXPIRES": f"{expires:g}"})

    def declare(**kwargs: Any) -> Any:
        with Connection(amqp_url, connect_timeout=5) as conn:
            return conn.channel().queue_declare(node.queue, **kwargs)

    try:
        run.prepare()
        node = run.node(1)
        worker = run.start_worker(node)
        run.wait_worker_ready(node)
        beat = run.start_beat(node)
        wait_beat_ready(beat)
        run.wait_runs(lambda rs: len(rs) >= 3, 45, "three runs")  # > expires of use

        # the same declaration is accepted (RabbitMQ compares the arguments) ...
        _, _, consumers = declare(durable=True, auto_delete=False,
                                  arguments={"x-expires": int(expires * 1000)})
        assert consumers == 1, f"{node.queue} has {consumers} consumers\n{run.tails()}"
        # ... other or no x-expires is not: the queue carries exactly x-expires = 3000 ms
        for other in ({"x-expires": int(expires * 1000) + 1}, {}):
            with pytest.raises(PreconditionFailed, match="x-expires"):
                declare(durable=True, auto_delete=False, arguments=other)

        # the worker stops; beat's sends keep the queue (our own probes are > expires apart)
        worker_stopped = _stop(worker)
        sleep_until(time.time() + expires + 2)
        assert beat.alive(), beat.tail()
        _, messages, consumers = declare(passive=True)
        assert consumers == 0, consumers
        kept = time.time() - worker_stopped

        # beat stops too: nothing renews the lease, the queue goes
        beat_stopped = _stop(beat)
        probed = time.time()  # the passive declare above renewed the lease before this
        sleep_until(probed + expires + 2)  # one probe only: a declare renews the lease
        with pytest.raises(NotFound):
            declare(passive=True)
            pytest.fail(f"{node.queue} still exists {expires + 2:g}s after the node's beat "
                        f"and worker stopped\n{run.tails()}")
        summary(workdir, "queue expiry (rabbitmq)",
                 f"{node.queue}: x-expires {expires * 1000:g} ms; still there {kept:.1f}s after "
                 f"its worker stopped while beat sent ({messages} messages waiting); gone "
                 f"{time.time() - beat_stopped:.1f}s after beat stopped too")
    finally:
        run.close()


def test_redis_node_queue_ttl_is_rearmed_by_beat_and_runs_out(
        workdir: Path, pg_dsn: str, redis_url: str) -> None:
    expires = 4.0
    run = EveryNodeRun(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="single",
                       env={"ELARION_BEAT_NODE_QUEUE_EXPIRES": f"{expires:g}"})
    client = redis.Redis.from_url(redis_url)
    try:
        run.prepare()
        node = run.node(1)
        beat = run.start_beat(node)  # no worker: the messages stay in the queue
        wait_beat_ready(beat)
        # beat logs its dispatched record just before it publishes: wait for the key itself
        wait_until(lambda: client.exists(node.queue), START_TIMEOUT, interval=0.1,
                   message=lambda: f"{node.queue} to appear in Redis\n{beat.tail()}")
        # sample for three periods: the key always exists, with a TTL of at most `expires`
        samples = []
        end = time.time() + 3 * PERIOD
        while time.time() < end:
            samples.append((int(client.llen(node.queue)), client.pttl(node.queue)))
            time.sleep(0.25)
        lengths = [n for n, _ in samples]
        assert all(0 < ttl <= expires * 1000 for _, ttl in samples), \
            f"TTL of {node.queue} (ms) while beat sends: {samples}\n{beat.tail()}"
        assert lengths[-1] >= lengths[0] + 2, f"the queue did not grow: {samples}"
        stopped = _stop(beat)
        last_send = max(sends(beat, proj.EN_INTERVAL))

        def gone() -> bool:
            return not client.exists(node.queue)

        wait_until(gone, expires + 6, interval=0.1,
                   message=lambda: f"{node.queue} to expire (TTL {client.pttl(node.queue)} ms)")
        gone_at = time.time()
        # not before its TTL ran out (the last send re-armed it to `expires`)
        assert gone_at - last_send >= expires - 1.0, \
            f"{node.queue} was gone {gone_at - last_send:.1f}s after the last send"
        summary(workdir, "queue expiry (redis)",
                 f"{node.queue}: {lengths[-1]} stale messages, TTL samples {samples[:4]}..; gone "
                 f"{gone_at - last_send:.1f}s after beat's last send "
                 f"({gone_at - stopped:.1f}s after the stop)")
    finally:
        client.close()
        run.close()


# -- 5: configuration error ----------------------------------------------------


def test_beat_refuses_an_every_node_entry_with_its_own_queue(
        workdir: Path, pg_dsn: str, redis_url: str) -> None:
    run = EveryNodeRun(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="bad")
    try:
        beat = run.start_beat(run.node(1))
        rc = beat.wait(90)
        output = beat.log()
        assert rc is not None, f"beat kept running\n{beat.tail()}"
        assert rc == 78, f"beat did not exit 78 (EX_CONFIG)\n{beat.tail()}"
        # one CRITICAL line says what stopped beat (docs/startup.md), no traceback
        (refused,) = beat.records(action="refused-start")
        said = refused["message"]
        assert refused["level"] == "CRITICAL" and refused.get("error") == "ConfigurationError"
        assert f"beat_schedule entry {proj.EN_BAD!r}" in said, \
            f"the error does not name the entry\n{beat.tail()}"
        assert "every_node" in said and "'queue'" in said, beat.tail()
        assert "Traceback" not in output, beat.tail()
        assert f"entry {proj.EN_INTERVAL!r}" not in output, beat.tail()
        assert not beat.records(action="dispatched"), beat.tail()
    finally:
        run.close()

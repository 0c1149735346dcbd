"""Acceptance: real celery beat (3 nodes) + worker processes on real brokers.

Each scenario runs ``celery -A tests.acceptance.proj beat -S ClaimingScheduler``
as node-1..node-3 and one ``celery worker`` on a queue of its own, then checks
what ran (runs table, written by the task from its elarion headers) against what
was claimed (claims table) and what the beats logged.

Times: the cron entry has a slot every even second and the interval winner
claims at a phase of its own; disruptive steps (kill -9, cut) happen at a
"quiet moment" as far as possible from both, so that no winning claim is in
flight. Slots before the warm-up end (ready + 2 s) or after the stop (- 2 s)
are not required to run, but nothing may ever run twice.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from urllib.parse import urlparse

import pytest
from sqlalchemy.engine import make_url

from celery_elarion_beat.testing import ProcessManager, sleep_until
from tests.acceptance.cluster import (
    CRON_JOB,
    INTERVAL_JOB,
    MINUTE_JOB,
    Cluster,
    analyse,
    delete_queue,
    even_ceil,
    expect_exactly_once,
    grid,
    iso,
    next_minute,
    parse_iso,
    quiet_moment,
    report,
    summary,
    utc,
)
from tests.helpers.tcpproxy import TcpProxy

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]

#: a beat must have launched this long before the minute boundary of scenario a ...
MIN_LEAD = 26.0
#: ... and at most this long (keeps the run near 30-45 s)
MAX_LEAD = 38.0
#: the boundary must be this far after the cluster is ready: warm-up, slots before the kill,
#: the kill, slots between the kill and the boundary
MIN_READY_LEAD = 16.0
AFTER_BOUNDARY = 10.5
CUT_SECONDS = 6.0
EDGE = 1.0  # the edges of the cut where a claim may still (or already) go through


# -- a: Redis, kill -9 one beat before the minute boundary ----------------------


@pytest.mark.fault
def test_redis_cluster_survives_kill_9_of_a_beat(workdir, pg_dsn, redis_url) -> None:
    # Launch so that the next minute boundary is MIN_LEAD..MAX_LEAD seconds away.
    now = time.time()
    boundary = next_minute(now + MIN_LEAD - 0.001)
    if boundary - now > MAX_LEAD:
        sleep_until(boundary - MAX_LEAD)
    cluster = Cluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url)
    try:
        launched = time.time()
        ready = cluster.start()
        if boundary - ready < MIN_READY_LEAD:  # a very slow start: use the next minute
            print(f"cluster took {ready - launched:.1f}s to start; aiming at the next minute")
            boundary += 60
        warm_end = even_ceil(ready + 2)
        target = max(warm_end + 4, (warm_end + boundary) / 2 - 1)
        sleep_until(target - 1)
        alive = cluster.alive_beats()
        assert alive == ["node-1", "node-2", "node-3"], \
            f"a beat died before the kill: {alive}\n{cluster.tails()}"
        # kill the beat that holds the interval job (it wins every window until it dies);
        # every beat races for every cron slot anyway
        windows = [c for c in cluster.claims() if c.job == INTERVAL_JOB]
        assert windows, f"no interval claim before the kill\n{cluster.tails()}"
        victim = windows[-1].node
        kill_at = quiet_moment(target, busy=[windows[-1].occurrence.timestamp()])
        assert kill_at <= boundary - 4, (kill_at, boundary)
        sleep_until(kill_at)
        cluster.beats[victim].kill9()
        killed_at = cluster.beats[victim].killed_at
        assert killed_at is not None
        assert not cluster.beats[victim].alive()

        sleep_until(boundary + AFTER_BOUNDARY)
        survivors = cluster.alive_beats()
        stop_mark = cluster.stop_beats()

        # an interval claim the victim won in its last second may never have been sent
        excused = [c.task_id for c in cluster.claims()
                   if c.node == victim and c.kind == "window"
                   and killed_at - 1.0 <= c.claimed_at.timestamp() <= killed_at]
        cluster.drain(stop_mark - 1.0, excused)
        cluster.stop_worker()
        claims, runs = cluster.claims(), cluster.runs()

        a = analyse(claims, runs, stop_mark=stop_mark, excused_task_ids=excused)
        expected = grid(warm_end, stop_mark - 2, 2)
        expect_exactly_once(a, CRON_JOB, expected, "cron")
        after_kill = [s for s in expected if s.timestamp() > killed_at]
        expect_exactly_once(a, MINUTE_JOB, [utc(boundary)], "minute")
        expect_exactly_once(a, MINUTE_JOB, [s for s in grid(warm_end, stop_mark - 2, 60)
                                            if s != utc(boundary)], "minute")
        if survivors != sorted(set(cluster.beats) - {victim}):
            a.fail(f"surviving beats {sorted(set(cluster.beats) - {victim})} should be alive "
                   f"at the end; alive: {survivors}")
        if len(after_kill) < 4:
            a.fail(f"only {len(after_kill)} cron slots after the kill were observed")
        windows_after = [c for c in claims if c.job == INTERVAL_JOB
                         and c.occurrence.timestamp() > killed_at + 2]
        if not windows_after:
            a.fail("no interval claim after the kill: the interval job stopped")
        a.counts["cron_expected_after_kill"] = len(after_kill)
        a.counts["interval_claims_after_kill"] = len(windows_after)
        for node in survivors:
            if cluster.beats[node].lines("Traceback"):
                a.fail(f"beat {node} logged a traceback")
        if not any(b.lines("claimed-elsewhere (winner node-") for b in cluster.beats.values()):
            a.fail("no beat logged a 'claimed-elsewhere (winner node-N)' skip")
        timeline = (f"ready {iso(utc(ready))}, warm-up ends {iso(utc(warm_end))}, killed "
                    f"{victim} at {utc(killed_at).time()}, minute boundary {iso(utc(boundary))}, "
                    f"stop {utc(stop_mark).time()}")
        text = report(a, timeline)
        summary(workdir, "scenario a (redis, kill -9)", text)
        assert not a.problems, f"{text}\n{cluster.tails()}"
    finally:
        cluster.close()


# -- b: RabbitMQ, PostgreSQL cut for ~6 s --------------------------------------


def _through(proxy: TcpProxy, dsn: str) -> str:
    return make_url(dsn).set(host=proxy.host, port=proxy.port).render_as_string(
        hide_password=False)


@pytest.mark.fault
def test_rabbitmq_cluster_fails_closed_while_postgres_is_cut(workdir, pg_dsn, amqp_url) -> None:
    target = urlparse(pg_dsn)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    cluster = Cluster(workdir, pg_dsn=pg_dsn, broker_url=amqp_url,
                      claims_dsn=_through(proxy, pg_dsn))
    try:
        ready = cluster.start()
        warm_end = even_ceil(ready + 2)
        target = warm_end + 5
        sleep_until(target - 1)
        windows = [c for c in cluster.claims() if c.job == INTERVAL_JOB]
        cut_at = quiet_moment(target, busy=[w.occurrence.timestamp() for w in windows[-1:]])
        sleep_until(cut_at)
        reset = proxy.cut()
        cut = time.time()
        sleep_until(cut + CUT_SECONDS)
        proxy.restore()
        restored = time.time()
        alive_after_cut = cluster.alive_beats()
        # each beat says so once it claims again; then watch dispatch for a while
        for beat in cluster.beats.values():
            if beat.alive():
                try:
                    beat.wait_for_log(r"claims database reachable again", 30)
                except AssertionError:
                    pass  # reported below with the log counts
        end = max(restored + 3 + 12, time.time() + 4)
        sleep_until(end)
        alive = cluster.alive_beats()
        stop_mark = cluster.stop_beats()
        # a claim committed just as the cut hit may have lost its reply: never sent
        excused = [c.task_id for c in cluster.claims()
                   if cut - EDGE <= c.claimed_at.timestamp() <= cut]
        cluster.drain(stop_mark - 1.0, excused)
        cluster.stop_worker()
        claims, runs = cluster.claims(), cluster.runs()

        a = analyse(claims, runs, stop_mark=stop_mark, excused_task_ids=excused)
        if alive_after_cut != list(cluster.beats) or alive != list(cluster.beats):
            a.fail(f"every beat must survive the outage; alive after the cut: "
                   f"{alive_after_cut}, at the end: {alive}")
        # nothing was claimed or ran for an occurrence inside the cut
        lo, hi = utc(cut + EDGE), utc(restored - EDGE)
        inside = [f"{c.job}@{c.occurrence.time()} by {c.node}" for c in claims
                  if lo <= c.occurrence <= hi]
        if inside:
            a.fail(f"claims inside the cut ({lo.time()}..{hi.time()}): {inside}")
        ran_inside = []
        for r in runs:
            if r.occurrence is None:
                continue
            start = parse_iso(r.occurrence)
            end_ = start + (timedelta(seconds=1) if r.claim == "window" else timedelta(0))
            if lo <= start and end_ <= hi:
                ran_inside.append(f"{r.entry}@{r.occurrence} by {r.node}")
        if ran_inside:
            a.fail(f"runs inside the cut ({lo.time()}..{hi.time()}): {ran_inside}")
        # dispatch before the cut and after recovery: every cron slot exactly once
        before = grid(warm_end, cut - EDGE, 2)
        after = grid(restored + 3, stop_mark - 2, 2)
        expect_exactly_once(a, CRON_JOB, before, "cron_before_cut")
        expect_exactly_once(a, CRON_JOB, after, "cron_after_restore")
        minutes = [m for m in grid(warm_end, stop_mark - 2, 60)
                   if m.timestamp() <= cut - EDGE or m.timestamp() >= restored + 3]
        expect_exactly_once(a, MINUTE_JOB, minutes, "minute")
        skipped_slots = grid(cut + EDGE, restored - EDGE, 2)
        a.counts["cron_slots_inside_cut"] = len(skipped_slots)
        if len(skipped_slots) < 2:
            a.fail(f"the cut covered only {len(skipped_slots)} cron slots")
        if len(after) < 4:
            a.fail(f"only {len(after)} cron slots after the restore were observed")
        if not [c for c in claims if c.job == INTERVAL_JOB
                and c.occurrence.timestamp() > restored + 1]:
            a.fail("no interval claim after the restore: the interval job did not resume")
        # one ERROR per outage and one recovery line per beat; fail-closed skips logged
        for node, beat in cluster.beats.items():
            down = beat.lines("claims database unavailable")
            down_err = [line for line in down if "ERROR" in line]
            up = beat.lines("claims database reachable again")
            errors = beat.lines("claim-error")
            a.counts[f"{node}_unavailable_lines"] = len(down)
            a.counts[f"{node}_reachable_lines"] = len(up)
            a.counts[f"{node}_claim_error_skips"] = len(errors)
            if len(down_err) != 1 or len(down) != 1:
                a.fail(f"{node}: expected exactly one ERROR 'claims database unavailable' line, "
                       f"got {down}")
            if len(up) != 1:
                a.fail(f"{node}: expected exactly one 'claims database reachable again' line, "
                       f"got {up}")
            # every beat tried every cron slot of the cut, and skipped it (fail closed)
            not_skipped = [iso(s) for s in skipped_slots
                           if not beat.lines(f"Skipping {CRON_JOB} at {iso(s)}: claim-error")]
            if not errors or not_skipped:
                a.fail(f"{node}: no 'Skipping {CRON_JOB} at <slot>: claim-error' line for the "
                       f"slots {not_skipped} inside the cut ({len(errors)} claim-error skips)")
            if beat.lines("Traceback"):
                a.fail(f"beat {node} logged a traceback")
        timeline = (f"ready {iso(utc(ready))}, warm-up ends {iso(utc(warm_end))}, cut "
                    f"{utc(cut).time()} ({reset} live connections reset), restored "
                    f"{utc(restored).time()}, stop {utc(stop_mark).time()}; proxy accepted "
                    f"{proxy.accepted}, refused {proxy.refused}")
        text = report(a, timeline)
        summary(workdir, "scenario b (rabbitmq, postgres cut)", text)
        assert not a.problems, f"{text}\n{cluster.tails(40)}"
    finally:
        try:
            cluster.close()
        finally:
            proxy.stop()


# -- configuration: refuses to run uncoordinated; masks the password --------


def test_beat_without_dsn_exits_and_names_the_setting(workdir, redis_url) -> None:
    run_id = uuid.uuid4().hex[:10]
    env = {"ELARION_ACC_BROKER": redis_url, "ELARION_ACC_QUEUE": f"elarion-acc-{run_id}"}
    with ProcessManager(workdir, "tests.acceptance.proj", env) as pm:
        beat = pm.beat("beat-no-dsn", scheduler="elarion")
        rc = beat.wait(90)
        output = beat.log()
        assert rc is not None, f"beat without elarion_beat_dsn kept running\n{beat.tail()}"
        assert rc != 0, f"beat without elarion_beat_dsn exited 0\n{beat.tail()}"
        assert "elarion_beat_dsn" in output, f"the error does not name the setting\n{beat.tail()}"
    delete_queue(env)


def test_beat_banner_masks_the_password_and_names_the_node(workdir, pg_dsn, redis_url,
                                                            table_name) -> None:
    run_id = uuid.uuid4().hex[:10]
    secret = "s3cret"
    dsn = make_url(pg_dsn).set(password=secret).render_as_string(hide_password=False)
    node = f"banner-node-{run_id}"
    # settings through the library's environment fallbacks (proj sets no elarion conf)
    env = {"ELARION_ACC_BROKER": redis_url, "ELARION_ACC_QUEUE": f"elarion-acc-{run_id}",
           "ELARION_BEAT_DSN": dsn, "ELARION_BEAT_NODE": node, "ELARION_BEAT_TABLE": table_name}
    try:
        with ProcessManager(workdir, "tests.acceptance.proj", env) as pm:
            beat = pm.beat("beat-banner", scheduler="elarion")
            # it really claims with that DSN (trust auth ignores the password)
            beat.wait_for_log(r"beat: Sending due task .* won\]", 90)
            assert beat.alive(), beat.tail()
        output = beat.log()
        masked = make_url(dsn).set(drivername="postgresql+psycopg").render_as_string(
            hide_password=True)
        assert ":***@" in masked
        assert f". claims -> {masked} (table {table_name})" in output, beat.tail(60)
        assert f". node -> {node}" in output, beat.tail(60)
        assert f"as node {node}" in output, beat.tail(60)
        assert secret not in output, f"the password leaked into the output\n{beat.tail(60)}"
        assert beat.returncode is not None
    finally:
        delete_queue(env)

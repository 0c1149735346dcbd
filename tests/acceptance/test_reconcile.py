"""Acceptance: the reconciliation report of a 3-node run with one ``kill -9`` (issue #13).

Three ``celery beat`` nodes and one ``celery worker`` of :mod:`tests.acceptance.proj_runs`
run a seconds cron, an interval and a failing cron on Redis and PostgreSQL; the beat
that holds the interval's newest window is killed with SIGKILL in the middle and
restarted. A survivor claims the interval's next window while the killed node is away
(a crash moves the work, with no failover: the "A node crashes" row). Then
``celery -A ... elarion-beat
status --since ... --json`` must account for every expected slot: for each exact-slot
entry ``expected == claimed + skipped + missed`` with nothing missed, no duplicate,
every published occurrence finished as succeeded or failed exactly as the tasks
themselves recorded, and an orphan only where the killed node held the claim (the
at-most-once rule). The human report is kept in the run's summary for the record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from celery_elarion_beat.store.states import RUN_FAILED, SUCCEEDED
from celery_elarion_beat.testing._harness import sleep_until, wait_until
from tests.acceptance import proj_runs as proj
from tests.acceptance.cluster import DRAIN_TIMEOUT, START_TIMEOUT, summary
from tests.acceptance.runs import RunsCluster

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# real beats and a kill -9
pytestmark += [pytest.mark.heavy]

#: seconds the cluster runs before the kill, and after the killed node came back
BEFORE_KILL, AFTER_KILL = 6.0, 6.0
#: seconds the killed node stays away (longer than the interval: a survivor's window)
AWAY = 3.0


def _status(cluster: RunsCluster, since: float, grace: float,
            *extra: str) -> tuple[int | None, str]:
    """The report over the last *since* seconds; slots younger than *grace* (due after
    the beats stopped) are not expected yet."""
    probe = cluster.pm.celery(f"reconcile-{len(cluster.pm.processes)}",
                              ["elarion-beat", "status", "--since", f"{since:.0f}s",
                               "--grace", f"{grace:.1f}s", *extra])
    rc = probe.wait(START_TIMEOUT)
    return rc, probe.log()


def _json(output: str) -> dict[str, Any]:
    start = output.find("{\n")
    parsed, _ = json.JSONDecoder().raw_decode(output[max(start, 0):])
    assert isinstance(parsed, dict), output[-3000:]
    return parsed


@pytest.mark.fault
def test_reconciliation_accounts_for_every_slot_after_a_kill(workdir: Path, pg_dsn: str,
                                                              redis_url: str) -> None:
    cluster = RunsCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="recorded",
                          beats=3)
    try:
        cluster.prepare()
        cluster.start_worker("w1", concurrency=4)
        began = time.time()
        cluster.launch_beats()
        started = cluster.wait_started()
        sleep_until(max(started.values()) + BEFORE_KILL)
        # kill the node that holds the interval: it won the newest window
        windows = [c for c in cluster.claims() if c.job == proj.QUICK_INTERVAL]
        assert windows, f"no interval window before the kill\n{cluster.tails()}"
        killed = max(windows, key=lambda c: c.occurrence).node
        cluster.beats[killed].kill9()
        killed_at = cluster.beats[killed].killed_at
        assert killed_at is not None
        time.sleep(AWAY)
        relaunched = time.time()
        cluster.launch_beats([killed])
        cluster.wait_started([killed])
        time.sleep(AFTER_KILL)
        stopped = cluster.stop_beats()
        # every published run finishes (the quick task takes 0.2 s)
        assert wait_until(lambda: not [c for c in cluster.claims()
                                       if c.state == "published" and c.run_state is None
                                       or c.run_state == "running"], DRAIN_TIMEOUT), \
            cluster.tails()
        since = time.time() - began + 5
        grace = time.time() - stopped + 1.0  # the report starts right after this
        rc, text = _status(cluster, since, grace)
        summary(workdir, "reconciliation after a 3-node run with one kill -9", text)
        rc_json, output = _status(cluster, since, grace + START_TIMEOUT, "--json")
        report = _json(output)["reconciliation"]
        entries = {e["job"]: e for e in report["entries"]}
        claims, runs = cluster.claims(), cluster.runs()
        problems: list[str] = []
        outcome = {r.task_id: r.outcome for r in runs}
        for job in (proj.QUICK_CRON, proj.FAILING):
            e = entries[job]
            if e["expected"] != e["claimed"] + e["skipped"] + e["missed"]:
                problems.append(f"{job}: expected {e['expected']} != claimed {e['claimed']} "
                                f"+ skipped {e['skipped']} + missed {e['missed']}")
            if e["missed"] or e["duplicates"]:
                problems.append(f"{job}: missed {e['missed']}, duplicates {e['duplicates']}")
            mine = [c for c in claims if c.job == job]
            if e["claimed"] != len(mine):
                problems.append(f"{job}: the report counts {e['claimed']} claims, the table "
                                f"holds {len(mine)}")
            # what the tasks recorded themselves agrees with the report
            own_ok = sum(1 for c in mine if outcome.get(c.task_id) == "succeeded")
            own_failed = sum(1 for c in mine if outcome.get(c.task_id) == "failed")
            if (e["succeeded"], e["failed"]) != (own_ok, own_failed):
                problems.append(f"{job}: report succeeded/failed {e['succeeded']}/"
                                f"{e['failed']}, the tasks recorded {own_ok}/{own_failed}")
            if e["published"] != e["succeeded"] + e["failed"]:
                problems.append(f"{job}: {e['published']} published, but "
                                f"{e['succeeded']} + {e['failed']} finished")
            # an orphan only where the killed node held the claim (at most once)
            orphans = [c for c in mine if c.state in ("pending", "failed")]
            if len(orphans) != e["orphaned"] or any(c.node != killed for c in orphans):
                problems.append(f"{job}: orphans {[(c.occurrence, c.node) for c in orphans]}"
                                f" vs reported {e['orphaned']}")
        taken = [c for c in claims if c.job == proj.QUICK_INTERVAL and c.node != killed
                 and killed_at < c.occurrence.timestamp() < relaunched]
        if not taken:
            problems.append(f"{proj.QUICK_INTERVAL}: no survivor claimed a window while "
                            f"{killed} was away: the interval stopped with its node")
        interval = entries[proj.QUICK_INTERVAL]
        if interval["duplicates"]:
            problems.append(f"{proj.QUICK_INTERVAL}: {interval['duplicates']} duplicates")
        if entries[proj.FAILING]["failed"] < 2 or entries[proj.QUICK_CRON]["succeeded"] < 5:
            problems.append(f"too few runs: {entries}")
        # the failing entry makes the report unhealthy: exit 1, whatever the format
        if (rc, rc_json) != (1, 1):
            problems.append(f"exit codes {rc} / {rc_json}, expected 1 (failed runs)")
        assert {c.run_state for c in claims if c.job == proj.QUICK_CRON
                and c.state == "published"} <= {SUCCEEDED}
        assert {c.run_state for c in claims if c.job == proj.FAILING
                and c.state == "published"} <= {RUN_FAILED}
        assert not problems, "\n".join(problems) + f"\n{text}\n{cluster.tails()}"
    finally:
        cluster.close()

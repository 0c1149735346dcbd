"""Acceptance: a quick restart of every node loses no run and doubles none (issue #35).

Three ``celery beat`` nodes and one ``celery worker`` of
:mod:`tests.acceptance.proj_missed` (group ``restart``: per catch-up policy, skip,
latest and all, an interval entry of 20 s and a ``cron("*/10 * * * * *")`` entry) on
Redis and PostgreSQL. Once the interval entries have run, every beat is stopped
(SIGTERM) 15 s after that run and started again about 2 s later: the beats are up
before the next run is due, as in a rolling deploy.

Before the fix, a due time that fell in the 2 s before a starting node read the
ledger was taken for one missed while the cluster was down, and ``skip`` waited for
the following point: the next run came one whole interval late (40 s after the last).
Proved here, for each policy:

* each interval entry's first run after the restart comes at its due time (one
  interval after its last run), or as the beats are up if they came later, never a
  whole interval late; consecutive runs are never closer than the interval (minus
  the window tolerance): none doubled; the run after it keeps the rhythm;
* every cron slot from the first restarted node's start on runs exactly once; the
  slots due while no beat ran are replayed once under ``latest`` and ``all``, never
  under ``skip``; no task id and no slot ran twice.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from celery_elarion_beat.testing._harness import sleep_until, wait_until
from tests.acceptance import proj_missed as proj
from tests.acceptance.cluster import (
    START_TIMEOUT,
    Analysis,
    expect_exactly_once,
    grid,
    iso,
    report,
    summary,
)
from tests.acceptance.missed import MissedCluster, check_runs, check_settled

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.heavy]

EVERY = proj.RESTART_INTERVAL
#: an interval claim may come this much before its due time (elarion_beat_window_tolerance)
TOLERANCE = timedelta(seconds=1)
#: how late a run may come after it is due (or after the beats are up), on a loaded machine
ON_TIME = timedelta(seconds=1.5)
#: the restart: stop this long after the interval entries' run, start this long after that
STOP_AFTER, DOWN = 15.0, 1.0


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "procs"
    path.mkdir()
    return path


def _claims(cluster: MissedCluster, job: str) -> list[Any]:
    return sorted((c for c in cluster.claims() if c.job == job), key=lambda c: c.occurrence)


@pytest.mark.slow
def test_a_quick_restart_loses_no_run_under_any_policy(workdir: Path, pg_dsn: str,
                                                       redis_url: str) -> None:
    cluster = MissedCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="restart")
    intervals = list(proj.RS_INTERVALS.values())
    try:
        cluster.prepare()
        cluster.start_worker()
        cluster.launch_beats()
        cluster.wait_started()
        wait_until(lambda: all(_claims(cluster, job) for job in intervals),
                   EVERY.total_seconds() + START_TIMEOUT, interval=0.1,
                   message=lambda: f"the interval entries' first runs\n{cluster.tails()}")
        last = {job: _claims(cluster, job)[-1].occurrence for job in intervals}
        ran_at = max(last.values()).timestamp()
        sleep_until(ran_at + STOP_AFTER)
        stopped = cluster.stop_beats()
        down_until = max(time.time(), ran_at + STOP_AFTER + DOWN)
        sleep_until(down_until)
        relaunched = cluster.launch_beats()
        started = cluster.wait_started()
        up = datetime.fromtimestamp(max(started.values()), last[intervals[0]].tzinfo)

        # the run that was lost, then the one after it (the rhythm, and no double)
        def second_after_restart() -> bool:
            return all(len([c for c in _claims(cluster, job)
                            if c.occurrence > last[job]]) >= 2 for job in intervals)

        wait_until(second_after_restart, 2 * EVERY.total_seconds() + START_TIMEOUT,
                   interval=0.2,
                   message=lambda: f"two interval runs after the restart\n{cluster.tails()}")
        end_mark = cluster.stop_beats()
        cluster.drain(end_mark - 1.0)
        cluster.stop_worker()
        claims, runs = cluster.claims(), cluster.runs()
    finally:
        cluster.close()

    a = Analysis(claims, runs)  # type: ignore[arg-type]
    check_runs(a)
    check_settled(a, end_mark - 1.0)
    figures = [f"stopped {stopped - ran_at:.1f}s after the interval run, relaunched "
               f"{relaunched - stopped:.1f}s later, every beat up "
               f"{up.timestamp() - ran_at:.1f}s after the run"]
    for policy, job in proj.RS_INTERVALS.items():
        own = sorted((c for c in claims if c.job == job), key=lambda c: c.occurrence)
        after = [c for c in own if c.occurrence > last[job]]
        gaps = [(b.occurrence - p.occurrence) for p, b in zip(own, own[1:])]
        due = last[job] + EVERY
        first = after[0].occurrence if after else None
        figures.append(f"{job}: due {iso(due)}, ran {iso(first) if first else None} "
                       f"({(first - due).total_seconds() if first else float('nan'):+.3f}s); "
                       f"gaps {[round(g.total_seconds(), 3) for g in gaps]}")
        if first is None:
            a.fail(f"{job} ({policy}): no run after the restart")
            continue
        if not due - TOLERANCE <= first <= max(due, up) + ON_TIME:
            a.fail(f"{job} ({policy}): the run due at {iso(due)} came at {iso(first)} "
                   f"(every beat up at {iso(up)}): a run was lost")
        if any(g < EVERY - TOLERANCE for g in gaps):
            a.fail(f"{job} ({policy}): runs closer than the interval: "
                   f"{[g.total_seconds() for g in gaps]}")
        if len(after) >= 2 and after[1].occurrence - first > EVERY + ON_TIME:
            a.fail(f"{job} ({policy}): the run after {iso(first)} came at "
                   f"{iso(after[1].occurrence)}, off the rhythm")
    first_up = min(started.values())
    end = end_mark - 2.0
    for policy, job in proj.RS_CRONS.items():
        before = [c.occurrence for c in claims if c.job == job
                  and c.occurrence.timestamp() < stopped]
        down = [s for s in grid(stopped, first_up, 10) if stopped <= s.timestamp() < first_up]
        label = job.replace("-", "_")
        expect_exactly_once(a, job, grid(first_up, end, 10), label)
        if policy == "skip":
            replayed = [r.occurrence for r in runs if r.entry == job and r.catch_up]
            if replayed:
                a.fail(f"{job}: skip replayed {replayed}")
        else:
            expect_exactly_once(a, job, down, f"{label}_down")
        if not before:
            a.fail(f"{job}: no run before the stop")
        figures.append(f"{job}: slots while down {[iso(s) for s in down]}")
    text = report(a, "\n".join(figures))
    summary(workdir, "quick restart", text)
    assert not a.problems, text

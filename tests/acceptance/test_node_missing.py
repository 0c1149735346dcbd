"""Acceptance: an every-node entry that stopped on one node is named (issue #35).

Three nodes, each a ``celery beat`` and a ``celery worker`` of
:mod:`tests.acceptance.proj_runs` (whose app calls ``install_worker``: each worker
consumes its node's queue and records each every-node run on a row of kind ``node``),
on Redis and PostgreSQL, run an every-node entry every :data:`PERIOD`. Once every node
ran it, ``status`` is quiet; then node-3's worker is killed (``kill -9``): its beat sends
on and the messages expire unexecuted. Within two periods ``celery -A ... elarion-beat
status --since <two periods> --json --fail-on node-missing`` names node-3, and only
node-3, in the entry's ``nodes_missing`` and exits 1; the gauge
``elarion_beat_every_node_missing`` (read from the same database, in this process) says
1 for node-3 and 0 for the others. When the worker is started again, node-3 is no
longer named and ``status`` exits 0. One cluster serves every step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from celery_elarion_beat.operate.coverage_metrics import METRIC, EveryNodeGauge
from celery_elarion_beat.schedules.slots import parse_iso
from celery_elarion_beat.testing._harness import wait_until
from tests.acceptance import proj_runs as proj
from tests.acceptance.cluster import START_TIMEOUT, summary
from tests.acceptance.runs import RunsCluster

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# three beats and three workers; a killed worker named within two periods
pytestmark += [pytest.mark.heavy]

PERIOD = proj.COVERAGE_PERIOD.total_seconds()
JOB = proj.COVERAGE_JOB
NODES = ("node-1", "node-2", "node-3")
KILLED = "node-3"
#: ``--since``: two periods, the least that judges a node (it must be live for two)
SINCE = f"{2 * PERIOD:g}s"


class Probe:
    """``status --since SINCE --json --fail-on node-missing``, run again and again; every
    report is kept (with when its command started and how long it took)."""

    def __init__(self, cluster: RunsCluster) -> None:
        self.cluster = cluster
        self.reports: list[tuple[float, float, int | None, dict[str, Any]]] = []

    def __call__(self) -> tuple[int | None, dict[str, Any]]:
        began = time.time()
        probe = self.cluster.pm.celery(
            f"status-{len(self.cluster.pm.processes)}",
            ["elarion-beat", "status", "--since", SINCE, "--json", "--fail-on", "node-missing"])
        rc = probe.wait(START_TIMEOUT)
        output = probe.log()
        try:
            report, _ = json.JSONDecoder().raw_decode(output[max(output.find("{\n"), 0):])
        except ValueError as exc:
            raise AssertionError(f"status (rc {rc}) printed no JSON ({exc}):\n"
                                 f"{output[-3000:]}") from None
        self.reports.append((began, time.time() - began, rc, report))
        return rc, report

    @staticmethod
    def entry(report: dict[str, Any]) -> dict[str, Any]:
        (found,) = [e for e in report["entries"] if e["name"] == JOB]
        return found


def at(report: dict[str, Any]) -> float:
    """When *report* was made (its database clock), as a Unix time."""
    return parse_iso(report["now"]).timestamp()


def gauge_values(gauge: EveryNodeGauge, registry: CollectorRegistry) -> dict[str, float]:
    assert gauge.refresh(), "the gauge could not read the claims database"
    return {s.labels["node"]: s.value for family in registry.collect()
            for s in family.samples if s.name == METRIC and s.labels["job"] == JOB}


def test_a_node_whose_worker_died_is_named_until_it_runs_again(
        workdir: Path, pg_dsn: str, redis_url: str) -> None:
    cluster = RunsCluster(workdir, pg_dsn=pg_dsn, broker_url=redis_url, schedule="coverage",
                          beats=len(NODES))
    app = proj.make_app(cluster.env, main=f"elarion-coverage-{cluster.run_id}")
    registry = CollectorRegistry()
    gauge = EveryNodeGauge(app, refresh=3600)
    registry.register(gauge)
    status = Probe(cluster)
    try:
        cluster.prepare()
        for node in NODES:
            cluster.start_worker(node, env={"ELARION_ACC_NODE": node}, wait=False)
        cluster.launch_beats(NODES)
        for node in NODES:
            cluster.workers[node].wait_for_log(r"\bready\.", START_TIMEOUT)
        cluster.wait_started(NODES)

        # every node ran the entry, and has been live for two periods: nothing missing
        def all_ran() -> dict[str, Any] | None:
            rc, report = status()
            entry = status.entry(report)
            return report if set(entry["nodes_ran"]) == set(NODES) and rc == 0 else None

        report = wait_until(all_ran, START_TIMEOUT, interval=0.2,
                            message=lambda: f"every node running {JOB}: {status.reports[-1:]}"
                                            f"\n{cluster.tails()}")
        entry = status.entry(report)
        assert entry["nodes_missing"] == [] and entry["nodes_not_tracked"] == [], entry
        assert "node-missing" in report["fail_on"] and report["findings"] == [], report
        assert gauge_values(gauge, registry) == dict.fromkeys(NODES, 0.0)

        # node-3's worker dies; its beat sends on
        cluster.workers[KILLED].kill9()
        killed_at = cluster.workers[KILLED].killed_at
        assert killed_at is not None
        checked = len(status.reports)

        def named() -> dict[str, Any] | None:
            rc, report = status()
            return report if rc == 1 and status.entry(report)["nodes_missing"] else None

        report = wait_until(named, 2 * PERIOD + 20, interval=0.2,
                            message=lambda: f"{KILLED} named missing: {status.reports[-1:]}\n"
                                            f"{cluster.tails()}")
        began, took, _, named_report = status.reports[-1]
        entry = status.entry(report)
        assert entry["nodes_missing"] == [KILLED], entry
        assert set(entry["nodes_ran"]) <= set(NODES) - {KILLED}, entry
        assert report["findings"] == ["node-missing"] and report["exit_code"] == 1, report
        # within two periods of the kill: no report made (on the database clock) more than
        # two periods after the kill failed to name it (node-3's last run started before
        # the kill, so one made a little earlier may name it too, as this one may have)
        late = [(at(r[3]) - killed_at, status.entry(r[3])["nodes_missing"])
                for r in status.reports[checked:] if at(r[3]) >= killed_at + 2 * PERIOD + 0.5]
        assert all(missing == [KILLED] for _, missing in late), late
        # no report ever named another node
        others = [(r[0], status.entry(r[3])["nodes_missing"]) for r in status.reports
                  if set(status.entry(r[3])["nodes_missing"] or ()) - {KILLED}]
        assert not others, others

        # the metric agrees
        values = gauge_values(gauge, registry)
        assert values == {"node-1": 0.0, "node-2": 0.0, KILLED: 1.0}, values

        # the worker comes back: node-3 runs it again and is no longer named
        restarted = time.time()
        cluster.start_worker(KILLED, env={"ELARION_ACC_NODE": KILLED})

        def healthy() -> dict[str, Any] | None:
            rc, report = status()
            return report if rc == 0 and not status.entry(report)["nodes_missing"] else None

        report = wait_until(healthy, START_TIMEOUT, interval=0.2,
                            message=lambda: f"{KILLED} running again: {status.reports[-1:]}\n"
                                            f"{cluster.tails()}")
        assert KILLED in status.entry(report)["nodes_ran"], report
        assert report["findings"] == [], report
        assert gauge_values(gauge, registry) == dict.fromkeys(NODES, 0.0)
        summary(workdir, "every-node accountability",
                f"{KILLED}'s worker killed at {killed_at:.1f}; named by the status started "
                f"{began - killed_at:.1f}s after (it took {took:.1f}s; its database clock "
                f"{at(named_report) - killed_at:.1f}s after); worker restarted "
                f"{restarted - killed_at:.1f}s after the kill, cleared after "
                f"{status.reports[-1][0] - restarted:.1f}s; {len(status.reports)} reports")
    finally:
        gauge.close()
        cluster.close()
        app.close()

"""Flower integration on real processes (the run is described in tests/flower/cluster.py):
the counters and histograms, the page and its JSON (states, runtimes, lateness),
url_prefix and basic_auth, Flower's own pages, and the events' payloads."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from typing import Any

import pytest

from celery_elarion_beat.observe.metrics import LATENESS_BUCKETS, lateness_outcome
from tests.flower.app import (
    CRON_JOB,
    FAIL_EVERY,
    INTERVAL_JOB,
    JOBS,
    OVERLAP_JOB,
    SECRET_ARG,
    SECRET_KWARG,
    SLOW_TASK,
    TASK,
)
from tests.flower.cluster import NODES, RUN_SECONDS, USER, Cluster, by_job_node
from tests.flower.support import (
    PROBE_JOB,
    PROBE_NODE,
    basic,
    elarion_lines,
    expected_counts,
    expected_histogram,
    get_json,
    histograms,
    http_get,
    occurrence_counts,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres]
# the package's Flower cluster is built once, on one worker
pytestmark += [pytest.mark.heavy, pytest.mark.xdist_group("flower-cluster")]


# -- the counters -------------------------------------------------------------------


def test_metrics_match_the_claims_table_and_the_beat_logs(cluster: Cluster) -> None:
    claimed = Counter((cl.job, cl.node) for cl in cluster.sent)
    assert set(j for j, _ in claimed) == set(JOBS), cluster.claims
    assert sum(claimed.values()) >= 8, f"too few claims in {RUN_SECONDS}s: {claimed}"
    assert by_job_node(cluster.expected, "dispatched") == claimed, "the beat logs disagree " \
        "with the claims table"
    skipped = by_job_node(cluster.expected, "skipped")
    for job in JOBS:
        assert sum(n for (j, _), n in skipped.items() if j == job) > 0, f"{job}: no skips"
    want = expected_counts(cluster.expected)
    for name, text in cluster.monitors().items():
        assert text, f"{name} does not answer"
        per_job, per_node = occurrence_counts(text)
        for counts, claimed_by in ((per_job, Counter(cl.job for cl in cluster.sent)),
                                   (per_node, Counter(cl.node for cl in cluster.sent))):
            sent = Counter({who: n for (who, outcome, _), n in counts.items()
                            if outcome == "dispatched"})
            assert sent == claimed_by, f"{name}: dispatched counts differ from the claims " \
                f"table\n{elarion_lines(text)}"
        assert (per_job, per_node) == want, f"{name}: counts differ from the beat logs\n" \
            f"metrics: {sorted(per_job.items())} {sorted(per_node.items())}\n" \
            f"logs: {sorted(want[0].items())} {sorted(want[1].items())}"
        assert "beat@" not in text, f"{name}: a beat hostname leaked into the metrics"
        assert not [line for line in elarion_lines(text)
                    if "job=" in line and "node=" in line], f"{name}: job x node series"
        assert not [line for line in elarion_lines(text) if "worker@" in line], \
            f"{name}: a run event counted as a beat node's"


def test_histograms_match_the_runs_and_the_dispatched_events(cluster: Cluster) -> None:
    """Both Flowers and both exporters serve the runtime of each run the worker
    recorded (the claims table) and the lateness of each dispatched slot (the events)."""
    runtimes = cluster.runtimes()
    failed = [cl for cl in cluster.sent if cl.run_state == "failed"]
    assert {(job, state) for job, state in runtimes} >= {
        (CRON_JOB, "succeeded"), (CRON_JOB, "failed"), (INTERVAL_JOB, "succeeded"),
        (OVERLAP_JOB, "succeeded")}, runtimes
    assert all(cl.job == CRON_JOB and cl.occurrence[17:19] in
               {f"{s:02d}" for s in range(0, 60, FAIL_EVERY)} for cl in failed), failed
    dispatched = [e for e in cluster.capture.snapshot() if e.get("type") == "elarion-dispatched"
                  and e.get("job") in JOBS]
    late: dict[tuple[str, str], list[float]] = {}
    for event in dispatched:
        if event.get("lateness") is not None:
            late.setdefault((event["job"], lateness_outcome(event)), []).append(
                event["lateness"])
    slots = [cl for cl in cluster.sent if cl.kind == "slot"]
    assert sum(map(len, late.values())) == len(slots), "a dispatched slot without lateness"
    assert {job for job, _ in late} == {CRON_JOB, OVERLAP_JOB}, "windows have no lateness"
    want_late = {key: expected_histogram(values, LATENESS_BUCKETS) for key, values in late.items()}
    for name, text in cluster.monitors().items():
        for metric, want in (("elarion_beat_runtime_seconds", runtimes),
                             ("elarion_beat_lateness_seconds", want_late)):
            found = histograms(text, metric)
            assert found.keys() == want.keys(), f"{name}: {metric}\n{elarion_lines(text)}"
            for key, samples in want.items():
                got = dict(found[key])
                assert got.pop("sum") == pytest.approx(samples["sum"], abs=1e-4), (name, key)
                assert got == {k: v for k, v in samples.items() if k != "sum"}, \
                    f"{name}: {metric} {key}"


# -- the page and its JSON -------------------------------------------------------------


def _occurrences(state: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(job["job"], occ["occurrence"]): occ for job in state["jobs"]
            for occ in job["occurrences"] if occ["occurrence"] and job["job"] != PROBE_JOB}


def test_the_state_json_shows_every_recent_occurrence(cluster: Cluster) -> None:
    state = get_json(cluster.plain + "/elarion/api/state")
    shown = _occurrences(state)
    assert {j["job"] for j in state["jobs"]} >= set(JOBS)
    for job in JOBS:
        rows = [cl for cl in cluster.claims if cl.job == job][-20:]  # the board keeps 20
        assert rows, job
        for claim in rows:
            occ = shown.get((job, claim.occurrence))
            assert occ is not None, f"{job} {claim.occurrence} missing from the page"
            skipped = {s["node"]: s["reason"] for s in occ["skipped"]}
            assert set(skipped) <= set(NODES)
            if not claim.sent:  # overlap: skip, decided by claim.node for every node
                assert (occ["state"], occ["task_id"], occ["runtime"]) == ("skipped", None, None)
                assert occ["winner"] == claim.node and set(skipped.values()) == {"still-running"}
                continue
            assert (occ["winner"], occ["task_id"]) == (claim.node, claim.task_id)
            assert claim.node not in skipped
            assert set(skipped.values()) <= {"claimed-elsewhere"}, occ
            if job == CRON_JOB and cluster.steady(claim.occurrence):
                assert set(skipped) == set(NODES) - {claim.node}, occ
            # the run, as the worker recorded it in the claims table
            assert (occ["state"], occ["worker"]) == (claim.run_state, claim.worker), occ
            assert occ["runtime"] == pytest.approx(claim.runtime, abs=1e-5), occ
            assert occ["exception"] == (claim.run_error.split(":")[0] if claim.run_error
                                        and claim.run_state == "failed" else None), occ
            if claim.kind == "slot":
                assert occ["lateness"] is not None and 0 <= occ["lateness"] < 5, occ
            else:
                assert occ["lateness"] is None, occ
    assert {o["state"] for o in shown.values()} >= {"succeeded", "failed", "skipped"}
    for job in state["jobs"]:
        if job["job"] in JOBS:
            runs = [cl.runtime or 0.0 for cl in cluster.sent if cl.job == job["job"]][-30:]
            assert sorted(job["runtimes"]) == pytest.approx(sorted(runs), abs=1e-5), job
    nodes = {n["node"]: n for n in state["nodes"]}
    assert set(nodes) >= set(NODES)
    assert not [n for n in nodes if n.startswith("worker@")], "a worker shown as a beat node"
    dispatched = by_job_node(cluster.expected, "dispatched")
    for node in NODES:
        assert nodes[node]["dispatched"] == sum(n for (_, nd), n in dispatched.items()
                                                if nd == node)
        assert nodes[node]["skipped"] == sum(n for (_, nd, o, _), n in
                                             cluster.expected.items()
                                             if nd == node and o == "skipped")
        assert cluster.stopped - 60 < nodes[node]["last_seen_ts"] <= time.time() + 1


def test_the_page_renders_inside_flower(cluster: Cluster) -> None:
    status, html = http_get(cluster.plain + "/elarion")
    assert status == 200, html[:500]
    assert "<title>Beat · Flower</title>" in html
    assert 'href="/workers"' in html and 'href="/tasks"' in html  # Flower's own navbar
    assert 'data-state-url="/elarion/api/state"' in html
    assert 'data-task-url="/task/__TASK_ID__"' in html
    initial = html.split('id="elarion-initial">', 1)[1].split("</script>", 1)[0]
    assert {j["job"] for j in json.loads(initial)["jobs"]} >= set(JOBS)
    # the sparklines are inline SVG drawn by the page's own script: nothing loaded from
    # anywhere but Flower's static files
    loaded = re.findall(r'<(?:script|link|img)\b[^>]*\b(?:src|href)="([^"]*)"', html)
    assert loaded and all(url.startswith("/static/") for url in loaded), loaded
    assert "createElementNS(SVG, tag)" in html and 'STATE = {"published": ' in html


def test_url_prefix_and_basic_auth_apply(cluster: Cluster) -> None:
    base, auth = cluster.guarded, cluster.auth
    root = base.rsplit("/flower", 1)[0]
    for path in ("/elarion", "/elarion/api/state"):
        assert http_get(base + path)[0] == 401, path
        assert http_get(base + path, basic(USER, "wrong"))[0] == 401, path
        assert http_get(root + path, auth)[0] == 404, path  # only under the prefix
    status, html = http_get(base + "/elarion", auth)
    assert status == 200
    assert 'data-state-url="/flower/elarion/api/state"' in html
    assert 'data-task-url="/flower/task/__TASK_ID__"' in html
    assert 'href="/flower/static/' in html or "/flower/static/" in html
    guarded = _occurrences(get_json(base + "/elarion/api/state", auth))
    plain = _occurrences(get_json(cluster.plain + "/elarion/api/state"))
    assert guarded == plain  # two Flowers, the same events


# -- Flower's own pages stay clean -----------------------------------------------------


def test_no_phantom_workers_and_no_fake_tasks_in_flower(cluster: Cluster) -> None:
    workers = get_json(cluster.plain + "/api/workers?refresh=1")
    assert not [w for w in workers if w.startswith("beat@") or w in NODES
                or w == f"worker@{PROBE_NODE}"], workers  # no worker made of elarion-run
    listed = get_json(cluster.plain + "/workers?json=1")["data"]
    assert not [w for w in listed if str(w.get("hostname", "")).startswith("beat@")], listed
    tasks = get_json(cluster.plain + "/api/tasks")
    claimed_ids = {cl.task_id for cl in cluster.claims}
    assert set(tasks) <= claimed_ids, set(tasks) - claimed_ids
    for task in tasks.values():
        assert task.get("name") in (TASK, SLOW_TASK), task
        assert not str(task.get("worker") or "").startswith("beat@"), task
        assert not str(task.get("client") or "").startswith("beat@"), task
    probe = get_json(cluster.plain + "/api/tasks?taskname=probe")
    assert probe == {}


# -- events never carry task arguments -------------------------------------------------


def test_beat_events_carry_no_task_arguments(cluster: Cluster) -> None:
    events = [e for e in cluster.capture.snapshot()
              if str(e.get("hostname", "")).startswith("beat@n")
              or (e.get("type") == "elarion-run" and e.get("job") in JOBS)]
    kinds = Counter(e["type"] for e in events)
    assert kinds["elarion-dispatched"] == len(cluster.sent), kinds
    assert kinds["elarion-skipped"] > 0, kinds
    # on the wire, the beats' outcomes came in batches: one per node and tick at most
    wire = [e for e in cluster.capture.raw() if str(e.get("hostname", "")).startswith("beat@n")]
    batches = [e for e in wire if e["type"] == "elarion-batch"]
    assert not [e for e in wire if e["type"] in ("elarion-dispatched", "elarion-skipped")]
    outcomes = kinds["elarion-dispatched"] + kinds["elarion-skipped"]
    assert sum(e["count"] for e in batches) == outcomes
    assert len(batches) < outcomes, (len(batches), outcomes)
    assert kinds["elarion-run"] == 2 * len(cluster.sent), kinds  # started, finished
    for event in events:
        assert "args" not in event and "kwargs" not in event, event
        text = json.dumps(event, default=str)
        assert SECRET_ARG not in text and SECRET_KWARG not in text, event
    for url in (cluster.plain + "/elarion", cluster.plain + "/elarion/api/state"):
        assert SECRET_ARG not in http_get(url)[1] and SECRET_KWARG not in http_get(url)[1]
    assert INTERVAL_JOB in {e.get("job") for e in events}

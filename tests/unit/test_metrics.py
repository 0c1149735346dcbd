"""The Prometheus counters stay bounded: jobs and nodes never multiply, dead nodes expire;
the lateness and runtime histograms bucket what the events say, and run events are
neither occurrences nor news of a beat node.

Time is driven by the events' own ``local_received`` (what a monitor's receiver
stamps on each event), never by sleeping. Each test has a registry of its own.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from celery_elarion_beat.observe.metrics import LATENESS_BUCKETS, RUNTIME_BUCKETS, counters_for

DAY = 24 * 3600.0
T0 = 1_000_000.0
NODES = [f"node-{i:02d}" for i in range(60)]
JOBS = [f"job-{i:03d}" for i in range(500)]
#: (outcome, reason) pairs the events below produce
OUTCOMES = [("dispatched", ""), ("skipped", "claimed-elsewhere")]

_SAMPLE = re.compile(r"^(?P<name>elarion_beat_\w+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def dispatched(node: str, job: str, ts: float) -> dict[str, Any]:
    return {"type": "elarion-dispatched", "hostname": f"beat@{node}", "job": job,
            "task_name": "proj.work", "node": node, "placement": "cluster", "claim": "slot",
            "occurrence": "2026-11-29T03:00:00Z", "task_id": f"{job}-t", "local_received": ts}


def skipped(node: str, job: str, ts: float, reason: str = "claimed-elsewhere") -> dict[str, Any]:
    return {"type": "elarion-skipped", "hostname": f"beat@{node}", "job": job,
            "task_name": "proj.work", "node": node, "placement": "cluster", "claim": "slot",
            "occurrence": "2026-11-29T03:00:00Z", "reason": reason, "winner": None,
            "local_received": ts}


def drift(node: str, ts: float) -> dict[str, Any]:
    return {"type": "elarion-drift", "hostname": f"beat@{node}", "node": node,
            "fingerprint": "f", "differing": {}, "local_received": ts}


def samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    """Every exported ``elarion_beat_*`` sample (no comments, no ``_created`` twins)."""
    out = []
    for line in generate_latest(registry).decode().splitlines():
        match = _SAMPLE.match(line)
        if match and not match["name"].endswith("_created"):
            out.append((match["name"], dict(_LABEL.findall(match["labels"])),
                        float(match["value"])))
    return out


def by_name(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(labels.values()): value for n, labels, value in samples(registry)
            if n == name}


def nodes_in(registry: CollectorRegistry) -> set[str]:
    """The nodes named by any exported series."""
    return {labels["node"] for _, labels, _ in samples(registry) if "node" in labels}


def one_round(ts: float, nodes: list[str] = NODES,
              jobs: list[str] = JOBS) -> Iterator[dict[str, Any]]:
    """Each job once: one node dispatches it, every other node skips it."""
    for j, job in enumerate(jobs):
        winner = nodes[j % len(nodes)]
        for node in nodes:
            yield dispatched(node, job, ts) if node == winner else skipped(node, job, ts)


def test_series_grow_with_jobs_plus_nodes_not_jobs_times_nodes() -> None:
    registry = CollectorRegistry()
    counters = counters_for(registry)
    for event in one_round(T0):
        counters.observe(event)

    series = samples(registry)
    bound = len(JOBS) * len(OUTCOMES) + len(NODES) * (len(OUTCOMES) + 1)  # + last seen
    assert len(series) <= bound, f"{len(series)} series for {len(JOBS)} jobs on " \
        f"{len(NODES)} nodes (bound {bound}); e.g. {series[:3]}"
    per_job = by_name(registry, "elarion_beat_occurrences_total")
    per_node = by_name(registry, "elarion_beat_node_occurrences_total")
    assert len(per_job) == len(JOBS) * len(OUTCOMES) and len(per_node) == len(NODES) * 2
    assert {len(k) for k in per_job} == {3} and {len(k) for k in per_node} == {3}
    assert per_job[("job-007", "dispatched", "")] == 1
    assert per_job[("job-007", "skipped", "claimed-elsewhere")] == len(NODES) - 1
    assert sum(v for (_, o, _), v in per_node.items() if o == "dispatched") == len(JOBS)
    assert per_node[("node-00", "skipped", "claimed-elsewhere")] == len(JOBS) - 9


def test_the_series_of_nodes_not_heard_from_for_a_day_are_dropped() -> None:
    registry = CollectorRegistry()
    counters = counters_for(registry)  # stale_after: 24 h by default
    for event in one_round(T0, jobs=JOBS[:20]):
        counters.observe(event)
    for node in NODES[:10]:
        counters.observe(drift(node, T0))
    live = NODES[-3:]

    # the live nodes go on; just under a day after the others' last event nothing is lost
    for event in one_round(T0 + DAY - 1, nodes=live, jobs=JOBS[:20]):
        counters.observe(event)
    assert nodes_in(registry) == set(NODES)
    assert len(by_name(registry, "elarion_beat_drift_events_total")) == 10

    # past a day: only the live nodes keep per-node series; the per-job history stays
    for event in one_round(T0 + DAY + 1, nodes=live, jobs=JOBS[:20]):
        counters.observe(event)
    assert nodes_in(registry) == set(live), "the series of nodes silent for a day remain"
    per_node = by_name(registry, "elarion_beat_node_occurrences_total")
    assert {k[0] for k in per_node} == set(live)
    assert by_name(registry, "elarion_beat_drift_events_total") == {}
    per_job = by_name(registry, "elarion_beat_occurrences_total")
    assert per_job[("job-000", "dispatched", "")] == 3  # one round of 60 nodes, two of 3
    # node-57 skipped the 20 jobs of the 60-node round and 13 of each 3-node round
    assert per_node[(live[0], "skipped", "claimed-elsewhere")] == 20 + 13 + 13
    # a node that comes back starts again from zero
    counters.observe(skipped(NODES[0], "job-000", T0 + DAY + 2, reason="claim-error"))
    assert by_name(registry, "elarion_beat_node_occurrences_total")[
        (NODES[0], "skipped", "claim-error")] == 1


def test_stale_after_is_a_constructor_argument() -> None:
    from celery_elarion_beat.observe.metrics import OccurrenceCounters

    registry = CollectorRegistry()
    counters = OccurrenceCounters(registry, stale_after=60)
    counters.observe(dispatched("old", "job", T0))
    counters.observe(drift("old", T0))
    counters.observe(dispatched("new", "job", T0 + 60))
    assert {k[0] for k in by_name(registry, "elarion_beat_node_occurrences_total")} == \
        {"old", "new"}
    counters.observe(skipped("new", "job", T0 + 61))
    assert {k[0] for k in by_name(registry, "elarion_beat_node_occurrences_total")} == {"new"}
    assert by_name(registry, "elarion_beat_drift_events_total") == {}


def test_concurrent_events_and_expiry_lose_no_count() -> None:
    registry = CollectorRegistry()
    counters = counters_for(registry)
    rounds = 200
    errors: list[BaseException] = []

    def feed(worker: int) -> None:
        try:
            for r in range(rounds):
                # every round is a new day: each round's nodes expire the previous ones
                node = f"w{worker}-r{r}"
                counters.observe(dispatched(node, f"job-{worker}", T0 + r * DAY * 1.5))
                counters.observe(skipped(node, f"job-{worker}", T0 + r * DAY * 1.5))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=feed, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    per_job = by_name(registry, "elarion_beat_occurrences_total")
    assert Counter({job: v for (job, o, _), v in per_job.items() if o == "dispatched"}) == \
        Counter({f"job-{w}": rounds for w in range(8)})
    # a thread running behind the others sends events already a day old: their nodes
    # go at once; only the nodes of the last round (the latest time) are left
    nodes = {k[0] for k in by_name(registry, "elarion_beat_node_occurrences_total")}
    assert nodes == {f"w{w}-r{rounds - 1}" for w in range(8)}


# -- the histograms ----------------------------------------------------------------------


def run(job: str, state: str, ts: float, runtime: Any = None,
        node: str = "node-00") -> dict[str, Any]:
    """A worker's elarion-run event; *node* is the beat node that sent the task."""
    event = {"type": "elarion-run", "hostname": "worker@w1", "job": job, "node": node,
             "occurrence": "2026-11-29T03:00:00Z", "task_id": f"{job}-t", "worker": "celery@w1",
             "placement": "cluster", "state": state, "local_received": ts}
    if runtime is not None:
        event["runtime"] = runtime
    return event


def buckets(registry: CollectorRegistry, name: str) -> dict[tuple[str, str], dict[str, float]]:
    """(job, outcome) -> {le: cumulative count, "count": n, "sum": s} of histogram *name*."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for line in generate_latest(registry).decode().splitlines():
        match = re.match(rf"^{name}_(bucket|count|sum)\{{([^}}]*)\}} (\S+)$", line)
        if match:
            labels = dict(_LABEL.findall(match[2]))
            key = labels.get("le", str(match[1]))
            out.setdefault((labels["job"], labels["outcome"]), {})[key] = float(match[3])
    return out


def test_lateness_is_bucketed_per_job_and_outcome() -> None:
    registry = CollectorRegistry()
    counters = counters_for(registry)
    for lateness, extra in ((0.004, {}), (0.01, {}), (0.3, {}), (2.0, {}), (4000.0, {}),
                            (45.0, {"catch_up": True}), (0.2, {"takeover": 1}),
                            (0.02, {"catch_up": True, "takeover": 2}),
                            (0.5, {"takeover": 0})):
        counters.observe({**dispatched("node-01", "job-a", T0), "lateness": lateness, **extra})
    counters.observe(dispatched("node-01", "job-a", T0))  # a window: no lateness
    late = buckets(registry, "elarion_beat_lateness_seconds")
    assert set(late) == {("job-a", "dispatched"), ("job-a", "catch-up"), ("job-a", "takeover")}
    plain = late[("job-a", "dispatched")]
    assert (plain["0.01"], plain["0.25"], plain["0.5"], plain["2.5"], plain["1800.0"],
            plain["+Inf"], plain["count"]) == (2, 2, 4, 5, 5, 6, 6)
    assert plain["sum"] == pytest.approx(0.004 + 0.01 + 0.3 + 2.0 + 4000.0 + 0.5)
    assert (late[("job-a", "catch-up")]["30.0"], late[("job-a", "catch-up")]["60.0"]) == (0, 1)
    assert late[("job-a", "takeover")]["count"] == 2  # takeover wins over catch-up
    assert [b for b in plain if b not in ("count", "sum")] == [
        str(b) for b in LATENESS_BUCKETS] + ["+Inf"]
    assert by_name(registry, "elarion_beat_occurrences_total")[
        ("job-a", "dispatched", "")] == 10


def test_runtimes_are_bucketed_per_job_and_run_state() -> None:
    registry = CollectorRegistry()
    counters = counters_for(registry)
    for state, runtime in (("running", None), ("succeeded", 0.004), ("succeeded", 0.6),
                           ("succeeded", 3599.0), ("succeeded", 9000.0), ("failed", 0.05),
                           ("retried", 12.0), ("running", 5.0)):
        counters.observe(run("job-b", state, T0, runtime))
    runs = buckets(registry, "elarion_beat_runtime_seconds")
    assert set(runs) == {("job-b", "succeeded"), ("job-b", "failed"), ("job-b", "retried")}
    ok = runs[("job-b", "succeeded")]
    assert (ok["0.01"], ok["1.0"], ok["3600.0"], ok["7200.0"], ok["+Inf"]) == (1, 2, 3, 3, 4)
    assert (runs[("job-b", "failed")]["0.05"], runs[("job-b", "failed")]["0.01"]) == (1, 0)
    assert runs[("job-b", "retried")]["10.0"] == 0 and runs[("job-b", "retried")]["30.0"] == 1
    assert [b for b in ok if b not in ("count", "sum")] == [
        str(b) for b in RUNTIME_BUCKETS] + ["+Inf"]


def test_run_events_are_neither_occurrences_nor_news_of_a_beat_node() -> None:
    registry = CollectorRegistry()
    counters = counters_for(registry)
    counters.observe(dispatched("node-00", "job", T0))
    for i in range(5):
        counters.observe(run("job", "running", T0 + i))
        counters.observe(run("job", "succeeded", T0 + i, 0.5))
    assert by_name(registry, "elarion_beat_occurrences_total") == {("job", "dispatched", ""): 1}
    assert by_name(registry, "elarion_beat_node_occurrences_total") == {
        ("node-00", "dispatched", ""): 1}
    assert "worker@w1" not in generate_latest(registry).decode()
    # a day later only its tasks' runs were heard of: node-00's series go all the same
    counters.observe(run("job", "succeeded", T0 + DAY + 1, 0.5, node="node-00"))
    assert by_name(registry, "elarion_beat_node_occurrences_total") == {}
    assert buckets(registry, "elarion_beat_runtime_seconds")[("job", "succeeded")]["count"] == 6


@pytest.mark.parametrize("bad", [-0.001, float("nan"), float("inf"), float("-inf"), "1.5",
                                 True, None, [1.0], {"s": 1}])
def test_bad_durations_are_left_out_and_never_raise(bad: Any) -> None:
    registry = CollectorRegistry()
    counters = counters_for(registry)
    counters.observe({**dispatched("node-01", "job", T0), "lateness": bad})
    counters.observe(run("job", "failed", T0, bad))
    counters.observe({**run("job", "succeeded", T0, 1.0), "state": bad}
                     if not isinstance(bad, (list, dict)) else run("job", "running", T0))
    assert buckets(registry, "elarion_beat_lateness_seconds") == {}
    assert buckets(registry, "elarion_beat_runtime_seconds") == {}
    assert by_name(registry, "elarion_beat_occurrences_total") == {("job", "dispatched", ""): 1}


def test_histogram_series_grow_with_jobs_never_with_nodes() -> None:
    registry = CollectorRegistry()
    counters = counters_for(registry)
    jobs = JOBS[:100]
    for i, event in enumerate(one_round(T0, jobs=jobs)):
        if event["type"] == "elarion-dispatched":
            event["lateness"] = (i % 97) / 10
            event["catch_up"] = i % 3 == 0
            counters.observe(event)
            counters.observe(run(event["job"], "succeeded" if i % 2 else "failed", T0,
                                 i / 7, node=event["node"]))
        else:
            counters.observe(event)
    names = {"elarion_beat_lateness_seconds", "elarion_beat_runtime_seconds"}
    series = [(n, labels) for n, labels, _ in samples(registry)
              if n.rsplit("_", 1)[0] in names]
    assert all(set(labels) <= {"job", "outcome", "le"} for _, labels in series)
    per_job = {(n.rsplit("_", 1)[0], labels["job"], labels["outcome"]) for n, labels in series}
    assert len(per_job) <= len(jobs) * 4  # 2 lateness + 2 runtime outcomes were sent
    assert {job for _, job, _ in per_job} == set(jobs)


def foreign(origin: str, task: str, count: Any, ts: float) -> dict[str, Any]:
    return {"type": "elarion-foreign-beat", "hostname": "worker@w1", "origin": origin,
            "host": origin.rpartition("@")[2], "task_name": task, "entry": None,
            "count": count, "worker": "celery@w1", "local_received": ts}


def test_foreign_beat_messages_are_counted_by_sender_and_task_and_expire() -> None:
    registry = CollectorRegistry()
    counters = counters_for(registry)
    counters.observe(foreign("gen1@old", "proj.a", 3, T0))
    counters.observe(foreign("gen1@old", "proj.a", 2, T0 + 1))
    counters.observe(foreign("gen1@old", "proj.b", 1, T0 + 1))
    for bad in (0, -1, "2", True, None):  # a malformed count never counts, never raises
        counters.observe(foreign("gen1@old", "proj.a", bad, T0 + 2))
    assert by_name(registry, "elarion_beat_foreign_beat_messages_total") == {
        ("gen1@old", "proj.a"): 5, ("gen1@old", "proj.b"): 1}
    # neither occurrences nor beat nodes
    assert by_name(registry, "elarion_beat_occurrences_total") == {}
    assert nodes_in(registry) == set()
    # a sender silent for a day goes, as a node's series do
    counters.observe(foreign("gen2@new", "proj.a", 1, T0 + DAY + 2))
    assert by_name(registry, "elarion_beat_foreign_beat_messages_total") == {
        ("gen2@new", "proj.a"): 1}


def test_the_cluster_label_appears_only_once_a_second_cluster_is_heard_of() -> None:
    """One app: the series of before clusters, no cluster label (cardinality flat). A
    second app's events: each counts under its own cluster from then on; two apps'
    nodes of one name are two series; the per-node series without a cluster go."""
    registry = CollectorRegistry()
    counters = counters_for(registry)
    counters.observe({**dispatched("node-1", "cleanup", T0), "cluster": "svc_a"})
    counters.observe({**drift("node-1", T0), "cluster": "svc_a"})
    assert all("cluster" not in labels for _, labels, _ in samples(registry))
    assert by_name(registry, "elarion_beat_occurrences_total") == {
        ("cleanup", "dispatched", ""): 1}

    counters.observe({**dispatched("node-1", "cleanup", T0 + 1), "cluster": "svc_b"})
    counters.observe({**skipped("node-1", "cleanup", T0 + 1), "cluster": "svc_a"})
    assert counters.clusters == {"svc_a", "svc_b"}
    assert by_name(registry, "elarion_beat_occurrences_total") == {
        ("cleanup", "dispatched", ""): 1,  # before the second cluster: no label
        ("svc_b", "cleanup", "dispatched", ""): 1,
        ("svc_a", "cleanup", "skipped", "claimed-elsewhere"): 1}
    per_node = by_name(registry, "elarion_beat_node_occurrences_total")
    assert set(per_node) == {("svc_b", "node-1", "dispatched", ""),
                             ("svc_a", "node-1", "skipped", "claimed-elsewhere")}
    seen = by_name(registry, "elarion_beat_node_last_seen_timestamp_seconds")
    assert set(seen) == {("svc_a", "node-1"), ("svc_b", "node-1")}
    assert by_name(registry, "elarion_beat_drift_events_total") == {}
